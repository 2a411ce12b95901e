/**
 * An upstream reached over HTTP: an undici pool with keep-alive and four deadlines per call
 * (connect, first byte, idle between chunks, total), shared by the upstream plugins that differ
 * only in wire family, auth header and, at most, where each request goes. Calls beyond the pool's connections wait in a bounded queue
 * for a bounded time, then get a 503.
 */
import { createRequire } from 'node:module';
import type { ResponseSink, Upstream, UpstreamCall, UpstreamRequest, UpstreamStats } from './contracts.js';
import { GatewayError } from './errors.js';
import { secretsOf } from './upstream-secrets.js';

/**
 * undici, loaded when the first upstream is made rather than with this module: the plugin API
 * re-exports createHttpUpstream, and a process that never calls an upstream (the simulator's own
 * server) would otherwise pay its load, about a third of that process's start.
 */
const requireCjs = createRequire(import.meta.url);
let loadedUndici: typeof import('undici') | undefined;
const undici = () => (loadedUndici ??= requireCjs('undici') as typeof import('undici'));

export interface HttpUpstreamOptions {
  baseUrl: string;
  apiKey?: string;
  headers?: Record<string, string>;
  connections?: number;
  /** How long a call may wait for a free connection (default 5 s). */
  queueTimeoutMs?: number;
  /** How many calls may wait for a connection (default 4 × connections). */
  maxQueue?: number;
  timeouts?: Partial<Timeouts>;
}

/** A call's deadlines, in milliseconds; each failure names the one that fired. */
export interface Timeouts {
  /** Until the TCP (and TLS) connection is up. */
  connectMs: number;
  /** From sending the request until the answer's status and headers. */
  firstByteMs: number;
  /** Between two chunks of the answer. */
  idleMs: number;
  /** The whole call, from sending (or queueing) to the answer's last byte. */
  totalMs: number;
}

export const defaultTimeouts: Timeouts = { connectMs: 10_000, firstByteMs: 120_000, idleMs: 120_000, totalMs: 1_800_000 };

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

const timeoutByCode: Record<string, keyof Timeouts> = {
  UND_ERR_CONNECT_TIMEOUT: 'connectMs',
  UND_ERR_HEADERS_TIMEOUT: 'firstByteMs',
  UND_ERR_BODY_TIMEOUT: 'idleMs',
};

const timeoutWhat: Record<keyof Timeouts, string> = {
  connectMs: 'did not accept a connection',
  firstByteMs: 'sent no first byte',
  idleMs: 'sent nothing more',
  totalMs: 'did not finish its answer',
};

/** A deadline fired: the message says which, and `param` names its option (`timeouts.firstByteMs`). */
export function timeoutError(upstream: string, which: keyof Timeouts, ms: number): GatewayError {
  return new GatewayError('upstream_timeout', `Upstream \`${upstream}\` ${timeoutWhat[which]} within ${ms} ms (timeouts.${which}).`, `timeouts.${which}`);
}

/** Maps a transport failure to the gateway's terms: refused → 503, timed out → 504, else 502. */
export function transportError(upstream: string, err: Error & { code?: string }, timeouts: Timeouts): GatewayError {
  const code = err.code ?? (err.cause as { code?: string } | undefined)?.code;
  const which = code && timeoutByCode[code];
  if (which) return timeoutError(upstream, which, timeouts[which]);
  if (code === 'ECONNREFUSED' || code === 'ENOTFOUND' || code === 'EHOSTUNREACH' || code === 'EAI_AGAIN') {
    return new GatewayError('upstream_unavailable', `Upstream \`${upstream}\` is unreachable (${code}).`);
  }
  return new GatewayError('upstream_error', `Upstream \`${upstream}\` failed: ${err.message}.`);
}

export interface HttpUpstreamKind {
  /** The wire family spoken: the dialect of that name builds the requests and reads the answers. */
  family: string;
  /** Headers that carry the upstream API key. */
  authHeaders(apiKey: string): Record<string, string>;
  /**
   * Where `req` goes, as a path and query under the base URL's path, when the kind's URLs differ
   * from its dialect's (a deployment in the path, an api-version query); `req.path` when absent.
   */
  target?(req: UpstreamRequest): string;
}

