/**
 * Console sessions: the admin token is exchanged for a random session id in an HttpOnly,
 * SameSite=Strict cookie, with a CSRF token that every state-changing call must echo in a header.
 * Wrong tokens are rate-limited per client address. Sessions live in memory and expire.
 */
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';

export const SESSION_COOKIE = 'sluice_session';

interface Session {
  csrfToken: string;
  expiresAt: number;
}

interface Attempts {
  failures: number;
  windowStart: number;
  lockedUntil: number;
}

export interface SessionOptions {
  ttlMs?: number;
  /** Wrong tokens allowed per address and window before a lockout. */
  maxFailures?: number;
  windowMs?: number;
  lockoutMs?: number;
}

const digest = (s: string) => createHash('sha256').update(s).digest();

export class Sessions {
  private readonly sessions = new Map<string, Session>();
  private readonly attempts = new Map<string, Attempts>();
  private readonly expected: Buffer;
  private readonly ttlMs: number;
  private readonly maxFailures: number;
  private readonly windowMs: number;
  private readonly lockoutMs: number;

  constructor(adminToken: string, options: SessionOptions = {}) {
    this.expected = digest(adminToken);
    this.ttlMs = options.ttlMs ?? 8 * 60 * 60 * 1000;
    this.maxFailures = options.maxFailures ?? 5;
    this.windowMs = options.windowMs ?? 60_000;
    this.lockoutMs = options.lockoutMs ?? 60_000;
  }

  /** Constant-time comparison with the admin token. */
  isAdminToken(candidate: string): boolean {
    return timingSafeEqual(digest(candidate), this.expected);
  }

  /** Seconds the address must wait before trying again, or 0. */
  lockedFor(address: string, now = Date.now()): number {
    const a = this.attempts.get(address);
    return a && a.lockedUntil > now ? Math.ceil((a.lockedUntil - now) / 1000) : 0;
  }

  /** Exchanges the admin token for a session; undefined when the token is wrong. */
  login(address: string, token: string, now = Date.now()): { id: string; session: Session } | undefined {
    if (!this.isAdminToken(token)) {
      const a = this.attempts.get(address) ?? { failures: 0, windowStart: now, lockedUntil: 0 };
      if (now - a.windowStart > this.windowMs) Object.assign(a, { failures: 0, windowStart: now });
      if (++a.failures >= this.maxFailures) Object.assign(a, { failures: 0, windowStart: now, lockedUntil: now + this.lockoutMs });
      this.attempts.set(address, a);
      return undefined;
    }
    this.attempts.delete(address);
    this.sweep(now);
    const id = randomBytes(32).toString('base64url');
    const session = { csrfToken: randomBytes(24).toString('base64url'), expiresAt: now + this.ttlMs };
    this.sessions.set(id, session);
    return { id, session };
  }

  get(id: string | undefined, now = Date.now()): Session | undefined {
    if (!id) return undefined;
    const session = this.sessions.get(id);
    if (session && session.expiresAt <= now) {
      this.sessions.delete(id);
      return undefined;
    }
    return session;
  }

  logout(id: string | undefined): void {
    if (id) this.sessions.delete(id);
  }

  private sweep(now: number): void {
    for (const [id, s] of this.sessions) if (s.expiresAt <= now) this.sessions.delete(id);
    for (const [address, a] of this.attempts) if (a.lockedUntil <= now && now - a.windowStart > this.windowMs) this.attempts.delete(address);
  }
}

/** The value of one cookie in a Cookie header. */
export function cookieValue(header: string | undefined, name: string): string | undefined {
  if (!header) return undefined;
  for (const part of header.split(';')) {
    const eq = part.indexOf('=');
    if (eq > 0 && part.slice(0, eq).trim() === name) return part.slice(eq + 1).trim();
  }
  return undefined;
}
