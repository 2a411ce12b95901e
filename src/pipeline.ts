/**
 * The pipeline: plugin lists built once per phase at boot, and the one owner of every exchange's
 * life, from accept to exactly one done (docs/architecture.md draws the stages). A phase that
 * returns nothing continues synchronously; only a returned promise is awaited. Whatever happens
 * (a local reply, an upstream failure, the client leaving or stalling, shutdown, an exception in
 * any plugin or callback), the exchange ends through `finish`, once.
 */
import type { Logger } from 'pino';
import { conversationKey } from './channels/affinity.js';
import { Failover, betweenCalls } from './channels/failover.js';
import type { Channel, ChannelTable } from './channels/table.js';
import type { ModelConfig } from './config/types.js';
import { LocalAnswer, type Plugin, type PhaseResult, type RuleOutcome, type Upstream, type UpstreamCall, type UpstreamDialect, type UpstreamRequest } from './contracts.js';
import { GatewayError, asGatewayError, errorHeaders } from './errors.js';
import type { Exchange } from './exchange.js';
import type { Outcome } from './contracts.js';
import { applyModelRules } from './model-rules.js';
import type { ClientResponse } from './client-response.js';
import { LiveSet } from './live-set.js';
import { Relay, activeRelay, writeAnswerStream, type RelayOwner } from './relay.js';
import { echoed } from './request-caps.js';
import { estimateTokens } from './tokens.js';
import { costOf } from './cost.js';
import { estimateUsage } from './usage-estimate.js';
import { implausibleCount } from './usage.js';
import { upstreamTraceparent } from './trace.js';
import { fittedToolNames, fitToolNames } from './tool-names.js';

/** What the config says to serve: replaced whole by a reload, while exchanges keep the one they began with. */
export interface Routing {
  models: Map<string, ModelConfig>;
  upstreams: Map<string, Upstream>;
  /** Each model's channels with their breakers; a reload builds it from the running one to keep their state. */
  channels: ChannelTable;
}

export interface PipelineOptions {
  plugins: Plugin[];
  routing: Routing;
  /** The loaded upstream dialects by the family they speak. */
  dialects: Map<string, UpstreamDialect>;
  log: Logger;
  /** Largest complete (non-stream) upstream answer that is read; beyond it the answer is refused. */
  maxUpstreamBodyBytes?: number;
  /** Largest single upstream stream event. */
  maxEventBytes?: number;
}

type PhaseName = 'request' | 'catalog' | 'admit' | 'route';

export class Pipeline implements RelayOwner {
  /** Exchanges accepted and not yet done, with the response each answers through (not a Map: see src/live-set.ts). */
  readonly inFlight = new LiveSet<Exchange, ClientResponse>();
  readonly log: Logger;
  readonly maxUpstreamBodyBytes: number;
  readonly maxEventBytes: number;
  private readonly phases: Record<PhaseName, Plugin[]>;
  private readonly framePlugins: Plugin[];
  private readonly donePlugins: Plugin[];
  /** The plugin that records upstream calls as spans of their own, if one is loaded. */
  private readonly tracer: Plugin | undefined;
  readonly tracesCalls: boolean;
  private routing: Routing;
  private readonly dialects: Map<string, UpstreamDialect>;
  /** Answers given by the gateway itself instead of an upstream (a WebSocket warm-up). */
  private readonly localAnswers = new WeakMap<Exchange, () => void>();

  constructor(options: PipelineOptions) {
    const having = (m: keyof Plugin) => options.plugins.filter((p) => typeof p[m] === 'function');
    this.phases = { request: having('request'), catalog: having('catalog'), admit: having('admit'), route: having('route') };
    this.framePlugins = having('frame');
    this.donePlugins = having('done');
    this.tracer = having('callSpan')[0];
    this.tracesCalls = this.tracer !== undefined;
    this.routing = options.routing;
    this.dialects = options.dialects;
    this.log = options.log;
    this.maxUpstreamBodyBytes = options.maxUpstreamBodyBytes ?? 64 * 1024 * 1024;
    this.maxEventBytes = options.maxEventBytes ?? 16 * 1024 * 1024;
  }

