/**
 * The pipeline: plugin lists built once per phase at boot, and the run of one exchange through
 * them. A phase that returns nothing continues synchronously; only a returned promise is awaited.
 */
import type { ModelConfig } from './config.js';
import type { Event, Response } from './canonical.js';
import type { ClientStream, Codec, Plugin, PhaseResult, Upstream, UpstreamCall, UpstreamRequest, Usage } from './contracts.js';
import { GatewayError, asGatewayError } from './errors.js';
import { StateKey, type Exchange } from './exchange.js';
import { SseSplitter, frameData } from './sse.js';

/** What the pipeline needs from the HTTP layer to answer one request. */
export interface ClientResponse {
  /** A complete response. */
  reply(status: number, headers: Record<string, string>, body: string | Buffer): void;
  /** Status and headers of a stream; the body follows with write(). */
  startStream(status: number, headers: Record<string, string>): void;
  /** Returns false when the client's buffer is full: wait for onWritable before writing more. */
  write(bytes: string | Buffer): boolean;
  onWritable(resume: () => void): void;
  end(bytes?: string | Buffer): void;
}

type PhaseName = 'request' | 'catalog' | 'admit' | 'route';

/** Stop retaining delivered frames for a usage estimate past this size. */
const MAX_RETAINED_BYTES = 8 * 1024 * 1024;

export class Pipeline {
  private readonly phases: Record<PhaseName, Plugin[]>;
  private readonly framePlugins: Plugin[];
  private readonly donePlugins: Plugin[];

  constructor(
    plugins: Plugin[],
    private readonly models: Map<string, ModelConfig>,
    private readonly upstreams: Map<string, Upstream>,
    private readonly codecs: Map<string, Codec>,
    private readonly onDoneError: (err: unknown, ex: Exchange) => void = () => {},
  ) {
    const having = (m: keyof Plugin) => plugins.filter((p) => typeof p[m] === 'function');
    this.phases = { request: having('request'), catalog: having('catalog'), admit: having('admit'), route: having('route') };
    this.framePlugins = having('frame');
    this.donePlugins = having('done');
  }

  /** Runs one exchange to its end; resolves after the done phase. Never rejects. */
  async run(ex: Exchange, res: ClientResponse): Promise<void> {
    try {
      await this.answer(ex, res);
    } catch (err) {
      this.fail(ex, res, asGatewayError(err));
    }
    this.runDone(ex);
  }

  /**
   * Checks who is opening a long-lived channel (a WebSocket upgrade): the request phase only.
   * A refusal is answered through `res` and ends the exchange; an acceptance leaves it open.
   */
  async connect(ex: Exchange, res: ClientResponse): Promise<boolean> {
    let refused: boolean;
    try {
      refused = await this.phase('request', ex, res);
    } catch (err) {
      this.fail(ex, res, asGatewayError(err));
      refused = true;
    }
    if (refused) this.runDone(ex);
    else ex.status = 101;
    return !refused;
  }

  /** Answers with an error before the exchange could start (oversized body, shutdown), then done. */
  async reject(ex: Exchange, res: ClientResponse, err: GatewayError): Promise<void> {
    this.fail(ex, res, err);
    this.runDone(ex);
  }

  private runDone(ex: Exchange): void {
    for (const plugin of this.donePlugins) {
      try {
        plugin.done!(ex);
      } catch (err) {
        this.onDoneError(err, ex);
      }
    }
  }

