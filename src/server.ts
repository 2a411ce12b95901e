/**
 * The uWebSockets.js adapter: routes, header copying, request framing checks, body collection
 * within limits, corked writes with backpressure, shedding under overload, and draining on
 * shutdown. Every exchange is handed to the pipeline, which owns it to its end.
 */
import { createServer } from 'node:net';
import { STATUS_CODES } from 'node:http';
import { loadUws, type HttpRequest, type HttpResponse, type us_listen_socket } from './uws.js';
import type { Logger } from 'pino';
import type { Config } from './config/types.js';
import type { ClientFamily, Endpoint, JsonHandler, JsonReply } from './contracts.js';
import { GatewayError } from './errors.js';
import { Exchange } from './exchange.js';
import type { ClientResponse } from './client-response.js';
import type { Pipeline } from './pipeline.js';
import { RouteHints, type ServedRoute } from './server-route-hints.js';
import { addSocketRoutes, type OpenSockets } from './socket.js';

export interface ServerOptions {
  host: string;
  port: number;
  /** Worker threads listen on one port together (the kernel spreads connections between them). */
  sharedPort?: boolean;
  limits: Config['server'];
  /** The client families whose endpoints are served. */
  families: ClientFamily[];
  pipeline: Pipeline;
  /** Extra routes by path prefix, e.g. `/admin/` (a prefix without a trailing slash also matches itself). */
  jsonRoutes?: Record<string, JsonHandler>;
  log: Logger;
}

export interface RunningServer {
  port: number;
  /**
   * Stops accepting, lets in-flight exchanges finish until the timeout, then ends each remaining
   * one with its family's failure (outcome `shutdown`) and closes the sockets.
   */
  drain(timeoutMs: number): Promise<void>;
}

const statusLine = (status: number) => `${status} ${STATUS_CODES[status] ?? ''}`;

type Candidates = { family: ClientFamily; endpoint: Endpoint }[];

/**
 * A 404 for whatever no family endpoint or route serves. When the path is served with its version
 * prefix fixed, the 404 says so, in the shape of the family that serves it (its SDK then shows
 * the message); otherwise in the OpenAI shape, as before.
 */
function noRoute(res: HttpResponse, req: HttpRequest, hints?: RouteHints<Candidates>): void {
  const method = req.getMethod().toUpperCase();
  const path = req.getUrl();
  const { message, suggested } = hints?.hint(method, path) ?? { message: `No route for ${method} ${path}.` };
  let status = 404;
  let body: string;
  if (suggested) {
    const { headers } = copyHeaders(req);
    const { family } = suggested.find((c) => !c.endpoint.when || c.endpoint.when(headers)) ?? suggested[0]!;
    const err = new GatewayError('not_found', message);
    status = family.errorStatus?.(err) ?? err.status;
    body = family.errorBody(err);
  } else {
    body = JSON.stringify({ error: { message, type: 'invalid_request_error', param: null, code: 'not_found' } });
  }
  res.cork(() => res.writeStatus(statusLine(status)).writeHeader('content-type', 'application/json').end(body));
}

/**
 * Writes are handed to uWS in slices of this size: one slice and its chunk framing fit uWS's 16 KB
 * cork buffer (one syscall each), and what uWS holds when the client is slow stays small.
 */
const SLICE_BYTES = 16 * 1024 - 64;
/** A stream that has written nothing for this long gets a filler (see UwsResponse). */
const HEARTBEAT_MS = 5000;
/** Replies larger than this are sent in slices (chunked) like a stream, so a slow reader is not cut. */
const LARGE_REPLY_BYTES = 64 * 1024;
/** Body bytes that may arrive before the headers are accepted; past them the upload is paused. */
const EARLY_BYTES = 64 * 1024;
/**
 * Admin and console bodies are small JSON (a group, a key, a sign-in). They are read only after
 * the route's `beforeBody` check (the admin token), within the in-flight body budget.
 */
const MAX_JSON_ROUTE_BODY_BYTES = 64 * 1024;