  /** Serves new exchanges from `routing`; those under way finish on the one they began with. */
  reconfigure(routing: Routing): void {
    this.routing = routing;
  }

  /** What new exchanges are served from. */
  currentRouting(): Routing {
    return this.routing;
  }

  /**
   * Takes an accepted exchange through its stages to exactly one done. Never throws. With
   * `answerLocally`, every check up to the route runs (key, body, model, admit) and then
   * `answerLocally` answers instead of an upstream.
   */
  accept(ex: Exchange, res: ClientResponse, answerLocally?: () => void): void {
    if (answerLocally) this.localAnswers.set(ex, answerLocally);
    this.inFlight.add(ex, res);
    this.attempt(ex, res, () => {
      ex.stage = 'headers';
      this.then(ex, res, this.phase('request', ex, res), () => this.afterHeaders(ex, res));
    });
  }

  /**
   * Checks who is opening a long-lived channel (a WebSocket upgrade): the request phase only, then
   * done. `open` runs when the caller is accepted; a refusal is answered through `res`.
   */
  connect(ex: Exchange, res: ClientResponse, open: () => void): void {
    this.inFlight.add(ex, res);
    this.attempt(ex, res, () => {
      ex.stage = 'headers';
      this.then(ex, res, this.phase('request', ex, res), () => {
        ex.status = 101;
        open();
        this.finish(ex, res);
      });
    });
  }

  /** Answers with an error before the exchange could start (a bad header, overload, shutdown), then done. */
  reject(ex: Exchange, res: ClientResponse, err: GatewayError): void {
    this.inFlight.add(ex, res);
    this.attempt(ex, res, () => this.stop(ex, res, err));
  }

  /**
   * Cuts an exchange short: the client went away (`aborted`), stopped reading (`client_stalled`),
   * or the gateway is stopping (`shutdown`, which still tells the client in its family's terms).
   * Whatever the exchange started is stopped, and done runs.
   */
  interrupt(ex: Exchange, res: ClientResponse, outcome: Exclude<Outcome, 'finished' | 'error'>): void {
    if (ex.over) return;
    ex.cutShort(outcome);
    try {
      ex.cancel();
      const relay = ex.get(activeRelay);
      if (relay) relay.interrupted(outcome);
      else if (outcome === 'shutdown') this.fail(ex, res, new GatewayError('shutting_down', 'The gateway is shutting down.'));
    } catch (err) {
      this.log.error({ err, req: ex.id, stage: ex.stage }, 'interrupting an exchange failed');
    }
    this.finish(ex, res);
  }

  /** Shutdown ran out of time: every exchange still in flight ends with its family's failure. */
  interruptAll(): void {
    for (const [ex, res] of this.inFlight.entries()) this.interrupt(ex, res, 'shutdown');
  }

  /** Runs `step` unless the exchange is over; an exception becomes the family's error. */
  attempt(ex: Exchange, res: ClientResponse, step: () => void): void {
    if (ex.over) return;
    try {
      step();
    } catch (err) {
      this.crash(ex, res, err);
    }
  }

  /**
   * An exception anywhere in an exchange: a GatewayError is a refusal like any other; anything else
   * is a bug, logged with its stack. Either way the client gets the family's error (or its stream's
   * failure event) and the exchange ends.
   */
  crash(ex: Exchange, res: ClientResponse, thrown: unknown): void {
    if (ex.over) return;
    if (!(thrown instanceof GatewayError)) this.log.error({ err: thrown, req: ex.id, stage: ex.stage }, 'exchange failed');
    const err = asGatewayError(thrown);
    try {
      ex.cancel();
      const relay = ex.get(activeRelay);
      if (relay) relay.failed(err);
      else this.fail(ex, res, err);
    } catch (again) {
      this.log.error({ err: again, req: ex.id }, 'answering a failed exchange failed');
    }
    this.finish(ex, res);
  }

