/**
 * Console sessions: the admin token is exchanged for a random session id in an HttpOnly,
 * SameSite=Strict cookie, with a CSRF token that every state-changing call must echo in a header.
 * A sign-in also marks the browser as a known device (a signed cookie), so that other people's
 * wrong tokens from the same address (a shared NAT, a proxy) do not lock its operator out.
 * Sessions live in memory and expire.
 */
import { createHash, createHmac, randomBytes, timingSafeEqual } from 'node:crypto';

export const SESSION_COOKIE = 'sluice_session';
export const DEVICE_COOKIE = 'sluice_device';

interface Session {
  csrfToken: string;
  expiresAt: number;
}

export interface SessionOptions {
  ttlMs?: number;
}

const digest = (s: string) => createHash('sha256').update(s).digest();

export class Sessions {
  private readonly sessions = new Map<string, Session>();
  private readonly expected: Buffer;
  /** Signs device cookies; derived from the token, so a new admin token forgets every device. */
  private readonly deviceKey: Buffer;
  private readonly ttlMs: number;

  constructor(adminToken: string, options: SessionOptions = {}) {
    this.expected = digest(adminToken);
    this.deviceKey = digest(`sluice device cookie\n${adminToken}`);
    this.ttlMs = options.ttlMs ?? 8 * 60 * 60 * 1000;
  }

  /** Constant-time comparison with the admin token. */
  isAdminToken(candidate: string): boolean {
    return timingSafeEqual(digest(candidate), this.expected);
  }

  /** Starts a session; the caller has checked the admin token. */
  start(now = Date.now()): { id: string; session: Session } {
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

  /** A new device cookie value: a random id and its signature. */
  newDevice(): string {
    const id = randomBytes(16).toString('base64url');
    return `${id}.${this.sign(id)}`;
  }

  /** The device id of a cookie value this gateway signed, else undefined. */
  device(cookie: string | undefined): string | undefined {
    const [id, signature, extra] = cookie?.split('.') ?? [];
    if (!id || !signature || extra !== undefined) return undefined;
    const expected = Buffer.from(this.sign(id));
    const given = Buffer.from(signature);
    return given.length === expected.length && timingSafeEqual(given, expected) ? id : undefined;
  }

  private sign(id: string): string {
    return createHmac('sha256', this.deviceKey).update(id).digest('base64url');
  }

  private sweep(now: number): void {
    for (const [id, s] of this.sessions) if (s.expiresAt <= now) this.sessions.delete(id);
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