/** What every response of one server shares: limits, the body budget, the writers under way. */
interface ServerContext {
  pipeline: Pipeline;
  maxBodyBytes: number;
  maxInFlightBodyBytes: number;
  bodyBytesInFlight: number;
  writeStallMs: number;
  /** Streams and large replies under way: one timer probes those whose client is behind and heartbeats the quiet ones. */
  writers: Set<UwsResponse>;
}

export function startServer(options: ServerOptions): Promise<RunningServer> {
  const uWS = loadUws();
  const { pipeline, limits, log } = options;
  // No `uWebSockets: 20` header on every response.
  (uWS as unknown as { _cfg(key: string): void })._cfg('silent');
  const app = uWS.App();
  const sockets: OpenSockets = new Set();
  let draining = false;
  const context: ServerContext = {
    pipeline,
    maxBodyBytes: limits.maxBodyBytes,
    maxInFlightBodyBytes: limits.maxInFlightBodyBytes,
    bodyBytesInFlight: 0,
    writeStallMs: limits.writeStallMs,
    writers: new Set(),
  };
  const probeMs = Math.max(50, Math.min(1000, Math.floor(limits.writeStallMs / 8)));
  const prober = setInterval(() => {
    const now = Date.now();
    for (const writer of context.writers) writer.tick(now);
  }, probeMs).unref();

  /** Admin, console and metrics requests under way: they count against maxConnections too. */
  let jsonInFlight = 0;
  const overloaded = () => pipeline.inFlight.size + sockets.size + jsonInFlight >= limits.maxConnections;

  /** Endpoints by method and path: families may share one (a model list), told apart by `when`. */
  const routes = new Map<string, Candidates>();
  /** Every family path, sockets and probes too, for what a 404 suggests. */
  const served: ServedRoute<Candidates>[] = [];
  for (const family of options.families) {
    addSocketRoutes(app, family, pipeline, {
      limits: limits.websocket,
      maxMessageBytes: limits.maxBodyBytes,
      writeStallMs: limits.writeStallMs,
      copyHeaders: (req) => copyHeaders(req).headers,
      sockets,
      refuse: () => (draining ? 'shutting_down' : overloaded() ? 'overloaded' : undefined),
    });
    for (const endpoint of family.endpoints) {
      served.push({ method: endpoint.method, pattern: endpoint.path, value: [{ family, endpoint }] });
      if (endpoint.kind === 'socket') continue;
      const key = `${endpoint.method} ${endpoint.path}`;
      routes.set(key, [...(routes.get(key) ?? []), { family, endpoint }]);
    }
  }
  for (const candidates of routes.values()) {
    // Endpoints with a condition are asked first; one without takes what they leave.
    candidates.sort((a, b) => Number(!a.endpoint.when) - Number(!b.endpoint.when));
    const { method, path, kind } = candidates[0]!.endpoint;
    if (kind === 'probe') {
      app[method](path, (res) => void res.cork(() => res.writeStatus(statusLine(200)).endWithoutBody(0)));
      continue;
    }
    const paramCount = path.split('/').filter((s) => s.startsWith(':')).length;
    app[method](path, (res, req) => {
      const { headers, repeated } = copyHeaders(req);
      const chosen = candidates.find((c) => !c.endpoint.when || c.endpoint.when(headers));
      // The path is served, for requests that say which API they speak: no other path to suggest.
      if (!chosen) return noRoute(res, req);
      const { family, endpoint } = chosen;
      const params = Array.from({ length: paramCount }, (_, i) => req.getParameter(i) ?? '');
      const ex = new Exchange(family, endpoint, req.getMethod().toUpperCase(), req.getUrl(), req.getQuery() ?? '', headers, params);
      const framing = endpoint.method === 'post' ? bodyFraming(headers, repeated, limits.maxBodyBytes) : { length: 0 };
      const out = new UwsResponse(res, context, ex, framing);
      if (framing.error) return pipeline.reject(ex, out, framing.error);
      if (draining) return pipeline.reject(ex, out, new GatewayError('shutting_down', 'The gateway is shutting down.', null, undefined, undefined, 5));
      if (overloaded()) return pipeline.reject(ex, out, atCapacity());
      pipeline.accept(ex, out);
    });
  }

  for (const [prefix, handler] of Object.entries(options.jsonRoutes ?? {})) {
    const route = (res: HttpResponse, req: HttpRequest) => {
      const method = req.getMethod().toUpperCase();
      const path = req.getUrl();
      const query = new URLSearchParams(req.getQuery() ?? '');
      const { headers, repeated } = copyHeaders(req);
      const remoteAddress = Buffer.from(res.getRemoteAddressAsText()).toString();
      let reserved = 0;
      jsonInFlight++;
      // Once, on the reply or the client's leaving: the slot and the body budget come back.
      const writer = new JsonWriter(res, () => {
        jsonInFlight--;
        context.bodyBytesInFlight -= reserved;
        reserved = 0;
      });
      // Reads are still served at capacity: an operator can see what is going on.
      if (overloaded() && method !== 'GET' && method !== 'HEAD') return writer.send(jsonError(atCapacity()), true);
      const failed = (err: unknown) => {
        log.error({ err }, 'json route failed');
        return { status: 500, body: { error: { message: 'internal error', code: 'internal_error' } } };
      };
      const answer = (body: Buffer) => {
        Promise.resolve()
          .then(() => handler({ method, path, query, headers, body, remoteAddress }))
          .catch(failed)
          .then((reply) => writer.send(reply, false, method === 'HEAD'))
          .catch((err) => {
            log.error({ err }, 'json route reply failed');
            writer.send({ status: 500, body: { error: { message: 'internal error', code: 'internal_error' } } });
          });
      };
      if (method === 'GET' || method === 'DELETE' || method === 'HEAD') return answer(Buffer.alloc(0));
      const framing = bodyFraming(headers, repeated, MAX_JSON_ROUTE_BODY_BYTES);
      if (framing.error) return writer.send(jsonError(framing.error), true);
      // Holds at most EARLY_BYTES, then pauses the upload, until the body is wanted.
      const reader = new BodyReader(res, framing.length, MAX_JSON_ROUTE_BODY_BYTES);
      const readBody = () => {
        const reserve = reader.complete ? 0 : (framing.length ?? MAX_JSON_ROUTE_BODY_BYTES);
        if (!takeBodyBudget(context, reserve)) return writer.send(jsonError(bodiesOverloaded()), true);
        reserved = reserve;
        reader.read(answer, (err) => writer.send(jsonError(err), true));
      };
      // The caller is checked on its headers first: a refused caller's body is never read.
      const early = handler.beforeBody?.({ method, path, query, headers, remoteAddress });
      if (!early) return readBody();
      Promise.resolve(early)
        .catch(failed)
        .then((reply) => (reply ? writer.send(reply, true) : readBody()));
    };
    app.any(prefix.endsWith('/') ? `${prefix}*` : prefix, route);
    if (!prefix.endsWith('/')) app.any(`${prefix}/*`, route);
  }

  app.get('/healthz', (res) => {
    res.cork(() => res.writeHeader('content-type', 'application/json').end(draining ? '{"status":"draining"}' : '{"status":"ok"}'));
  });

  const hints = new RouteHints(served.map((r) => ({ ...r, value: routes.get(`${r.method} ${r.pattern}`) ?? r.value })));
  app.any('/*', (res, req) => noRoute(res, req, hints));

  return new Promise((resolve, reject) => {
    // Exclusive: a second Sluice on the same port fails here instead of silently taking half the
    // traffic. Worker threads share theirs (the primary thread checked the port was free).
    // Not in the 20.30 type declarations, but in the binary.
    const exclusive = (uWS as unknown as { LIBUS_LISTEN_EXCLUSIVE_PORT: number }).LIBUS_LISTEN_EXCLUSIVE_PORT;
    const listen = app.listen as unknown as (host: string, port: number, options: number, done: (socket: us_listen_socket | false) => void) => void;
    listen.call(app, options.host, options.port, options.sharedPort ? 0 : exclusive, (socket) => {
      if (!socket) {
        clearInterval(prober);
        return void whyCannotListen(options.host, options.port).then((reason) => reject(new Error(`cannot listen on ${options.host}:${options.port}: ${reason}`)));
      }
      resolve({
        port: uWS.us_socket_local_port(socket),
        async drain(timeoutMs) {
          draining = true;
          uWS.us_listen_socket_close(socket);
          const deadline = Date.now() + timeoutMs;
          while (pipeline.inFlight.size > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 25));
          pipeline.interruptAll();
          // Let the failure events leave before the sockets close.
          await new Promise((r) => setTimeout(r, 50));
          for (const socket of sockets) socket.close(1001, 'the gateway is shutting down');
          clearInterval(prober);
          // Idle keep-alive connections too (in the binary, not in the 20.30 declarations): uWS
          // would hold them, and a worker thread's event loop with them, for its 10 s idle timeout.
          (app as unknown as { close(): void }).close();
        },
      });
    });
  });
}

