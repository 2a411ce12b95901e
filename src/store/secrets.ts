/** Key secrets as every store keeps them: only a SHA-256 hash and the first characters. */
import { createHash, randomBytes } from 'node:crypto';

export function hashSecret(secret: string): string {
  return createHash('sha256').update(secret).digest('hex');
}

/** A new key's secret and what a store keeps of it: an id, the secret's hash and its first characters. */
export function mintKey(): { id: string; secret: string; hash: string; prefix: string } {
  const secret = `sk-${randomBytes(24).toString('base64url')}`;
  return { id: `key_${randomBytes(8).toString('hex')}`, secret, hash: hashSecret(secret), prefix: secret.slice(0, 7) };
}
