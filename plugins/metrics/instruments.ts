/**
 * What /metrics reports, in one prom-client registry per thread. Exchanges are recorded once, in
 * the done phase (a handful of additions, labelled with values taken from the exchange); the
 * gateway's state (in-flight exchanges, breakers, pools, the usage journal) is read when scraped.
 *
 * Names follow the OpenTelemetry GenAI semantic conventions mapped to Prometheus (dots become
 * underscores, seconds get their unit suffix): `gen_ai.client.token.usage`,
 * `gen_ai.server.request.duration`, `gen_ai.server.time_to_first_token`, with the attributes
 * `gen_ai.operation.name`, `gen_ai.request.model`, `gen_ai.token.type` and `error.type`. What the
 * conventions do not cover is `sluice_*`.
 *
 * Every label value comes from config or a closed set (families, endpoint kinds, error codes,
 * outcomes, statuses): a model the client named that does not exist is `unknown`, and no request
 * id, key or client string ever becomes a label.
 */
import { Counter, Gauge, Registry, type Metric } from 'prom-client';
import { type Exchange, type GatewayView, limitRefusal, type UpstreamStats } from '../../src/plugin-api.js';

/** The conventions' advised buckets (seconds; tokens). */
const DURATION_BUCKETS = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92];
const TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10];
const TOKEN_BUCKETS = [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864];

/** Every model exchange is a chat operation in the conventions' terms, whatever its family. */
const OPERATION = 'chat';

const MODEL_LABELS = ['gen_ai_operation_name', 'gen_ai_request_model', 'sluice_family', 'sluice_upstream', 'sluice_channel'];

const BREAKER_STATES = { closed: 0, 'half-open': 1, open: 2 } as const;

type Labels = Record<string, string | number>;

/**
 * One metric recorded per exchange, by label values given in `labelNames` order. prom-client's own
 * `inc` and `observe` check and hash every label object (most of a microsecond each, several per
 * exchange); here a series is found through one map per label, keyed by values that are mostly
 * the config's own strings (their hashes are cached), and prom-client reads it only when scraped,
 * through `get()` in the shape its registry formats and its aggregator adds up.
 */
abstract class Recorded<S> {
  readonly aggregator = 'sum';
  private readonly root = new Map<string, unknown>();
  private readonly series: { labels: Labels; state: S }[] = [];

  constructor(
    readonly name: string,
    readonly help: string,
    private readonly labelNames: readonly string[],
    registry: Registry,
  ) {
    // A registry reads its metrics through name and get() alone.
    registry.registerMetric(this as unknown as Metric);
  }

  protected abstract fresh(): S;

  protected at(values: readonly string[]): S {
    let node = this.root;
    const last = values.length - 1;
    for (let i = 0; i < last; i++) {
      let next = node.get(values[i]!) as Map<string, unknown> | undefined;
      if (!next) node.set(values[i]!, (next = new Map()));
      node = next;
    }
    let state = node.get(values[last]!) as S | undefined;
    if (state === undefined) {
      const labels: Labels = {};
      this.labelNames.forEach((name, i) => (labels[name] = values[i]!));
      node.set(values[last]!, (state = this.fresh()));
      this.series.push({ labels, state });
    }
    return state;
  }

  protected each(): { labels: Labels; state: S }[] {
    return this.series;
  }
}

class RecordedCounter extends Recorded<{ value: number }> {
  readonly type = 'counter';

  protected fresh() {
    return { value: 0 };
  }

  inc(values: readonly string[], by = 1): void {
    this.at(values).value += by;
  }

  get() {
    return { name: this.name, help: this.help, type: this.type, aggregator: this.aggregator, values: this.each().map(({ labels, state }) => ({ labels, value: state.value })) };
  }
}

class RecordedHistogram extends Recorded<{ counts: number[]; sum: number; count: number }> {
  readonly type = 'histogram';

  constructor(name: string, help: string, labelNames: readonly string[], private readonly bounds: number[], registry: Registry) {
    super(name, help, labelNames, registry);
  }

  /** One count per bucket, the last for what is above every bound. */
  protected fresh() {
    return { counts: new Array<number>(this.bounds.length + 1).fill(0), sum: 0, count: 0 };
  }

  observe(values: readonly string[], value: number): void {
    const series = this.at(values);
    let i = 0;
    while (i < this.bounds.length && value > this.bounds[i]!) i++;
    series.counts[i]!++;
    series.sum += value;
    series.count++;
  }