/** uWS says only that listening failed; the operating system says why. */
function whyCannotListen(host: string, port: number): Promise<string> {
  return new Promise((resolve) => {
    const probe = createServer();
    probe.once('error', (err: NodeJS.ErrnoException) => {
      const reasons: Record<string, string> = {
        EADDRINUSE: 'the address is already in use (is another Sluice running?)',
        EACCES: 'permission denied (ports below 1024 need privileges)',
        EADDRNOTAVAIL: 'the address is not available on this machine',
      };
      resolve(reasons[err.code ?? ''] ?? `${err.message}`);
    });
    probe.listen({ host, port, exclusive: true }, () => probe.close(() => resolve('uWebSockets.js refused the address')));
  });
}

function copyHeaders(req: HttpRequest): { headers: Record<string, string>; repeated: Set<string> | undefined } {
  const headers: Record<string, string> = {};
  let repeated: Set<string> | undefined;
  req.forEach((k, v) => {
    if (k in headers) (repeated ??= new Set()).add(k);
    headers[k] = v;
  });
  return { headers, repeated };
}

const atCapacity = () => new GatewayError('overloaded', 'The gateway is at capacity; try again shortly.', null, undefined, undefined, 1);
const bodiesOverloaded = () => new GatewayError('overloaded', 'Too many request bodies are being received; try again shortly.', null, undefined, undefined, 1);

