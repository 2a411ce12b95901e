/**
 * The content-generation upstream dialect: what a native Gemini upstream is sent and answers. Upstream
 * kinds that speak it set the API key; the path is relative to a base URL that ends in `/v1beta`.
 */
import { codeForStatus, GatewayError, jsonOrUndefined, parseUpstreamJson, type UpstreamDialect } from '../../../src/plugin-api.js';
import { canonicalToGemini, geminiBodyToCanonical } from './canonical.js';
import { geminiStreamReader } from './stream.js';
import type { UpstreamGeminiAnswer, UpstreamGeminiError } from './wire.js';

export const RETRY_INFO = 'type.googleapis.com/google.rpc.RetryInfo';

/** The wait a Google error's `google.rpc.RetryInfo` detail asks for (`"retryDelay": "30s"`), in whole seconds. */
function retryDelaySeconds(details: unknown): number | undefined {
  if (!Array.isArray(details)) return undefined;
  for (const d of details) {
    if (d?.['@type'] !== RETRY_INFO || typeof d.retryDelay !== 'string') continue;
    const match = /^(\d+(?:\.\d+)?)s$/.exec(d.retryDelay.trim());
    if (match) return Math.ceil(Number(match[1]));
  }
  return undefined;
}

export const upstreamPath = (model: string, stream: boolean) => `/models/${encodeURIComponent(model)}:${stream ? 'streamGenerateContent?alt=sse' : 'generateContent'}`;

/** What a native Gemini upstream speaks. */
export const geminiDialect: UpstreamDialect = {
  family: 'gemini',
  toolNames: { valid: /^[a-zA-Z_][a-zA-Z0-9_.:-]{0,127}$/, invalid: /[^a-zA-Z0-9_.:-]/g, maxLength: 128 },

  fromCanonical(req) {
    return {
      method: 'POST',
      path: upstreamPath(req.model, req.stream),
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(canonicalToGemini(req)),
    };
  },

  readResponse: (body) => geminiBodyToCanonical(parseUpstreamJson(body) as UpstreamGeminiAnswer),

  streamReader: () => geminiStreamReader(),

  readError(status, body) {
    const error: UpstreamGeminiError | undefined = jsonOrUndefined<{ error?: UpstreamGeminiError }>(body)?.error;
    const message: string = error?.message ?? (body.toString().slice(0, 300) || `Upstream answered ${status}.`);
    // Gemini says 400 for a bad API key: that is the gateway's credential, not the client's request (7.11 item 8).
    const badKey = /API key not valid/i.test(message) || JSON.stringify(error?.details ?? []).includes('API_KEY_INVALID');
    const effective = badKey ? 401 : status;
    return new GatewayError(codeForStatus(effective), message, null, effective, error?.status, retryDelaySeconds(error?.details));
  },
};
