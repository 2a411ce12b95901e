/**
 * Console sessions: the admin token is exchanged for a random session id in an HttpOnly,
 * SameSite=Strict cookie, with a CSRF token that every state-changing call must echo in a header.
 * A sign-in also marks the browser as a known device (a signed cookie), so that other people's
 * wrong tokens from the same address (a shared NAT, a proxy) do not lock its operator out.
 * Sessions live in the store's shared state (hashed ids) and expire, so every worker and every
 * instance behind a load balancer knows them.
 */
import { createHash, createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import type { SharedState } from '../store/store.js';

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
  private readonly expected: Buffer;
  /** Signs device cookies; derived from the token, so a new admin token forgets every device. */
  private readonly deviceKey: Buffer;
  private readonly ttlMs: number;
  private readonly tokenDigest: string;

  /** `tokenDigest`: the hex SHA-256 of the admin token (src/admin/token.ts). */
  constructor(
    tokenDigest: string,
    private readonly state: SharedState,
    options: SessionOptions = {},
  ) {
    this.expected = Buffer.from(tokenDigest, 'hex');
    this.deviceKey = digest(`sluice device cookie\n${tokenDigest}`);
    this.tokenDigest = tokenDigest;
    this.ttlMs = options.ttlMs ?? 8 * 60 * 60 * 1000;
  }

  /** Constant-time comparison with the admin token. */
  isAdminToken(candidate: string): boolean {
    return timingSafeEqual(digest(candidate), this.expected);
  }

  /** Starts a session; the caller has checked the admin token. */
  async start(now = Date.now()): Promise<{ id: string; session: Session }> {
    const id = randomBytes(32).toString('base64url');
    const session = { csrfToken: randomBytes(24).toString('base64url'), expiresAt: now + this.ttlMs };
    await this.state.setState(this.stateName(id), JSON.stringify(session), session.expiresAt);
    return { id, session };
  }

  async get(id: string | undefined, now = Date.now()): Promise<Session | undefined> {
    if (!id) return undefined;
    const stored = await this.state.getState(this.stateName(id));
    const session = stored === undefined ? undefined : (JSON.parse(stored) as Session);
    return session && session.expiresAt > now ? session : undefined;
  }

  async logout(id: string | undefined): Promise<void> {
    if (id) await this.state.deleteState(this.stateName(id));
  }

  /**
   * A session's name in the shared state: a hash of its id (reading the store reveals no cookie)
   * and of the admin token, so a new token ends every session made with the old one.
   */
  private stateName(id: string): string {
    return `session:${digest(`${this.tokenDigest}\n${id}`).toString('base64url')}`;
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
