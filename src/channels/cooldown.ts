/**
 * Channels resting after an upstream's 429 with a Retry-After: no exchange calls them again until
 * that time has passed (bounded by `retry.maxCoolDownSeconds`). A rest belongs to what the upstream
 * limited, the upstream and the model it was asked for (`coolDownKey`), so every model channel
 * that reaches the same upstream model rests with it.
 *
 * The check is on every route, so it is a lookup in this thread's own map (none at all while
 * nothing rests): no await, no message, no Redis call per request. A 429 is told to the other
 * threads and instances through the limiter's CoolDownBus when it has one (src/limits/limiter.ts), and
 * what they tell is written into the map as it arrives.
 */
import type { CoolDownBus } from '../limits/limiter.js';

/** What the cool-down of a channel calling `upstream` for `upstreamModel` is kept under. */
export const coolDownKey = (upstream: string, upstreamModel: string): string => `${upstream}/${upstreamModel}`;

export class CoolDowns {
  /** Key → when its rest ends (this process's clock, ms); ended ones are dropped when met. */
  private readonly resting = new Map<string, number>();

  constructor(private readonly bus?: CoolDownBus) {
    bus?.subscribe((key, ms) => this.rest(key, ms, Date.now()));
  }

  /** When `key`'s rest ends, or 0 when it is not resting. */
  until(key: string, now: number): number {
    if (this.resting.size === 0) return 0;
    const until = this.resting.get(key);
    if (until === undefined) return 0;
    if (until > now) return until;
    this.resting.delete(key);
    return 0;
  }

  /** `key` answered 429 with a Retry-After of `ms`: it rests here, and everywhere the bus reaches. */
  coolDown(key: string, ms: number, now = Date.now()): void {
    if (!(ms > 0)) return;
    this.rest(key, ms, now);
    this.bus?.publish(key, ms);
  }

  /** The ms left of `key`'s rest, 0 when it is not resting: what GET /admin/upstreams and the metrics show. */
  left(key: string, now = Date.now()): number {
    const until = this.until(key, now);
    return until ? until - now : 0;
  }

  /** A rest only ever grows: a shorter one heard later (a late message) does not cut it short. */
  private rest(key: string, ms: number, now: number): void {
    const until = now + ms;
    if ((this.resting.get(key) ?? 0) < until) this.resting.set(key, until);
  }
}
