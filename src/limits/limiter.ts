/**
 * The Limiter: every limit decision goes through this interface, so one process can keep its
 * counters in memory (limiter-memory.ts) and many can share them in a store such as Redis, without
 * the callers changing. docs/architecture.md explains the contract.
 *
 * One `acquire` decides for all the scopes an exchange falls under (its key, its group, its model)
 * at once and all-or-nothing: it takes a concurrency slot, takes a request from each sliding
 * one-minute window, and reserves the estimated tokens and the worst-case spend, or takes nothing
 * and says why. A budget admits a request only when its own reservation fits in what is left
 * (`admitsSpend`), so what is spent never passes the budget while usage stays within reservations.
 * One `settle` per granted lease, when the exchange ends however it ends, replaces the
 * reservations with what was actually used and frees the slot.
 */
import type { BudgetPeriod } from '../budget.js';
import { StateKey } from '../state-key.js';
import type { Limits, Store } from '../store/store.js';

/** A key's, group's or model's limits as the config and the admin API accept them. */
export const limitsSchema = {
  type: 'object',
  additionalProperties: false,
  properties: { rpm: { type: 'integer', minimum: 1 }, tpm: { type: 'integer', minimum: 1 }, concurrency: { type: 'integer', minimum: 1 } },
} as const;

/** One scope an exchange is counted in: `key:ID`, `group:NAME`, `model:ID`. */
export interface LimitScope {
  id: string;
  limits?: Limits;
  /** A spending limit for the current period: spend from `since` on counts. */
  budget?: BudgetPeriod;
}

/** What an exchange asks for at admission, and later what it used. */
export interface Amounts {
  tokens: number;
  cost: number;
}

/** Where a limiter learns a scope's spend in a period it has not counted itself (the usage records). */
export type SpendSource = (scope: string, since: number) => Promise<number>;

/** One rate window after a decision: its size, what is left, and how long until it is whole again. */
export interface RateWindow {
  limit: number;
  remaining: number;
  resetMs: number;
}

/** A scope's request and token windows after a decision, for the rate-limit headers. */
export interface WindowStatus {
  scope: string;
  requests?: RateWindow;
  tokens?: RateWindow;
}

/** The tightest request window and the tightest token window of all an exchange's scopes: what its headers report. */
export type RateLimitWindows = Omit<WindowStatus, 'scope'>;

/** `unavailable`: a shared limiter's store did not answer and its fail mode is closed. */
export type Refusal = 'concurrency' | 'requests' | 'tokens' | 'too_large' | 'budget' | 'unavailable';

/** Set on an exchange the limiter refused, with why: what the done phase reports (metrics). */
export const limitRefusal = new StateKey<Refusal>('limit refusal');

export type Decision<L> =
  | { granted: true; lease: L; windows: WindowStatus[] }
  | {
      granted: false;
      scope: string;
      reason: Refusal;
      limit: number;
      retryAfterMs: number;
      windows: WindowStatus[];
      /** A `budget` refusal: the scope's spend in the period and what requests in flight hold reserved. */
      budget?: { spent: number; reserved: number };
    };

export interface Limiter<L = unknown> {
  /** All or nothing over `scopes`. Answers at once when it can (the memory limiter always can, once a budget's spend is known). */
  acquire(scopes: LimitScope[], ask: Amounts, now?: number): Decision<L> | Promise<Decision<L>>;
  /** Exactly once per granted lease: reconciles the reservation with `used` and frees the slot. */
  settle(lease: L, used: Amounts, now?: number): void | Promise<void>;
  close?(): Promise<void>;
  /**
   * Present on a limiter shared beyond this thread (the worker threads' RemoteLimiter, Redis): how
   * channel cool-downs (src/channels/cooldown.ts) reach the other threads and instances it serves.
   */
  readonly coolDowns?: CoolDownBus;
  /**
   * Present on a limiter shared by several instances (Redis): how prompt-cache affinity pins
   * (src/channels/affinity.ts) reach the other instances and threads on it.
   */
  readonly pins?: PinBus;
}

/**
 * Channel cool-downs shared by everyone a limiter serves: an upstream's 429 with a Retry-After,
 * seen by one thread or instance, rests that channel in all of them. Nothing here is on a
 * request's path: publishing happens on a 429, hearing when another published.
 */
export interface CoolDownBus {
  /** Channel `key` rests for `ms` from now: tell the others (fire and forget). */
  publish(key: string, ms: number): void;
  /** `heard` is called with what the others publish, and on (re)connecting with what still rests. */
  subscribe(heard: (key: string, ms: number) => void): void;
}

/**
 * Prompt-cache affinity pins shared by everyone on a limiter: a conversation pinned to a channel
 * by one instance (after a failover) is served there by all of them. Each keeps every pin it hears
 * in its own map, so choosing a channel never waits on the limiter: publishing happens when a pin
 * is made, moved, renewed (at most once per half TTL) or dropped, hearing when another published.
 */
export interface PinBus {
  /** Conversation `key` is pinned to `channel` for `ttlMs` from now, or (`channel` undefined) no longer pinned. Fire and forget. */
  publish(key: string, channel: string | undefined, ttlMs: number): void;
  /** `heard` is called with what the others publish, and on (re)connecting with every pin alive. */
  subscribe(heard: (key: string, channel: string | undefined, ttlMs: number) => void): void;
}

export const WINDOW_MS = 60_000;

/** Costs compared in billionths (what costOf rounds to), so sums of binary fractions do not decide. */
const nano = (x: number) => Math.floor(x * 1e9 + 0.5);

/**
 * The budget rule, the same in every limiter (limiter-redis.ts repeats it in Lua, in the same
 * order of additions): a request is admitted only while the period is not used up and its own
 * reserved cost fits in what spend and other reservations left. A zero cost (an unpriced model)
 * passes until the period is used up.
 */
export function admitsSpend(amount: number, spent: number, reserved: number, cost: number): boolean {
  return nano(spent + reserved) < nano(amount) && nano(spent + reserved + cost) <= nano(amount);
}

/** How long a budget refusal waits: a second when the request would fit once requests in flight settle, else until the period ends. */
export function budgetRetryMs(amount: number, spent: number, reserved: number, cost: number, periodLeftMs: number): number {
  return nano(reserved) > 0 && nano(spent + cost) <= nano(amount) && nano(spent) < nano(amount) ? 1000 : periodLeftMs;
}

/** A scope's spend since a time, from the usage records (the truth a limiter starts from). */
export function spendInUsage(store: Pick<Store, 'queryUsage'>): SpendSource {
  return async (scope, since) => {
    const colon = scope.indexOf(':');
    const [kind, name] = [scope.slice(0, colon), scope.slice(colon + 1)];
    const filter = kind === 'key' ? { key: name } : kind === 'group' ? { group: name } : kind === 'model' ? { model: name } : undefined;
    if (!filter) throw new Error(`no spend is recorded for scope ${scope}`);
    return (await store.queryUsage({ ...filter, since, limit: 1 })).totals.cost;
  };
}
