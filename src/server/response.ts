/**
 * The write side of one HTTP exchange (UwsResponse): corked writes in slices, backpressure, the
 * probes and heartbeats that find a slow or vanished client, and the body read once the headers
 * were accepted. The most delicate state machine of the server, so it has a module to itself; the
 * class comment says how it works.
 */
import type { ClientResponse } from '../client-response.js';
import { GatewayError } from '../errors.js';
import type { Exchange } from '../exchange.js';
import { sendAtTurnEnd } from '../turn-end.js';
import type { HttpResponse } from '../uws.js';
import { BodyReader, type BodyFraming } from './body.js';
import { bodiesOverloaded, statusLine, takeBodyBudget, type ServerContext, type Writer } from './context.js';

/**
 * Writes are handed to uWS in slices of this size: one slice and its chunk framing fit uWS's 16 KB
 * cork buffer (one syscall each), and what uWS holds when the client is slow stays small.
 */
const SLICE_BYTES = 16 * 1024 - 64;
/** What uWS adds to each write of a chunked body (a CRLF, the length in hex, a CRLF), rounded up. */
const CHUNK_FRAMING_BYTES = 16;
/** A stream that has written nothing for this long gets a filler (see UwsResponse). */
const HEARTBEAT_MS = 5000;
/** Replies larger than this are sent in slices (chunked) like a stream, so a slow reader is not cut. */
const LARGE_REPLY_BYTES = 64 * 1024;

