/**
 * An upstream reached over HTTP: an undici pool with keep-alive and connect, first-byte and idle
 * timeouts, shared by the upstream plugins that differ only in wire family and auth header. Calls
 * beyond the pool's connections wait in a bounded queue for a bounded time, then get a 503.
 */
import { Pool } from 'undici';
import type { ResponseSink, Upstream, UpstreamCall, UpstreamRequest } from './contracts.js';
import { GatewayError } from './errors.js';

export interface HttpUpstreamOptions {
  baseUrl: string;
  apiKey?: string;
  headers?: Record<string, string>;
  connections?: number;
  /** How long a call may wait for a free connection (default 5 s). */
  queueTimeoutMs?: number;
  /** How many calls may wait for a connection (default 4 × connections). */
  maxQueue?: number;
  timeouts?: { connectMs?: number; firstByteMs?: number; idleMs?: number };
}

function readOptions(name: string, raw: Record<string, unknown>): HttpUpstreamOptions {
  const o = raw as Partial<HttpUpstreamOptions>;
  if (typeof o.baseUrl !== 'string' || !/^https?:\/\//.test(o.baseUrl)) {
    throw new Error(`upstreams.${name}.baseUrl: an http(s) URL is required, e.g. https://api.openai.com/v1`);
  }
  if (o.apiKey !== undefined && typeof o.apiKey !== 'string') throw new Error(`upstreams.${name}.apiKey: must be a string`);
  for (const key of ['connections', 'queueTimeoutMs', 'maxQueue'] as const) {
    const value = o[key];
    if (value !== undefined && (!Number.isInteger(value) || value < (key === 'connections' ? 1 : 0))) {
      throw new Error(`upstreams.${name}.${key}: must be a whole number${key === 'connections' ? ' of at least 1' : ''}`);
    }
  }
  return o as HttpUpstreamOptions;
}

/** Maps a transport failure to the gateway's terms: refused → 503, timed out → 504, else 502. */
export function transportError(upstream: string, err: Error & { code?: string }): GatewayError {
  const code = err.code ?? (err.cause as { code?: string } | undefined)?.code;
  if (code === 'UND_ERR_CONNECT_TIMEOUT' || code === 'UND_ERR_HEADERS_TIMEOUT' || code === 'UND_ERR_BODY_TIMEOUT') {
    return new GatewayError('upstream_timeout', `Upstream \`${upstream}\` timed out (${code}).`);
  }
  if (code === 'ECONNREFUSED' || code === 'ENOTFOUND' || code === 'EHOSTUNREACH' || code === 'EAI_AGAIN') {
    return new GatewayError('upstream_unavailable', `Upstream \`${upstream}\` is unreachable (${code}).`);
  }
  return new GatewayError('upstream_error', `Upstream \`${upstream}\` failed: ${err.message}.`);
}

export interface HttpUpstreamKind {
  family: string;
  /** Headers that carry the upstream API key. */
  authHeaders(apiKey: string): Record<string, string>;
}

