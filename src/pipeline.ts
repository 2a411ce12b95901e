/**
 * The pipeline: plugin lists built once per phase at boot, and the one owner of every exchange's
 * life, from accept to exactly one done (docs/architecture.md draws the stages). A phase that
 * returns nothing continues synchronously; only a returned promise is awaited. Whatever happens
 * (a local reply, an upstream failure, the client leaving or stalling, shutdown, an exception in
 * any plugin or callback), the exchange ends through `finish`, once.
 */
import type { Logger } from 'pino';
import type { ModelConfig } from './config.js';
import type { Event, Response } from './canonical.js';
import type { ClientStream, Codec, Plugin, PhaseResult, ResponseSink, Upstream, UpstreamCall, UpstreamRequest, Usage } from './contracts.js';
import { GatewayError, asGatewayError } from './errors.js';
import { StateKey, type Exchange, type Outcome } from './exchange.js';
import { applyModelRules } from './model-rules.js';
import { echoed } from './request-caps.js';
import { replaceStringField } from './json-splice.js';
import { SseSplitter, frameData, sniffEventStream } from './sse.js';
import { estimateTokens } from './tokens.js';

/** What the pipeline needs from the client's side of the connection to answer one exchange. */
export interface ClientResponse {
  /** A complete response. */
  reply(status: number, headers: Record<string, string>, body: string | Buffer): void;
  /** Status and headers of a stream; the body follows with write(). */
  startStream(status: number, headers: Record<string, string>): void;
  /** Returns false when the client's buffer is full: wait for onWritable before writing more. */
  write(bytes: string | Buffer): boolean;
  onWritable(resume: () => void): void;
  end(bytes?: string | Buffer): void;
  /**
   * Reads the request body, after the headers were accepted. Absent when the exchange arrives with
   * its body (a WebSocket message).
   */
  readBody?(onBody: (body: Buffer) => void, onRefused: (err: GatewayError) => void): void;
  /** Called once, after the done phase. */
  finished?(ex: Exchange): void;
}

export interface PipelineOptions {
  plugins: Plugin[];
  models: Map<string, ModelConfig>;
  upstreams: Map<string, Upstream>;
  codecs: Map<string, Codec>;
  log: Logger;
  /** Largest complete (non-stream) upstream answer that is read; beyond it the answer is refused. */
  maxUpstreamBodyBytes?: number;
  /** Largest single upstream stream event. */
  maxEventBytes?: number;
}

type PhaseName = 'request' | 'catalog' | 'admit' | 'route';

/** Delivered output kept per stream for a usage estimate; the rest is only counted. */
const SAMPLE_BYTES = 16 * 1024;

export class Pipeline {
  /** Exchanges accepted and not yet done, with the response each answers through. */
  readonly inFlight = new Map<Exchange, ClientResponse>();
  readonly log: Logger;
  readonly maxUpstreamBodyBytes: number;
  readonly maxEventBytes: number;
  private readonly phases: Record<PhaseName, Plugin[]>;
  private readonly framePlugins: Plugin[];
  private readonly donePlugins: Plugin[];
  private readonly models: Map<string, ModelConfig>;
  private readonly upstreams: Map<string, Upstream>;
  private readonly codecs: Map<string, Codec>;

  constructor(options: PipelineOptions) {
    const having = (m: keyof Plugin) => options.plugins.filter((p) => typeof p[m] === 'function');
    this.phases = { request: having('request'), catalog: having('catalog'), admit: having('admit'), route: having('route') };
    this.framePlugins = having('frame');
    this.donePlugins = having('done');
    this.models = options.models;
    this.upstreams = options.upstreams;
    this.codecs = options.codecs;
    this.log = options.log;
    this.maxUpstreamBodyBytes = options.maxUpstreamBodyBytes ?? 64 * 1024 * 1024;
    this.maxEventBytes = options.maxEventBytes ?? 16 * 1024 * 1024;
  }

  /** Takes an accepted exchange through its stages to exactly one done. Never throws. */
  accept(ex: Exchange, res: ClientResponse): void {
    this.inFlight.set(ex, res);
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
    this.inFlight.set(ex, res);
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
    this.inFlight.set(ex, res);
    this.attempt(ex, res, () => this.stop(ex, res, err));
  }

