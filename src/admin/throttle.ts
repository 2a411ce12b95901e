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
import type { SharedState } from '../store/store.js';
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

export interface ThrottleClient {
  /** Wrong tokens in the client's current window. */
  failures: number;
  windowStart: number;
  /** Waits imposed so far: the next wait is firstWait × 2^strikes. */
  strikes: number;
  lockedUntil: number;
  lastFailure: number;
}

/** Wrong tokens from everyone, in fixed windows (a sliding one is estimated from two). */
export interface ThrottleWindows {
  start: number;
  current: number;
  previous: number;
}

/** Where the throttle keeps its counts: this process's memory, or the store every instance shares. */
export interface ThrottleStorage {
  client(key: string): Promise<ThrottleClient | undefined>;
  /** `forgetAt`: when the client may be forgotten (it has been quiet long enough). */
  saveClient(key: string, client: ThrottleClient, forgetAt: number): Promise<void>;
  windows(): Promise<ThrottleWindows | undefined>;
  saveWindows(windows: ThrottleWindows, forgetAt: number): Promise<void>;
}

/** Counts in memory, at most `maxClients` of them (the least recently failed are forgotten first). */
export class MemoryThrottleStorage implements ThrottleStorage {
  /** In order of last failure, oldest first. */
  private readonly clients = new Map<string, { client: ThrottleClient; forgetAt: number }>();
  private global: ThrottleWindows | undefined;

  constructor(private readonly maxClients = defaultThrottle.maxClients) {}

  async client(key: string): Promise<ThrottleClient | undefined> {
    const held = this.clients.get(key);
    return held && { ...held.client };
  }

  async saveClient(key: string, client: ThrottleClient, forgetAt: number): Promise<void> {
    this.clients.delete(key); // re-inserted last: the map stays ordered by last failure
    this.clients.set(key, { client, forgetAt });
    // Oldest first: drop the quiet ones, and any beyond the bound.
    for (const [k, held] of this.clients) {
      if (this.clients.size <= this.maxClients && held.forgetAt > client.lastFailure) break;
      this.clients.delete(k);
    }
  }

  async windows(): Promise<ThrottleWindows | undefined> {
    return this.global && { ...this.global };
  }

  async saveWindows(windows: ThrottleWindows): Promise<void> {
    this.global = windows;
  }
}

/**
 * Counts in the store's shared state, so a guesser spreading tries over instances behind a load
 * balancer meets one throttle. Updates are read-modify-write, one at a time per client within an
 * instance (`GuessThrottle.serially`): tries racing on several instances may be counted once, which
 * loosens the throttle by at most the number of instances.
 */
export class SharedThrottleStorage implements ThrottleStorage {
  constructor(private readonly state: SharedState) {}

  async client(key: string): Promise<ThrottleClient | undefined> {
    const stored = await this.state.getState(`throttle:${key}`);
    return stored === undefined ? undefined : (JSON.parse(stored) as ThrottleClient);
  }

  async saveClient(key: string, client: ThrottleClient, forgetAt: number): Promise<void> {
    await this.state.setState(`throttle:${key}`, JSON.stringify(client), forgetAt);
  }

  async windows(): Promise<ThrottleWindows | undefined> {
    const stored = await this.state.getState('throttle-windows');
    return stored === undefined ? undefined : (JSON.parse(stored) as ThrottleWindows);
  }

  async saveWindows(windows: ThrottleWindows, forgetAt: number): Promise<void> {
    await this.state.setState('throttle-windows', JSON.stringify(windows), forgetAt);
  }
}

export class GuessThrottle {
  private readonly options: ThrottleOptions;
  private readonly storage: ThrottleStorage;
  /** Per client, the check under way: checks of one client run one after another (see `serially`). */
  private readonly queues = new Map<string, Promise<unknown>>();

  constructor(options: Partial<ThrottleOptions> = {}, storage?: ThrottleStorage) {
    this.options = { ...defaultThrottle, ...options };
    this.storage = storage ?? new MemoryThrottleStorage(this.options.maxClients);
  }

  /**
   * Runs `check` after the client's earlier checks have ended. A check reads the client's count,
   * compares and writes it back; without this, parallel guesses from one client would all read the
   * count before any of them wrote it, and all be checked.
   */
  serially<T>(client: string, check: () => Promise<T>): Promise<T> {
    const next = (this.queues.get(client) ?? Promise.resolve()).then(check, check);
    this.queues.set(client, next);
    const forget = () => void (this.queues.get(client) === next && this.queues.delete(client));
    next.then(forget, forget);
    return next;
  }

  /** Whole seconds `client` must wait before its next token is checked, or 0. */
  async waitFor(client: string, now = Date.now()): Promise<number> {
    const c = await this.storage.client(client);
    return c && c.lockedUntil > now ? Math.ceil((c.lockedUntil - now) / 1000) : 0;
  }

  /** Records a wrong token; returns the wait it started, in seconds, or 0. */
  async failed(client: string, now = Date.now()): Promise<number> {
    const { perClient, windowMs, firstWaitMs, maxWaitMs, forgetMs } = this.options;
    const windows = this.roll(await this.storage.windows(), now);
    windows.current++;
    await this.storage.saveWindows(windows, now + 2 * windowMs);
    const stored = await this.storage.client(client);
    const c = stored && now - stored.lastFailure < forgetMs ? stored : { failures: 0, windowStart: now, strikes: 0, lockedUntil: 0, lastFailure: now };
    if (now - c.windowStart >= windowMs) Object.assign(c, { failures: 0, windowStart: now });
    c.failures++;
    c.lastFailure = now;

    const allowance = c.strikes > 0 || this.pressing(windows, now) ? 1 : perClient;
    let wait = 0;
    if (c.failures >= allowance) {
      wait = Math.min(firstWaitMs * 2 ** c.strikes, maxWaitMs);
      Object.assign(c, { failures: 0, windowStart: now, strikes: c.strikes + 1, lockedUntil: now + wait });
    }
    await this.storage.saveClient(client, c, Math.max(now + forgetMs, c.lockedUntil));
    return Math.ceil(wait / 1000);
  }

  /** Wrong tokens from all clients in the last window have passed the global budget. */
  async underPressure(now = Date.now()): Promise<boolean> {
    return this.pressing(this.roll(await this.storage.windows(), now), now);
  }

  private pressing(windows: ThrottleWindows, now: number): boolean {
    // A sliding window, estimated from the current and the previous fixed window.
    const elapsed = (now - windows.start) / this.options.windowMs;
    return windows.previous * (1 - elapsed) + windows.current >= this.options.globalBudget;
  }

  private roll(stored: ThrottleWindows | undefined, now: number): ThrottleWindows {
    const { windowMs } = this.options;
    const w = stored ?? { start: now - (now % windowMs), current: 0, previous: 0 };
    const windows = Math.floor((now - w.start) / windowMs);
    if (windows < 1) return w;
    return { start: w.start + windows * windowMs, current: 0, previous: windows === 1 ? w.current : 0 };
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
