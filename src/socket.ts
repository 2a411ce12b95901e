/**
 * WebSocket channels for families that have one (the Responses WebSocket mode). The upgrade is
 * authenticated like any request; then each client message is a turn: a streamed exchange on the
 * family's generate endpoint, owned by the pipeline like any other, and each event of its stream
 * goes back as one text message. A message may name a lane: turns on one lane run in order, lanes
 * run side by side (a socket without lanes runs its turns one at a time). A message refused before
 * it could run is a turn too, so every turn gets its done and its access line. Closing the socket
 * interrupts every running turn. Sockets are capped in number, idle time (with pings), lifetime,
 * lanes, waiting messages and the history their lanes keep.
 */
import { STATUS_CODES } from 'node:http';
import type { HttpRequest, HttpResponse, TemplatedApp, WebSocket } from './uws.js';
import type { WebSocketLimits } from './config/types.js';
import { socketTurn, type ClientFamily, type Principal, type SocketProtocol } from './contracts.js';
import { GatewayError, asGatewayError, catalog, codeForStatus, type ErrorCode } from './errors.js';
import { Exchange } from './exchange.js';
import type { ClientResponse } from './client-response.js';
import type { Pipeline } from './pipeline.js';
import { SseSplitter, frameData } from './sse.js';

/** Sends stop asking the upstream for more while this much is queued for the client. */
const BACKPRESSURE_BYTES = 64 * 1024;
/** uWS drops a message beyond this much queued; the pause above keeps far below it. */
const MAX_BACKPRESSURE_BYTES = 16 * 1024 * 1024;
/** Messages a socket may have waiting behind the running ones (all lanes), and their bytes. */
const MAX_QUEUED = 16;
const MAX_QUEUED_BYTES = 4 * 1024 * 1024;
/** Lanes one socket may open; each keeps its own chain (all of them together within maxMessageBytes). */
const MAX_LANES = 8;
/** A client with this much unread is not reading at all: it gets no more answers, it is closed. */
const MAX_UNREAD_BYTES = 1024 * 1024;
/** The warm-up's usage: it produced nothing. */
const NO_USAGE = { inputTokens: 0, outputTokens: 0 };

/** The open sockets of a server, for the connection cap and for closing them at shutdown. */
export type OpenSockets = Set<{ close(code: number, reason: string): void }>;

interface Waiting {
  message: unknown;
  bytes: number;
}

interface Lane {
  id?: string;
  state: unknown;
  /** What the lane keeps for later turns (its chain), as its protocol counts it. */
  retainedBytes: number;
  queue: Waiting[];
  current?: { ex: Exchange; res: ClientResponse };
}

