/**
 * Byte-level server-sent-events framing. Upstream chunks are split into frames as views into the
 * chunk (no copy); the only copy is a frame that straddles two chunks. Frames keep their
 * terminating blank line, so writing the kept frames back out is byte-exact.
 */

import { GatewayError } from './errors.js';
import { jsonOrUndefined } from './json-body.js';

const LF = 0x0a;
const CR = 0x0d;
const LF_LF = Buffer.from('\n\n');
const CRLF_CRLF = Buffer.from('\r\n\r\n');

/** Visits one frame; return false to drop it from the relayed output. */
export type FrameVisitor = (frame: Buffer) => boolean;

export class SseSplitter {
  /** Pieces of an incomplete frame carried over from earlier chunks, joined once the frame ends. */
  private tail: Buffer[] = [];
  private tailBytes = 0;
  /** Learned from the first frame: upstreams do not switch line endings midway. */
  private delimiter: Buffer | null = null;

  /** A frame longer than `maxFrameBytes` is refused: the carry-over must stay bounded. */
  constructor(private readonly maxFrameBytes = Infinity) {}

  /**
   * Splits a chunk into frames. `visit` sees each complete frame; `write` receives maximal runs of
   * consecutive kept frames, as views into the chunk wherever possible.
   */
  push(chunk: Buffer, visit: FrameVisitor, write: (bytes: Buffer) => void): void {
    let start = 0;
    if (this.tailBytes > 0) {
      const end = this.endOfStraddlingFrame(chunk);
      if (end < 0) {
        this.carry(chunk);
        return;
      }
      this.tail.push(chunk.subarray(0, end));
      const frame = Buffer.concat(this.tail, this.tailBytes + end);
      this.tail = [];
      this.tailBytes = 0;
      if (visit(frame)) write(frame);
      start = end;
    }
    let runStart = start;
    for (;;) {
      const end = this.frameEnd(chunk, start);
      if (end < 0) break;
      if (!visit(chunk.subarray(start, end))) {
        if (start > runStart) write(chunk.subarray(runStart, start));
        runStart = end;
      }
      start = end;
    }
    if (start > runStart) write(chunk.subarray(runStart, start));
    if (start < chunk.length) this.carry(chunk.subarray(start));
  }

  /**
   * Like `push`, for a visitor that needs only the frames where `key` holds an object (a usage
   * object) and the last complete frame of each chunk: the chunk is searched once for the key and
   * once, from its end, for its last frame boundary, instead of frame by frame. The frames not
   * visited are written as they came. Both ways of writing the key are searched (`"k":{` and
   * `"k": {`): one upstream may mix them (Anthropic writes its pings with a space).
   */
  pushSparse(chunk: Buffer, key: ObjectKeyNeedle, visit: FrameVisitor, write: (bytes: Buffer) => void): void {
    // Until the first frame has taught the delimiter, frame by frame.
    if (!this.delimiter) return this.push(chunk, visit, write);
    if (this.tailBytes > 0) {
      // The frame carried over from the last chunk, whole, then the rest.
      const end = this.endOfStraddlingFrame(chunk);
      if (end < 0) return this.push(chunk, visit, write);
      this.push(chunk.subarray(0, end), visit, write);
      chunk = chunk.subarray(end);
    }
    const delimiter = this.delimiter;
    const last = chunk.lastIndexOf(delimiter);
    const complete = last < 0 ? 0 : last + delimiter.length;
    let runStart = 0;
    let visitedUpTo = 0;
    const frameAt = (start: number, end: number) => {
      visitedUpTo = end;
      if (visit(chunk.subarray(start, end))) return;
      if (start > runStart) write(chunk.subarray(runStart, start));
      runStart = end;
    };
    // The next hit of each form; the nearer one is the next frame to visit.
    let compact = chunk.indexOf(key.compact);
    let spaced = chunk.indexOf(key.spaced);
    for (;;) {
      const at = compact < 0 ? spaced : spaced < 0 ? compact : Math.min(compact, spaced);
      if (at < 0 || at >= complete) break;
      const before = chunk.lastIndexOf(delimiter, at);
      frameAt(before < 0 ? 0 : before + delimiter.length, chunk.indexOf(delimiter, at) + delimiter.length);
      if (compact >= 0 && compact < visitedUpTo) compact = chunk.indexOf(key.compact, visitedUpTo);
      if (spaced >= 0 && spaced < visitedUpTo) spaced = chunk.indexOf(key.spaced, visitedUpTo);
    }
    // The chunk's last frame, unless a search already brought it.
    if (complete > visitedUpTo) {
      const from = complete - delimiter.length - 1;
      const before = from < 0 ? -1 : chunk.lastIndexOf(delimiter, from);
      frameAt(Math.max(visitedUpTo, before < 0 ? 0 : before + delimiter.length), complete);
    }
    if (complete > runStart) write(chunk.subarray(runStart, complete));
    if (complete < chunk.length) this.carry(chunk.subarray(complete));
  }

  /** The blank line that ends this stream's frames (LF LF until one was seen). */
  delimiterOrDefault(): Buffer {
    return this.delimiter ?? LF_LF;
  }

  /** Whatever remains when the upstream ends without a closing blank line. */
  flush(): Buffer | null {
    const rest = this.tailBytes > 0 ? Buffer.concat(this.tail, this.tailBytes) : null;
    this.tail = [];
    this.tailBytes = 0;
    return rest;
  }

  private carry(piece: Buffer): void {
    this.tailBytes += piece.length;
    if (this.tailBytes > this.maxFrameBytes) {
      this.tail = [];
      this.tailBytes = 0;
      throw new GatewayError('upstream_error', `The upstream sent a stream event larger than ${this.maxFrameBytes} bytes.`);
    }
    this.tail.push(piece);
  }