  /**
   * Cuts an exchange short: the client went away (`aborted`), stopped reading (`client_stalled`),
   * or the gateway is stopping (`shutdown`, which still tells the client in its family's terms).
   * Whatever the exchange started is stopped, and done runs.
   */
  interrupt(ex: Exchange, res: ClientResponse, outcome: Exclude<Outcome, 'finished' | 'error'>): void {
    if (ex.over) return;
    if (outcome !== 'shutdown') ex.aborted = true;
    ex.outcome = outcome;
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
    for (const [ex, res] of [...this.inFlight]) this.interrupt(ex, res, 'shutdown');
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
    ex.catalog = [...this.models.values()].filter((m) => families.some((f) => m.families[f]));
    this.then(ex, res, this.phase('catalog', ex, res), () => {
      ex.status = 200;
      res.reply(200, { 'content-type': 'application/json' }, JSON.stringify(ex.codec.modelList!(ex.catalog, ex)));
      this.finish(ex, res);
    });
  }

  private decode(ex: Exchange, res: ClientResponse): void {
    ex.codec.decode(ex);
    ex.stage = 'decoded';
    ex.model = this.models.get(ex.modelId);
    if (!ex.model) {
      throw new GatewayError('model_not_found', `The model \`${echoed(ex.modelId)}\` does not exist or you do not have access to it.`, 'model');
    }
    this.then(ex, res, this.phase('admit', ex, res), () => {
      ex.stage = 'admitted';
      ex.upstream = this.upstreams.get(ex.model!.upstream);
      this.then(ex, res, this.phase('route', ex, res), () => {
        ex.stage = 'routed';
        this.send(ex, res);
      });
    });
  }

  private send(ex: Exchange, res: ClientResponse): void {
    const upstream = ex.upstream;
    if (!upstream) throw new GatewayError('upstream_unavailable', `No upstream is configured for model \`${ex.modelId}\`.`);
    if (!ex.model!.families[ex.family]) {
      throw new GatewayError('unsupported_parameter', `Model \`${ex.modelId}\` is not offered on the ${ex.family} endpoints.`, 'model');
    }
    const upstreamCodec = upstream.family === ex.family ? ex.codec : this.codecs.get(upstream.family);
    if (!upstreamCodec) throw new GatewayError('upstream_unavailable', `No codec is loaded for the ${upstream.family} family of upstream \`${upstream.name}\`.`);
    // One model-rules step for every family, on the canonical request; passthrough keeps the client's bytes.
    const canonical = ex.codec.toCanonical(ex, upstream.family);
    const rules = applyModelRules(ex, canonical, upstreamCodec);
    const req: UpstreamRequest = upstreamCodec === ex.codec ? ex.codec.prepare(ex, upstream, rules) : upstreamCodec.fromCanonical(canonical, ex);
    const relay = new Relay(this, ex, res, upstream, upstreamCodec, this.framePlugins);
    ex.set(activeRelay, relay);
    ex.stage = 'upstream';
    relay.call = upstream.send(req, relay);
    ex.onCancel(() => relay.call?.abort());
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
          return settled instanceof GatewayError ? (this.stop(ex, res, settled), true) : this.phase(name, ex, res, i + 1);
        });
      }
      if (result instanceof GatewayError) {
        this.stop(ex, res, result);
        return true;
      }
    }
    return false;
  }

  /** A local reply with an error, and the end of the exchange. */
  private stop(ex: Exchange, res: ClientResponse, err: GatewayError): void {
    this.fail(ex, res, err);
    this.finish(ex, res);
  }

  /** Answers with the family's error body, unless the client is gone. */
  fail(ex: Exchange, res: ClientResponse, err: GatewayError): void {
    ex.error = err;
    if (ex.outcome === 'finished') ex.outcome = 'error';
    if (ex.aborted) return;
    ex.status = err.status;
    const headers: Record<string, string> = { 'content-type': 'application/json' };
    if (err.retryAfterSeconds !== undefined) headers['retry-after'] = String(err.retryAfterSeconds);
    res.reply(err.status, headers, ex.codec.errorBody(err));
  }
}

