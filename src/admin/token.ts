/**
 * The admin token: from config or the environment, else generated once. A generated token is
 * written to the data dir (0600) and its SHA-256 to the store, so every instance sharing the store
 * accepts it; an instance that finds only the digest (a shared store, a fresh data dir) checks
 * tokens against it without ever knowing the token.
 */
import { createHash, randomBytes } from 'node:crypto';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { SharedState } from '../store/store.js';

const DIGEST_STATE = 'admin-token-sha256';

export interface AdminCredential {
  /** The token itself, when this instance knows it (configured, or in its data dir). */
  token?: string;
  /** Hex SHA-256 of the token: what requests are checked against. */
  digest: string;
  /** Where it came from, for the start banner. */
  source: 'configured' | 'generated' | 'data-dir' | 'shared-store';
}

export const tokenDigest = (token: string) => createHash('sha256').update(token).digest('hex');

/**
 * `shared`: other instances use the store (PostgreSQL). A store in the data dir (SQLite) is not:
 * there a deleted token file means "make a new token", as it always has.
 */
export async function resolveAdminToken(dataDir: string, configured: string | undefined, state: SharedState, shared: boolean): Promise<AdminCredential> {
  if (configured) return { token: configured, digest: tokenDigest(configured), source: 'configured' };
  const file = join(dataDir, 'admin-token');
  if (existsSync(file)) {
    const token = readFileSync(file, 'utf8').trim();
    const digest = tokenDigest(token);
    // A store that has none yet (an upgrade, or a new shared store) learns it.
    if (!(await state.setState(DIGEST_STATE, digest, null, { onlyIfAbsent: shared })) && (await state.getState(DIGEST_STATE)) !== digest) {
      // Two tokens would each work on some instances: refuse rather than guess which one is meant.
      throw new Error(
        `the admin token in ${file} is not the one the shared store knows (another instance made that one): ` +
          'remove the file to use the shared token, or set adminToken (SLUICE_ADMIN_TOKEN) on every instance',
      );
    }
    return { token, digest, source: 'data-dir' };
  }
  const stored = shared ? await state.getState(DIGEST_STATE) : undefined;
  if (stored) return { digest: stored, source: 'shared-store' };
  const token = `sluice-admin-${randomBytes(24).toString('base64url')}`;
  // Instances starting together on one shared store: the first to store its digest wins.
  if (!(await state.setState(DIGEST_STATE, tokenDigest(token), null, { onlyIfAbsent: shared }))) {
    const winner = await state.getState(DIGEST_STATE);
    if (!winner) throw new Error('the shared store lost the admin token it was given at start: start again');
    return { digest: winner, source: 'shared-store' };
  }
  writeFileSync(file, token + '\n', { mode: 0o600, flag: 'wx' });
  return { token, digest: tokenDigest(token), source: 'generated' };
}