interface Connection {
  /** The upgrade's request id, which names the socket in the logs. */
  id: string;
  headers: Record<string, string>;
  /** Who opened the socket: each turn that runs is checked again, a refused one is recorded under it. */
  principal: Principal | undefined;
  handle: { close(code: number, reason: string): void };
  /** Lanes by name; '' is the lane of messages that name none. */
  lanes: Map<string, Lane>;
  turns: number;
  running: number;
  queued: number;
  queuedBytes: number;
  /** The lanes' retained bytes together, held to maxMessageBytes. */
  retainedBytes: number;
  closed: boolean;
  /** The lifetime is over: close once the turns running are done. */
  expiring: boolean;
  lifetime?: NodeJS.Timeout;
  /** Resume the upstreams paused on this socket once the client's queue drains. */
  resumes: (() => void)[];
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

export function addSocketRoutes(app: TemplatedApp, family: ClientFamily, pipeline: Pipeline, options: SocketOptions): void {
  const protocol = family.socket;
  const generate = family.endpoints.find((e) => e.kind === 'generate');
  if (!protocol || !generate) return;
  const { limits, sockets } = options;
  const blocked = new Set<WebSocket<Connection>>();
  const turnContext: TurnContext = { protocol, pipeline, blocked };
  setInterval(() => {
    const now = Date.now();
    for (const ws of blocked) checkStall(ws, now);
  }, Math.max(50, Math.min(1000, Math.floor(options.writeStallMs / 8)))).unref();

  const running = (connection: Connection) => [...connection.lanes.values()].flatMap((lane) => (lane.current ? [lane.current] : []));

  /** Closed first, so the interrupted turns' ends do not start queued ones. */
  const closeConnection = (connection: Connection, outcome: 'aborted' | 'client_stalled') => {
    connection.closed = true;
    for (const lane of connection.lanes.values()) lane.queue.length = 0;
    for (const { ex, res } of running(connection)) pipeline.interrupt(ex, res, outcome);
  };

  const checkStall = (ws: WebSocket<Connection>, now: number) => {
    const connection = ws.getUserData();
    if (connection.closed) return void blocked.delete(ws);
    const queued = ws.getBufferedAmount();
    if (queued < connection.blockedBytes) {
      connection.blockedSince = now;
      connection.blockedBytes = queued;
    }
    // Watched as long as an upstream waits for the drain, however little is queued: uWS refuses a
    // send (status 0) once the kernel's buffer is full, with as little as a KB of its own queued.
    if (queued < BACKPRESSURE_BYTES && connection.resumes.length === 0) return void blocked.delete(ws);
    if (now - connection.blockedSince < options.writeStallMs) return;
    blocked.delete(ws);
    closeConnection(connection, 'client_stalled');
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
    pipeline.log.warn({ socket: connection.id, status: err.status, code: err.upstreamCode, message: err.message }, 'websocket error');
    send(ws, protocol.error(err));
    connection.closed = true;
    ws.end(1000, 'connection limit reached');
  };

  /** One turn's exchange, named for the logs. */
  const turnExchange = (connection: Connection, turn: number, lane: string | undefined) => {
    const ex = new Exchange(family, generate, 'WS', generate.path, '', connection.headers, []);
    ex.set(socketTurn, { socket: connection.id, turn, lane });
    return ex;
  };

  /** A turn refused before it could run: under the key that opened the socket, as over HTTP. */
  const rejectTurn = (connection: Connection, ex: Exchange, res: ClientResponse, err: GatewayError) => {
    ex.principal = connection.principal;
    pipeline.reject(ex, res, err);
  };

  /** A message that cannot run, answered with an error event as a turn of its own. */
  const refuse = (ws: WebSocket<Connection>, err: GatewayError, lane?: string) => {
    const connection = ws.getUserData();
    const ex = turnExchange(connection, ++connection.turns, lane);
    rejectTurn(connection, ex, socketResponse(ws, turnContext, { id: lane, state: undefined }, () => {}), err);
  };

  /**
   * A turn on the lane ended: what the lanes keep for later turns is held to maxMessageBytes
   * together, the most recently used last. A chain longer than that could not be continued anyway
   * (its next request would be too large); without the bound, 8 lanes each keeping one made a
   * socket hold 8 times it for its whole life.
   */
  const turnEnded = (connection: Connection, lane: Lane) => {
    const kept = protocol.turnEnded?.(lane.state) ?? 0;
    connection.retainedBytes += kept - lane.retainedBytes;
    lane.retainedBytes = kept;
    const name = lane.id ?? '';
    connection.lanes.delete(name);
    connection.lanes.set(name, lane);
    for (const older of connection.lanes.values()) {
      if (connection.retainedBytes <= options.maxMessageBytes) break;
      if (older.retainedBytes === 0) continue;
      protocol.forget?.(older.state);
      connection.retainedBytes -= older.retainedBytes;
      older.retainedBytes = 0;
    }
  };

  /** Runs the lane's next message, if it has none running. */
  const pump = (ws: WebSocket<Connection>, lane: Lane): void => {
    const connection = ws.getUserData();
    if (lane.current || connection.closed) return;
    if (connection.expiring) return void (connection.running === 0 && expire(ws));
    const next = lane.queue.shift();
    if (next === undefined) return;
    connection.queued--;
    connection.queuedBytes -= next.bytes;
    // Numbered when it starts: a message still waiting when the socket closes never became a turn.
    const ex = turnExchange(connection, ++connection.turns, lane.id);
    const res = socketResponse(ws, turnContext, lane, () => {
      connection.running--;
      lane.current = undefined;
      turnEnded(connection, lane);
      pump(ws, lane);
    });
    lane.current = { ex, res };
    connection.running++;
    let turn: { body: Buffer; answer?: string[] };
    try {
      turn = protocol.request(next.message, lane.state);
    } catch (err) {
      return rejectTurn(connection, ex, res, asGatewayError(err));
    }
    // A turn may carry a history (Responses chaining) that no single message shows: the whole
    // request is held to the limit an HTTP body is, so chaining cannot grow it without bound.
    if (turn.body.length > options.maxMessageBytes) {
      const err = new GatewayError('request_too_large', `This turn's request, with the history it continues, is ${turn.body.length} bytes: over the limit of ${options.maxMessageBytes} bytes (server.maxBodyBytes). Start a new conversation, or send less.`);
      return rejectTurn(connection, ex, res, err);
    }
    ex.body = turn.body;
    const answer = turn.answer;
    if (!answer) return pipeline.accept(ex, res);
    // A local answer: every check runs (key, request, model, grants), then no upstream call.
    pipeline.accept(ex, res, () => {
      ex.status = 200;
      ex.usage = NO_USAGE;
      for (const event of answer) res.event(event);
    });
  };

  for (const endpoint of family.endpoints.filter((e) => e.kind === 'socket')) {
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
        const ex = new Exchange(family, endpoint, 'GET', req.getUrl(), req.getQuery() ?? '', headers, []);
        let aborted = false;
        const refusal = httpReply(res, () => aborted);
        res.onAborted(() => {
          aborted = true;
          pipeline.interrupt(ex, refusal, 'aborted');
        });
        const refusing = upgradeRefusal(limits, options.refuse() ?? (sockets.size >= limits.maxSockets ? 'overloaded' : undefined));
        if (refusing) return pipeline.reject(ex, refusal, refusing);
        pipeline.connect(ex, refusal, () => {
          if (aborted) return;
          const connection: Connection = {
            id: ex.id,
            headers,
            principal: ex.principal,
            handle: { close() {} },
            lanes: new Map(),
            turns: 0,
            running: 0,
            queued: 0,
            queuedBytes: 0,
            retainedBytes: 0,
            closed: false,
            expiring: false,
            resumes: [],
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
          if (connection.running === 0 && !connection.closed) expire(ws);
        }, limits.maxLifetimeMinutes * 60_000).unref();
      },
      message(ws, message, isBinary) {
        const connection = ws.getUserData();
        if (ws.getBufferedAmount() > MAX_UNREAD_BYTES) return void ws.end(1008, 'the client is not reading');
        if (isBinary) return refuse(ws, new GatewayError('invalid_request', 'Send JSON text frames, not binary ones.'));
        const text = Buffer.from(message).toString('utf8');
        let read: { lane?: string; message: unknown };
        try {
          read = protocol.read(text);
        } catch (err) {
          return refuse(ws, asGatewayError(err));
        }
        if (connection.queued >= MAX_QUEUED || (connection.queued > 0 && connection.queuedBytes + text.length > MAX_QUEUED_BYTES)) {
          const err = new GatewayError('rate_limit_exceeded', `Too many messages are waiting on this socket (at most ${MAX_QUEUED}, ${MAX_QUEUED_BYTES} bytes); wait for a response to finish.`);
          return refuse(ws, err, read.lane);
        }
        let lane = connection.lanes.get(read.lane ?? '');
        if (!lane) {
          if (connection.lanes.size >= MAX_LANES) {
            const err = new GatewayError('rate_limit_exceeded', `This socket already has ${MAX_LANES} lanes (stream_id); open another socket for more.`, 'stream_id');
            return refuse(ws, err, read.lane);
          }
          lane = { id: read.lane, state: protocol.open(read.lane), retainedBytes: 0, queue: [] };
          connection.lanes.set(read.lane ?? '', lane);
        }
        connection.queued++;
        connection.queuedBytes += text.length;
        lane.queue.push({ message: read.message, bytes: text.length });
        pump(ws, lane);
      },
      drain(ws) {
        const connection = ws.getUserData();
        if (ws.getBufferedAmount() < BACKPRESSURE_BYTES && connection.resumes.length > 0) {
          blocked.delete(ws);
          for (const resume of connection.resumes.splice(0)) resume();
        }
      },
      close(ws) {
        const connection = ws.getUserData();
        sockets.delete(connection.handle);
        blocked.delete(ws);
        clearTimeout(connection.lifetime);
        closeConnection(connection, 'aborted');
      },
    });
  }
}

