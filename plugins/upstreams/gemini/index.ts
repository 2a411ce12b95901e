/** A native Gemini upstream: `{baseUrl}/models/{model}:generateContent`, key in `x-goog-api-key`. */
import { createHttpUpstream, definePlugin } from '../../../src/plugin-api.js';

const kind = { family: 'gemini', authHeaders: (apiKey: string) => ({ 'x-goog-api-key': apiKey }) };

export default definePlugin((ctx) => {
  ctx.addUpstreamKind('gemini', (name, options) => createHttpUpstream(kind, name, options));
  return { name: 'upstreams/gemini' };
});
