/**
 * WebSocket channels for families that have one (the Responses WebSocket mode). The upgrade is
 * authenticated like any request; then each client message runs, one at a time and in order, as
 * a streamed exchange on the family's generate endpoint, owned by the pipeline like any other,
 * and each event of its stream goes back as one text message. Closing the socket aborts the
 * exchange in flight. Sockets are capped in number, idle time (with pings) and lifetime.
 */
import { STATUS_CODES } from 'node:http';
import uWS, { type HttpRequest, type HttpResponse, type TemplatedApp, type WebSocket } from './uws.js';
import type { WebSocketLimits } from './config.js';
import type { Codec, SocketProtocol } from './contracts.js';
import { GatewayError, asGatewayError, type ErrorCode } from './errors.js';
import { Exchange } from './exchange.js';
import type { ClientResponse, Pipeline } from './pipeline.js';
import { SseSplitter, frameData } from './sse.js';

/** Sends stop asking the upstream for more while this much is queued for the client. */
const BACKPRESSURE_BYTES = 64 * 1024;
/** uWS drops a message beyond this much queued; the pause above keeps far below it. */
const MAX_BACKPRESSURE_BYTES = 16 * 1024 * 1024;
/** Messages a socket may have waiting behind the one running, and their bytes. */
const MAX_QUEUED = 16;
const MAX_QUEUED_BYTES = 4 * 1024 * 1024;
/** A client with this much unread is not reading at all: it gets no more answers, it is closed. */
const MAX_UNREAD_BYTES = 1024 * 1024;

/** The open sockets of a server, for the connection cap and for closing them at shutdown. */
export type OpenSockets = Set<{ close(code: number, reason: string): void }>;

interface Connection {
  headers: Record<string, string>;
  handle: { close(code: number, reason: string): void };
  state: unknown;
  queue: string[];
  queuedBytes: number;
  busy: boolean;
  closed: boolean;
  /** The lifetime is over: close once the exchange in flight is done. */
  expiring: boolean;
  lifetime?: NodeJS.Timeout;
  current?: { ex: Exchange; res: ClientResponse };
  /** Resumes the upstream once the client's queue drains. */
  resume?: () => void;
  /** Since when the client has not taken what is queued, and how much that was. */
  blockedSince: number;
  blockedBytes: number;
}

export interface SocketOptions {
  limits: WebSocketLimits;
  maxMessageBytes: number;
  writeStallMs: number;
  copyHeaders(req: HttpRequest): Record<string, string>;
  sockets: OpenSockets;
  /** Why a new socket must be refused now (shutdown, overload), if it must. */
  refuse(): ErrorCode | undefined;
}