  get() {
    const values: { labels: Labels; value: number; metricName: string }[] = [];
    for (const { labels, state } of this.each()) {
      let below = 0;
      this.bounds.forEach((le, i) => {
        below += state.counts[i]!;
        values.push({ labels: { ...labels, le }, value: below, metricName: `${this.name}_bucket` });
      });
      values.push({ labels: { ...labels, le: '+Inf' }, value: state.count, metricName: `${this.name}_bucket` });
      values.push({ labels, value: state.sum, metricName: `${this.name}_sum` });
      values.push({ labels, value: state.count, metricName: `${this.name}_count` });
    }
    return { name: this.name, help: this.help, type: this.type, aggregator: this.aggregator, values };
  }
}

export class Instruments {
  readonly registry = new Registry();

  private readonly requests = new RecordedCounter(
    'sluice_requests_total',
    'Exchanges that ended (each WebSocket turn is one), by family, endpoint, model, upstream, channel, status and outcome.',
    ['sluice_family', 'sluice_endpoint', 'gen_ai_request_model', 'sluice_upstream', 'sluice_channel', 'http_status', 'sluice_outcome', 'error_type'],
    this.registry,
  );
  private readonly duration = new RecordedHistogram(
    'gen_ai_server_request_duration_seconds',
    'Model requests from arrival to their last byte (gen_ai.server.request.duration).',
    [...MODEL_LABELS, 'sluice_stream', 'error_type'],
    DURATION_BUCKETS,
    this.registry,
  );
  private readonly timeToFirstToken = new RecordedHistogram(
    'gen_ai_server_time_to_first_token_seconds',
    'Streamed model requests from arrival to the first byte of their answer (gen_ai.server.time_to_first_token).',
    MODEL_LABELS,
    TTFT_BUCKETS,
    this.registry,
  );
  private readonly tokenUsage = new RecordedHistogram(
    'gen_ai_client_token_usage',
    'Tokens per model request, input (cache reads and writes included) or output (reasoning included) (gen_ai.client.token.usage).',
    [...MODEL_LABELS, 'gen_ai_token_type'],
    TOKEN_BUCKETS,
    this.registry,
  );
  private readonly tokens = new RecordedCounter(
    'sluice_tokens_total',
    'Tokens used: input and output as the usage records count them; cached_input and cache_write are parts of input, reasoning is part of output.',
    [...MODEL_LABELS, 'type'],
    this.registry,
  );
  private readonly rejections = new RecordedCounter(
    'sluice_limiter_rejections_total',
    'Exchanges the limiter refused, by reason (concurrency, requests, tokens, too_large, budget, unavailable).',
    ['reason'],
    this.registry,
  );

  /** Plugins' figures (GatewayView.addFigure) already in the registry. */
  private figuresSeen = 0;

  /** Adds the figures plugins reported since the last scrape (a plugin may load after this one). */
  addFigures(): void {
    const figures = this.view.figures();
    for (; this.figuresSeen < figures.length; this.figuresSeen++) {
      const figure = figures[this.figuresSeen]!;
      const options = { name: figure.name, help: figure.help, registers: [this.registry], aggregator: figure.aggregate ?? ('sum' as const) };
      if (figure.type === 'counter') {
        new Counter({
          ...options,
          collect() {
            this.reset();
            this.inc(figure.read());
          },
        });
      } else {
        new Gauge({
          ...options,
          collect() {
            this.set(figure.read());
          },
        });
      }
    }
  }

