/**
 * The chat completions upstream dialect: what an OpenAI-compatible chat upstream is sent and answers.
 * Upstream kinds that speak it set the API key; the path is relative to a base URL that ends in `/v1`.
 */
import { parseUpstreamJson, type UpstreamDialect } from '../../../src/plugin-api.js';
import { readOpenAiError } from '../openai-common.js';
import { canonicalToChat, chatResponseToCanonical } from './canonical.js';
import { chatStreamReader } from './stream.js';
import type { UpstreamChatCompletion } from './wire.js';

/** What an OpenAI-compatible chat upstream speaks. */
export const chatDialect: UpstreamDialect = {
  family: 'chat',
  // OpenAI's chat has no top-k; what it lacks beyond that, its canonical form lacks too.
  unsendable: ['topK'],
  toolNames: { valid: /^[a-zA-Z0-9_-]{1,64}$/, invalid: /[^a-zA-Z0-9_-]/g, maxLength: 64 },

  fromCanonical(req, ex) {
    return {
      method: 'POST',
      path: '/chat/completions',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(canonicalToChat(req, ex.model!.features.streamUsage)),
    };
  },

  readResponse: (body) => chatResponseToCanonical(parseUpstreamJson(body) as UpstreamChatCompletion),

  streamReader: () => chatStreamReader(),

  readError: readOpenAiError,
};
