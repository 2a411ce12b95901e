/**
 * The pipeline: plugin lists built once per phase at boot, and the run of one exchange through
 * them. A phase that returns nothing continues synchronously; only a returned promise is awaited.
 */
import type { ModelConfig } from './config.js';
import type { Plugin, PhaseResult, Upstream, UpstreamCall, UpstreamRequest } from './contracts.js';
import { GatewayError, asGatewayError } from './errors.js';
import { StateKey, type Exchange } from './exchange.js';
import { SseSplitter } from './sse.js';

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
      ex.catalog = [...this.models.values()];
      if (await this.phase('catalog', ex, res)) return;
      ex.status = 200;
      res.reply(200, { 'content-type': 'application/json' }, JSON.stringify(ex.codec.modelList(ex.catalog)));
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
    if (upstream.family !== ex.family) {
      throw new GatewayError('unsupported_parameter', `Model \`${ex.modelId}\` is not served on the ${ex.family} endpoint.`, 'model');
    }
    await this.relay(ex, res, upstream, ex.codec.prepare(ex, upstream));
  }

  /** Runs one phase; returns true when a plugin answered (the exchange is over). */
  private async phase(name: PhaseName, ex: Exchange, res: ClientResponse): Promise<boolean> {
    for (const plugin of this.phases[name]) {
      let result: PhaseResult = plugin[name]!(ex);
      if (result && typeof (result as Promise<unknown>).then === 'function') result = await result;
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
   * upstream's own bytes; frames are only looked at, never rebuilt.
   */
  private relay(ex: Exchange, res: ClientResponse, upstream: Upstream, req: UpstreamRequest): Promise<void> {
    return new Promise<void>((resolve) => {
      let call: UpstreamCall | undefined;
      let settled = false;
      let upstreamStatus = 0;
      let streaming = false;
      const collected: Buffer[] = [];
      const splitter = new SseSplitter();
      const passthrough = ex.stream ? ex.codec.passthroughStream(ex) : undefined;
      const delivered: Buffer[] = [];
      let retained = 0;

      const settle = () => {
        if (settled) return false;
        settled = true;
        ex.usage ??= passthrough?.usage();
        if (!ex.usage && retained > 0) ex.set(deliveredFrames, delivered);
        resolve();
        return true;
      };
      const firstByte = () => {
        ex.ttfbMs ??= ex.elapsedMs();
      };
      const visit = (frame: Buffer): boolean => {
        for (const plugin of this.framePlugins) plugin.frame!(ex, frame);
        const keep = passthrough!.frame(frame);
        if (keep && retained < MAX_RETAINED_BYTES) {
          delivered.push(frame);
          retained += frame.length;
        }
        return keep;
      };
      let writable = true;
      const write = (bytes: Buffer) => {
        firstByte();
        if (!res.write(bytes)) writable = false;
      };

      ex.onAbort(() => {
        call?.abort();
        ex.outcome = 'aborted';
        settle();
      });

      call = upstream.send(req, {
        start: (status, headers) => {
          upstreamStatus = status;
          const contentType = String(headers['content-type'] ?? '');
          streaming = ex.stream && status < 300 && contentType.includes('text/event-stream');
          if (!streaming || ex.aborted) return;
          ex.status = 200;
          res.startStream(200, {
            'content-type': ex.codec.streamContentType,
            'cache-control': 'no-cache',
            'x-accel-buffering': 'no',
          });
        },
        data: (chunk) => {
          if (settled) return false;
          if (!streaming) {
            collected.push(chunk);
            return true;
          }
          writable = true;
          splitter.push(chunk, visit, write);
          if (!writable) res.onWritable(() => call!.resume());
          return writable;
        },
        end: () => {
          if (settled) return;
          if (streaming) {
            const rest = splitter.flush();
            if (rest && visit(rest)) write(rest);
            res.end();
          } else {
            this.finishCollected(ex, res, upstream, upstreamStatus, Buffer.concat(collected));
          }
          settle();
        },
        error: (err) => {
          if (settled) return;
          ex.error = err;
          ex.outcome = 'error';
          if (streaming) {
            res.end(ex.codec.streamErrorFrame(err));
          } else {
            this.fail(ex, res, err);
          }
          settle();
        },
      });
    });
  }

  /** A complete upstream body: pass a success through, map a failure to the client's terms. */
  private finishCollected(ex: Exchange, res: ClientResponse, upstream: Upstream, status: number, body: Buffer): void {
    if (status >= 200 && status < 300) {
      ex.status = status;
      ex.usage = ex.codec.bodyUsage(body);
      ex.ttfbMs ??= ex.elapsedMs();
      res.reply(status, { 'content-type': 'application/json' }, body);
      return;
    }
    const detail = upstreamMessage(body);
    if (status === 401 || status === 403) {
      this.fail(ex, res, new GatewayError('upstream_error', `Upstream \`${upstream.name}\` rejected the gateway's credentials (${status}).`));
    } else if (status >= 400 && status < 500) {
      // The client's own mistake as the upstream saw it: same status, same family, same body.
      ex.error = new GatewayError('invalid_request', detail ?? `Upstream answered ${status}.`, null, status);
      ex.outcome = 'error';
      ex.status = status;
      res.reply(status, { 'content-type': 'application/json' }, body);
    } else {
      const message = `Upstream \`${upstream.name}\` answered ${status}${detail ? `: ${detail}` : '.'}`;
      this.fail(ex, res, new GatewayError(status === 503 ? 'upstream_unavailable' : status === 504 ? 'upstream_timeout' : 'upstream_error', message));
    }
  }
}

/** Frames delivered to the client while usage was unknown, for a tokenizer estimate. */
export const deliveredFrames = new StateKey<Buffer[]>('delivered frames');

function upstreamMessage(body: Buffer): string | undefined {
  try {
    const parsed = JSON.parse(body.toString('utf8'));
    const message = parsed?.error?.message ?? parsed?.message;
    return typeof message === 'string' ? message.slice(0, 500) : undefined;
  } catch {
    return body.length ? body.toString('utf8', 0, 200) : undefined;
  }
}