  private async answer(ex: Exchange, res: ClientResponse): Promise<void> {
    if (await this.phase('request', ex, res)) return;

    if (ex.endpoint.kind === 'models') {
      const families = ex.endpoint.families ?? [ex.family];
      ex.catalog = [...this.models.values()].filter((m) => families.some((f) => m.families[f]));
      if (await this.phase('catalog', ex, res)) return;
      ex.status = 200;
      res.reply(200, { 'content-type': 'application/json' }, JSON.stringify(ex.codec.modelList!(ex.catalog, ex)));
      return;
    }

    ex.codec.decode(ex);
    ex.model = this.models.get(ex.modelId);
    if (!ex.model) {
      throw new GatewayError('model_not_found', `The model \`${ex.modelId}\` does not exist or you do not have access to it.`, 'model');
    }
    if (await this.phase('admit', ex, res)) return;
    ex.upstream = this.upstreams.get(ex.model.upstream);
    if (await this.phase('route', ex, res)) return;
    const upstream = ex.upstream;
    if (!upstream) throw new GatewayError('upstream_unavailable', `No upstream is configured for model \`${ex.modelId}\`.`);
    if (!ex.model.families[ex.family]) {
      throw new GatewayError('unsupported_parameter', `Model \`${ex.modelId}\` is not offered on the ${ex.family} endpoints.`, 'model');
    }
    if (upstream.family === ex.family) return this.relay(ex, res, upstream, ex.codec, ex.codec.prepare(ex, upstream));
    const upstreamCodec = this.codecs.get(upstream.family);
    if (!upstreamCodec) throw new GatewayError('upstream_unavailable', `No codec is loaded for the ${upstream.family} family of upstream \`${upstream.name}\`.`);
    const req = upstreamCodec.fromCanonical(ex.codec.toCanonical(ex, upstream.family), ex);
    await this.relay(ex, res, upstream, upstreamCodec, req);
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
        return result.then((settled) => (settled instanceof GatewayError ? (this.fail(ex, res, settled), true) : this.phase(name, ex, res, i + 1)));
      }
      if (result instanceof GatewayError) {
        this.fail(ex, res, result);
        return true;
      }
    }
    return false;
  }

  private fail(ex: Exchange, res: ClientResponse, err: GatewayError): void {
    ex.error = err;
    if (ex.outcome !== 'aborted') ex.outcome = 'error';
    if (ex.aborted) return;
    ex.status = err.status;
    res.reply(err.status, { 'content-type': 'application/json' }, ex.codec.errorBody(err));
  }

  /**
   * Sends the request upstream and relays the answer. A same-family stream is forwarded as the
   * upstream's own bytes (frames are only looked at); otherwise the upstream codec reads it into
   * canonical events and the client codec writes them.
   */
  private relay(ex: Exchange, res: ClientResponse, upstream: Upstream, upstreamCodec: Codec, req: UpstreamRequest): Promise<void> {
    return new Promise<void>((resolve) => {
      let call: UpstreamCall | undefined;
      let settled = false;
      let upstreamStatus = 0;
      let stream: ClientStream | undefined;
      const collected: Buffer[] = [];
      const splitter = new SseSplitter();

      let writable = true;
      const write = (bytes: Buffer | string) => {
        ex.ttfbMs ??= ex.elapsedMs();
        if (!res.write(bytes)) writable = false;
      };
      const visit = (frame: Buffer): boolean => {
        for (const plugin of this.framePlugins) plugin.frame!(ex, frame);
        return stream!.frame(frame);
      };
      const settle = () => {
        if (settled) return;
        settled = true;
        ex.usage ??= stream?.usage();
        resolve();
      };

      ex.onAbort(() => {
        call?.abort();
        ex.outcome = 'aborted';
        settle();
      });

      call = upstream.send(req, {
        start: (status, headers) => {
          upstreamStatus = status;
          const isEventStream = String(headers['content-type'] ?? '').includes('text/event-stream');
          if (!ex.stream || status >= 300 || !isEventStream || ex.aborted) return;
          stream = upstreamCodec === ex.codec ? recording(ex, ex.codec.passthroughStream(ex)) : translating(ex, upstreamCodec);
          ex.status = 200;
          res.startStream(200, { 'content-type': ex.codec.streamContentType(ex), 'cache-control': 'no-cache', 'x-accel-buffering': 'no' });
        },
        data: (chunk) => {
          if (settled) return false;
          if (!stream) {
            collected.push(chunk);
            return true;
          }
          writable = true;
          splitter.push(chunk, visit, write);
          const own = stream.take?.();
          if (own) write(own);
          if (!writable) res.onWritable(() => call!.resume());
          return writable;
        },
        end: () => {
          if (settled) return;
          if (stream) {
            const rest = splitter.flush();
            if (rest && visit(rest)) write(rest);
            res.end((stream.take?.() ?? '') + stream.end());
          } else {
            this.finishCollected(ex, res, upstream, upstreamCodec, upstreamStatus, Buffer.concat(collected));
          }
          settle();
        },
        error: (err) => {
          if (settled) return;
          ex.error = err;
          ex.outcome = 'error';
          if (stream) res.end(stream.fail(err));
          else this.fail(ex, res, err);
          settle();
        },
      });
    });
  }

  /** A complete upstream body: the answer in the client's family, or a failure in its terms. */
  private finishCollected(ex: Exchange, res: ClientResponse, upstream: Upstream, upstreamCodec: Codec, status: number, body: Buffer): void {
    const sameFamily = upstreamCodec === ex.codec;
    if (status >= 200 && status < 300) {
      ex.status = status;
      ex.ttfbMs ??= ex.elapsedMs();
      if (sameFamily) {
        ex.usage = ex.codec.bodyUsage(body);
        res.reply(status, { 'content-type': 'application/json' }, body);
        return;
      }
      let answer: Response;
      try {
        answer = upstreamCodec.readResponse(body, ex);
      } catch (err) {
        // A 200 can still be a refusal (a blocked prompt) or an unreadable body.
        this.fail(ex, res, asGatewayError(err));
        return;
      }
      ex.usage = answer.usage;
      res.reply(status, { 'content-type': 'application/json' }, ex.codec.writeResponse(answer, ex));
      return;
    }
    const err = upstreamCodec.readError(status, body);
    if (err.status === 401 || err.status === 403) {
      this.fail(ex, res, new GatewayError('upstream_error', `Upstream \`${upstream.name}\` rejected the gateway's credentials (${status}).`));
    } else if (status >= 400 && status < 500) {
      // The client's own mistake as the upstream saw it: same status; the same body when the family matches.
      ex.error = err;
      ex.outcome = 'error';
      ex.status = status;
      res.reply(status, { 'content-type': 'application/json' }, sameFamily ? body : ex.codec.errorBody(err));
    } else {
      const message = `Upstream \`${upstream.name}\` answered ${status}: ${err.message}`;
      this.fail(ex, res, new GatewayError(status === 503 ? 'upstream_unavailable' : status === 504 ? 'upstream_timeout' : 'upstream_error', message));
    }
  }
}

