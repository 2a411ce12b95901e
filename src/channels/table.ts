/**
 * Every model's channels, ready to call: the upstream, the model as that channel serves it, the
 * upstream's retry policy and the channel's circuit breaker. A table is built from a config; a
 * reload builds a new one from the running one, and channels that did not change keep their
 * breaker (and so their state and counts).
 */
import type { AffinityConfig, ChannelConfig, ModelConfig, UpstreamConfig } from '../config/types.js';
import type { Upstream } from '../contracts.js';
import type { PinBus } from '../limits/limiter.js';
import { defaultAffinity } from '../config/defaults.js';
import { AffinityPins, channelSeed } from './affinity.js';
import { Breaker, type BreakerSnapshot } from './breaker.js';
import { CoolDowns, coolDownKey } from './cooldown.js';
import { breakerPolicy, retryPolicy, type RetryPolicy } from './policy.js';

/** The weight of the newest call in a channel's latency average: about the last ten calls count. */
const LATENCY_WEIGHT = 0.2;
/** How fast an idle channel's latency average fades. */
const LATENCY_HALF_LIFE_MS = 10_000;

export class Channel {
  /** What this channel's cool-down is kept under: its upstream and upstream model. */
  readonly coolDownKey: string;
  /** Its rendezvous hash for prompt-cache affinity: from its upstream and upstream model, so a reload keeps it. */
  readonly seed: number;
  /** Calls under way on it, in this thread (`strategy: least-busy`). */
  inFlight = 0;
  /** Moving average of its calls' wait for an answer, in ms; undefined before its first (`strategy: least-latency`). */
  latencyMs: number | undefined;
  private latencyAt = 0;

  constructor(
    readonly config: ChannelConfig,
    /** The model as this channel serves it: codecs read `upstream` and `upstreamModel` from it. */
    readonly model: ModelConfig,
    readonly upstream: Upstream,
    readonly retry: RetryPolicy,
    readonly breaker: Breaker,
    /** The model, upstream, upstream model and upstream config: what must match to keep the breaker. */
    readonly identity: string,
    private readonly coolDowns: CoolDowns = new CoolDowns(),
  ) {
    this.coolDownKey = coolDownKey(config.upstream, config.upstreamModel);
    this.seed = channelSeed(this.coolDownKey);
  }

  /** A call answered after `ms`: an exponentially weighted average, so a channel that slows down is seen within a few calls. */
  observeLatency(ms: number, now = Date.now()): void {
    this.latencyMs = this.latencyMs === undefined ? ms : this.latencyMs + LATENCY_WEIGHT * (ms - this.latencyMs);
    this.latencyAt = now;
  }

  /**
   * The average as a choice reads it: fading towards 0 while the channel serves nothing (halved
   * every LATENCY_HALF_LIFE_MS), so a channel that was slow once, or measured on a cold
   * connection, is tried again instead of never serving.
   */
  latencyFor(now: number): number {
    if (this.latencyMs === undefined) return 0;
    return this.latencyMs * 0.5 ** ((now - this.latencyAt) / LATENCY_HALF_LIFE_MS);
  }

  /** When the channel's cool-down ends (an upstream's 429 with Retry-After), 0 when it is not cooling down. */
  coolingUntil(now: number): number {
    return this.coolDowns.until(this.coolDownKey, now);
  }

  /** The upstream answered 429 with a Retry-After of `ms`: no exchange calls it for that long (up to the policy's bound). */
  coolDown(ms: number, now: number): void {
    this.coolDowns.coolDown(this.coolDownKey, Math.min(ms, this.retry.maxCoolDownSeconds * 1000), now);
  }
}

/** One upstream and its channels, as GET /admin/upstreams shows them. */
export interface UpstreamReport {
  name: string;
  kind: string;
  family: string;
  channels: ({ model: string; channel: string; priority: number; weight: number; coolingUntil: string | null; latencyMs: number | null; inFlight: number } & BreakerSnapshot)[];
}

export class ChannelTable {
  private readonly byModel = new Map<string, Channel[]>();
  private readonly kinds: Map<string, string>;
  /** Every channel's cool-down; one per gateway (thread), handed from table to table on reload. */
  readonly coolDowns: CoolDowns;
  /** Conversations pinned away from their first-ranked channel; handed on like the cool-downs. */
  readonly affinity: AffinityPins;

  /**
   * `previous` is the table in use when the config is reloaded: its breakers carry over to the
   * channels that are the same in the new config, and its cool-downs and affinity pins to every
   * channel. `affinity` is the config's (on by default); `pinBus` shares the pins of a first
   * table with the other instances (the Redis limiter's).
   */
  constructor(
    models: Iterable<ModelConfig>,
    upstreamConfigs: Record<string, UpstreamConfig>,
    private readonly upstreams: Map<string, Upstream>,
    previous?: ChannelTable,
    coolDowns?: CoolDowns,
    affinity: AffinityConfig = defaultAffinity,
    pinBus?: PinBus,
  ) {
    this.coolDowns = coolDowns ?? previous?.coolDowns ?? new CoolDowns();
    this.affinity = previous?.affinity ?? new AffinityPins(affinity, pinBus);
    this.affinity.configure(affinity);
    const kept = new Map<string, Breaker>();
    for (const channels of previous?.byModel.values() ?? []) for (const c of channels) kept.set(c.identity, c.breaker);
    this.kinds = new Map(Object.entries(upstreamConfigs).map(([name, c]) => [name, c.kind]));
    for (const model of models) {
      const channels = model.channels.map((config) => {
        const upstreamConfig = upstreamConfigs[config.upstream]!;
        const identity = JSON.stringify([model.id, config.upstream, config.upstreamModel, upstreamConfig]);
        const breaker = kept.get(identity) ?? new Breaker(breakerPolicy(upstreamConfig));
        const view: ModelConfig = { ...model, upstream: config.upstream, upstreamModel: config.upstreamModel };
        return new Channel(config, view, upstreams.get(config.upstream)!, retryPolicy(upstreamConfig), breaker, identity, this.coolDowns);
      });
      this.byModel.set(model.id, channels);
    }
  }

  /** A model's channels, by priority. */
  of(modelId: string): Channel[] {
    return this.byModel.get(modelId) ?? [];
  }

  /** Every upstream with the state of each model channel on it. */
  report(now = Date.now()): UpstreamReport[] {
    return [...this.upstreams.values()].map((u) => ({
      name: u.name,
      kind: this.kinds.get(u.name) ?? '',
      family: u.family,
      channels: [...this.byModel.values()].flatMap((channels) =>
        channels
          .filter((c) => c.config.upstream === u.name)
          .map((c) => {
            const cooling = c.coolingUntil(now);
            return {
              model: c.model.id,
              channel: c.config.name,
              priority: c.config.priority,
              weight: c.config.weight,
              coolingUntil: cooling ? new Date(cooling).toISOString() : null,
              latencyMs: c.latencyMs === undefined ? null : Math.round(c.latencyMs * 10) / 10,
              inFlight: c.inFlight,
              ...c.breaker.snapshot(now),
            };
          }),
      ),
    }));
  }
}
