/**
 * The Messages upstream dialect: what an Anthropic Messages upstream is sent and answers. Upstream
 * kinds that speak it set the API key and `anthropic-version`; the path is relative to a base URL
 * that ends in `/v1`.
 */
import { parseUpstreamJson, StateKey, type UpstreamDialect } from '../../../src/plugin-api.js';
import { canonicalToMessages, jsonToolFor, type JsonTool } from './request.js';
import { messagesResponseToCanonical } from './response.js';
import { messagesStreamReader } from './stream.js';
import { readMessagesError, type UpstreamMessagesAnswer } from './wire.js';

/** Anthropic requires max_tokens; this is sent when neither the request nor the model sets a ceiling. */
const FALLBACK_MAX_TOKENS = 4096;

/** The forced tool that carries the exchange's JSON output, for reading the answer. */
const jsonToolKey = new StateKey<JsonTool | undefined>('messages json tool');

export const messagesDialect: UpstreamDialect = {
  family: 'messages',
  unsendable: ['seed', 'presencePenalty', 'frequencyPenalty'],
  toolNames: { valid: /^[a-zA-Z0-9_-]{1,128}$/, invalid: /[^a-zA-Z0-9_-]/g, maxLength: 128 },

  fromCanonical(req, ex) {
    const jsonTool = jsonToolFor(req);
    ex.set(jsonToolKey, jsonTool);
    const body = canonicalToMessages(req, { defaultMaxTokens: FALLBACK_MAX_TOKENS, jsonTool });
    return { method: 'POST', path: '/messages', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) };
  },

  readResponse: (body, ex) => messagesResponseToCanonical(parseUpstreamJson(body) as UpstreamMessagesAnswer, ex.get(jsonToolKey)),

  streamReader: (ex) => messagesStreamReader(ex.get(jsonToolKey)),

  readError: readMessagesError,
};