export function createHttpUpstream(kind: HttpUpstreamKind, name: string, raw: Record<string, unknown>): Upstream {
  const options = readOptions(name, raw);
  const url = new URL(options.baseUrl);
  const basePath = url.pathname.replace(/\/+$/, '');
  const timeouts = options.timeouts ?? {};
  const connections = options.connections ?? 256;
  const pool = new Pool(url.origin, {
    connections,
    connectTimeout: timeouts.connectMs ?? 10_000,
    headersTimeout: timeouts.firstByteMs ?? 120_000,
    bodyTimeout: timeouts.idleMs ?? 120_000,
    keepAliveTimeout: 30_000,
  });
  const fixedHeaders: Record<string, string> = { ...options.headers };
  if (options.apiKey) Object.assign(fixedHeaders, kind.authHeaders(options.apiKey));
  const gate = new ConnectionGate(name, connections, options.maxQueue ?? connections * 4, options.queueTimeoutMs ?? 5000);

  const dispatch = (call: HttpCall) => {
    const { req, sink } = call;
    pool.dispatch(
      { method: req.method, path: basePath + req.path, headers: { ...req.headers, ...fixedHeaders }, body: req.body },
      {
        onRequestStart(c) {
          call.controller = c;
          if (call.aborted) c.abort(new Error('client went away'));
        },
        onResponseStart(_c, status, headers) {
          sink.start(status, headers);
        },
        onResponseData(c, chunk) {
          if (!sink.data(chunk)) c.pause();
        },
        onResponseEnd() {
          gate.release(call);
          sink.end();
        },
        onResponseError(_c, err) {
          gate.release(call);
          if (!call.aborted) sink.error(transportError(name, err));
        },
      },
    );
  };

  return {
    name,
    family: kind.family,
    send(req, sink) {
      const call = new HttpCall(req, sink, gate);
      gate.admit(call, dispatch);
      return call;
    },
    close: () => pool.close(),
  };
}

/** One call to an HTTP upstream: waiting for a connection, or dispatched. */
class HttpCall implements UpstreamCall {
  controller: { pause(): void; resume(): void; abort(reason: Error): void } | undefined;
  aborted = false;
  /** Set while the call waits for a connection. */
  waiting: NodeJS.Timeout | undefined;

  constructor(
    readonly req: UpstreamRequest,
    readonly sink: ResponseSink,
    private readonly gate: ConnectionGate,
  ) {}

  pause(): void {
    this.controller?.pause();
  }

  resume(): void {
    this.controller?.resume();
  }

  abort(): void {
    if (this.aborted) return;
    this.aborted = true;
    if (this.waiting) this.gate.release(this);
    this.controller?.abort(new Error('client went away'));
  }
}

/**
 * Keeps calls to one upstream within its connections. undici would queue the rest without bound
 * (and a request could wait minutes for its 504); here at most `maxQueue` wait, each at most
 * `timeoutMs`, and the rest are refused at once with a 503 and Retry-After.
 */
class ConnectionGate {
  private active = 0;
  private readonly queue = new Set<{ call: HttpCall; start: (call: HttpCall) => void }>();
  private readonly entries = new Map<HttpCall, { call: HttpCall; start: (call: HttpCall) => void }>();

  constructor(
    private readonly name: string,
    private readonly connections: number,
    private readonly maxQueue: number,
    private readonly timeoutMs: number,
  ) {}

  admit(call: HttpCall, start: (call: HttpCall) => void): void {
    if (this.active < this.connections) {
      this.active++;
      return start(call);
    }
    if (this.queue.size >= this.maxQueue) {
      return this.refuse(call, `Upstream \`${this.name}\` is busy: all ${this.connections} connections are in use and ${this.maxQueue} calls are waiting.`);
    }
    const entry = { call, start };
    this.queue.add(entry);
    this.entries.set(call, entry);
    call.waiting = setTimeout(() => {
      this.forget(call);
      this.refuse(call, `Upstream \`${this.name}\` is busy: no connection came free within ${this.timeoutMs} ms.`);
    }, this.timeoutMs);
  }

  /** A call ended (or gave up waiting): its connection goes to the next in line. */
  release(call: HttpCall): void {
    if (call.waiting) return this.forget(call);
    this.active--;
    for (const next of this.queue) {
      this.forget(next.call);
      this.active++;
      return next.start(next.call);
    }
  }

  private forget(call: HttpCall): void {
    clearTimeout(call.waiting);
    call.waiting = undefined;
    const entry = this.entries.get(call);
    if (entry) this.queue.delete(entry);
    this.entries.delete(call);
  }

  private refuse(call: HttpCall, message: string): void {
    // Never from inside send(): the caller has not got the call object yet.
    queueMicrotask(() => call.sink.error(new GatewayError('upstream_busy', message, null, undefined, undefined, 1)));
  }
}
