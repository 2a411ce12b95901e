/**
 * One exchange's upstream calls: which channel goes first (lower priority first, by weight within
 * a priority, skipping channels whose breaker is open; a conversation's own channel first when
 * affinity knows it), and, when a call fails before anything reached the client, whether and when
 * another channel is tried. Each call's result goes to its channel's breaker, exactly once.
 */
import type { Logger } from 'pino';
import type { ModelConfig } from '../config/types.js';
import type { UpstreamCall } from '../contracts.js';
import { GatewayError } from '../errors.js';
import { StateKey } from '../state-key.js';
import type { Exchange } from '../exchange.js';
import { rendezvous, type AffinityPins, type ConversationKey } from './affinity.js';
import type { Channel } from './table.js';

/** A channel the breaker let through, and when the call may start. */
interface Attempt {
  channel: Channel;
  probe: boolean;
  at: number;
}

/** Set while an exchange waits between a failed call and the next one. */
export const betweenCalls = new StateKey<boolean>('between upstream calls');

/** A conversation's key and the pins it may have, for prompt-cache affinity. */
export interface Affinity {
  key: ConversationKey;
  pins: AffinityPins;
}

export class Failover {
  private readonly order: Channel[];
  /** The conversation's first-ranked channel, when affinity ranks them. */
  private readonly firstRanked: Channel | undefined;
  // The three below are made when first needed: most exchanges make one call and fail none.
  /** Channels called so far (a model has a few: a list is searched faster than a set is made). */
  private readonly tried: Channel[] = [];
  /** Channels that asked for a short wait (Retry-After): called once more when it is over. */
  private resting: Map<Channel, number> | undefined;
  /** Channels already given their one more call. */
  private rested: Set<Channel> | undefined;
  /** The call under way, or the next one while its backoff runs; its breaker ticket is held. */
  private current: Attempt | undefined;
  private call: UpstreamCall | undefined;
  private timer: NodeJS.Timeout | undefined;
  private retries = 0;

  constructor(
    private readonly ex: Exchange,
    channels: Channel[],
    /** Makes one upstream call on a channel. */
    private readonly launch: (channel: Channel) => UpstreamCall,
    /** Runs a step of the exchange so that an exception ends it in the family's terms. */
    private readonly guard: (step: () => void) => void,
    private readonly log: Logger,
    private readonly affinity?: Affinity,
  ) {
    const strategy = channels[0]?.model.strategy ?? 'weighted';
    if (!affinity || channels.length < 2) {
      this.order = inOrder(channels, strategy);
      return;
    }
    this.order = inOrder(channels, strategy, affinity.key.seed);
    // Weighted: every turn ranks the channels alike, and only a conversation served elsewhere needs
    // a pin. By latency or load the ranking changes from turn to turn: every conversation is pinned
    // where it was first served.
    this.firstRanked = strategy === 'weighted' ? this.order[0] : undefined;
    // A conversation pinned to another channel after its own failed goes there first, within the
    // best priority: when a better-priority channel is back, the conversation goes back to it.
    const pinned = affinity.pins.channel(affinity.key.id, Date.now());
    const at = pinned === undefined ? -1 : this.order.findIndex((c) => c.coolDownKey === pinned);
    if (at > 0 && this.order[at]!.config.priority === this.order[0]!.config.priority) this.order.unshift(...this.order.splice(at, 1));
  }

  /**
   * Makes the first call. When no channel may be called it throws, without calling any: a 429
   * when one of them is cooling down after an upstream's 429 (the upstream is limiting this model:
   * a client's rate-limit handling waits and tries again), else a 503 (every breaker is open).
   * Either way its Retry-After says when the first of them may be called again.
   */
  begin(): void {
    const now = Date.now();
    const first = this.take(now);
    if (!first) {
      let at = Infinity;
      let cooling = false;
      for (const c of this.order) {
        const until = c.coolingUntil(now);
        if (until) cooling = true;
        at = Math.min(at, Math.max(until, c.breaker.nextCallAt(now)));
      }
      const seconds = Math.max(1, Math.ceil((at - now) / 1000));
      this.ex.upstream = undefined;
      if (cooling) {
        throw new GatewayError(
          'upstream_rate_limited',
          `Every upstream channel of model \`${this.ex.model!.id}\` is rate limited by its upstream; please try again in ${seconds}s.`,
          null,
          undefined,
          'rate_limit_exceeded',
          seconds,
        );
      }
      throw new GatewayError(
        'upstream_unavailable',
        `Every upstream channel of model \`${this.ex.model!.id}\` is failing (circuit open); the next try is in ${seconds} s.`,
        null,
        undefined,
        undefined,
        seconds,
      );
    }
    this.start(first);
  }

  /** The call's channel answered (a stream ended, a complete answer came, or the client's own mistake). */
  succeeded(): void {
    const attempt = this.settle(undefined);
    if (!attempt) return;
    const now = Date.now();
    attempt.channel.breaker.succeeded(now, attempt.probe);
    if (this.affinity) this.affinity.pins.served(this.affinity.key.id, attempt.channel.coolDownKey, attempt.channel === this.firstRanked, now);
  }