/** Takes `bytes` of the in-flight body budget shared by every route; false when it is spent. */
function takeBodyBudget(context: ServerContext, bytes: number): boolean {
  if (context.bodyBytesInFlight + bytes > context.maxInFlightBodyBytes) return false;
  context.bodyBytesInFlight += bytes;
  return true;
}

/** A gateway error as an admin, console or metrics reply. */
function jsonError(err: GatewayError): JsonReply {
  const reply: JsonReply = { status: err.status, body: { error: { message: err.message, code: err.code } } };
  if (err.retryAfterSeconds !== undefined) reply.headers = { 'retry-after': String(err.retryAfterSeconds) };
  return reply;
}

function emptyBody(ex: Exchange): GatewayError {
  return new GatewayError('invalid_request', `The request body is empty: ${ex.method} ${ex.path} needs a JSON object. Send one, with Content-Type: application/json.`);
}

/** How a request body is framed: its declared length (undefined when chunked), or why it is refused. */
interface BodyFraming {
  length?: number;
  error?: GatewayError;
}

/** Checks Content-Length before anything is allocated. */
function bodyFraming(headers: Record<string, string>, repeated: Set<string> | undefined, limit: number): BodyFraming {
  const declared = headers['content-length'];
  if (repeated?.has('content-length')) return { error: new GatewayError('invalid_request', 'The request has more than one Content-Length header.') };
  const coding = headers['transfer-encoding'];
  if (coding !== undefined) {
    // uWS decodes any value that contains "chunked" as chunked: anything but exactly that is
    // refused (RFC 9112 §6.1: chunked must come last; a coding the server lacks is a 501).
    const codings = coding.toLowerCase().split(',').map((c) => c.trim());
    if (codings.at(-1) !== 'chunked') return { error: new GatewayError('invalid_request', `Transfer-Encoding "${coding.slice(0, 64)}" does not end in chunked: send Transfer-Encoding: chunked, or a Content-Length.`) };
    if (codings.length > 1) return { error: new GatewayError('unsupported_transfer_encoding', `Transfer-Encoding "${coding.slice(0, 64)}" is not supported: send Transfer-Encoding: chunked alone, or a Content-Length.`) };
  }
  if (declared === undefined) {
    // Chunked: read up to the limit. Neither header: HTTP/1.1 says the body is empty (RFC 9112
    // §6.3), which is what `curl -X POST` without data sends; the route says if it needs one.
    return { length: coding !== undefined ? undefined : 0 };
  }
  if (!/^\d{1,15}$/.test(declared)) return { error: new GatewayError('invalid_request', `The Content-Length header "${declared.slice(0, 32)}" is not a byte count.`) };
  const length = Number(declared);
  if (length > limit) return { error: new GatewayError('request_too_large', `The request body (${length} bytes) exceeds the limit of ${limit} bytes.`) };
  return { length };
}

