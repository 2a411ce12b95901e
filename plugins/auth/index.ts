/** Auth: who is calling. The family's codec finds the credential; the store knows the key. */
import { definePlugin } from '../../src/contracts.js';
import { GatewayError } from '../../src/errors.js';

/** Enough of a secret to recognise it in an error, never enough to use it. */
function mask(secret: string): string {
  return secret.length > 12 ? `${secret.slice(0, 5)}…${secret.slice(-4)}` : '…';
}

export default definePlugin(({ store }) => ({
  name: 'auth',
  request(ex) {
    const secret = ex.codec.credential(ex);
    if (secret === undefined) {
      return new GatewayError('missing_api_key', "You didn't provide an API key. Send it in the family's auth header.");
    }
    if (secret === '') return new GatewayError('invalid_api_key', 'The API key header is malformed.');
    const key = store.findKeyBySecret(secret);
    if (!key) return new GatewayError('invalid_api_key', `Incorrect API key provided: ${mask(secret)}.`);
    if (key.disabled) return new GatewayError('key_disabled', `The API key ${key.id} is disabled.`);
    // Checked on every request: a cached key must not outlive its expiry.
    if (key.expiresAt !== null && key.expiresAt <= Date.now()) {
      return new GatewayError('key_expired', `The API key ${key.id} expired at ${new Date(key.expiresAt).toISOString()}.`);
    }
    const group = store.getGroup(key.group);
    if (!group) return new GatewayError('invalid_api_key', `The API key ${key.id} belongs to no group.`);
    ex.principal = { keyId: key.id, keyName: key.name, group };
  },
}));