  /** Index just past the delimiter that ends the frame starting at `from`, or -1. */
  private frameEnd(buf: Buffer, from: number): number {
    if (this.delimiter) {
      const at = buf.indexOf(this.delimiter, from);
      return at < 0 ? -1 : at + this.delimiter.length;
    }
    const lf = buf.indexOf(LF_LF, from);
    const crlf = buf.indexOf(CRLF_CRLF, from);
    if (lf < 0 && crlf < 0) return -1;
    this.delimiter = crlf >= 0 && (lf < 0 || crlf < lf) ? CRLF_CRLF : LF_LF;
    return (this.delimiter === LF_LF ? lf : crlf) + this.delimiter.length;
  }

  /** Finds the end of the carried frame in `chunk`, looking only at the seam and then the chunk. */
  private endOfStraddlingFrame(chunk: Buffer): number {
    const lastPart = this.tail[this.tail.length - 1]!;
    const before = lastPart.length >= 3 || this.tail.length === 1 ? lastPart.subarray(Math.max(0, lastPart.length - 3)) : this.lastTailBytes(3);
    const seam = Buffer.concat([before, chunk.subarray(0, 3)]);
    const inSeam = this.frameEnd(seam, 0);
    if (inSeam > before.length) return inSeam - before.length;
    return this.frameEnd(chunk, 0);
  }

  /** The last `n` carried bytes, when they span several tiny pieces. */
  private lastTailBytes(n: number): Buffer {
    const bytes: number[] = [];
    for (let i = this.tail.length - 1; i >= 0 && bytes.length < n; i--) {
      const part = this.tail[i]!;
      for (let j = part.length - 1; j >= 0 && bytes.length < n; j--) bytes.unshift(part[j]!);
    }
    return Buffer.from(bytes);
  }
}

/** The joined `data:` payload of one frame, or null when it has none. */
export function frameData(frame: Buffer): string | null {
  let out: string | null = null;
  let lineStart = 0;
  while (lineStart < frame.length) {
    let lineEnd = frame.indexOf(LF, lineStart);
    if (lineEnd < 0) lineEnd = frame.length;
    const contentEnd = lineEnd > lineStart && frame[lineEnd - 1] === CR ? lineEnd - 1 : lineEnd;
    if (contentEnd - lineStart >= 5 && frame.toString('latin1', lineStart, lineStart + 5) === 'data:') {
      const valueStart = frame[lineStart + 5] === 0x20 ? lineStart + 6 : lineStart + 5;
      const value = frame.toString('utf8', valueStart, contentEnd);
      out = out === null ? value : out + '\n' + value;
    }
    lineStart = lineEnd + 1;
  }
  return out;
}

/** The JSON payloads of frames; frames without data or with non-JSON data are skipped. */
export function* frameJson(frames: Iterable<Buffer>): Generator<any> {
  for (const frame of frames) {
    const value = jsonOrUndefined(frameData(frame));
    if (value !== undefined) yield value;
  }
}

/** One `data:` frame, terminated. */
export function dataFrame(payload: string): string {
  return `data: ${payload}\n\n`;
}

/** One frame with an `event:` line, as the Responses family sends them. */
export function eventFrame(event: string, payload: string): string {
  return `event: ${event}\ndata: ${payload}\n\n`;
}

/**
 * What SseSplitter.pushSparse searches for: a JSON key holding an object, as compact serialisers
 * write it (`"usage":{`) and as Python-style ones do (`"usage": {`). Frames where the key is null
 * (a stream with include_usage sends `"usage":null` in every chunk) do not match.
 */
export class ObjectKeyNeedle {
  readonly compact: Buffer;
  readonly spaced: Buffer;
  constructor(key: string) {
    this.compact = Buffer.from(`"${key}":{`);
    this.spaced = Buffer.from(`"${key}": {`);
  }
}

/**
 * True when the frame has the JSON key (given as `"name"` bytes) followed by an object rather than
 * null: a byte search that spares parsing the frames that do not carry it.
 */
export function hasObjectField(frame: Buffer, quotedKey: Buffer): boolean {
  for (let at = frame.indexOf(quotedKey); at >= 0; at = frame.indexOf(quotedKey, at + 1)) {
    let i = at + quotedKey.length;
    while (frame[i] === 0x20) i++;
    if (frame[i++] !== 0x3a) continue;
    while (frame[i] === 0x20) i++;
    if (frame[i] === 0x7b) return true;
  }
  return false;
}

/** How an event stream's first line can start: a field (`data:`, `event:`, `id:`, `retry:`) or a comment. */
const SSE_STARTS = ['data:', 'event:', 'id:', 'retry:', ':'].map((s) => Buffer.from(s));
/** Leading blank lines looked through before a body is taken for something else. */
const SNIFF_BYTES = 1024;

/**
 * Whether a body that was not labelled `text/event-stream` is one anyway (self-hosted servers send
 * SSE as `text/plain`): its first line starts like an SSE field or comment. Undefined until the
 * first bytes decide it.
 */
export function sniffEventStream(head: Buffer): boolean | undefined {
  let i = head[0] === 0xef && head[1] === 0xbb && head[2] === 0xbf ? 3 : 0;
  while (i < head.length && (head[i] === LF || head[i] === CR)) i++;
  if (i === head.length) return head.length > SNIFF_BYTES ? false : undefined;
  let undecided = false;
  for (const start of SSE_STARTS) {
    const n = Math.min(start.length, head.length - i);
    if (head.compare(start, 0, n, i, i + n) !== 0) continue;
    if (n === start.length) return true;
    undecided = true;
  }
  return undecided ? undefined : false;
}
