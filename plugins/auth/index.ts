/**
 * Auth: who is calling. The family's codec finds the credential; the store knows the key. A cached
 * key answers at once; only a lookup the cache cannot answer makes the phase wait.
 */
import { definePlugin, type Exchange, GatewayError, type KeyLookup, StoreUnavailableError } from '../../src/plugin-api.js';

/** Enough of a secret to recognise it in an error, never enough to use it. */
function mask(secret: string): string {
  return secret.length > 12 ? `${secret.slice(0, 5)}…${secret.slice(-4)}` : '…';
}

/** Where each family's codec looks for the key (its `credential`), in the words of its clients' docs. */
const howToSendKey: Record<string, string> = {
  chat: 'Send it as `Authorization: Bearer YOUR_KEY`.',
  responses: 'Send it as `Authorization: Bearer YOUR_KEY`.',
  gemini: 'Send it as `x-goog-api-key: YOUR_KEY` (`x-svc-api-key: YOUR_KEY` and a `?key=YOUR_KEY` query parameter work too).',
  messages: 'Send it as `x-api-key: YOUR_KEY` (or `Authorization: Bearer YOUR_KEY`).',
};

export default definePlugin(({ store }) => ({
  name: 'auth',
  authenticates: true,
  request(ex) {
    const secret = ex.clientFamily.credential(ex);
    if (secret === undefined) {
      return new GatewayError('missing_api_key', `You didn't provide an API key. ${howToSendKey[ex.family] ?? 'Send it in the header your API client uses for its key.'}`);
    }
    if (secret === '') return new GatewayError('invalid_api_key', 'The API key header is malformed.');
    const found = store.keyBySecret(secret);
    return found instanceof Promise ? found.then((f) => identify(ex, secret, f), unreachable) : identify(ex, secret, found);
  },
}));

/** The database is down and the key was never seen: it cannot be checked, which is not the caller's fault. */
function unreachable(err: unknown): GatewayError {
  if (!(err instanceof StoreUnavailableError)) throw err;
  return new GatewayError('store_unavailable', 'The API key cannot be checked right now: the key store is unavailable. Try again shortly.', null, undefined, undefined, 5);
}

function identify(ex: Exchange, secret: string, found: KeyLookup | undefined): GatewayError | undefined {
  if (!found) return new GatewayError('invalid_api_key', `Incorrect API key provided: ${mask(secret)}.`);
  const { key, group } = found;
  if (key.disabled) return new GatewayError('key_disabled', `The API key ${key.id} is disabled.`);
  // Checked on every request: a cached key must not outlive its expiry.
  if (key.expiresAt !== null && key.expiresAt <= Date.now()) {
    return new GatewayError('key_expired', `The API key ${key.id} expired at ${new Date(key.expiresAt).toISOString()}.`);
  }
  if (!group) return new GatewayError('invalid_api_key', `The API key ${key.id} belongs to no group.`);
  ex.principal = { keyId: key.id, keyName: key.name, group, key };
}
