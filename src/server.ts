/**
 * The uWebSockets.js adapter: routes, header copying, body collection under a size limit, corked
 * writes with backpressure, and draining on shutdown. Everything else happens in the pipeline.
 */
import { STATUS_CODES } from 'node:http';
import uWS from 'uWebSockets.js';
import type { Logger } from 'pino';
import type { Codec, Endpoint } from './contracts.js';
import { GatewayError } from './errors.js';
import { Exchange } from './exchange.js';
import type { ClientResponse, Pipeline } from './pipeline.js';
import { addSocketRoutes } from './socket.js';

/** A plain HTTP route outside the model families (the admin API, the console). */
export interface JsonRequest {
  method: string;
  path: string;
  query: URLSearchParams;
  headers: Record<string, string>;
  body: Buffer;
  remoteAddress: string;
}

export interface JsonReply {
  status: number;
  /** Sent as JSON. */
  body?: unknown;
  /** Sent as it is, instead of `body`. */
  raw?: { contentType: string; data: Buffer | string };
  headers?: Record<string, string>;
}

export type JsonHandler = (req: JsonRequest) => JsonReply | Promise<JsonReply>;

export interface ServerOptions {
  host: string;
  port: number;
  maxBodyBytes: number;
  codecs: Codec[];
  pipeline: Pipeline;
  /** Extra routes by path prefix, e.g. `/admin/` (a prefix without a trailing slash also matches itself). */
  jsonRoutes?: Record<string, JsonHandler>;
  log: Logger;
}

export interface RunningServer {
  port: number;
  /** Stops accepting, waits for in-flight exchanges up to the timeout, then cuts the rest. */
  drain(timeoutMs: number): Promise<void>;
}

/** The npm alias of uWS falls back to a slow pure-JS imitation when its binary cannot load. */
export function assertNativeUws(): void {
  if (process.env.UWS_USE_FALLBACK || !/\[native code\]/.test(String(uWS.App))) {
    throw new Error(
      'uWebSockets.js could not load its native binary and fell back to its pure-JS imitation; ' +
        'Sluice refuses to run on it. Use Node.js 20 on linux/darwin x64 or arm64.',
    );
  }
}

const statusLine = (status: number) => `${status} ${STATUS_CODES[status] ?? ''}`;

export function startServer(options: ServerOptions): Promise<RunningServer> {
  assertNativeUws();
  const { pipeline, maxBodyBytes, log } = options;
  const app = uWS.App();
  const inFlight = new Set<{ cut(): void }>();
  const openSockets = new Set<{ cut(): void }>();
  let draining = false;

  for (const codec of options.codecs) {
    addSocketRoutes(app, codec, pipeline, { maxMessageBytes: maxBodyBytes, copyHeaders, inFlight, open: openSockets, draining: () => draining });
    for (const endpoint of codec.endpoints) {
      if (endpoint.kind === 'socket') continue;
      const paramCount = endpoint.path.split('/').filter((s) => s.startsWith(':')).length;
      app[endpoint.method](endpoint.path, (res, req) => {
        const headers = copyHeaders(req);
        const params = Array.from({ length: paramCount }, (_, i) => req.getParameter(i) ?? '');
        const ex = new Exchange(codec, endpoint, req.getMethod().toUpperCase(), req.getUrl(), req.getQuery() ?? '', headers, params);
        const out = new UwsResponse(res, ex.id);
        res.onAborted(() => {
          out.closed = true;
          ex.markAborted();
        });
        const run = (body?: Buffer) => {
          if (body) ex.body = body;
          inFlight.add(out);
          void pipeline.run(ex, out).finally(() => inFlight.delete(out));
        };
        if (draining) return void pipeline.reject(ex, out, new GatewayError('shutting_down', 'The gateway is shutting down.'));
        if (endpoint.method === 'get') return run();
        readBody(res, headers, maxBodyBytes, run, () =>
          pipeline.reject(ex, out, new GatewayError('request_too_large', `The request body exceeds ${maxBodyBytes} bytes.`)),
        );
      });
    }
  }

  for (const [prefix, handler] of Object.entries(options.jsonRoutes ?? {})) {
    const route = (res: uWS.HttpResponse, req: uWS.HttpRequest) => {
      const method = req.getMethod().toUpperCase();
      const path = req.getUrl();
      const query = new URLSearchParams(req.getQuery() ?? '');
      const headers = copyHeaders(req);
      const remoteAddress = Buffer.from(res.getRemoteAddressAsText()).toString();
      const out = new UwsResponse(res, '');
      res.onAborted(() => (out.closed = true));
      const answer = (body: Buffer) => {
        Promise.resolve()
          .then(() => handler({ method, path, query, headers, body, remoteAddress }))
          .catch((err) => {
            log.error({ err }, 'json route failed');
            return { status: 500, body: { error: { message: 'internal error', code: 'internal_error' } } };
          })
          .then((reply) => sendJson(out, reply));
      };
      if (method === 'GET' || method === 'DELETE') return answer(Buffer.alloc(0));
      readBody(res, headers, maxBodyBytes, answer, () =>
        sendJson(out, { status: 413, body: { error: { message: 'request body too large', code: 'request_too_large' } } }),
      );
    };
    app.any(prefix.endsWith('/') ? `${prefix}*` : prefix, route);
    if (!prefix.endsWith('/')) app.any(`${prefix}/*`, route);
  }

  app.get('/healthz', (res) => {
    res.cork(() => res.writeHeader('content-type', 'application/json').end(draining ? '{"status":"draining"}' : '{"status":"ok"}'));
  });

  app.any('/*', (res, req) => {
    const body = { error: { message: `No route for ${req.getMethod().toUpperCase()} ${req.getUrl()}.`, type: 'invalid_request_error', param: null, code: 'not_found' } };
    res.cork(() => res.writeStatus(statusLine(404)).writeHeader('content-type', 'application/json').end(JSON.stringify(body)));
  });

  return new Promise((resolve, reject) => {
    app.listen(options.host, options.port, (socket) => {
      if (!socket) return reject(new Error(`cannot listen on ${options.host}:${options.port}`));
      resolve({
        port: uWS.us_socket_local_port(socket),
        async drain(timeoutMs) {
          draining = true;
          uWS.us_listen_socket_close(socket);
          const deadline = Date.now() + timeoutMs;
          while (inFlight.size > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 25));
          for (const out of inFlight) out.cut();
          // The cut responses run their done phase on the next ticks.
          while (inFlight.size > 0 && Date.now() < deadline + 1000) await new Promise((r) => setTimeout(r, 10));
          for (const socket of openSockets) socket.cut();
        },
      });
    });
  });
}