/**
 * Collects a request body under its limit. uWS lends each chunk only for the duration of the
 * callback, so every chunk is copied; once the body is wanted and its length is known, the copies
 * go straight into one buffer. The data handler is attached at once (uWS drops data that arrives
 * without one). Until the headers are accepted (an async key check), at most EARLY_BYTES wait;
 * past that the socket is paused, which also hides a client leaving, so only then.
 */
class BodyReader {
  complete = false;
  private body: Buffer | undefined;
  private early: Buffer[] | undefined = [];
  private size = 0;
  private paused = false;
  private failed: GatewayError | undefined;
  private onBody: ((body: Buffer) => void) | undefined;
  private onRefused: ((err: GatewayError) => void) | undefined;

  constructor(
    private readonly res: HttpResponse,
    private readonly declared: number | undefined,
    private readonly limit: number,
  ) {
    if (declared === 0) this.complete = true;
    else res.onData((chunk, isLast) => this.take(chunk, isLast));
  }

  read(onBody: (body: Buffer) => void, onRefused: (err: GatewayError) => void): void {
    this.onBody = onBody;
    this.onRefused = onRefused;
    const early = this.early!;
    this.early = undefined;
    if (this.declared !== undefined && !this.complete) {
      this.body = Buffer.allocUnsafe(this.declared);
      let at = 0;
      for (const piece of early) at += piece.copy(this.body, at);
    } else if (early.length) {
      this.early = early;
    }
    if (this.paused) {
      this.paused = false;
      this.res.resume();
    }
    this.deliver();
  }

  private take(chunk: ArrayBuffer, isLast: boolean): void {
    if (this.failed || this.complete) return;
    const bytes = new Uint8Array(chunk);
    if (this.size + bytes.length > (this.declared ?? this.limit)) {
      this.failed = new GatewayError('request_too_large', `The request body exceeds ${this.declared ?? this.limit} bytes.`);
    } else {
      if (this.body) this.body.set(bytes, this.size);
      else (this.early ??= []).push(Buffer.from(bytes));
      this.size += bytes.length;
      this.complete = isLast;
      if (!this.onBody && !this.complete && this.size > EARLY_BYTES && !this.paused) {
        this.paused = true;
        this.res.pause();
      }
    }
    this.deliver();
  }

  private deliver(): void {
    if (this.failed && this.onRefused) {
      const refuse = this.onRefused;
      this.onRefused = this.onBody = undefined;
      refuse(this.failed);
    } else if (this.complete && this.onBody) {
      const deliver = this.onBody;
      this.onBody = this.onRefused = undefined;
      const body = this.body ? this.body.subarray(0, this.size) : Buffer.concat(this.early ?? [], this.size);
      // The exchange owns it from here: a stream may outlive this reader by hours.
      this.body = this.early = undefined;
      deliver(body);
    }
  }
}