  constructor(private readonly view: GatewayView) {
    const registers = [this.registry];
    new Gauge({
      name: 'sluice_in_flight',
      help: 'Exchanges accepted and not yet done.',
      registers,
      aggregator: 'sum',
      collect() {
        this.set(view.inFlight());
      },
    });
    new Gauge({
      name: 'sluice_usage_journal_pending',
      help: 'Usage records journaled and not yet written to the store.',
      registers,
      aggregator: 'sum',
      collect() {
        this.set(view.usageQueued());
      },
    });
    new Gauge({
      name: 'sluice_breaker_state',
      help: "Each model channel's circuit breaker: 0 closed, 1 half-open, 2 open (with worker threads, the worst thread's).",
      labelNames: ['sluice_upstream', 'sluice_channel', 'gen_ai_request_model'],
      registers,
      aggregator: 'max',
      collect() {
        this.reset();
        for (const u of view.upstreams()) {
          for (const c of u.channels) this.set({ sluice_upstream: u.name, sluice_channel: c.channel, gen_ai_request_model: c.model }, BREAKER_STATES[c.state]);
        }
      },
    });
    new Gauge({
      name: 'sluice_channel_cooldown_seconds',
      help: "Seconds left of each model channel's cool-down after its upstream answered 429 with Retry-After, 0 when none (with worker threads, the shortest any thread holds: what every thread honours).",
      labelNames: ['sluice_upstream', 'sluice_channel', 'gen_ai_request_model'],
      registers,
      aggregator: 'min',
      collect() {
        this.reset();
        for (const u of view.upstreams()) {
          for (const c of u.channels) this.set({ sluice_upstream: u.name, sluice_channel: c.channel, gen_ai_request_model: c.model }, c.coolDownSeconds);
        }
      },
    });
    const pool = (name: string, help: string, value: (s: UpstreamStats) => number) =>
      new Gauge({
        name,
        help,
        labelNames: ['sluice_upstream'],
        registers,
        aggregator: 'sum',
        collect() {
          this.reset();
          for (const u of view.upstreams()) if (u.pool) this.set({ sluice_upstream: u.name }, value(u.pool));
        },
      });
    pool('sluice_upstream_connections', 'Connections an upstream pool may open.', (s) => s.connections);
    pool('sluice_upstream_connections_busy', 'Upstream calls holding a pool connection.', (s) => s.busy);
    pool('sluice_upstream_queue_length', 'Upstream calls waiting for a pool connection.', (s) => s.queued);
    const total = (name: string, help: string, value: (s: UpstreamStats) => number) =>
      new Counter({
        name,
        help,
        labelNames: ['sluice_upstream'],
        registers,
        collect() {
          this.reset();
          for (const u of view.upstreams()) if (u.pool) this.inc({ sluice_upstream: u.name }, value(u.pool));
        },
      });
    total('sluice_upstream_queue_waits_total', 'Upstream calls that waited for a pool connection and got one.', (s) => s.waits);
    total('sluice_upstream_queue_wait_seconds_total', 'Time those calls waited, added up.', (s) => s.waitSeconds);
    total('sluice_upstream_busy_total', 'Upstream calls refused with upstream_busy (queue full, or no connection in time).', (s) => s.refused);
  }

  // Label values are written into these for each exchange: `at` reads them and keeps none (a new
  // series copies them), so recording allocates nothing.
  private readonly requestValues: string[] = new Array(8).fill('');
  private readonly durationValues: string[] = new Array(7).fill('');
  private readonly modelValues: string[] = new Array(5).fill('');
  private readonly tokenValues: string[] = new Array(6).fill('');

  /** One ended exchange: a handful of additions, no label objects. */
  record(ex: Exchange): void {
    // A name the client sent that matches no configured model is not a label value.
    const model = ex.model?.id ?? (ex.modelId ? 'unknown' : '');
    const family = ex.family;
    const upstream = ex.upstream?.name ?? '';
    const channel = ex.channel?.name ?? '';
    const errorType = ex.error?.code ?? '';
    const request = this.requestValues;
    request[0] = family;
    request[1] = ex.endpoint.kind;
    request[2] = model;
    request[3] = upstream;
    request[4] = channel;
    request[5] = String(ex.reportedStatus);
    request[6] = ex.outcome;
    request[7] = errorType;
    this.requests.inc(request);
    const refusal = ex.get(limitRefusal);
    if (refusal) this.rejections.inc([refusal]);
    // The GenAI metrics cover model requests whose model is known.
    if (ex.endpoint.kind !== 'generate' || !ex.model) return;
    const labels = this.modelValues;
    labels[0] = OPERATION;
    labels[1] = model;
    labels[2] = family;
    labels[3] = upstream;
    labels[4] = channel;
    const duration = this.durationValues;
    for (let i = 0; i < 5; i++) duration[i] = labels[i]!;
    duration[5] = ex.stream ? 'true' : 'false';
    duration[6] = errorType;
    this.duration.observe(duration, ex.elapsedMs() / 1000);
    if (ex.stream && ex.status === 200 && ex.ttfbMs !== undefined) this.timeToFirstToken.observe(labels, ex.ttfbMs / 1000);
    const usage = ex.usage;
    if (!usage) return;
    const typed = this.tokenValues;
    for (let i = 0; i < 5; i++) typed[i] = labels[i]!;
    typed[5] = 'input';
    this.tokenUsage.observe(typed, usage.inputTokens);
    this.tokens.inc(typed, usage.inputTokens);
    typed[5] = 'output';
    this.tokenUsage.observe(typed, usage.outputTokens);
    this.tokens.inc(typed, usage.outputTokens);
    this.moreTokens(typed, 'cached_input', usage.cachedTokens);
    this.moreTokens(typed, 'cache_write', usage.cacheWriteTokens);
    this.moreTokens(typed, 'reasoning', usage.reasoningTokens);
  }

  private moreTokens(typed: string[], type: string, count: number | undefined): void {
    if (!count) return;
    typed[5] = type;
    this.tokens.inc(typed, count);
  }
}