/** Why an upgrade is refused, if it is: 426 tells a client to use HTTP instead, at once. */
function upgradeRefusal(limits: WebSocketLimits, refused: ErrorCode | undefined): GatewayError | undefined {
  if (!limits.enabled) return new GatewayError('invalid_request', 'WebSockets are switched off on this gateway; use HTTP.', null, 426, 'websocket_disabled');
  if (refused === 'shutting_down') return new GatewayError(refused, 'The gateway is shutting down.', null, undefined, undefined, 5);
  if (refused) return new GatewayError(refused, 'The gateway has as many WebSockets open as it allows; try again shortly.', null, undefined, undefined, 1);
  return undefined;
}

function send(ws: WebSocket<Connection>, text: string): boolean {
  if (ws.getUserData().closed) return true;
  let status = 1;
  ws.cork(() => (status = ws.send(text, false)));
  return status === 1 && ws.getBufferedAmount() < BACKPRESSURE_BYTES;
}

interface TurnContext {
  protocol: SocketProtocol;
  pipeline: Pipeline;
  blocked: Set<WebSocket<Connection>>;
}

/**
 * The pipeline's view of one turn on a socket: stream frames become messages (passing through the
 * lane's protocol state), and a turn that ended in an error event gets a log line.
 */
function socketResponse(ws: WebSocket<Connection>, turn: TurnContext, lane: Pick<Lane, 'id' | 'state'>, finished: () => void): ClientResponse & { event(data: string): boolean } {
  const { protocol, pipeline, blocked } = turn;
  const connection = ws.getUserData();
  const splitter = new SseSplitter();
  const event = (data: string) => send(ws, protocol.sent(data, lane.state));
  const sendEvents = (bytes: string | Buffer) => {
    let ok = true;
    splitter.push(
      typeof bytes === 'string' ? Buffer.from(bytes) : bytes,
      (frame) => {
        const data = frameData(frame);
        if (data && data !== '[DONE]') ok = event(data) && ok;
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
    event,
    reply(status, headers, body) {
      if (status < 400) return void send(ws, body.toString());
      // An error before the stream began, already in the family's body shape; its Retry-After goes with it.
      // Read back into the same error: a code of the catalog keeps its kind (an upstream failure is
      // not the client's mistake), any other (an upstream's own) is shown as it came.
      let error: GatewayError;
      try {
        const parsed = JSON.parse(body.toString()).error ?? {};
        const retryAfter = headers['retry-after'] === undefined ? undefined : Number(headers['retry-after']);
        const known = typeof parsed.code === 'string' && Object.hasOwn(catalog, parsed.code);
        error = new GatewayError(known ? (parsed.code as ErrorCode) : codeForStatus(status), parsed.message ?? 'request failed', parsed.param ?? null, status, known ? undefined : (parsed.code ?? undefined), retryAfter);
      } catch {
        error = new GatewayError('internal_error', body.toString().slice(0, 300));
      }
      send(ws, protocol.error(error, lane.id));
    },
    startStream() {},
    write: sendEvents,
    onWritable(resume) {
      connection.resumes.push(resume);
    },
    end(bytes) {
      if (bytes) sendEvents(bytes);
    },
    finished(ex) {
      const err = ex.error;
      if (err && !ex.aborted) {
        const { socket, turn: number } = ex.get(socketTurn)!;
        pipeline.log.warn({ req: ex.id, socket, turn: number, lane: lane.id, status: err.status, code: err.upstreamCode ?? err.code, message: err.message }, 'websocket error');
      }
      finished();
    },
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