/**
 * The pipeline's view of one uWS response: every write corked, nothing written after close, the
 * body read only once the headers were accepted, and slow clients handled without the upstream
 * racing ahead.
 *
 * Backpressure: uWS 20.30 closes a connection 10 s after a write it could not complete unless the
 * socket reports writable in time, and a slowly reading client can take far longer than that to
 * free enough room. So writes go to uWS in slices small enough for one corked syscall each; when
 * one is refused, the socket is paused (which disarms that timeout; every refused write re-arms
 * it, so every one is followed by a pause), the upstream waits, and a timer probes the client with
 * one more byte of what waits or, in a stream, a filler (an SSE comment, or a space between JSON
 * elements: every stream write ends at an event boundary). uWS first tries to pass on what it
 * holds, so an accepted probe means the client took everything. No accepted probe for
 * `writeStallMs`: the client is cut and the exchange ends as `client_stalled`. A stream that has
 * written nothing for HEARTBEAT_MS gets a filler too, which also finds a refusal uWS did not
 * report (a corked write can look accepted) and a client that left while the upstream was quiet.
 */
class UwsResponse implements ClientResponse {
  /** The response is complete or the connection is gone: nothing more is written. */
  private closed = false;
  private pendingHead: { status: number; headers: Record<string, string> } | undefined;
  private readonly body: BodyReader | undefined;
  private bodyReserved = 0;
  /** Paused (see begin): resumed when the response ends. */
  private paused = false;
  /** Bytes uWS has not been given yet because the client is behind. */
  private readonly held: Buffer[] = [];
  /** What a refused write could not hand over, for the caller to hold. */
  private unsent: Buffer | undefined;
  private blocked = false;
  private lastProgress = 0;
  /** A harmless write between events, for probes and heartbeats; undefined for a plain body. */
  private filler: string | undefined;
  /** Writes so far, and what the heartbeat saw last time, so a write costs no clock read. */
  private writes = 0;
  private seenWrites = -1;
  private quietSince = 0;
  private ending = false;
  private resumeUpstream: (() => void) | undefined;

  constructor(
    private readonly res: HttpResponse,
    private readonly context: ServerContext,
    private readonly ex: Exchange,
    private readonly framing: BodyFraming,
  ) {
    res.onAborted(() => {
      this.closed = true;
      this.forget();
      context.pipeline.interrupt(ex, this, 'aborted');
    });
    if (ex.endpoint.method === 'post' && !framing.error) this.body = new BodyReader(res, framing.length, context.maxBodyBytes);
  }

  readBody(onBody: (body: Buffer) => void, onRefused: (err: GatewayError) => void): void {
    const reserve = this.body?.complete ? 0 : Number(this.ex.headers['content-length'] ?? this.context.maxBodyBytes);
    if (!takeBodyBudget(this.context, reserve)) return onRefused(bodiesOverloaded());
    this.bodyReserved = reserve;
    this.body!.read((body) => {
      this.releaseBody();
      // Every family endpoint that takes a POST wants a JSON object: an empty body gets a
      // message that says so, instead of a JSON parse error about nothing.
      if (body.length === 0) return onRefused(emptyBody(this.ex));
      onBody(body);
    }, onRefused);
  }

  finished(): void {
    this.releaseBody();
  }

  reply(status: number, headers: Record<string, string>, body: string | Buffer): void {
    if (this.closed) return;
    if (body.length > LARGE_REPLY_BYTES) {
      const bytes = typeof body === 'string' ? Buffer.from(body) : body;
      this.begin(status, headers, undefined);
      // The last byte is kept for end(), so a reply held back by a slow client always has a byte to probe with.
      this.write(bytes.subarray(0, bytes.length - 1));
      this.end(bytes.subarray(bytes.length - 1));
      return;
    }
    this.closed = true;
    // A reply sent before the body was read leaves unread bytes on the connection: close it.
    const closeConnection = this.framing.error !== undefined || (this.body !== undefined && !this.body.complete);
    this.res.cork(() => {
      this.head(status, headers);
      this.res.end(body, closeConnection);
    });
  }

