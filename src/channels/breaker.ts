/**
 * A circuit breaker for one model channel. Closed, it lets every call through and counts
 * failures; it opens after `failures` consecutive failures or when the window's error rate
 * reaches `errorRate` (once it holds `minRequests` calls). Open, it refuses calls until
 * `coolDownSeconds` have passed; then it is half-open and lets one call through, the probe: a
 * success closes it, a failure opens it again for another cool-down.
 */
import type { BreakerPolicy } from './policy.js';

export type BreakerState = 'closed' | 'open' | 'half-open';

/** What GET /admin/upstreams shows of a breaker. */
export interface BreakerSnapshot {
  state: BreakerState;
  consecutiveFailures: number;
  recentRequests: number;
  recentErrors: number;
  lastError: string | null;
  openedAt: string | null;
  nextProbeAt: string | null;
}

export class Breaker {
  private consecutiveFailures = 0;
  /** Set while open (and half-open): when it opened, and when the next probe may go. */
  private openedAt: number | undefined;
  private nextProbeAt = 0;
  /** A half-open breaker's probe is under way: nothing else goes through. */
  private probing = false;
  private lastError: string | null = null;
  private readonly window: CallWindow;

  constructor(readonly policy: BreakerPolicy) {
    this.window = new CallWindow(policy.windowSeconds);
  }

  state(now: number): BreakerState {
    if (this.openedAt === undefined) return 'closed';
    return now < this.nextProbeAt ? 'open' : 'half-open';
  }

  /** Whether a call could go through now (without taking the probe). */
  available(now: number): boolean {
    const state = this.state(now);
    return state === 'closed' || (state === 'half-open' && !this.probing);
  }

  /**
   * Takes a call through the breaker: undefined when refused, else whether the call is the
   * half-open probe (its result decides the state). Every admitted call ends in exactly one of
   * succeeded, failed or released.
   */
  admit(now: number): { probe: boolean } | undefined {
    if (!this.available(now)) return undefined;
    if (this.openedAt === undefined) return { probe: false };
    this.probing = true;
    return { probe: true };
  }

  succeeded(now: number, probe: boolean): void {
    this.window.add(now, false);
    this.consecutiveFailures = 0;
    if (!probe) return;
    // Closed again: the failures that opened it are history.
    this.probing = false;
    this.openedAt = undefined;
    this.window.clear();
  }

  failed(now: number, probe: boolean, error: string): void {
    this.window.add(now, true);
    this.consecutiveFailures++;
    this.lastError = error;
    if (probe) {
      this.probing = false;
      return this.open(now);
    }
    if (this.openedAt !== undefined) return;
    const { requests, errors } = this.window.totals(now);
    const { failures, minRequests, errorRate } = this.policy;
    if (this.consecutiveFailures >= failures || (requests >= minRequests && errors >= errorRate * requests)) this.open(now);
  }

  /** An admitted call ended without telling anything about the channel (the client left). */
  released(probe: boolean): void {
    if (probe) this.probing = false;
  }

  /** When the next call may go through: now when it is closed. */
  nextCallAt(now: number): number {
    return this.openedAt === undefined ? now : Math.max(now, this.nextProbeAt);
  }

  snapshot(now: number): BreakerSnapshot {
    const { requests, errors } = this.window.totals(now);
    const open = this.openedAt !== undefined;
    return {
      state: this.state(now),
      consecutiveFailures: this.consecutiveFailures,
      recentRequests: requests,
      recentErrors: errors,
      lastError: this.lastError,
      openedAt: open ? new Date(this.openedAt!).toISOString() : null,
      nextProbeAt: open ? new Date(this.nextProbeAt).toISOString() : null,
    };
  }

  private open(now: number): void {
    this.openedAt = now;
    this.nextProbeAt = now + this.policy.coolDownSeconds * 1000;
  }
}

/** Calls and failures over the last `seconds`, in one bucket per second. */
class CallWindow {
  private readonly second: Float64Array;
  private readonly requests: Uint32Array;
  private readonly errors: Uint32Array;

  constructor(private readonly seconds: number) {
    this.second = new Float64Array(seconds).fill(-1);
    this.requests = new Uint32Array(seconds);
    this.errors = new Uint32Array(seconds);
  }

  add(now: number, error: boolean): void {
    const second = Math.floor(now / 1000);
    const i = second % this.seconds;
    if (this.second[i] !== second) {
      this.second[i] = second;
      this.requests[i] = 0;
      this.errors[i] = 0;
    }
    this.requests[i]!++;
    if (error) this.errors[i]!++;
  }

  totals(now: number): { requests: number; errors: number } {
    const oldest = Math.floor(now / 1000) - this.seconds;
    let requests = 0;
    let errors = 0;
    for (let i = 0; i < this.seconds; i++) {
      if (this.second[i]! <= oldest) continue;
      requests += this.requests[i]!;
      errors += this.errors[i]!;
    }
    return { requests, errors };
  }

  clear(): void {
    this.second.fill(-1);
  }
}