function copyHeaders(req: uWS.HttpRequest): Record<string, string> {
  const headers: Record<string, string> = {};
  req.forEach((k, v) => (headers[k] = v));
  return headers;
}

/**
 * Collects a request body. uWS lends each chunk only for the duration of the callback, so every
 * chunk is copied; with a content-length the copy goes straight into one buffer.
 */
function readBody(
  res: uWS.HttpResponse,
  headers: Record<string, string>,
  limit: number,
  onBody: (body: Buffer) => void,
  onTooLarge: () => void,
): void {
  const declared = headers['content-length'] !== undefined ? Number(headers['content-length']) : undefined;
  if (declared !== undefined && declared > limit) {
    onTooLarge();
    return;
  }
  let body = declared !== undefined && Number.isFinite(declared) ? Buffer.allocUnsafe(declared) : undefined;
  const chunks: Buffer[] = [];
  let size = 0;
  let failed = false;
  res.onData((chunk, isLast) => {
    if (failed) return;
    const bytes = new Uint8Array(chunk);
    if (size + bytes.length > limit || (body && size + bytes.length > body.length)) {
      failed = true;
      onTooLarge();
      return;
    }
    if (body) body.set(bytes, size);
    else chunks.push(Buffer.from(bytes));
    size += bytes.length;
    if (isLast) onBody(body ? body.subarray(0, size) : Buffer.concat(chunks, size));
  });
}

function sendJson(out: UwsResponse, reply: JsonReply): void {
  if (reply.raw) {
    out.reply(reply.status, { 'content-type': reply.raw.contentType, ...reply.headers }, reply.raw.data);
    return;
  }
  const headers = { 'content-type': 'application/json', ...reply.headers };
  out.reply(reply.status, headers, reply.body === undefined ? '' : JSON.stringify(reply.body));
}

/** The pipeline's view of a uWS response: every write corked, nothing written after close. */
class UwsResponse implements ClientResponse {
  closed = false;
  private pendingHead: { status: number; headers: Record<string, string> } | undefined;

  constructor(
    private readonly res: uWS.HttpResponse,
    private readonly requestId: string,
  ) {}

  reply(status: number, headers: Record<string, string>, body: string | Buffer): void {
    if (this.closed) return;
    this.closed = true;
    this.res.cork(() => {
      this.head(status, headers);
      // A reply sent before the body was read leaves unread bytes on the connection: close it.
      if (status === 413) this.res.writeHeader('connection', 'close');
      this.res.end(body);
    });
  }

  /** The head waits for the first body bytes so both leave in one packet. */
  startStream(status: number, headers: Record<string, string>): void {
    if (!this.closed) this.pendingHead = { status, headers };
  }

  write(bytes: string | Buffer): boolean {
    if (this.closed) return true;
    let ok = true;
    this.res.cork(() => {
      this.flushHead();
      ok = this.res.write(bytes);
    });
    return ok;
  }

  onWritable(resume: () => void): void {
    if (this.closed) return;
    this.res.onWritable(() => {
      resume();
      return true;
    });
  }

  end(bytes?: string | Buffer): void {
    if (this.closed) return;
    this.closed = true;
    this.res.cork(() => {
      this.flushHead();
      this.res.end(bytes);
    });
  }

  /** Shutdown ran out of time: close the connection; onAborted then ends the exchange. */
  cut(): void {
    if (!this.closed) this.res.close();
  }

  private flushHead(): void {
    if (!this.pendingHead) return;
    this.head(this.pendingHead.status, this.pendingHead.headers);
    this.pendingHead = undefined;
  }

  private head(status: number, headers: Record<string, string>): void {
    this.res.writeStatus(statusLine(status));
    if (this.requestId) this.res.writeHeader('x-request-id', this.requestId);
    for (const name in headers) this.res.writeHeader(name, headers[name]!);
  }
}