function emptyBody(ex: Exchange): GatewayError {
  return new GatewayError('invalid_request', `The request body is empty: ${ex.method} ${ex.path} needs a JSON object. Send one, with Content-Type: application/json.`);
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
export class UwsResponse implements ClientResponse, Writer {
  /** Its slot among the writers the stall timer probes (src/live-set.ts); -1 when not there. */
  liveSlot = -1;
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
  /** Bytes of this response have reached uWS: the socket is paused and our writable handler set (see handOver). */
  private handedOver = false;
  /**
   * The first writes of a response, made in one turn of the event loop, handed to uWS in one cork
   * at its end (flushTurn) or with the end of the response: a stream that arrives whole in one
   * upstream read leaves in one or two syscalls instead of one per write and one for the end.
   * They and their chunk framing always fit uWS's cork buffer, so they are never copied together.
   * Only the first turn's: a microtask allocates 156 bytes, and a stream that arrives token by
   * token would pay one per token for nothing.
   */
  private readonly queued: (string | Buffer)[] = [];
  private queuedBytes = 0;
  /** What a reply or a stream's end waits with until the end of the turn (see leave). */
  private last: { status: number; headers: Record<string, string>; body: string | Buffer; closeConnection: boolean } | undefined;
  private lastBytes: string | Buffer | undefined;
  /** uWS reported the connection gone: the response object must not be touched again. */
  private aborted = false;

  constructor(
    private readonly res: HttpResponse,
    private readonly context: ServerContext,
    private readonly ex: Exchange,
    private readonly framing: BodyFraming,
  ) {
    res.onAborted(() => {
      this.aborted = true;
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
    if (body.length > LARGE_REPLY_BYTES && this.ex.method !== 'HEAD') {
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
    this.last = { status, headers, body, closeConnection };
    this.leave(this.sendReply);
  }

  private readonly sendReply = (): void => {
    const last = this.last!;
    this.last = undefined;
    this.sendUnlessGone(() =>
      this.res.cork(() => {
        this.head(last.status, last.headers);
        // A HEAD reply: no body, and no length (see JsonWriter.send for why).
        if (this.ex.method === 'HEAD') last.closeConnection ? this.res.endWithoutBody(Buffer.byteLength(last.body), true) : this.res.endWithoutBody();
        else this.res.end(last.body, last.closeConnection);
      }),
    );
  };

  /**
   * Hands the response's last cork (`send`: the reply, or a stream's end) to uWS. An answer an
   * upstream gave leaves at the end of the turn, after the usage journal has appended the turn's
   * records (src/turn-end.ts), so a client that has it has a record too. A refusal the gateway made
   * itself leaves at once: it cost nothing, and one made inside uWS's request handler must end
   * before uWS reads the next pipelined request.
   */
  private leave(send: () => void): void {
    if (this.ex.attempts > 0 && this.ex.endpoint.kind === 'generate') sendAtTurnEnd(send);
    else send();
  }

  /** A last cork, skipped for a client gone since it was made; a failure is logged, never thrown into the turn's other sends. */
  private sendUnlessGone(send: () => void): void {
    if (this.aborted) return;
    try {
      send();
    } catch (err) {
      this.context.pipeline.log.error({ err, req: this.ex.id }, 'sending an answer failed');
    }
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
    if (!this.handedOver && this.fitsQueue(bytes.length, 1)) {
      this.queuedBytes += bytes.length;
      if (this.queued.push(bytes) === 1) queueMicrotask(this.flushTurn);
      return true;
    }
    if (this.queued.length > 0 && !this.flushQueued()) {
      this.held.push(typeof bytes === 'string' ? Buffer.from(bytes) : bytes);
      return false;
    }
    if (this.send(bytes)) return true;
    if (this.unsent) this.held.push(this.unsent);
    this.block();
    return false;
  }

  /** Whether `pieces` more writes of `bytes` in all, with the queue, fit one cork of uWS. */
  private fitsQueue(bytes: number, pieces: number): boolean {
    return this.queuedBytes + bytes + CHUNK_FRAMING_BYTES * (this.queued.length + pieces) <= SLICE_BYTES;
  }

  /**
   * Hands the writes queued in this turn to uWS. A refusal found here pauses the upstream at its
   * next write, one upstream read later than a write refused on the spot (what the gateway holds
   * per slow client stays within slow-clients.test's bound).
   */
  private readonly flushTurn = (): void => {
    if (this.queued.length > 0 && !this.closed) this.flushQueued();
  };

  /** The queued writes, in one cork (one syscall); false, and blocked, when uWS could not pass them all on (it keeps the rest). */
  private flushQueued(): boolean {
    this.handOver();
    this.headAloneBefore(this.queuedBytes);
    this.res.cork(this.writeQueued);
    if (!this.corkedOk) this.block();
    return this.corkedOk;
  }

  private readonly writeQueued = (): void => {
    this.flushHead();
    let ok = true;
    for (const piece of this.queued) ok = this.res.write(piece) && ok;
    this.queued.length = 0;
    this.queuedBytes = 0;
    this.corkedOk = ok;
  };

  onWritable(resume: () => void): void {
    if (this.closed) return;
    if (this.blocked) this.resumeUpstream = resume;
    else resume();
  }

  end(bytes?: string | Buffer): void {
    if (this.closed) return;
    // The queued writes leave with the end (in endWith) when the last bytes fit their cork too.
    if (this.queued.length > 0 && !this.fitsQueue(bytes?.length ?? 0, 1)) this.flushQueued();
    if (bytes && bytes.length > SLICE_BYTES && !this.blocked) {
      // All but the last slice now; the last leaves with the end, in one syscall.
      const buf = typeof bytes === 'string' ? Buffer.from(bytes) : bytes;
      const last = buf.length % SLICE_BYTES || SLICE_BYTES;
      this.write(buf.subarray(0, buf.length - last));
      bytes = buf.subarray(buf.length - last);
    }
    if (this.blocked) {
      if (bytes?.length) this.held.push(typeof bytes === 'string' ? Buffer.from(bytes) : bytes);
      this.ending = true;
      return;
    }
    this.endWith(bytes);
  }

  /** Ends the response in one cork: what is queued, then `bytes` with the end (for a generation, at the end of the turn). */
  private endWith(bytes: string | Buffer | undefined): void {
    this.closed = true;
    this.forget();
    this.lastBytes = bytes;
    this.leave(this.sendEnd);
  }

  private readonly sendEnd = (): void => {
    const bytes = this.lastBytes;
    this.lastBytes = undefined;
    this.sendUnlessGone(() => {
      this.headAloneBefore(this.queuedBytes + (bytes?.length ?? 0));
      this.res.cork(() => {
        this.flushHead();
        // Reading again, for the next request on this connection (end(…, true) would write its
        // Connection header into the chunked body).
        if (this.paused) this.res.resume();
        for (const piece of this.queued) this.res.write(piece);
        this.res.end(bytes);
      });
    });
    this.queued.length = 0;
    this.queuedBytes = 0;
  };

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
  }

  /**
   * Before the first bytes of a response that does not end with them reach uWS. Paused for the
   * rest of the response: no request body is left to read, uWS's fixed write timeout stays
   * disarmed, and pausing now, while uWS holds nothing, is what lets resume() restore reading for
   * the next request at the end (uWS keeps the events a pause saw per buffer state). A response
   * whose bytes all leave with its end needs neither (two epoll_ctl calls fewer).
   */
  private handOver(): void {
    if (this.handedOver) return;
    this.handedOver = true;
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
    this.handOver();
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
    this.headAloneBefore(bytes.length);
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

  /** A head not yet sent goes in a cork of its own before more than half a slice: together they would overflow uWS's cork buffer. */
  private headAloneBefore(bytes: number): void {
    if (this.pendingHead && bytes > SLICE_BYTES / 2) this.res.cork(this.flushHead);
  }

  private readonly flushHead = (): void => {
    if (!this.pendingHead) return;
    this.head(this.pendingHead.status, this.pendingHead.headers);
    this.pendingHead = undefined;
  };

  private head(status: number, headers: Record<string, string>): void {
    this.res.writeStatus(statusLine(status));
    this.res.writeHeader('x-request-id', this.ex.id);
    if (this.context.overheadHeader) this.res.writeHeader('x-sluice-overhead-ms', gatewayMs(this.ex).toFixed(2));
    for (const name in headers) this.res.writeHeader(name, headers[name]!);
    const extra = this.ex.responseHeaders;
    if (extra) for (const name in extra) this.res.writeHeader(name, extra[name]!);
  }
}

/**
 * The time an exchange has spent in the gateway so far: since it arrived, less what it waited on
 * upstream calls (each from sending to its answer or failure). A backoff between calls is the
 * gateway's.
 */
export function gatewayMs(ex: Exchange): number {
  const now = performance.now();
  let upstream = 0;
  for (const call of ex.calls) upstream += call.waitMs ?? now - call.sentMark;
  return Math.max(0, ex.elapsedMs() - upstream);
}
