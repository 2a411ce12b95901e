/**
 * Plain HTTP routes beside the model families, by path prefix: the admin API, the console, metrics.
 * Their caller is checked on the headers before any body byte is read (`JsonHandler.beforeBody`),
 * their bodies are small (unless the route says otherwise) and counted in the in-flight body
 * budget, and their replies are JSON or raw bytes written at once, or a stream of chunks written
 * as the client takes them (server-sent events): none of the family routes' machinery for slow
 * clients, heartbeats or upstream pacing.
 */
import type { Logger } from 'pino';
import type { JsonHandler, JsonReply } from '../contracts.js';
import type { GatewayError } from '../errors.js';
import type { HttpRequest, HttpResponse, TemplatedApp } from '../uws.js';
import { BodyReader, bodyFraming } from './body.js';
import { atCapacity, bodiesOverloaded, copyHeaders, statusLine, takeBodyBudget, type ServerContext } from './context.js';

/**
 * Admin and console bodies are small JSON (a group, a key, a sign-in). They are read only after
 * the route's `beforeBody` check (the admin token), within the in-flight body budget.
 */
const MAX_JSON_ROUTE_BODY_BYTES = 64 * 1024;

/** Serves each handler under its prefix (a prefix without a trailing slash also matches itself). */
export function addJsonRoutes(app: TemplatedApp, routes: Record<string, JsonHandler>, context: ServerContext, log: Logger): void {
  for (const [prefix, handler] of Object.entries(routes)) {
    const route = (res: HttpResponse, req: HttpRequest) => {
      const method = req.getMethod().toUpperCase();
      const path = req.getUrl();
      const query = new URLSearchParams(req.getQuery() ?? '');
      const { headers, repeated } = copyHeaders(req);
      const remoteAddress = Buffer.from(res.getRemoteAddressAsText()).toString();
      let reserved = 0;
      context.jsonInFlight++;
      const left = new AbortController();
      // The body budget comes back once the body is the handler's (or it was never read).
      const release = () => {
        context.bodyBytesInFlight -= reserved;
        reserved = 0;
      };
      // Once, on the reply or the client's leaving: the slot comes back.
      const writer = new JsonWriter(
        res,
        () => {
          context.jsonInFlight--;
          release();
        },
        () => left.abort(),
        log,
      );
      // Reads are still served at capacity: an operator can see what is going on.
      if (context.overloaded() && method !== 'GET' && method !== 'HEAD') return writer.send(jsonError(atCapacity()), true);
      const failed = (err: unknown) => {
        log.error({ err }, 'json route failed');
        return { status: 500, body: { error: { message: 'internal error', code: 'internal_error' } } };
      };
      const answer = (body: Buffer) => {
        // A streamed reply can last for hours: the budget is for bodies being read, not for replies.
        release();
        Promise.resolve()
          .then(() => handler({ method, path, query, headers, body, remoteAddress, signal: left.signal }))
          .catch(failed)
          .then((reply) => writer.send(reply, false, method === 'HEAD'))
          .catch((err) => {
            log.error({ err }, 'json route reply failed');
            writer.send({ status: 500, body: { error: { message: 'internal error', code: 'internal_error' } } });
          });
      };
      if (method === 'GET' || method === 'DELETE' || method === 'HEAD') return answer(Buffer.alloc(0));
      const maxBody = handler.maxBodyBytes ?? MAX_JSON_ROUTE_BODY_BYTES;
      const framing = bodyFraming(headers, repeated, maxBody);
      if (framing.error) return writer.send(jsonError(framing.error), true);
      // Holds at most EARLY_BYTES, then pauses the upload, until the body is wanted.
      const reader = new BodyReader(res, framing.length, maxBody);
      const readBody = () => {
        const reserve = reader.complete ? 0 : (framing.length ?? maxBody);
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

}

/** A gateway error as an admin, console or metrics reply. */
function jsonError(err: GatewayError): JsonReply {
  const reply: JsonReply = { status: err.status, body: { error: { message: err.message, code: err.code } } };
  if (err.retryAfterSeconds !== undefined) reply.headers = { 'retry-after': String(err.retryAfterSeconds) };
  return reply;
}

/** Chunks of a streamed reply are handed to uWS in slices that fit its cork buffer with their framing. */
const SLICE_BYTES = 16 * 1024 - 64;

/** Answers one plain-route call: at once, or (`JsonReply.stream`) chunk by chunk. */
class JsonWriter {
  private closed = false;
  /** Set while a streamed reply waits for the client to take what uWS holds. */
  private drained: (() => void) | undefined;

  /** `ended` runs once: when the reply is written, or when the client leaves first; `aborted` only then. */
  constructor(
    private readonly res: HttpResponse,
    private readonly ended: () => void,
    private readonly aborted: () => void,
    private readonly log: Logger,
  ) {
    res.onAborted(() => {
      if (this.closed) return;
      this.end();
      this.aborted();
      this.drained?.();
    });
  }

  private end(): void {
    if (this.closed) return;
    this.closed = true;
    this.ended();
  }

  send(reply: JsonReply, closeConnection = false, headOnly = false): void {
    if (this.closed) {
      // The client left while the handler worked: a stream it made is still told to stop.
      if (reply.stream) void closeChunks(reply.stream.chunks);
      return;
    }
    if (reply.stream) {
      const { stream } = reply;
      // HEAD: the headers alone, the stream never read.
      if (headOnly) void closeChunks(stream.chunks);
      else {
        this.stream(reply, stream).catch((err: unknown) => {
          this.log.error({ err }, 'streamed json route reply failed');
          void closeChunks(stream.chunks);
          if (this.closed) return;
          this.res.cork(() => this.res.end());
          this.end();
        });
        return;
      }
    }
    const [contentType, data] = reply.raw
      ? [reply.raw.contentType, reply.raw.data]
      : ['application/json', reply.body === undefined ? '' : JSON.stringify(reply.body)];
    this.res.cork(() => {
      this.head(reply, contentType);
      // A HEAD reply's length is left out unless the connection closes after it: uWS 20.30, told a
      // length with no body, waits for that body and closes the connection at the next request.
      if (headOnly) closeConnection ? this.res.endWithoutBody(Buffer.byteLength(data), true) : this.res.endWithoutBody();
      else this.res.end(data, closeConnection);
    });
    // Only once written: a reply that failed to serialise can still be answered with a 500.
    this.end();
  }

  private head(reply: JsonReply, contentType: string): void {
    this.res.writeStatus(statusLine(reply.status)).writeHeader('content-type', contentType);
    for (const name in reply.headers) {
      const value = reply.headers[name]!;
      for (const one of Array.isArray(value) ? value : [value]) this.res.writeHeader(name, one);
    }
  }

  /** Writes each chunk as it comes, waiting while the client is behind; stops the chunks if the client leaves. */
  private async stream(reply: JsonReply, { contentType, chunks }: NonNullable<JsonReply['stream']>): Promise<void> {
    this.res.cork(() => this.head(reply, contentType));
    this.res.onWritable(() => {
      this.drained?.();
      return true;
    });
    const iterator = chunks[Symbol.asyncIterator]();
    try {
      for (;;) {
        const next = await iterator.next();
        if (this.closed || next.done) break;
        const bytes = typeof next.value === 'string' ? Buffer.from(next.value) : next.value;
        for (let at = 0; at < bytes.length && !this.closed; at += SLICE_BYTES) {
          let taken = true;
          this.res.cork(() => (taken = this.res.write(bytes.subarray(at, at + SLICE_BYTES))));
          if (!taken) await new Promise<void>((resume) => (this.drained = resume));
          this.drained = undefined;
        }
        if (this.closed) break;
      }
    } catch (err) {
      // The reply has started: all that can be done is end it, and say why in the log.
      this.log.error({ err }, 'streamed json route reply failed');
    }
    if (this.closed) {
      await iterator.return?.().catch(() => undefined);
      return;
    }
    this.res.cork(() => this.res.end());
    this.end();
  }
}

/** Ends a stream's iteration that will not be read (its `return`), so what feeds it lets go. */
async function closeChunks(chunks: AsyncIterable<Uint8Array | string>): Promise<void> {
  try {
    await chunks[Symbol.asyncIterator]().return?.();
  } catch {
    // Nothing more can be done for a stream nobody reads.
  }
}