  /** The done phase, exactly once. */
  finish(ex: Exchange, res: ClientResponse): void {
    if (ex.over) return;
    ex.over = true;
    this.inFlight.delete(ex);
    // An upstream's count no upstream could make is not billed: a negative one would refund a
    // budget, a huge one exhaust it for good. The gateway's estimate stands in, and the lie is logged.
    const impossible = ex.usage && !ex.usage.estimated ? implausibleCount(ex.usage) : undefined;
    if (impossible) this.log.warn({ req: ex.id, upstream: ex.upstream?.name, count: impossible }, 'the upstream reported a token count that cannot be real: the usage is estimated instead');
    // What reached the upstream is counted even when it never reported usage (a cut or aborted
    // stream): estimated from the prompt and the output delivered. A refusal here consumed nothing.
    const reachedUpstream = ex.upstream && !ex.get(betweenCalls);
    if (impossible || (!ex.usage && reachedUpstream && ex.endpoint.kind === 'generate' && (ex.status === 200 || ex.aborted || ex.outcome === 'shutdown'))) {
      try {
        ex.usage = estimateUsage(ex);
      } catch (err) {
        ex.usage = undefined;
        this.log.error({ err, req: ex.id }, 'estimating usage failed');
      }
    }
    // Priced once here, for every done plugin (usage records, budgets).
    const prices = ex.model?.prices;
    // An answer given here (a cache hit) cost nothing, whatever its usage says it once did.
    if (prices) ex.cost = ex.usage && !ex.answeredBy ? costOf(ex.usage, prices) : 0;
    for (const plugin of this.donePlugins) {
      try {
        plugin.done!(ex);
      } catch (err) {
        this.log.error({ err, req: ex.id, plugin: plugin.name }, 'done phase failed');
      }
    }
    try {
      res.finished?.(ex);
    } catch (err) {
      this.log.error({ err, req: ex.id }, 'finishing a response failed');
    }
  }

  /** Continues with `next` once a phase let the exchange through (at once when it did not return a promise). */
  private then(ex: Exchange, res: ClientResponse, answered: boolean | Promise<boolean>, next: () => void): void {
    if (answered instanceof Promise) {
      answered.then(
        (stopped) => stopped || this.attempt(ex, res, next),
        (err) => this.crash(ex, res, err),
      );
    } else if (!answered) {
      next();
    }
  }

  private afterHeaders(ex: Exchange, res: ClientResponse): void {
    if (ex.endpoint.kind === 'models') return this.listModels(ex, res);
    if (!res.readBody) return this.decode(ex, res);
    ex.stage = 'body';
    res.readBody(
      (body) =>
        this.attempt(ex, res, () => {
          ex.body = body;
          this.decode(ex, res);
        }),
      (err) => this.attempt(ex, res, () => this.stop(ex, res, err)),
    );
  }

  private listModels(ex: Exchange, res: ClientResponse): void {
    const families = ex.endpoint.families ?? [ex.family];
    ex.catalog = [...this.routing.models.values()].filter((m) => families.some((f) => m.families[f]));
    this.then(ex, res, this.phase('catalog', ex, res), () => {
      ex.status = 200;
      res.reply(200, { 'content-type': 'application/json' }, JSON.stringify(ex.clientFamily.modelList!(ex.catalog, ex)));
      this.finish(ex, res);
    });
  }

  private decode(ex: Exchange, res: ClientResponse): void {
    ex.clientFamily.decode(ex);
    ex.stage = 'decoded';
    const routing = this.routing;
    ex.model = routing.models.get(ex.modelId);
    if (!ex.model) {
      throw new GatewayError('model_not_found', `The model \`${echoed(ex.modelId)}\` does not exist or you do not have access to it.`, 'model');
    }
    this.then(ex, res, this.phase('admit', ex, res), () => {
      ex.stage = 'admitted';
      if (ex.endpoint.kind === 'count') return (checkOffered(ex), this.countTokens(ex, res));
      ex.upstream = routing.upstreams.get(ex.model!.upstream);
      this.then(ex, res, this.phase('route', ex, res), () => {
        ex.stage = 'routed';
        const local = this.localAnswers.get(ex);
        if (!local) return this.send(ex, res, routing);
        // Answered here: no upstream served it (the access log and usage record say none).
        ex.upstream = undefined;
        local();
        this.finish(ex, res);
      });
    });
  }

