/**
 * One Exchange per request: everything a plugin may need to know about it, gathered in one place.
 * Headers are copied when the request arrives because uWS frees its request object afterwards.
 */
import { randomBytes } from 'node:crypto';
import type * as canonical from './canonical.js';
import type { ChannelConfig, ModelConfig } from './config/types.js';
import type { ClientFamily, Endpoint, ExchangeView, Outcome, Principal, Stage, Upstream, UpstreamCallRecord } from './contracts.js';
import type { GatewayError } from './errors.js';
import type { StateKey } from './state-key.js';
import { traceOf, type TraceContext } from './trace.js';
import type { Usage } from './usage.js';

let counter = 0;
const idPrefix = randomBytes(4).toString('hex');
/** Every exchange's body until one is read: shared, as an empty Buffer cannot change (a new one per exchange was half of the constructor's 0.35 µs). */
const NO_BODY = Buffer.alloc(0);

export class Exchange implements ExchangeView {
  readonly id = `${idPrefix}${(++counter).toString(36).padStart(6, '0')}`;
  /** process.hrtime.bigint() at arrival. */
  readonly startedAt = process.hrtime.bigint();
  readonly createdAt = Date.now();
  /** Its slot among the pipeline's exchanges in flight (src/live-set.ts); -1 when not there. */
  liveSlot = -1;

  body: Buffer = NO_BODY;
  /** The parsed client request, in the family's own shape: the family that decoded it reads it with its own type. */
  request: unknown = {};
  modelId = '';
  model: ModelConfig | undefined;
  stream = false;
  principal: Principal | undefined;
  /** Models the caller may see, for listing endpoints. */
  catalog: ModelConfig[] = [];
  upstream: Upstream | undefined;
  /** The model's channel of the upstream call under way (or the last one made). */
  channel: ChannelConfig | undefined;
  /** Upstream calls made so far: more than one after a failover. */
  attempts = 0;
  /** Each upstream call, in order, with its timing and how it ended (the tracing plugin's client spans). */
  readonly calls: UpstreamCallRecord[] = [];

  status = 0;
  /** Milliseconds from arrival to the first response byte written. */
  ttfbMs: number | undefined;
  usage: Usage | undefined;
  /** What `usage` cost at the model's prices, set before the done phase; undefined without prices. */
  cost: number | undefined;
  outcome: Outcome = 'finished';
  /** The status the usage records and metrics report: a client that left before any answer is a 499. */
  get reportedStatus(): number {
    return this.status || (this.outcome === 'aborted' ? 499 : 0);
  }
  error: GatewayError | undefined;
  stage: Stage = 'accepted';
  /** Set when the client went away; nothing may be written after that. */
  aborted = false;
  /** Extra headers for the client's response (the limits' `x-ratelimit-*`), set before it starts. */
  responseHeaders: Record<string, string> | undefined;
  /** The plugin that answered in place of an upstream (a LocalAnswer), if one did. */
  answeredBy: string | undefined;
  /** The complete canonical answer, kept when a plugin asked for it (keepAnswer). */
  answer: canonical.Response | undefined;
  /** Up to how many characters the relay keeps `answer`; undefined: it keeps none. */
  keptAnswerLimit: number | undefined;

  /** What to stop when the exchange is cut short: the body read, the upstream call. */
  private readonly cancelers: (() => void)[] = [];
  private parsedQuery: URLSearchParams | undefined;
  private traceContext: TraceContext | undefined;
  private finishReasonsFound: readonly canonical.FinishReason[] | undefined;
  private findFinishReasons: (() => readonly canonical.FinishReason[] | undefined) | undefined;
  private readonly state = new Map<StateKey<unknown>, unknown>();

  constructor(
    /** The family the client speaks (chosen by the endpoint it called). */
    readonly clientFamily: ClientFamily,
    readonly endpoint: Endpoint,
    readonly method: string,
    readonly path: string,
    readonly query: string,
    readonly headers: Record<string, string>,
    readonly params: string[],
  ) {}

  get family(): string {
    return this.clientFamily.name;
  }

  /** Milliseconds since arrival. */
  elapsedMs(): number {
    return Number(process.hrtime.bigint() - this.startedAt) / 1e6;
  }

  queryParam(name: string): string | undefined {
    this.parsedQuery ??= new URLSearchParams(this.query);
    return this.parsedQuery.get(name) ?? undefined;
  }

  /** The W3C trace this exchange belongs to (src/trace.ts): the client's `traceparent`, or a new trace. */
  get trace(): TraceContext {
    return (this.traceContext ??= traceOf(this.headers));
  }

  get<T>(key: StateKey<T>): T | undefined {
    return this.state.get(key) as T | undefined;
  }

  set<T>(key: StateKey<T>, value: T): void {
    this.state.set(key, value);
  }

  /** Set when the done phase starts: nothing more may happen to this exchange. */
  over = false;

  /**
   * Why the model stopped, in canonical terms, once the answer said; undefined before, or when it
   * never did. Worked out when first read (see `answeredBecause`).
   */
  get finishReasons(): readonly canonical.FinishReason[] | undefined {
    if (this.findFinishReasons) {
      const find = this.findFinishReasons;
      this.findFinishReasons = undefined;
      this.finishReasonsFound = find();
    }
    return this.finishReasonsFound;
  }

  /**
   * Records why the answer ended, or how to find out: a passthrough answer is not parsed on its
   * way, so its reasons are read from its bytes only if a plugin asks (the tracing plugin does).
   */
  answeredBecause(reasons: readonly canonical.FinishReason[] | (() => readonly canonical.FinishReason[] | undefined)): void {
    if (typeof reasons === 'function') this.findFinishReasons = reasons;
    else {
      this.findFinishReasons = undefined;
      this.finishReasonsFound = reasons;
    }
  }

  /** Registers what to stop if the exchange is cut short; runs at once if it already was. */
  onCancel(cancel: () => void): void {
    if (this.over) cancel();
    else this.cancelers.push(cancel);
  }

  keepAnswer(maxChars: number): void {
    this.keptAnswerLimit = maxChars;
  }

  /** Stops whatever the exchange has started (the pipeline calls this once, when cutting it short). */
  cancel(): void {
    for (const cancel of this.cancelers.splice(0)) cancel();
  }

  // How an exchange ended is written here and nowhere else: `outcome`, `error` and `aborted`.

  /** It failed with `err`. An exchange already cut short (aborted, stalled, shutdown) keeps that outcome. */
  failedWith(err: GatewayError): void {
    this.error = err;
    if (this.outcome === 'finished') this.outcome = 'error';
  }

  /** It was cut short: the client went away or stopped reading, or the gateway is stopping. */
  cutShort(outcome: Exclude<Outcome, 'finished' | 'error'>): void {
    if (outcome !== 'shutdown') this.aborted = true;
    this.outcome = outcome;
  }
}

/** Plugins see every public member of the exchange but the pipeline's own: `cancel`, how it ended, why the answer did, its slot in flight (a member left out of ExchangeView fails here). */
type Shown<Unseen extends never> = Unseen;
type AllShown = Shown<Exclude<keyof Exchange, keyof ExchangeView | 'cancel' | 'failedWith' | 'cutShort' | 'keptAnswerLimit' | 'answeredBecause' | 'liveSlot'>>;