  startStream(status: number, headers: Record<string, string>): void {
    const type = headers['content-type'] ?? '';
    this.begin(status, headers, type.startsWith('text/event-stream') ? ':\n\n' : type.startsWith('application/json') ? ' ' : undefined);
  }

  write(bytes: string | Buffer): boolean {
    if (this.closed) return true;
    this.writes++;
    if (this.blocked) {
      this.held.push(typeof bytes === 'string' ? Buffer.from(bytes) : bytes);
      return false;
    }
    if (this.send(bytes)) return true;
    if (this.unsent) this.held.push(this.unsent);
    this.block();
    return false;
  }

  onWritable(resume: () => void): void {
    if (this.closed) return;
    if (this.blocked) this.resumeUpstream = resume;
    else resume();
  }

  end(bytes?: string | Buffer): void {
    if (this.closed) return;
    if (bytes && bytes.length > SLICE_BYTES && !this.blocked) {
      this.write(bytes);
      bytes = undefined;
    }
    if (this.blocked) {
      if (bytes?.length) this.held.push(typeof bytes === 'string' ? Buffer.from(bytes) : bytes);
      this.ending = true;
      return;
    }
    this.closed = true;
    this.forget();
    this.res.cork(() => {
      this.flushHead();
      // Reading again, for the next request on this connection (end(…, true) would write its
      // Connection header into the chunked body).
      if (this.paused) this.res.resume();
      this.res.end(bytes);
    });
  }

  /** Called by the server's timer: probes a client that is behind, or sends a heartbeat on a quiet stream. */
  tick(now: number): void {
    if (this.closed) return this.forget();
    if (this.blocked) return this.probe(now);
    if (this.writes !== this.seenWrites) {
      this.seenWrites = this.writes;
      this.quietSince = now;
    } else if (this.filler && now - this.quietSince >= HEARTBEAT_MS) {
      this.quietSince = now;
      this.write(this.filler);
    }
  }

  /** Status and headers now (sent with the first bytes); from here on writes may be held back. */
  private begin(status: number, headers: Record<string, string>, filler: string | undefined): void {
    if (this.closed) return;
    this.pendingHead = { status, headers };
    this.filler = filler;
    this.context.writers.add(this);
    // Paused for the whole response: no request body is left to read, uWS's fixed write timeout
    // stays disarmed, and pausing now, while uWS holds nothing, is what lets resume() restore
    // reading for the next request at the end (uWS keeps the events a pause saw per buffer state).
    this.res.pause();
    this.paused = true;
    // With a handler of ours, a writable event disarms uWS's timeout instead of re-arming it.
    this.res.onWritable(() => {
      if (this.blocked) this.progress();
      else if (this.filler && !this.closed) this.write(this.filler); // uWS leaves draining to the handler
      return true;
    });
  }

  /** One probe of a client that is behind (see the class comment). */
  private probe(now: number): void {
    if (now - this.lastProgress >= this.context.writeStallMs) return this.stalled();
    let probe: Buffer | string;
    const first = this.held[0];
    if (first) {
      probe = first.subarray(0, 1);
      if (first.length > 1) this.held[0] = first.subarray(1);
      else this.held.shift();
    } else if (this.filler) {
      probe = this.filler;
    } else {
      return;
    }
    if (this.corkedWrite(probe)) return this.progress();
    // Refused: left reading until the client catches up. Paused, uWS never reads, so a client
    // that closed its connection goes unseen (uWS holds our bytes, so no write reaches the kernel
    // to fail) until writeStallMs; reading, its EOF closes the socket within a probe. The refused
    // write re-armed uWS's fixed timeout, and each next probe, due long before it, does again.
    this.res.resume();
  }

  /** Hands bytes to uWS slice by slice; false when it could not pass them all on, with the rest in `unsent`. */
  private send(bytes: string | Buffer): boolean {
    this.unsent = undefined;
    if (bytes.length <= SLICE_BYTES) return this.corkedWrite(bytes);
    const buf = typeof bytes === 'string' ? Buffer.from(bytes) : bytes;
    for (let at = 0; at < buf.length; at += SLICE_BYTES) {
      if (!this.corkedWrite(buf.subarray(at, at + SLICE_BYTES))) {
        if (at + SLICE_BYTES < buf.length) this.unsent = buf.subarray(at + SLICE_BYTES);
        return false;
      }
    }
    return true;
  }

