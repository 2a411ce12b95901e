/**
 * The Responses upstream dialect: what a native Responses upstream is sent and answers. Upstream
 * kinds that speak it set the API key; the path is relative to a base URL that ends in `/v1`.
 */
import { parseUpstreamJson, type UpstreamDialect } from '../../../src/plugin-api.js';
import { readOpenAiError } from '../openai-common.js';
import { canonicalToResponses, responsesBodyToCanonical } from './canonical.js';
import { responsesStreamReader } from './stream.js';
import type { UpstreamResponse } from './wire.js';

/** What a native Responses upstream speaks. */
export const responsesDialect: UpstreamDialect = {
  family: 'responses',

  unsendable: ['topK', 'stop', 'seed', 'presencePenalty', 'frequencyPenalty'],
  toolNames: { valid: /^[a-zA-Z0-9_-]{1,64}$/, invalid: /[^a-zA-Z0-9_-]/g, maxLength: 64 },

  fromCanonical(req) {
    return {
      method: 'POST',
      path: '/responses',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(canonicalToResponses(req)),
    };
  },

  readResponse: (body) => responsesBodyToCanonical(parseUpstreamJson(body) as UpstreamResponse),

  streamReader: () => responsesStreamReader(),

  readError: readOpenAiError,
};
