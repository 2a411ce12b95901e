/**
 * Request bodies: the framing checks made on the headers, before anything is allocated
 * (Content-Length, Transfer-Encoding), and the reader that collects a body under its limit. Shared
 * by the family routes (through the response, server/response.ts) and the JSON routes.
 */
import { GatewayError } from '../errors.js';
import type { HttpResponse } from '../uws.js';

/** Body bytes that may arrive before the headers are accepted; past them the upload is paused. */
const EARLY_BYTES = 64 * 1024;

/** How a request body is framed: its declared length (undefined when chunked), or why it is refused. */
export interface BodyFraming {
  length?: number;
  error?: GatewayError;
}

/** Checks Content-Length before anything is allocated. */
export function bodyFraming(headers: Record<string, string>, repeated: Set<string> | undefined, limit: number): BodyFraming {
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
export class BodyReader {
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
