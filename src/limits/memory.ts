/**
 * The in-memory Limiter for one process. Decisions are synchronous (so N simultaneous requests
 * against a limit of M get exactly N − M refusals); only the first request of a budget period
 * waits, once, for the period's spend so far from the usage records.
 *
 * Windows are sliding logs: one entry per admitted request in the last minute, with its tokens,
 * so `rpm` is exact and a reconciled token count replaces its reservation in place.
 */
import { WINDOW_MS, admitsSpend, budgetRetryMs, type Amounts, type Decision, type LimitScope, type Limiter, type Refusal, type SpendSource, type WindowStatus } from './limiter.js';

interface Entry {
  t: number;
  tokens: number;
}

interface Spend {
  since: number;
  spent: number;
  reserved: number;
}

class ScopeState {
  constructor(readonly id: string) {}

  /** Admitted requests of the last minute, oldest first, from `head` on. */
  entries: Entry[] = [];
  head = 0;
  tokens = 0;
  active = 0;
  spend: Spend | undefined;
  /** The spend of a new period being read from the usage records. */
  loading: Promise<void> | undefined;

  prune(now: number): void {
    const cutoff = now - WINDOW_MS;
    while (this.head < this.entries.length && this.entries[this.head]!.t <= cutoff) this.tokens -= this.entries[this.head++]!.tokens;
    if (this.head > 1024 && this.head * 2 > this.entries.length) {
      this.entries = this.entries.slice(this.head);
      this.head = 0;
    }
  }

  get requests(): number {
    return this.entries.length - this.head;
  }

  get idle(): boolean {
    return this.active === 0 && this.requests === 0 && this.spend === undefined && this.loading === undefined;
  }

  /** Milliseconds until the window has room for `tokens` more (or one more request when tokens is 0). */
  waitFor(now: number, excessTokens: number, excessRequests: number): number {
    let freedTokens = 0;
    for (let i = this.head; i < this.entries.length; i++) {
      const e = this.entries[i]!;
      freedTokens += e.tokens;
      if (i - this.head + 1 >= excessRequests && freedTokens >= excessTokens) return Math.max(1, e.t + WINDOW_MS - now);
    }
    return WINDOW_MS;
  }
}

export interface MemoryLease {
  states: ScopeState[];
  /** Per state, its window entry when the scope has a request or token limit. */
  entries: (Entry | undefined)[];
  spends: { spend: Spend; cost: number }[];
  settled: boolean;
}

export class MemoryLimiter implements Limiter<MemoryLease> {
  private readonly scopes = new Map<string, ScopeState>();

  constructor(private readonly spendSource: SpendSource) {}

  acquire(scopes: LimitScope[], ask: Amounts, now = Date.now()): Decision<MemoryLease> | Promise<Decision<MemoryLease>> {
    const states = scopes.map((s) => this.state(s.id));
    // A budget period the limiter has not counted yet: read its spend once, then decide.
    const loads: Promise<void>[] = [];
    scopes.forEach((scope, i) => {
      const state = states[i]!;
      if (!scope.budget || state.spend?.since === scope.budget.since) return;
      state.loading ??= this.loadSpend(scope.id, state, scope.budget.since);
      loads.push(state.loading);
    });
    if (loads.length) return Promise.all(loads).then(() => this.acquire(scopes, ask, Date.now()));
    return this.decide(scopes, states, ask, now);
  }

  private async loadSpend(id: string, state: ScopeState, since: number): Promise<void> {
    try {
      state.spend = { since, spent: await this.spendSource(id, since), reserved: 0 };
    } finally {
      state.loading = undefined;
    }
  }

