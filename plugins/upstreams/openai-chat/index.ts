/** An OpenAI-compatible chat completions upstream: OpenAI, vLLM, llama.cpp, Ollama, most hosted providers. */
import { createHttpUpstream, definePlugin } from '../../../src/plugin-api.js';

const kind = { family: 'chat', authHeaders: (apiKey: string) => ({ authorization: `Bearer ${apiKey}` }) };

export default definePlugin((ctx) => {
  ctx.addUpstreamKind('openai-chat', (name, options) => createHttpUpstream(kind, name, options));
  return { name: 'upstreams/openai-chat' };
});