  /** A `count` endpoint: the prompt's tokens by the tokenizer, answered here without an upstream. */
  private countTokens(ex: Exchange, res: ClientResponse): void {
    const tokens = estimateTokens(ex.clientFamily.promptText(ex));
    ex.status = 200;
    res.reply(200, { 'content-type': 'application/json' }, JSON.stringify(ex.clientFamily.tokenCount!(tokens, ex)));
    this.finish(ex, res);
  }

  private send(ex: Exchange, res: ClientResponse, routing: Routing): void {
    const model = ex.model!;
    const channels = routing.channels.of(model.id);
    if (channels.length === 0) throw new GatewayError('upstream_unavailable', `No upstream is configured for model \`${ex.modelId}\`.`);
    checkOffered(ex);
    // Every channel of a model speaks one family (checked at boot).
    const upstreamFamily = channels[0]!.upstream.family;
    const dialect = this.dialects.get(upstreamFamily);
    if (!dialect) throw new GatewayError('upstream_unavailable', `No dialect is loaded for the ${upstreamFamily} family of model \`${ex.modelId}\`.`);
    // Same family on both sides: the client's bytes go upstream (the family prepares them), when the family relays its own.
    const passthrough = upstreamFamily === ex.family ? ex.clientFamily.passthrough : undefined;
    // One model-rules step for every family, on the canonical request; passthrough keeps the client's
    // bytes. A native request the rules cannot act on (and no conversation to key) needs neither.
    const needsCanonical = !passthrough || channels.length > 1 || rulesMayAct(model) || passthrough.asksForServerTools?.(ex) !== false;
    const canonical = needsCanonical ? ex.clientFamily.toCanonical(ex, upstreamFamily) : undefined;
    const rules = canonical ? applyModelRules(ex, canonical, dialect) : NOTHING_APPLIED;
    ex.stage = 'upstream';
    // Every upstream call is in the exchange's trace, with the gateway's span as its parent, or,
    // when a plugin records the call as a span of its own, that span.
    const tracer = this.tracer;
    const traceparent = tracer ? undefined : upstreamTraceparent(ex.trace);
    // Each call names its channel on the exchange: the one that served is the last one made.
    const call = (channel: Channel): UpstreamCall => {
      ex.model = channel.model;
      ex.upstream = channel.upstream;
      ex.channel = channel.config;
      ex.attempts++;
      let req: UpstreamRequest;
      if (passthrough) req = passthrough.prepare(ex, channel.upstream, rules);
      else {
        // Tool names the upstream would refuse are renamed for it; the relay names its calls back.
        const fitted = fitToolNames({ ...canonical!, model: channel.model.upstreamModel }, dialect.toolNames);
        // Set, or cleared: a channel tried before may have needed names this one does not.
        if (fitted.renamed || ex.get(fittedToolNames)) ex.set(fittedToolNames, fitted.renamed);
        req = dialect.fromCanonical(fitted.req, ex);
      }
      req.model = channel.model.upstreamModel;
      if (tracer) {
        const record = ex.calls.at(-1)!;
        record.spanId = tracer.callSpan!(ex);
        req.traceparent = upstreamTraceparent(ex.trace, record.spanId);
      } else {
        req.traceparent = traceparent;
      }
      req.tracestate = ex.trace.state;
      const relay = new Relay(this, ex, res, channel.upstream, dialect, this.framePlugins, failover);
      ex.set(activeRelay, relay);
      return (relay.call = channel.upstream.send(req, relay));
    };
    const affinity = routing.channels.affinity;
    const conversation = channels.length > 1 && affinity.current.enabled ? conversationKey(model.id, ex.headers, canonical!, affinity.current) : undefined;
    const failover: Failover = new Failover(ex, channels, call, (step) => this.attempt(ex, res, step), this.log, conversation && { key: conversation, pins: affinity });
    ex.onCancel(() => failover.cancel());
    failover.begin();
  }