  /** One corked write: it and its chunk framing fit uWS's cork buffer, so it leaves in one syscall. */
  private corkedWrite(bytes: string | Buffer): boolean {
    if (this.pendingHead && bytes.length > SLICE_BYTES / 2) this.res.cork(this.flushHead);
    this.corking = bytes;
    this.res.cork(this.writeCorking);
    this.corking = '';
    return this.corkedOk;
  }

  /** What corkedWrite hands to uWS inside its cork, and whether uWS took it all (no closure per write). */
  private corking: string | Buffer = '';
  private corkedOk = true;
  private readonly writeCorking = () => {
    this.flushHead();
    this.corkedOk = this.res.write(this.corking);
  };

  private block(): void {
    // Every refused write re-arms uWS's fixed timeout; pausing disarms it again.
    this.res.pause();
    this.paused = true;
    if (this.blocked) return;
    this.blocked = true;
    this.lastProgress = Date.now();
  }

  /** The client took everything uWS held: pass on what waits, then let the upstream go on. */
  private progress(): void {
    if (this.closed || !this.blocked) return;
    this.lastProgress = Date.now();
    while (this.held.length > 0) {
      const next = this.held.shift()!;
      if (!this.send(next)) {
        if (this.unsent) this.held.unshift(this.unsent);
        this.res.pause();
        return;
      }
    }
    this.blocked = false;
    // Paused again, as for the rest of a response (a probe may have left it reading).
    this.res.pause();
    if (this.ending) return this.end();
    const resume = this.resumeUpstream;
    this.resumeUpstream = undefined;
    resume?.();
  }

  private stalled(): void {
    this.closed = true;
    this.forget();
    this.context.pipeline.interrupt(this.ex, this, 'client_stalled');
    this.res.close();
  }

  private forget(): void {
    this.context.writers.delete(this);
  }

  private releaseBody(): void {
    this.context.bodyBytesInFlight -= this.bodyReserved;
    this.bodyReserved = 0;
  }

  private readonly flushHead = (): void => {
    if (!this.pendingHead) return;
    this.head(this.pendingHead.status, this.pendingHead.headers);
    this.pendingHead = undefined;
  };

  private head(status: number, headers: Record<string, string>): void {
    this.res.writeStatus(statusLine(status));
    this.res.writeHeader('x-request-id', this.ex.id);
    for (const name in headers) this.res.writeHeader(name, headers[name]!);
    const extra = this.ex.responseHeaders;
    if (extra) for (const name in extra) this.res.writeHeader(name, extra[name]!);
  }
}

/** Answers one admin or console call. */
class JsonWriter {
  private closed = false;

  /** `ended` runs once: when the reply is written, or when the client leaves first. */
  constructor(
    private readonly res: HttpResponse,
    private readonly ended: () => void,
  ) {
    res.onAborted(() => this.end());
  }

  private end(): void {
    if (this.closed) return;
    this.closed = true;
    this.ended();
  }

  send(reply: JsonReply, closeConnection = false, headOnly = false): void {
    if (this.closed) return;
    const [contentType, data] = reply.raw
      ? [reply.raw.contentType, reply.raw.data]
      : ['application/json', reply.body === undefined ? '' : JSON.stringify(reply.body)];
    this.res.cork(() => {
      this.res.writeStatus(statusLine(reply.status)).writeHeader('content-type', contentType);
      for (const name in reply.headers) {
        const value = reply.headers[name]!;
        for (const one of Array.isArray(value) ? value : [value]) this.res.writeHeader(name, one);
      }
      if (headOnly) this.res.endWithoutBody(Buffer.byteLength(data), closeConnection);
      else this.res.end(data, closeConnection);
    });
    // Only once written: a reply that failed to serialise can still be answered with a 500.
    this.end();
  }
}
