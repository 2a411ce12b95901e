/**
 * WebSocket channels for families that have one (the Responses WebSocket mode). The upgrade is
 * authenticated like any request; then each client message runs, one at a time and in order, as
 * a streamed exchange on the family's generate endpoint, and each event of its stream goes back
 * as one text message. Closing the socket aborts the exchange in flight.
 */
import { STATUS_CODES } from 'node:http';
import uWS from 'uWebSockets.js';
import type { Codec, SocketProtocol } from './contracts.js';
import { GatewayError, asGatewayError } from './errors.js';
import { Exchange } from './exchange.js';
import type { ClientResponse, Pipeline } from './pipeline.js';
import { SseSplitter, frameData } from './sse.js';

/** Sends stop asking for more while this much is still queued for the client. */
const BACKPRESSURE_BYTES = 1024 * 1024;
/** Messages a socket may have waiting behind the one running. */
const MAX_QUEUED = 16;

interface Connection {
  headers: Record<string, string>;
  /** Closes the socket (shutdown). */
  handle: { cut(): void };
  state: unknown;
  queue: string[];
  busy: boolean;
  closed: boolean;
  current?: Exchange;
  /** Resumes the upstream once the client's queue drains. */
  resume?: () => void;
}

export interface SocketOptions {
  maxMessageBytes: number;
  copyHeaders(req: uWS.HttpRequest): Record<string, string>;
  /** Exchanges in flight, for draining on shutdown. */
  inFlight: Set<{ cut(): void }>;
  /** Open sockets, closed once the drain is over. */
  open: Set<{ cut(): void }>;
  /** New upgrades are refused while draining. */
  draining(): boolean;
}

export function addSocketRoutes(app: uWS.TemplatedApp, codec: Codec, pipeline: Pipeline, { maxMessageBytes, copyHeaders, inFlight: track, open, draining }: SocketOptions): void {
  const protocol = codec.socket;
  const generate = codec.endpoints.find((e) => e.kind === 'generate');
  if (!protocol || !generate) return;

  /** Runs the next queued message, if none is running. */
  const pump = (ws: uWS.WebSocket<Connection>): void => {
    const connection = ws.getUserData();
    if (connection.busy || connection.closed || connection.queue.length === 0) return;
    const message = connection.queue.shift()!;
    const ex = new Exchange(codec, generate, 'POST', generate.path, '', connection.headers, []);
    try {
      ex.body = protocol.request(message, connection.state);
    } catch (err) {
      send(ws, protocol.error(asGatewayError(err)));
      return pump(ws);
    }
    connection.busy = true;
    connection.current = ex;
    track.add(connection.handle);
    void pipeline.run(ex, socketResponse(ws, protocol)).finally(() => {
      track.delete(connection.handle);
      connection.busy = false;
      connection.current = undefined;
      pump(ws);
    });
  };

  for (const endpoint of codec.endpoints.filter((e) => e.kind === 'socket')) {
    app.ws<Connection>(endpoint.path, {
      maxPayloadLength: maxMessageBytes,
      idleTimeout: 120,
      sendPingsAutomatically: true,
      maxBackpressure: 64 * 1024 * 1024,
      upgrade(res, req, context) {
        const headers = copyHeaders(req);
        const key = req.getHeader('sec-websocket-key');
        const subprotocol = req.getHeader('sec-websocket-protocol');
        const extensions = req.getHeader('sec-websocket-extensions');
        const ex = new Exchange(codec, endpoint, 'GET', req.getUrl(), req.getQuery() ?? '', headers, []);
        let aborted = false;
        res.onAborted(() => (aborted = true));
        const refusal = httpReply(res, () => aborted);
        if (draining()) return void refusal.reply(503, { 'content-type': 'application/json' }, codec.errorBody(new GatewayError('shutting_down', 'The gateway is shutting down.')));
        void pipeline.connect(ex, refusal).then((accepted) => {
          if (!accepted || aborted) return;
          const connection: Connection = { headers, handle: { cut() {} }, state: protocol.open(), queue: [], busy: false, closed: false };
          res.cork(() => res.upgrade(connection, key, subprotocol, extensions, context));
        });
      },
      open(ws) {
        const connection = ws.getUserData();
        connection.handle.cut = () => connection.closed || ws.end(1001, 'the gateway is shutting down');
        open.add(connection.handle);
      },
      message(ws, message, isBinary) {
        const connection = ws.getUserData();
        if (isBinary) return void send(ws, protocol.error(new GatewayError('invalid_request', 'Send JSON text frames, not binary ones.')));
        if (connection.queue.length >= MAX_QUEUED) {
          return void send(ws, protocol.error(new GatewayError('rate_limit_exceeded', `More than ${MAX_QUEUED} messages are waiting on this socket; wait for a response to finish.`)));
        }
        connection.queue.push(Buffer.from(message).toString('utf8'));
        pump(ws);
      },
      drain(ws) {
        const connection = ws.getUserData();
        if (ws.getBufferedAmount() < BACKPRESSURE_BYTES && connection.resume) {
          const resume = connection.resume;
          connection.resume = undefined;
          resume();
        }
      },
      close(ws) {
        const connection = ws.getUserData();
        open.delete(connection.handle);
        connection.closed = true;
        connection.queue.length = 0;
        connection.current?.markAborted();
      },
    });
  }
}

function send(ws: uWS.WebSocket<Connection>, text: string): boolean {
  if (ws.getUserData().closed) return true;
  let status = 1;
  ws.cork(() => (status = ws.send(text, false)));
  return status === 1 && ws.getBufferedAmount() < BACKPRESSURE_BYTES;
}

/** The pipeline's view of one exchange on a socket: stream frames become messages. */
function socketResponse(ws: uWS.WebSocket<Connection>, protocol: SocketProtocol): ClientResponse {
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
  };
}

/** Answers a refused upgrade as plain HTTP. */
function httpReply(res: uWS.HttpResponse, aborted: () => boolean): ClientResponse {
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