/** The exchange's relay while an upstream call is under way. */
const activeRelay = new StateKey<Relay>('active relay');

/**
 * Relays one upstream answer to the client. A same-family stream is forwarded as the upstream's
 * own bytes (frames are only looked at); otherwise the upstream codec reads it into canonical
 * events and the client codec writes them. Every callback is guarded: an exception ends the
 * exchange in the family's terms instead of reaching the upstream's transport.
 */
class Relay implements ResponseSink {
  call: UpstreamCall | undefined;
  private status = 0;
  private stream: ClientStream | undefined;
  private readonly collected: Buffer[] = [];
  private collectedBytes = 0;
  private readonly splitter: SseSplitter;
  private writable = true;
  /** A stream was asked for and the answer is not labelled as one: its first bytes decide. */
  private sniffing = false;
  /** Splices the client's name for the model into a passthrough answer, when it differs from the upstream's. */
  private readonly rename: ((json: Buffer) => Buffer) | undefined;
  /** Renamed frames of the current chunk, written together after it. */
  private readonly renamed: Buffer[] = [];

  constructor(
    private readonly pipeline: Pipeline,
    private readonly ex: Exchange,
    private readonly res: ClientResponse,
    private readonly upstream: Upstream,
    private readonly upstreamCodec: Codec,
    private readonly framePlugins: Plugin[],
  ) {
    this.splitter = new SseSplitter(pipeline.maxEventBytes);
    const key = ex.codec.modelKey;
    if (upstreamCodec === ex.codec && key && ex.modelId !== ex.model!.upstreamModel) {
      const quotedKey = Buffer.from(key);
      const name = Buffer.from(JSON.stringify(ex.modelId));
      this.rename = (json) => replaceStringField(json, quotedKey, name);
    }
  }

  private readonly resume = () => this.call?.resume();

  private readonly write = (bytes: Buffer | string) => {
    this.ex.ttfbMs ??= this.ex.elapsedMs();
    if (!this.res.write(bytes)) this.writable = false;
  };

  private readonly visit = (frame: Buffer): boolean => {
    for (const plugin of this.framePlugins) plugin.frame!(this.ex, frame);
    return this.stream!.frame(frame);
  };

  /** Visits the renamed copy of a frame, kept to be written after the chunk (so frames stay in order). */
  private readonly visitRenamed = (frame: Buffer): boolean => {
    const renamed = this.rename!(frame);
    if (this.visit(renamed)) this.renamed.push(renamed);
    return false;
  };

  start(status: number, headers: Record<string, string | string[] | undefined>): void {
    const { ex, res } = this;
    this.pipeline.attempt(ex, res, () => {
      this.status = status;
      if (!ex.stream || status < 200 || status >= 300) return;
      if (String(headers['content-type'] ?? '').includes('text/event-stream')) this.startStream();
      else this.sniffing = true;
    });
  }

  private startStream(): void {
    const { ex, res } = this;
    this.stream = this.upstreamCodec === ex.codec ? recording(ex, ex.codec.passthroughStream(ex)) : translating(ex, this.upstreamCodec);
    ex.status = 200;
    ex.stage = 'streaming';
    res.startStream(200, { 'content-type': ex.codec.streamContentType(ex), 'cache-control': 'no-cache', 'x-accel-buffering': 'no' });
  }

