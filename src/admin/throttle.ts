/**
 * Slows down guessing of the admin token. Each client (an address, or a console device that once
 * signed in) may send a few wrong tokens; then it must wait before its next token is even checked,
 * and each further wrong token doubles the wait, up to a cap. Wrong tokens from everywhere are
 * counted too: once they pass a budget per window (many addresses guessing together), every client
 * gets a single wrong token before its wait starts.
 *
 * A right token is never refused because of other clients' failures: a client with no failures of
 * its own always has its token checked. Refusing unchecked tokens from clean clients under
 * pressure would let anyone lock the operator out, and answering "wrong" faster or slower would
 * still tell a botnet which guess was right, so the global budget tightens every client's
 * allowance instead; a botnet then gets one guess per address per (growing) wait.
 */
import { canonicalAddress } from '../trusted-proxies.js';

export interface ThrottleOptions {
  /** Wrong tokens a client may send before its first wait. */
  perClient: number;
  /** Wrong tokens from all clients per window before every client gets only one. */
  globalBudget: number;
  windowMs: number;
  /** The first wait; each later wrong token doubles it. */
  firstWaitMs: number;
  maxWaitMs: number;
  /** A client quiet this long starts afresh. */
  forgetMs: number;
  /** Clients remembered at most (the oldest are forgotten first), so a botnet cannot fill memory. */
  maxClients: number;
}

export const defaultThrottle: ThrottleOptions = {
  perClient: 5,
  globalBudget: 100,
  windowMs: 15 * 60_000,
  firstWaitMs: 30_000,
  maxWaitMs: 15 * 60_000,
  forgetMs: 60 * 60_000,
  maxClients: 100_000,
};

interface Client {
  /** Wrong tokens in the client's current window. */
  failures: number;
  windowStart: number;
  /** Waits imposed so far: the next wait is firstWait × 2^strikes. */
  strikes: number;
  lockedUntil: number;
  lastFailure: number;
}

export class GuessThrottle {
  private readonly options: ThrottleOptions;
  /** In order of last failure, oldest first. */
  private readonly clients = new Map<string, Client>();
  private globalWindowStart = 0;
  private globalCurrent = 0;
  private globalPrevious = 0;

  constructor(options: Partial<ThrottleOptions> = {}) {
    this.options = { ...defaultThrottle, ...options };
  }

  /** Whole seconds `client` must wait before its next token is checked, or 0. */
  waitFor(client: string, now = Date.now()): number {
    const c = this.clients.get(client);
    return c && c.lockedUntil > now ? Math.ceil((c.lockedUntil - now) / 1000) : 0;
  }

  /** Records a wrong token; returns the wait it started, in seconds, or 0. */
  failed(client: string, now = Date.now()): number {
    const { perClient, windowMs, firstWaitMs, maxWaitMs } = this.options;
    this.forgetStale(now);
    this.countGlobal(now);
    const c = this.clients.get(client) ?? { failures: 0, windowStart: now, strikes: 0, lockedUntil: 0, lastFailure: now };
    if (now - c.windowStart >= windowMs) Object.assign(c, { failures: 0, windowStart: now });
    c.failures++;
    c.lastFailure = now;
    this.clients.delete(client); // re-inserted last: the map stays ordered by last failure
    this.clients.set(client, c);
    while (this.clients.size > this.options.maxClients) this.clients.delete(this.clients.keys().next().value!);

    const allowance = c.strikes > 0 || this.underPressure(now) ? 1 : perClient;
    if (c.failures < allowance) return 0;
    const wait = Math.min(firstWaitMs * 2 ** c.strikes, maxWaitMs);
    Object.assign(c, { failures: 0, windowStart: now, strikes: c.strikes + 1, lockedUntil: now + wait });
    return Math.ceil(wait / 1000);
  }

  /** Wrong tokens from all clients in the last window have passed the global budget. */
  underPressure(now = Date.now()): boolean {
    this.roll(now);
    // A sliding window, estimated from the current and the previous fixed window.
    const elapsed = (now - this.globalWindowStart) / this.options.windowMs;
    return this.globalPrevious * (1 - elapsed) + this.globalCurrent >= this.options.globalBudget;
  }

  private countGlobal(now: number): void {
    this.roll(now);
    this.globalCurrent++;
  }

  private roll(now: number): void {
    const { windowMs } = this.options;
    const windows = Math.floor((now - this.globalWindowStart) / windowMs);
    if (windows < 1) return;
    this.globalPrevious = windows === 1 ? this.globalCurrent : 0;
    this.globalCurrent = 0;
    this.globalWindowStart += windows * windowMs;
  }

  private forgetStale(now: number): void {
    for (const [key, c] of this.clients) {
      if (now - c.lastFailure < this.options.forgetMs) break;
      this.clients.delete(key);
    }
  }
}

/**
 * The throttle key of an address. An IPv6 client usually holds a whole /64, so its addresses
 * share one key; otherwise each of them would be a fresh client.
 */
export function addressKey(address: string): string {
  const canonical = canonicalAddress(address);
  if (!canonical) return address;
  if (!canonical.includes(':')) return canonical;
  const [head = '', tail] = canonical.split('::');
  const groups = head ? head.split(':') : [];
  const tailGroups = tail ? tail.split(':') : [];
  if (tail !== undefined) groups.push(...Array<string>(8 - groups.length - tailGroups.length).fill('0'), ...tailGroups);
  return `${groups.slice(0, 4).join(':')}::/64`;
}
