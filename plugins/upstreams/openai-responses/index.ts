/** A native OpenAI Responses upstream (`POST {baseUrl}/responses`). */
import { createHttpUpstream, definePlugin } from '../../../src/plugin-api.js';

const kind = { family: 'responses', authHeaders: (apiKey: string) => ({ authorization: `Bearer ${apiKey}` }) };

export default definePlugin((ctx) => {
  ctx.addUpstreamKind('openai-responses', (name, options) => createHttpUpstream(kind, name, options));
  return { name: 'upstreams/openai-responses' };
});