  /**
   * Runs one phase; true when a plugin answered (the exchange is over). Plugins run back to back
   * until one returns a promise: one await per phase at most, never one per plugin.
   */
  private phase(name: PhaseName, ex: Exchange, res: ClientResponse, from = 0): boolean | Promise<boolean> {
    const plugins = this.phases[name];
    for (let i = from; i < plugins.length; i++) {
      const result: PhaseResult = plugins[i]![name]!(ex);
      if (result instanceof Promise) {
        return result.then((settled) => {
          if (ex.over) return true;
          if (settled instanceof GatewayError) return this.stop(ex, res, settled), true;
          if (settled instanceof LocalAnswer) return this.answerLocally(name, ex, res, settled), true;
          return this.phase(name, ex, res, i + 1);
        });
      }
      if (result instanceof GatewayError) {
        this.stop(ex, res, result);
        return true;
      }
      if (result instanceof LocalAnswer) {
        this.answerLocally(name, ex, res, result);
        return true;
      }
    }
    return false;
  }

  /**
   * A plugin's answer in place of an upstream's (a response cache hit), written by the client's
   * family as a translated answer is: a stream request gets it as a stream.
   */
  private answerLocally(phase: PhaseName, ex: Exchange, res: ClientResponse, local: LocalAnswer): void {
    if ((phase !== 'admit' && phase !== 'route') || ex.endpoint.kind !== 'generate') {
      throw new Error(`plugin ${local.by} answered in the ${phase} phase of a ${ex.endpoint.kind} request; an answer is taken in the admit and route phases of a generation`);
    }
    checkOffered(ex);
    ex.answeredBy = local.by;
    ex.upstream = undefined;
    ex.usage = local.answer.usage;
    ex.answeredBecause([local.answer.finishReason]);
    ex.status = 200;
    ex.ttfbMs = ex.elapsedMs();
    const family = ex.clientFamily;
    if (ex.stream) writeAnswerStream(ex, res, local.answer);
    else res.reply(200, { 'content-type': 'application/json' }, family.writeResponse(local.answer, ex));
    this.finish(ex, res);
  }

  /** A local reply with an error, and the end of the exchange. */
  private stop(ex: Exchange, res: ClientResponse, err: GatewayError): void {
    this.fail(ex, res, err);
    this.finish(ex, res);
  }

  /** Answers with the family's error body, unless the client is gone. */
  fail(ex: Exchange, res: ClientResponse, err: GatewayError): void {
    ex.failedWith(err);
    if (ex.aborted) return;
    ex.status = ex.clientFamily.errorStatus?.(err) ?? err.status;
    res.reply(ex.status, errorHeaders(err), ex.clientFamily.errorBody(err));
  }
}

/** What the rules did to a request they had nothing to act on. */
const NOTHING_APPLIED: RuleOutcome = Object.freeze({ droppedTools: Object.freeze([]) as never[], droppedParams: Object.freeze([]) as never[] });

/**
 * Whether the model rules could refuse or change a native request by more than its server tools:
 * a feature the model lacks, or an output ceiling or default (src/model-rules.ts).
 */
function rulesMayAct(model: ModelConfig): boolean {
  const { features, maxOutputTokens } = model;
  const allowsAll = features.tools && features.jsonSchema && features.vision && features.temperature && features.reasoning;
  return !allowsAll || maxOutputTokens.max !== undefined || maxOutputTokens.default !== undefined;
}

/** A model is served only on the families its config offers it on. */
function checkOffered(ex: Exchange): void {
  if (!ex.model!.families[ex.family]) {
    throw new GatewayError('unsupported_parameter', `Model \`${ex.modelId}\` is not offered on the ${ex.family} endpoints.`, 'model');
  }
}
