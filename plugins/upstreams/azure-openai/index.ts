/**
 * Azure OpenAI: OpenAI chat completions behind a deployment path and an `api-version` query,
 * `POST {baseUrl}/openai/deployments/{deployment}/chat/completions?api-version=…`, with the key in
 * `api-key`. The deployment is the model's upstream name (`upstreamModel`). It speaks the chat
 * dialect, so passthrough, translation and usage work as for any chat upstream.
 *
 *   upstreams:
 *     azure: { kind: azure-openai, baseUrl: https://RESOURCE.openai.azure.com, apiKey: ${AZURE_OPENAI_API_KEY} }
 *   models:
 *     - { id: gpt-4o, upstream: azure, upstreamModel: my-gpt-4o-deployment }
 */
import { createHttpUpstream, definePlugin, type UpstreamRequest } from '../../../src/plugin-api.js';

/** The newest generally available data-plane version when this was written; `apiVersion` overrides it. */
export const DEFAULT_API_VERSION = '2024-10-21';

function apiVersionOption(name: string, value: unknown): string {
  if (value === undefined) return DEFAULT_API_VERSION;
  if (typeof value === 'string' && /^\d{4}-\d{2}-\d{2}(-preview)?$/.test(value)) return value;
  throw new Error(`upstreams.${name}.apiVersion: must be an Azure OpenAI API version such as ${DEFAULT_API_VERSION}`);
}

export default definePlugin((ctx) => {
  ctx.addUpstreamKind('azure-openai', (name, options) => {
    const query = `api-version=${apiVersionOption(name, options.apiVersion)}`;
    const target = (req: UpstreamRequest) => {
      const [path, search] = req.path.split('?', 2);
      return `/openai/deployments/${encodeURIComponent(req.model!)}${path}?${search ? `${search}&` : ''}${query}`;
    };
    return createHttpUpstream({ family: 'chat', authHeaders: (apiKey) => ({ 'api-key': apiKey }), target }, name, options);
  });
  return { name: 'upstreams/azure-openai' };
});
