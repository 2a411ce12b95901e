/**
 * An upstream kind for an OpenAI-compatible provider that scopes every call to an account in the
 * path, `POST {baseUrl}/accounts/{account}/ai/v1/chat/completions`, with the key as a Bearer token
 * and the account also named in a header. It speaks the chat dialect, so streaming, translation to
 * the other client families, usage and failover work as for any chat upstream.
 *
 *   upstreams:
 *     provider: { kind: account-openai, baseUrl: https://api.example.com, account: acme, apiKey: ${PROVIDER_API_KEY} }
 */
import { createHttpUpstream, definePlugin, type UpstreamRequest } from 'sluice/plugin-api';

function accountOption(name: string, value: unknown): string {
  if (typeof value === 'string' && /^[A-Za-z0-9_-]{1,64}$/.test(value)) return value;
  // Thrown at start (and on a reload, which then keeps the running config): the message is what the operator sees.
  throw new Error(`upstreams.${name}.account: set it to your provider account's id (letters, digits, _ and -), for example account: acme`);
}

export default definePlugin((ctx) => {
  ctx.addUpstreamKind('account-openai', (name, options) => {
    const account = accountOption(name, options.account);
    // `headers` are sent on every call; `authHeaders` only when the entry has an `apiKey`.
    const withAccount = { ...options, headers: { ...(options.headers as Record<string, string> | undefined), 'x-account': account } };
    const target = (req: UpstreamRequest) => `/accounts/${account}/ai/v1${req.path}`;
    return createHttpUpstream({ family: 'chat', authHeaders: (apiKey) => ({ authorization: `Bearer ${apiKey}` }), target }, name, withAccount);
  });
  return { name: 'account-openai' };
});