  data(chunk: Buffer): boolean {
    const { ex, res } = this;
    if (ex.over) return false;
    try {
      if (!this.stream) {
        this.collectedBytes += chunk.length;
        if (this.collectedBytes > this.pipeline.maxUpstreamBodyBytes) {
          throw new GatewayError('upstream_error', `Upstream \`${this.upstream.name}\` sent an answer larger than ${this.pipeline.maxUpstreamBodyBytes} bytes.`);
        }
        this.collected.push(chunk);
        if (!this.sniffing) return true;
        const head = this.collected.length === 1 ? chunk : Buffer.concat(this.collected, this.collectedBytes);
        const isEventStream = sniffEventStream(head);
        if (isEventStream === undefined) return true;
        this.sniffing = false;
        if (!isEventStream) return true;
        this.collected.length = 0;
        this.collectedBytes = 0;
        this.startStream();
        chunk = head;
      }
      this.writable = true;
      this.splitter.push(chunk, this.rename ? this.visitRenamed : this.visit, this.write);
      this.writeRenamed();
      const own = this.stream!.take?.();
      if (own) this.write(own);
      if (!this.writable) res.onWritable(this.resume);
      return this.writable;
    } catch (err) {
      this.pipeline.crash(ex, res, err);
      return false;
    }
  }

  end(): void {
    const { ex, res } = this;
    this.pipeline.attempt(ex, res, () => {
      const stream = this.stream;
      if (stream) {
        // An unterminated last event is terminated, so the client's parser sees it (and nothing joins it).
        const rest = this.splitter.flush();
        if (rest && this.rename) this.visitRenamed(Buffer.concat([rest, this.splitter.delimiterOrDefault()]));
        else if (rest && this.visit(rest)) this.write(Buffer.concat([rest, this.splitter.delimiterOrDefault()]));
        this.writeRenamed();
        res.end((stream.take?.() ?? '') + stream.end());
        ex.usage ??= stream.usage();
      } else {
        this.finishCollected(Buffer.concat(this.collected, this.collectedBytes));
      }
      this.pipeline.finish(ex, res);
    });
  }

  error(err: GatewayError): void {
    const { ex, res } = this;
    this.pipeline.attempt(ex, res, () => {
      this.failed(err);
      this.pipeline.finish(ex, res);
    });
  }

  private writeRenamed(): void {
    if (this.renamed.length === 0) return;
    this.write(this.renamed.length === 1 ? this.renamed[0]! : Buffer.concat(this.renamed));
    this.renamed.length = 0;
  }

  /** The exchange failed midway: a stream ends with its family's failure event, anything else with an error reply. */
  failed(err: GatewayError): void {
    const { ex, res, stream } = this;
    ex.error = err;
    if (ex.outcome === 'finished') ex.outcome = 'error';
    ex.usage ??= stream?.usage();
    if (!stream) return this.pipeline.fail(ex, res, err);
    if (!ex.aborted) res.end(stream.fail(err));
  }

  /** The pipeline cut the exchange short (the upstream call is already aborted). */
  interrupted(outcome: Outcome): void {
    this.ex.usage ??= this.stream?.usage();
    if (outcome === 'shutdown') this.failed(new GatewayError('shutting_down', 'The gateway shut down before the answer was complete.'));
  }

  /** A complete upstream body: the answer in the client's family, or a failure in its terms. */
  private finishCollected(body: Buffer): void {
    const { ex, res, upstream, upstreamCodec, status } = this;
    const sameFamily = upstreamCodec === ex.codec;
    if (status >= 200 && status < 300) {
      ex.status = status;
      ex.ttfbMs ??= ex.elapsedMs();
      if (sameFamily) {
        ex.usage = ex.codec.bodyUsage(body);
        res.reply(status, { 'content-type': 'application/json' }, this.rename ? this.rename(body) : body);
        return;
      }
      // A 200 can still be a refusal (a blocked prompt) or an unreadable body: readResponse throws.
      const answer: Response = upstreamCodec.readResponse(body, ex);
      answer.usage ??= estimateUsage(ex, answerText(answer));
      ex.usage = answer.usage;
      res.reply(status, { 'content-type': 'application/json' }, ex.codec.writeResponse(answer, ex));
      return;
    }
    const err = upstreamCodec.readError(status, body);
    if (err.status === 401 || err.status === 403) {
      this.pipeline.fail(ex, res, new GatewayError('upstream_error', `Upstream \`${upstream.name}\` rejected the gateway's credentials (${status}).`));
    } else if (status >= 400 && status < 500) {
      // The client's own mistake as the upstream saw it: same status; the same body when the family matches.
      ex.error = err;
      ex.outcome = 'error';
      ex.status = status;
      res.reply(status, { 'content-type': 'application/json' }, sameFamily ? body : ex.codec.errorBody(err));
    } else {
      const message = `Upstream \`${upstream.name}\` answered ${status}: ${err.message}`;
      this.pipeline.fail(ex, res, new GatewayError(status === 503 ? 'upstream_unavailable' : status === 504 ? 'upstream_timeout' : 'upstream_error', message));
    }
  }
}