export function createHttpUpstream(kind: HttpUpstreamKind, name: string, raw: Record<string, unknown>): Upstream {
  const options = readOptions(name, raw);
  const url = new URL(options.baseUrl);
  const basePath = url.pathname.replace(/\/+$/, '');
  // Shown in errors: the origin drops any user:password, the path leaves out the query.
  const shownBase = url.origin + basePath;
  // A base URL with no version segment is the usual cause; the dialect's own URLs say which one.
  const versionHint = kind.target || /\/v\d/.test(basePath) ? '' : `: does it need ${kind.family === 'gemini' ? '/v1beta' : '/v1'} at the end?`;
  const missingRouteError = (method: string, path: string) =>
    new GatewayError(
      'upstream_error',
      `Upstream \`${name}\` has no ${method} ${url.origin}${withoutSecrets(path)} (it answered 404). Check upstreams.${name}.baseUrl, now ${shownBase}${versionHint || '.'}`,
    );
  const timeouts: Timeouts = { ...defaultTimeouts, ...options.timeouts };
  const connections = options.connections ?? 256;
  const pool = new (undici().Pool)(url.origin, {
    connections,
    connectTimeout: timeouts.connectMs,
    headersTimeout: timeouts.firstByteMs,
    bodyTimeout: timeouts.idleMs,
    keepAliveTimeout: 30_000,
  });
  /** The upstream's configured headers and its key, sent with every call. */
  const fixedHeaders = new Map(Object.entries({ ...options.headers, ...(options.apiKey && kind.authHeaders(options.apiKey)) }));
  const gate = new ConnectionGate(name, connections, options.maxQueue ?? connections * 4, options.queueTimeoutMs ?? 5000);

  const dispatch = (call: HttpCall) => {
    const req = call.req!;
    const sink = call.sink;
    // undici holds what it needs from here on: a long stream must not keep the request twice.
    call.req = undefined;
    // Names and values in turn, as undici takes them, the configured headers winning over the
    // request's. Not an object spread of the two: on Node 20 a spread of two sources is allocated
    // straight into the old generation (a literal or a one-source spread is not), and with the
    // array undici's Object.keys made of it, it was 220 of the 314 bytes per exchange that outlived
    // the young generation: at 10,000 req/s a mark-compact every 2 to 4 s.
    const headers: string[] = [];
    for (const name in req.headers) if (!fixedHeaders.has(name)) headers.push(name, req.headers[name]!);
    for (const [name, value] of fixedHeaders) headers.push(name, value);
    if (req.traceparent) headers.push('traceparent', req.traceparent);
    if (req.tracestate) headers.push('tracestate', req.tracestate);
    const body = typeof req.body === 'string' ? Buffer.from(req.body) : req.body;
    const large = body !== undefined && body.length > HELD_BODY_BYTES;
    if (large) headers.push('content-length', String(body.length));
    const path = basePath + (kind.target ? kind.target(req) : req.path);
    /** A 404, held back until its body says whether the URL itself is missing (see routeMissing). */
    let notFound: { headers: Record<string, string | string[] | undefined>; chunks: Buffer[]; bytes: number } | undefined;
    // undici takes any iterable of chunks as a body (sentOnce); its types list only some.
    pool.dispatch(
      { method: req.method, path, headers, body: large ? (sentOnce(body) as unknown as Buffer) : body },
      {
        onRequestStart(c) {
          call.controller = c;
          if (call.stopped) c.abort(new Error('call stopped'));
        },
        onResponseStart(_c, status, headers) {
          if (status === 404) notFound = { headers, chunks: [], bytes: 0 };
          else if (!call.stopped) sink.start(status, headers);
        },
        onResponseData(c, chunk) {
          if (notFound) {
            if (notFound.bytes < NOT_FOUND_BODY_BYTES) notFound.chunks.push(chunk.subarray(0, NOT_FOUND_BODY_BYTES - notFound.bytes));
            notFound.bytes += chunk.length;
          } else if (!call.stopped && !sink.data(chunk)) c.pause();
        },
        onResponseEnd() {
          gate.release(call);
          if (!call.settle()) return;
          if (!notFound) return sink.end();
          const answer = Buffer.concat(notFound.chunks);
          if (routeMissing(answer)) return sink.error(missingRouteError(req.method, path));
          sink.start(404, notFound.headers);
          if (answer.length) sink.data(answer);
          sink.end();
        },
        onResponseError(_c, err) {
          gate.release(call);
          if (call.settle()) sink.error(transportError(name, err, timeouts));
        },
      },
    );
  };

  return {
    name,
    family: kind.family,
    secrets: secretsOf([options.apiKey, ...fixedHeaders.values()]),
    send(req, sink) {
      const call = new HttpCall(req, sink, gate);
      call.deadline = setTimeout(() => call.fail(timeoutError(name, 'totalMs', timeouts.totalMs)), timeouts.totalMs);
      gate.admit(call, dispatch);
      return call;
    },
    close: () => pool.close(),
    stats: () => gate.stats(),
  };
}

/**
 * A path to show in an error. Keys travel in headers (HttpUpstreamKind.authHeaders); a kind's
 * query parameter that still looks like a credential is hidden all the same.
 */
function withoutSecrets(path: string): string {
  return path.replace(/([?&][^=&]*(?:key|token|secret|sig|password|auth)[^=&]*=)[^&]*/gi, '$1…');
}

/** Enough of a 404's body to tell a provider's error from a page about a missing URL. */
const NOT_FOUND_BODY_BYTES = 16 * 1024;

/** Messages that say only that the URL does not exist, lower-cased, without a trailing `(POST /path)` or full stop. */
const NO_SUCH_URL = [
  /^invalid url\b/, // OpenAI: "Invalid URL (POST /chat/completions)"
  /^(?:404\s*[:-]?\s*)?(?:(?:page|file|path|route|endpoint|url|resource|method)\s+)?not found$/, // "Not Found" (Anthropic, FastAPI), "404 page not found" (Go), "Resource not found" (Azure)
  /^(?:no|unknown) (?:route|path|endpoint|url)\b/,
  /^cannot (?:get|post|put|patch|delete)\b/, // Express
];

