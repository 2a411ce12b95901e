/**
 * Cross-site protection for state-changing admin calls. Browsers send `Origin` on every POST,
 * PATCH and DELETE, so a call from another site shows itself; scripts send none and prove
 * themselves with the Bearer token, which a browser never adds on its own.
 */
import type { ForwardedView } from '../trusted-proxies.js';
import { AdminError } from './service.js';

/** `scheme://host[:port]` as browsers write it (lowercase, no default port), or undefined. */
export function normalizeOrigin(text: string): string | undefined {
  try {
    const url = new URL(text);
    return url.protocol === 'http:' || url.protocol === 'https:' ? url.origin : undefined;
  } catch {
    return undefined;
  }
}

/**
 * Throws 403 unless the call may change state: its `Origin`, when present, is the request's own
 * origin or an allowed one; a call that rides on the session cookie must carry an `Origin`.
 */
export function checkOrigin(origin: string | undefined, usesCookie: boolean, via: ForwardedView, allowed: ReadonlySet<string>): void {
  if (origin === undefined) {
    if (usesCookie) throw new AdminError(403, 'origin_required', 'a state-changing call with the session cookie must carry an Origin header');
    return;
  }
  const own = via.host ? normalizeOrigin(`${via.https ? 'https' : 'http'}://${via.host}`) : undefined;
  const given = normalizeOrigin(origin);
  if (given && (given === own || allowed.has(given))) return;
  throw new AdminError(
    403,
    'origin_not_allowed',
    `Origin ${JSON.stringify(origin)} may not change state here; allowed: ${[own, ...allowed].filter(Boolean).join(', ') || 'none'} (admin.allowedOrigins adds more)`,
  );
}