/**
 * Looks at a passthrough stream's frames, keeping a bounded sample of what was delivered for a
 * usage estimate in case the upstream never reports usage.
 */
function recording(ex: Exchange, stream: ClientStream): ClientStream {
  const frames: Buffer[] = [];
  let sampled = 0;
  let delivered = 0;
  ex.set(deliveredOutput, () => (frames.length ? ex.codec.deliveredText(frames) : ''));
  ex.set(deliveredScale, () => (sampled ? delivered / sampled : 1));
  return {
    ...stream,
    frame(frame) {
      const keep = stream.frame(frame);
      if (keep) {
        delivered += frame.length;
        if (sampled < SAMPLE_BYTES) {
          // A view would pin the whole upstream chunk; the sample is small, so copy it.
          frames.push(Buffer.from(frame));
          sampled += frame.length;
        }
      }
      return keep;
    },
  };
}

/** Reads upstream frames into canonical events and writes them as client frames, one write per chunk. */
function translating(ex: Exchange, upstreamCodec: Codec): ClientStream {
  const reader = upstreamCodec.streamReader(ex);
  const writer = ex.codec.streamWriter(ex);
  let usage: Usage | undefined;
  let sample = '';
  let delivered = 0;
  let failed = false;
  let pending = '';
  ex.set(deliveredOutput, () => sample);
  ex.set(deliveredScale, () => (sample.length ? delivered / sample.length : 1));
  const emit = (events: Event[]): string => {
    let out = '';
    for (const e of events) {
      if (failed) break;
      if (e.type === 'usage') usage = e.usage;
      else if (e.type === 'text' || e.type === 'reasoning' || e.type === 'tool_arguments') {
        delivered += e.delta.length;
        if (sample.length < SAMPLE_BYTES) sample += e.delta;
      } else if (e.type === 'error') {
        failed = true;
        ex.error = e.error;
        ex.outcome = 'error';
        out += writer.fail(e.error);
        break;
      }
      out += writer.event(e);
    }
    return out;
  };
  return {
    frame(frame) {
      const data = frameData(frame);
      if (data !== null) pending += emit(reader.frame(data));
      return false;
    },
    take() {
      const out = pending;
      pending = '';
      return out;
    },
    end: () => {
      let out = emit(reader.end());
      // Every client gets usage: counted locally when the upstream reported none.
      if (!failed && !usage) out += emit([{ type: 'usage', usage: estimateUsage(ex) }]);
      return failed ? out : out + writer.end();
    },
    fail: (err) => (failed ? '' : ((failed = true), writer.fail(err))),
    usage: () => usage,
  };
}

/** A bounded sample of the output text delivered to the client, for a tokenizer estimate when usage never came. */
export const deliveredOutput = new StateKey<() => string>('delivered output');
/** How many times larger the whole delivered output was than its sample (1 when it was all kept). */
export const deliveredScale = new StateKey<() => number>('delivered output scale');

/**
 * Usage counted locally (and marked estimated) for an answer whose upstream reported none: the
 * prompt, and the output delivered (by default the stream's bounded sample, scaled up).
 */
export function estimateUsage(ex: Exchange, output = ex.get(deliveredOutput)?.() ?? '', scale = ex.get(deliveredScale)?.() ?? 1): Usage {
  return { inputTokens: estimateTokens(ex.codec.promptText(ex)), outputTokens: Math.round(estimateTokens(output) * scale), estimated: true };
}

/** The output text of a complete answer, for an estimate. */
function answerText(answer: Response): string {
  let text = (answer.reasoning ?? '') + answer.text;
  for (const call of answer.toolCalls) text += call.name + call.arguments;
  return text;
}
