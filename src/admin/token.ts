/** The admin token: from config or the environment, else generated once and kept in the data dir. */
import { randomBytes } from 'node:crypto';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

export function resolveAdminToken(dataDir: string, configured: string | undefined): { token: string; generated: boolean } {
  if (configured) return { token: configured, generated: false };
  const file = join(dataDir, 'admin-token');
  if (existsSync(file)) return { token: readFileSync(file, 'utf8').trim(), generated: false };
  const token = `sluice-admin-${randomBytes(24).toString('base64url')}`;
  writeFileSync(file, token + '\n', { mode: 0o600, flag: 'wx' });
  return { token, generated: true };
}
