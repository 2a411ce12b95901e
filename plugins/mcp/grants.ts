/**
 * Who may use what through `/mcp`: the caller's Sluice key (Bearer), and its group's `mcpTools`
 * grants, `server/tool` or `server/*`. Nothing is granted by default.
 */
import { StoreUnavailableError, type CachedStore, type Exchange } from '../../src/plugin-api.js';

export type Principal = NonNullable<Exchange['principal']>;

/** Why a caller is refused, with the HTTP status to answer. */
export interface Refusal {
  status: number;
  message: string;
}

/** The key in `Authorization: Bearer KEY`, checked as the auth plugin checks a model call's. */
export async function authenticate(store: CachedStore, authorization: string | undefined): Promise<Principal | Refusal> {
  const secret = authorization?.startsWith('Bearer ') ? authorization.slice(7).trim() : undefined;
  if (!secret) return { status: 401, message: "You didn't provide an API key. Send your Sluice key as `Authorization: Bearer YOUR_KEY`." };
  let found;
  try {
    found = await store.keyBySecret(secret);
  } catch (err) {
    if (!(err instanceof StoreUnavailableError)) throw err;
    return { status: 503, message: 'The API key cannot be checked right now: the key store is unavailable. Try again shortly.' };
  }
  if (!found) return { status: 401, message: 'Incorrect API key provided.' };
  const { key, group } = found;
  if (key.disabled) return { status: 401, message: `The API key ${key.id} is disabled.` };
  if (key.expiresAt !== null && key.expiresAt <= Date.now()) return { status: 401, message: `The API key ${key.id} expired at ${new Date(key.expiresAt).toISOString()}.` };
  if (!group) return { status: 401, message: `The API key ${key.id} belongs to no group.` };
  return { keyId: key.id, keyName: key.name, group, key };
}

export const isRefusal = (x: Principal | Refusal): x is Refusal => 'status' in x;

/** Whether a group's grants name the tool, or every tool of its server. */
export function grantsTool(mcpTools: readonly string[], server: string, tool: string): boolean {
  return mcpTools.includes(`${server}/*`) || mcpTools.includes(`${server}/${tool}`);
}

/** Resources and prompts are the server's as a whole: only `server/*` grants them. */
export function grantsServer(mcpTools: readonly string[], server: string): boolean {
  return mcpTools.includes(`${server}/*`);
}
