/**
 * What each upstream's config says about retrying and circuit breaking (`upstreams.X.retry`,
 * `upstreams.X.breaker`), with the defaults. The keys are validated with the rest of the config
 * (src/config/schema.ts); here they only get their defaults. The config's types name these
 * policies, so this module takes an upstream's settings as they are and imports nothing of the config.
 */

export interface RetryPolicy {
  /** Upstream calls per request, the first one included, when this upstream's call failed. */
  attempts: number;
  /** Base of the exponential backoff between calls: backoffMs · 2^(n−1), with ±50 % jitter. */
  backoffMs: number;
  /** A Retry-After up to this long is waited for; a longer one moves on to the next channel. */
  maxRetryAfterSeconds: number;
  /**
   * A 429's Retry-After rests the channel (no exchange calls it) for that long, up to this; 0 turns
   * cool-downs off. The bound keeps a wrong or huge Retry-After from taking a channel away for hours.
   */
  maxCoolDownSeconds: number;
}

export interface BreakerPolicy {
  /** Consecutive failures that open the breaker. */
  failures: number;
  /** Share of failed calls within the window that opens it (once the window holds minRequests). */
  errorRate: number;
  windowSeconds: number;
  minRequests: number;
  /** How long an open breaker refuses calls before it lets one probe through. */
  coolDownSeconds: number;
}

export const defaultRetry: RetryPolicy = { attempts: 3, backoffMs: 100, maxRetryAfterSeconds: 5, maxCoolDownSeconds: 300 };
export const defaultBreaker: BreakerPolicy = { failures: 5, errorRate: 0.5, windowSeconds: 60, minRequests: 20, coolDownSeconds: 30 };

export function retryPolicy(config: { retry?: Partial<RetryPolicy> }): RetryPolicy {
  return { ...defaultRetry, ...config.retry };
}

export function breakerPolicy(config: { breaker?: Partial<BreakerPolicy> }): BreakerPolicy {
  return { ...defaultBreaker, ...config.breaker };
}