  private decide(scopes: LimitScope[], states: ScopeState[], ask: Amounts, now: number): Decision<MemoryLease> {
    const windows: WindowStatus[] = [];
    let refusal: Omit<Extract<Decision<MemoryLease>, { granted: false }>, 'windows' | 'granted'> | undefined;
    const refuse = (scope: string, reason: Refusal, limit: number, retryAfterMs: number, budget?: { spent: number; reserved: number }) =>
      (refusal ??= { scope, reason, limit, retryAfterMs, ...(budget && { budget }) });
    scopes.forEach((scope, i) => {
      const state = states[i]!;
      state.prune(now);
      const { rpm, tpm, concurrency } = scope.limits ?? {};
      if (concurrency !== undefined && state.active >= concurrency) refuse(scope.id, 'concurrency', concurrency, 1000);
      if (rpm !== undefined && state.requests >= rpm) refuse(scope.id, 'requests', rpm, state.waitFor(now, 0, state.requests - rpm + 1));
      if (tpm !== undefined) {
        if (ask.tokens > tpm) refuse(scope.id, 'too_large', tpm, WINDOW_MS);
        else if (state.tokens + ask.tokens > tpm) refuse(scope.id, 'tokens', tpm, state.waitFor(now, state.tokens + ask.tokens - tpm, 0));
      }
      const budget = scope.budget;
      if (budget) {
        const { spent, reserved } = state.spend!;
        if (!admitsSpend(budget.amount, spent, reserved, ask.cost)) {
          const retry = budgetRetryMs(budget.amount, spent, reserved, ask.cost, budget.until !== undefined ? budget.until - now : 86_400_000);
          refuse(scope.id, 'budget', budget.amount, retry, { spent, reserved });
        }
      }
    });
    if (refusal) {
      scopes.forEach((scope, i) => windows.push(status(scope, states[i]!, now)));
      return { granted: false, ...refusal, windows };
    }
    const lease: MemoryLease = { states, entries: [], spends: [], settled: false };
    scopes.forEach((scope, i) => {
      const state = states[i]!;
      state.active++;
      let entry: Entry | undefined;
      if (scope.limits?.rpm !== undefined || scope.limits?.tpm !== undefined) {
        entry = { t: now, tokens: ask.tokens };
        state.entries.push(entry);
        state.tokens += ask.tokens;
      }
      lease.entries.push(entry);
      if (scope.budget) {
        state.spend!.reserved += ask.cost;
        lease.spends.push({ spend: state.spend!, cost: ask.cost });
      }
      windows.push(status(scope, state, now));
    });
    return { granted: true, lease, windows };
  }

  settle(lease: MemoryLease, used: Amounts, now = Date.now()): void {
    if (lease.settled) return;
    lease.settled = true;
    lease.states.forEach((state, i) => {
      const entry = lease.entries[i];
      // Only while the entry is still in the window does it count there.
      if (entry && entry.t > now - WINDOW_MS) {
        state.tokens += used.tokens - entry.tokens;
        entry.tokens = used.tokens;
      }
      state.active--;
    });
    for (const { spend, cost } of lease.spends) {
      spend.reserved -= cost;
      spend.spent += used.cost;
    }
    for (const state of lease.states) this.forgetIfIdle(state, now);
  }

  /** What the limiter counts for a scope's budget period, when it has counted it. */
  spend(scope: string, since: number): { spent: number; reserved: number } | undefined {
    const spend = this.scopes.get(scope)?.spend;
    return spend?.since === since ? { spent: spend.spent, reserved: spend.reserved } : undefined;
  }

  private state(id: string): ScopeState {
    let state = this.scopes.get(id);
    if (!state) this.scopes.set(id, (state = new ScopeState(id)));
    return state;
  }

  private forgetIfIdle(state: ScopeState, now: number): void {
    state.prune(now);
    if (state.idle && this.scopes.get(state.id) === state) this.scopes.delete(state.id);
  }
}

function status(scope: LimitScope, state: ScopeState, now: number): WindowStatus {
  const { rpm, tpm } = scope.limits ?? {};
  const oldest = state.requests > 0 ? state.entries[state.head]!.t + WINDOW_MS - now : 0;
  return {
    scope: scope.id,
    ...(rpm !== undefined && { requests: { limit: rpm, remaining: Math.max(0, rpm - state.requests), resetMs: Math.max(0, oldest) } }),
    ...(tpm !== undefined && { tokens: { limit: tpm, remaining: Math.max(0, tpm - state.tokens), resetMs: Math.max(0, oldest) } }),
  };
}