/**
 * Whether an upstream's 404 says its URL does not exist (a base URL without `/v1`, say), as
 * opposed to the provider speaking about the request (a model, a deployment or a previous
 * response it does not know). The first is the gateway's misconfiguration and becomes a 502 that
 * names the URL; the second reaches the client as the upstream's own 404. A URL that does not
 * exist gets a web server's page (HTML, plain text, empty), a JSON body without an error message
 * (`{"detail":"Not Found"}`), or an error message that says no more than "not found".
 */
export function routeMissing(body: Buffer): boolean {
  let parsed: any;
  try {
    parsed = JSON.parse(body.toString('utf8'));
  } catch {
    return true;
  }
  const error = parsed?.error;
  const message = typeof error === 'string' ? error : typeof error?.message === 'string' ? error.message : parsed?.message;
  if (typeof message !== 'string' || message.trim() === '') return true;
  const said = message
    .trim()
    .toLowerCase()
    .replace(/\s*\([^)]*\)$/, '')
    .replace(/[.!]+$/, '');
  return NO_SUCH_URL.some((pattern) => pattern.test(said));
}

/** Bodies above this go to undici as a one-shot iterable: it keeps a Buffer body until the answer ends. */
const HELD_BODY_BYTES = 16 * 1024;

/**
 * The body as an iterable that lets go of it once undici has taken it. A plain object: a
 * generator would keep the buffer alive in its closure.
 */
function sentOnce(body: Buffer): Iterable<Buffer> {
  let rest: Buffer | undefined = body;
  const iterator: Iterator<Buffer> = {
    next() {
      const value = rest;
      rest = undefined;
      return value ? { value, done: false } : { value: undefined, done: true };
    },
  };
  return { [Symbol.iterator]: () => iterator };
}

/** One call to an HTTP upstream: waiting for a connection, or dispatched. */
class HttpCall implements UpstreamCall {
  controller: { pause(): void; resume(): void; abort(reason: Error): void } | undefined;
  /** The sink has heard the end (or the client left): nothing more reaches it. */
  stopped = false;
  /** Set while the call waits for a connection. */
  waiting: NodeJS.Timeout | undefined;
  /** The total deadline. */
  deadline: NodeJS.Timeout | undefined;

  constructor(
    /** Until dispatched. */
    public req: UpstreamRequest | undefined,
    readonly sink: ResponseSink,
    private readonly gate: ConnectionGate,
  ) {}

  pause(): void {
    this.controller?.pause();
  }

  resume(): void {
    this.controller?.resume();
  }

  /** The client went away. */
  abort(): void {
    if (this.settle()) this.stopTransport();
  }

  /** The call fails now (a deadline, a full queue): the sink hears it at once, undici stops as soon as it can. */
  fail(err: GatewayError): void {
    if (!this.settle()) return;
    this.stopTransport();
    this.sink.error(err);
  }

  /** Marks the call over for its sink; false when it already was. */
  settle(): boolean {
    if (this.stopped) return false;
    this.stopped = true;
    clearTimeout(this.deadline);
    return true;
  }

  /** A waiting call leaves the queue; a dispatched one is aborted (undici then frees its connection). */
  private stopTransport(): void {
    if (this.waiting) this.gate.release(this);
    this.controller?.abort(new Error('call stopped'));
  }
}

interface QueuedCall {
  call: HttpCall;
  start: (call: HttpCall) => void;
  /** performance.now() when it began to wait. */
  since: number;
}

/**
 * Keeps calls to one upstream within its connections. undici would queue the rest without bound
 * (and a request could wait minutes for its 504); here at most `maxQueue` wait, each at most
 * `timeoutMs`, and the rest are refused at once with a 503 and Retry-After.
 */
class ConnectionGate {
  private active = 0;
  private readonly queue = new Set<QueuedCall>();
  private readonly entries = new Map<HttpCall, QueuedCall>();
  // Counted only off the fast path: when a call has to wait, or is refused.
  private waits = 0;
  private waitMs = 0;
  private refused = 0;

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
    const entry = { call, start, since: performance.now() };
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
      this.waits++;
      this.waitMs += performance.now() - next.since;
      return next.start(next.call);
    }
  }

  stats(): UpstreamStats {
    return { connections: this.connections, busy: this.active, queued: this.queue.size, waits: this.waits, waitSeconds: this.waitMs / 1000, refused: this.refused };
  }

  private forget(call: HttpCall): void {
    clearTimeout(call.waiting);
    call.waiting = undefined;
    const entry = this.entries.get(call);
    if (entry) this.queue.delete(entry);
    this.entries.delete(call);
  }

  private refuse(call: HttpCall, message: string): void {
    this.refused++;
    // Never from inside send(): the caller has not got the call object yet.
    queueMicrotask(() => call.fail(new GatewayError('upstream_busy', message, null, undefined, undefined, 1)));
  }
}