export function addSocketRoutes(app: TemplatedApp, codec: Codec, pipeline: Pipeline, options: SocketOptions): void {
  const protocol = codec.socket;
  const generate = codec.endpoints.find((e) => e.kind === 'generate');
  if (!protocol || !generate) return;
  const { limits, sockets } = options;
  const blocked = new Set<WebSocket<Connection>>();
  const stallCheck = setInterval(() => {
    const now = Date.now();
    for (const ws of blocked) checkStall(ws, now);
  }, Math.max(50, Math.min(1000, Math.floor(options.writeStallMs / 8)))).unref();

  const checkStall = (ws: WebSocket<Connection>, now: number) => {
    const connection = ws.getUserData();
    if (connection.closed) return void blocked.delete(ws);
    const queued = ws.getBufferedAmount();
    if (queued < connection.blockedBytes) {
      connection.blockedSince = now;
      connection.blockedBytes = queued;
    }
    if (queued < BACKPRESSURE_BYTES) return void blocked.delete(ws);
    if (now - connection.blockedSince < options.writeStallMs) return;
    blocked.delete(ws);
    // Closed first, so the interrupted turn's end does not start the next queued one.
    connection.closed = true;
    connection.queue.length = 0;
    if (connection.current) pipeline.interrupt(connection.current.ex, connection.current.res, 'client_stalled');
    ws.close();
  };

  const expire = (ws: WebSocket<Connection>) => {
    const connection = ws.getUserData();
    const err = new GatewayError(
      'invalid_request',
      `This WebSocket connection reached its ${limits.maxLifetimeMinutes}-minute limit. Open a new connection to continue.`,
      null,
      400,
      'websocket_connection_limit_reached',
    );
    send(ws, protocol.error(err));
    connection.closed = true;
    ws.end(1000, 'connection limit reached');
  };

  /** Runs the next queued message, if none is running. */
  const pump = (ws: WebSocket<Connection>): void => {
    const connection = ws.getUserData();
    if (connection.busy || connection.closed) return;
    if (connection.expiring) return expire(ws);
    const message = connection.queue.shift();
    if (message === undefined) return;
    connection.queuedBytes -= message.length;
    const ex = new Exchange(codec, generate, 'POST', generate.path, '', connection.headers, []);
    try {
      ex.body = protocol.request(message, connection.state);
    } catch (err) {
      send(ws, protocol.error(asGatewayError(err)));
      return pump(ws);
    }
    connection.busy = true;
    const res = socketResponse(ws, protocol, blocked, () => {
      connection.busy = false;
      connection.current = undefined;
      pump(ws);
    });
    connection.current = { ex, res };
    pipeline.accept(ex, res);
  };

  for (const endpoint of codec.endpoints.filter((e) => e.kind === 'socket')) {
    app.ws<Connection>(endpoint.path, {
      maxPayloadLength: options.maxMessageBytes,
      idleTimeout: limits.idleTimeoutSeconds,
      sendPingsAutomatically: true,
      maxBackpressure: MAX_BACKPRESSURE_BYTES,
      upgrade(res, req, context) {
        const headers = options.copyHeaders(req);
        const key = req.getHeader('sec-websocket-key');
        const subprotocol = req.getHeader('sec-websocket-protocol');
        const extensions = req.getHeader('sec-websocket-extensions');
        const ex = new Exchange(codec, endpoint, 'GET', req.getUrl(), req.getQuery() ?? '', headers, []);
        let aborted = false;
        const refusal = httpReply(res, () => aborted);
        res.onAborted(() => {
          aborted = true;
          pipeline.interrupt(ex, refusal, 'aborted');
        });
        const refused = options.refuse() ?? (sockets.size >= limits.maxSockets ? 'overloaded' : undefined);
        if (refused) {
          const message = refused === 'shutting_down' ? 'The gateway is shutting down.' : 'The gateway has as many WebSockets open as it allows; try again shortly.';
          return pipeline.reject(ex, refusal, new GatewayError(refused, message, null, undefined, undefined, refused === 'shutting_down' ? 5 : 1));
        }
        pipeline.connect(ex, refusal, () => {
          if (aborted) return;
          const connection: Connection = {
            headers,
            handle: { close() {} },
            state: protocol.open(),
            queue: [],
            queuedBytes: 0,
            busy: false,
            closed: false,
            expiring: false,
            blockedSince: 0,
            blockedBytes: 0,
          };
          res.cork(() => res.upgrade(connection, key, subprotocol, extensions, context));
        });
      },
      open(ws) {
        const connection = ws.getUserData();
        connection.handle.close = (code, reason) => connection.closed || ws.end(code, reason);
        sockets.add(connection.handle);
        connection.lifetime = setTimeout(() => {
          connection.expiring = true;
          if (!connection.busy && !connection.closed) expire(ws);
        }, limits.maxLifetimeMinutes * 60_000).unref();
      },
      message(ws, message, isBinary) {
        const connection = ws.getUserData();
        if (ws.getBufferedAmount() > MAX_UNREAD_BYTES) return void ws.end(1008, 'the client is not reading');
        if (isBinary) return void send(ws, protocol.error(new GatewayError('invalid_request', 'Send JSON text frames, not binary ones.')));
        if (connection.queue.length >= MAX_QUEUED || (connection.queue.length > 0 && connection.queuedBytes + message.byteLength > MAX_QUEUED_BYTES)) {
          return void send(ws, protocol.error(new GatewayError('rate_limit_exceeded', `Too many messages are waiting on this socket (at most ${MAX_QUEUED}, ${MAX_QUEUED_BYTES} bytes); wait for a response to finish.`)));
        }
        const text = Buffer.from(message).toString('utf8');
        connection.queuedBytes += text.length;
        connection.queue.push(text);
        pump(ws);
      },
      drain(ws) {
        const connection = ws.getUserData();
        if (ws.getBufferedAmount() < BACKPRESSURE_BYTES && connection.resume) {
          blocked.delete(ws);
          const resume = connection.resume;
          connection.resume = undefined;
          resume();
        }
      },
      close(ws) {
        const connection = ws.getUserData();
        sockets.delete(connection.handle);
        blocked.delete(ws);
        clearTimeout(connection.lifetime);
        connection.closed = true;
        connection.queue.length = 0;
        if (connection.current) pipeline.interrupt(connection.current.ex, connection.current.res, 'aborted');
      },
    });
  }
}

function send(ws: WebSocket<Connection>, text: string): boolean {
  if (ws.getUserData().closed) return true;
  let status = 1;
  ws.cork(() => (status = ws.send(text, false)));
  return status === 1 && ws.getBufferedAmount() < BACKPRESSURE_BYTES;
}

/** The pipeline's view of one exchange on a socket: stream frames become messages. */
function socketResponse(ws: WebSocket<Connection>, protocol: SocketProtocol, blocked: Set<WebSocket<Connection>>, finished: () => void): ClientResponse {
  const connection = ws.getUserData();
  const splitter = new SseSplitter();
  const sendEvents = (bytes: string | Buffer) => {
    let ok = true;
    splitter.push(
      typeof bytes === 'string' ? Buffer.from(bytes) : bytes,
      (frame) => {
        const data = frameData(frame);
        if (data && data !== '[DONE]') {
          ok = send(ws, data) && ok;
          protocol.sent(data, connection.state);
        }
        return false;
      },
      () => {},
    );
    if (!ok && !connection.closed && !blocked.has(ws)) {
      connection.blockedSince = Date.now();
      connection.blockedBytes = ws.getBufferedAmount();
      blocked.add(ws);
    }
    return ok;
  };
  return {
    reply(status, _headers, body) {
      if (status < 400) return void send(ws, body.toString());
      // An error before the stream began, already in the family's body shape.
      let error: GatewayError;
      try {
        const parsed = JSON.parse(body.toString()).error ?? {};
        error = new GatewayError('invalid_request', parsed.message ?? 'request failed', parsed.param ?? null, status, parsed.code ?? undefined);
      } catch {
        error = new GatewayError('internal_error', body.toString().slice(0, 300));
      }
      send(ws, protocol.error(error));
    },
    startStream() {},
    write: sendEvents,
    onWritable(resume) {
      connection.resume = resume;
    },
    end(bytes) {
      if (bytes) sendEvents(bytes);
    },
    finished,
  };
}

/** Answers a refused upgrade as plain HTTP. */
function httpReply(res: HttpResponse, aborted: () => boolean): ClientResponse {
  const reply = (status: number, headers: Record<string, string>, body: string | Buffer) => {
    if (aborted()) return;
    res.cork(() => {
      res.writeStatus(`${status} ${STATUS_CODES[status] ?? ''}`);
      for (const name in headers) res.writeHeader(name, headers[name]!);
      res.end(body);
    });
  };
  return { reply, startStream() {}, write: () => true, onWritable() {}, end() {} };
}
