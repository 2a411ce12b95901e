/**
 * A native Anthropic Messages upstream: `POST {baseUrl}/messages` (baseUrl such as
 * `https://api.anthropic.com/v1`), key in `x-api-key`. Anthropic requires `anthropic-version`: the
 * client's own goes through when it sent one (passthrough), else `anthropicVersion` from config.
 */
import { createHttpUpstream, definePlugin, type Upstream } from '../../../src/plugin-api.js';

export const DEFAULT_ANTHROPIC_VERSION = '2023-06-01';

const kind = { family: 'messages', authHeaders: (apiKey: string) => ({ 'x-api-key': apiKey }) };

export function anthropicUpstream(name: string, options: Record<string, unknown>): Upstream {
  const { anthropicVersion = DEFAULT_ANTHROPIC_VERSION, ...http } = options;
  if (typeof anthropicVersion !== 'string' || anthropicVersion === '') {
    throw new Error(`upstreams.${name}.anthropicVersion: must be a version date such as ${DEFAULT_ANTHROPIC_VERSION}`);
  }
  const upstream = createHttpUpstream(kind, name, http);
  return {
    ...upstream,
    send(req, sink) {
      if (req.headers['anthropic-version']) return upstream.send(req, sink);
      return upstream.send({ ...req, headers: { ...req.headers, 'anthropic-version': anthropicVersion } }, sink);
    },
  };
}

export default definePlugin((ctx) => {
  ctx.addUpstreamKind('anthropic', anthropicUpstream);
  return { name: 'upstreams/anthropic' };
});