/** Keeps the frames a passthrough stream delivered while usage is unknown, for an estimate. */
function recording(ex: Exchange, stream: ClientStream): ClientStream {
  const frames: Buffer[] = [];
  let retained = 0;
  ex.set(deliveredOutput, () => (frames.length ? ex.codec.deliveredText(frames) : ''));
  return {
    ...stream,
    frame(frame) {
      const keep = stream.frame(frame);
      if (keep && retained < MAX_RETAINED_BYTES) {
        frames.push(frame);
        retained += frame.length;
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
  let delivered = '';
  let failed = false;
  let pending = '';
  ex.set(deliveredOutput, () => delivered);
  const emit = (events: Event[]): string => {
    let out = '';
    for (const e of events) {
      if (failed) break;
      if (e.type === 'usage') usage = e.usage;
      else if (e.type === 'text' || e.type === 'reasoning' || e.type === 'tool_arguments') delivered += e.delta;
      else if (e.type === 'error') {
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
      const out = emit(reader.end());
      return failed ? out : out + writer.end();
    },
    fail: (err) => (failed ? '' : ((failed = true), writer.fail(err))),
    usage: () => usage,
  };
}

/** The output text delivered to the client, for a tokenizer estimate when usage never came. */
export const deliveredOutput = new StateKey<() => string>('delivered output');