  /**
   * The call failed. With `retry` (nothing has reached the client yet) another channel is tried
   * after a backoff, if the policy of the channel that failed allows one and a channel is left:
   * returns true when it will be, and the exchange goes on. `rateLimited`: the upstream answered
   * 429, so its Retry-After also cools the channel down for every exchange.
   */
  failed(err: GatewayError, retryAfterMs: number | undefined, retry: boolean, rateLimited = false): boolean {
    const attempt = this.settle(err.message);
    if (!attempt) return false;
    const { channel, probe } = attempt;
    const now = Date.now();
    // A full connection pool is the gateway's own limit, not the channel's health.
    if (err.code === 'upstream_busy') channel.breaker.released(probe);
    else channel.breaker.failed(now, probe, err.message);
    if (rateLimited && retryAfterMs !== undefined) channel.coolDown(retryAfterMs, now);
    if (!retry || this.ex.attempts >= channel.retry.attempts) return false;
    if (retryAfterMs !== undefined && retryAfterMs <= channel.retry.maxRetryAfterSeconds * 1000 && !this.rested?.has(channel)) {
      (this.resting ??= new Map()).set(channel, now + retryAfterMs);
      (this.rested ??= new Set()).add(channel);
    }
    const next = this.take(now);
    if (!next) return false;
    const backoff = channel.retry.backoffMs * 2 ** this.retries++ * (0.5 + Math.random());
    const delayMs = Math.round(Math.max(backoff, next.at - now));
    this.log.warn(
      { req: this.ex.id, model: this.ex.model!.id, channel: channel.config.name, attempt: this.ex.attempts, err: err.message, next: next.channel.config.name, delayMs },
      'upstream call failed before the answer started; trying again',
    );
    this.current = next;
    // Between calls nothing is at the upstream: an exchange cut short now used nothing.
    this.ex.set(betweenCalls, true);
    this.timer = setTimeout(() => {
      this.timer = undefined;
      this.guard(() => this.start(next));
    }, delayMs);
    return true;
  }

  /** The exchange was cut short: no further call, the one under way is aborted, its ticket returned. */
  cancel(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
    this.call?.abort();
    const attempt = this.settle('the exchange was cut short');
    if (attempt) attempt.channel.breaker.released(attempt.probe);
  }

  private start(attempt: Attempt): void {
    this.ex.set(betweenCalls, false);
    this.current = attempt;
    const { upstream, upstreamModel } = attempt.channel.config;
    attempt.channel.inFlight++;
    this.ex.calls.push({ upstream, upstreamModel, startedAt: Date.now(), endedAt: undefined, error: undefined, sentMark: performance.now(), waitMs: undefined, spanId: undefined });
    this.call = this.launch(attempt.channel);
  }

  /**
   * Ends the current attempt's hold on its breaker ticket, and its record with `error` (undefined:
   * it answered); undefined when it was already settled (or, after a backoff was cut short, never made).
   */
  private settle(error: string | undefined): Attempt | undefined {
    const attempt = this.current;
    this.current = undefined;
    this.call = undefined;
    const record = this.ex.calls.at(-1);
    if (attempt && record && record.endedAt === undefined) {
      record.endedAt = Date.now();
      record.error = error;
      record.waitMs ??= performance.now() - record.sentMark;
      attempt.channel.inFlight--;
      if (error === undefined) attempt.channel.observeLatency(record.waitMs);
    }
    return attempt;
  }

  /**
   * The next channel to call: one not tried yet and not cooling down, in order, else one whose
   * short Retry-After (to this exchange) ends first.
   */
  private take(now: number): Attempt | undefined {
    for (const channel of this.order) {
      if (this.tried.includes(channel) || channel.coolingUntil(now)) continue;
      const ticket = channel.breaker.admit(now);
      if (!ticket) continue;
      this.tried.push(channel);
      return { channel, probe: ticket.probe, at: now };
    }
    if (!this.resting) return undefined;
    for (const [channel, at] of [...this.resting].sort((a, b) => a[1] - b[1])) {
      const ticket = channel.breaker.admit(now);
      if (!ticket) continue;
      this.resting.delete(channel);
      return { channel, probe: ticket.probe, at };
    }
    return undefined;
  }
}

/**
 * Channels by priority, and within a priority in a random order weighted by `weight` (each
 * channel's key is an exponential draw with its weight as the rate: the smallest key is channel
 * i with probability wᵢ / Σw, and so on down the list). With a conversation's seed the draw is
 * fixed by the conversation and the channel (weighted rendezvous hashing): the same order for
 * every turn, in every thread and instance, and still each channel's weight share over many
 * conversations. `least-latency` and `least-busy` put the channel with the lowest latency average
 * or the fewest calls under way first, the weighted draw breaking ties.
 */
function inOrder(channels: Channel[], strategy: ModelConfig['strategy'], conversation?: number): Channel[] {
  if (channels.length < 2) return channels;
  const uniform = conversation === undefined ? () => 1 - Math.random() : (c: Channel) => rendezvous(conversation, c.seed);
  // By latency, a channel not yet measured goes first (0), so every channel gets measured; an idle one's average fades.
  const now = Date.now();
  const measure = strategy === 'least-latency' ? (c: Channel) => c.latencyFor(now) : strategy === 'least-busy' ? (c: Channel) => c.inFlight : () => 0;
  return channels
    .map((c) => ({ c, by: measure(c), key: -Math.log(uniform(c)) / c.config.weight }))
    .sort((a, b) => a.c.config.priority - b.c.config.priority || a.by - b.by || a.key - b.key)
    .map((k) => k.c);
}

/** A Retry-After header (seconds or an HTTP date) in milliseconds from now; undefined when absent or unreadable. */
export function retryAfterMs(value: string | string[] | undefined, now = Date.now()): number | undefined {
  const text = Array.isArray(value) ? value[0] : value;
  if (!text) return undefined;
  const trimmed = text.trim();
  if (/^\d+(\.\d+)?$/.test(trimmed)) return Number(trimmed) * 1000;
  const date = Date.parse(trimmed);
  return Number.isFinite(date) ? Math.max(0, date - now) : undefined;
}
