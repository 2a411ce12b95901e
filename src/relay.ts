/**
 * The relay: one upstream answer on its way to the client, as the upstream's own bytes (same
 * family) or translated through canonical events. Every callback is guarded so an exception ends
 * the exchange in the family's terms; the pipeline owns the exchange's end.
 */
import { AnswerCollector, eventsOf, type Event, type FinishReason, type Response, type StreamReader } from './canonical.js';
import type { ClientResponse } from './client-response.js';
import { retryAfterMs, type Failover } from './channels/failover.js';
import type { ClientStream, FamilyPassthrough, Plugin, ResponseSink, Upstream, UpstreamCall, UpstreamDialect } from './contracts.js';
import { scrubBytes, scrubError, scrubText } from './upstream-secrets.js';
import { fittedToolNames, restoreEventNames, restoreToolNames } from './tool-names.js';
import { implausibleCount, type Usage } from './usage.js';
import { errorHeaders, GatewayError, withRetryAfter } from './errors.js';
import { errorInAnswer, looksLikeJsonObject } from './json-body.js';
import { StateKey } from './state-key.js';
import type { Exchange } from './exchange.js';
import type { Outcome } from './contracts.js';
import { replaceStringField } from './json-splice.js';
import { SseSplitter, failureSaid, frameData, frameEndAt, sniffEventStream, sseLines, type SparseScan } from './sse.js';
import { SAMPLE_BYTES, answerText, deliveredOutput, deliveredScale, estimateUsage } from './usage-estimate.js';

const NO_BODY = Buffer.alloc(0);

/**
 * What a relay needs of the exchange's owner, the pipeline (src/pipeline.ts): its size limits, and
 * how an exchange goes on or ends. The relay is handed one, so the pipeline, which starts relays,
 * depends on the relay and not the other way round.
 */
export interface RelayOwner {
  /** Largest complete (non-stream) upstream answer that is read. */
  readonly maxUpstreamBodyBytes: number;
  /** Largest single upstream stream event. */
  readonly maxEventBytes: number;
  /**
   * A plugin records the upstream calls as spans (Plugin.callSpan) and reads finish reasons: only
   * then does a relayed answer keep what its finish reason is read from (the last runs, the body).
   */
  readonly tracesCalls: boolean;
  /** Runs `step` unless the exchange is over; an exception becomes the family's error. */
  attempt(ex: Exchange, res: ClientResponse, step: () => void): void;
  /** An exception anywhere in the exchange: the client gets the family's error and the exchange ends. */
  crash(ex: Exchange, res: ClientResponse, thrown: unknown): void;
  /** The done phase, exactly once. */
  finish(ex: Exchange, res: ClientResponse): void;
  /** Answers with the family's error body, unless the client is gone (the exchange is not finished yet). */
  fail(ex: Exchange, res: ClientResponse, err: GatewayError): void;
}

/** The exchange's relay while an upstream call is under way. */
export const activeRelay = new StateKey<Relay>('active relay');

/**
 * Relays one upstream answer to the client. A same-family stream is forwarded as the upstream's
 * own bytes (frames are only looked at); otherwise the upstream dialect reads it into canonical
 * events and the client family writes them. Every callback is guarded: an exception ends the
 * exchange in the family's terms instead of reaching the upstream's transport.
 */
export class Relay implements ResponseSink {
  call: UpstreamCall | undefined;
  /** The upstream's own failure event reached the client: the stream ends with nothing more. */
  private failureRelayed = false;
  private status = 0;
  /** The upstream's Retry-After on a 429 or 503. */
  private retryAfter: string | string[] | undefined;
  private stream: ClientStream | undefined;
  private readonly collected: Buffer[] = [];
  private collectedBytes = 0;
  private readonly splitter: SseSplitter;
  private writable = true;
  /** A stream was asked for and the answer is not labelled as one: its first bytes decide. */
  private sniffing = false;
  /** Splices the client's name for the model into a passthrough answer, when it differs from the upstream's. */
  private readonly rename: ((json: Buffer) => Buffer) | undefined;
  /** Renamed frames of the current chunk, written together after it. */
  private readonly renamed: Buffer[] = [];
  /** The upstream speaks the client's family: its bytes are the client's. */
  /** The family's own passthrough, when the upstream speaks the client's family and the family relays its bytes. */
  private readonly passthrough: FamilyPassthrough | undefined;
  /** Passthrough: only the frames this scan names are visited (see ClientStream.sparse). */
  private sparse: SparseScan | undefined;
  /** Passthrough: the first bytes relayed, and how many were relayed, for a usage estimate. */
  private readonly sample: Buffer[] = [];
  private sampled = 0;
  /**
   * Pieces of the sample at and after this index are views of the current upstream chunk, copied
   * when the next one arrives (a view would pin its chunk for the rest of the stream). A stream
   * that arrives whole in one chunk is never copied: 16 KB fewer per stream, in a backing store of
   * its own that counted towards V8's next collection.
   */
  private sampleViews = 0;
  private relayed = 0;
  /** The answer as it goes, in canonical form, when the exchange keeps it (ExchangeView.keepAnswer). */
  private kept: AnswerCollector | undefined;
  /** Passthrough stream kept: the dialect's reading of the frames the client gets as they are. */
  private keptReader: StreamReader | undefined;
  /**
   * Passthrough streams: the last few runs of frames relayed (views of small runs, the end of a
   * large one), where the finish reason is: read from them only if a plugin asks (see
   * `finishReasonsOfTail`).
   */
  private readonly tail: Buffer[] = [];
  private tailRuns = 0;

  constructor(
    private readonly pipeline: RelayOwner,
    private readonly ex: Exchange,
    private readonly res: ClientResponse,
    private readonly upstream: Upstream,
    private readonly dialect: UpstreamDialect,
    private readonly framePlugins: Plugin[],
    /** Hears how the call went; before anything reached the client, it may try another channel. */
    private readonly failover: Failover,
  ) {
    this.splitter = new SseSplitter(pipeline.maxEventBytes);
    this.passthrough = dialect.family === ex.family ? ex.clientFamily.passthrough : undefined;
    const key = this.passthrough?.modelKey;
    if (this.passthrough && key && ex.modelId !== ex.model!.upstreamModel) {
      const quotedKey = Buffer.from(key);
      const name = Buffer.from(JSON.stringify(ex.modelId));
      this.rename = (json) => replaceStringField(json, quotedKey, name);
    }
  }

  private readonly resume = () => this.call?.resume();

  private readonly write = (bytes: Buffer | string) => {
    this.ex.ttfbMs ??= this.ex.elapsedMs();
    if (!this.res.write(bytes)) this.writable = false;
  };

  /**
   * The upstream's own bytes on their way to the client (a passthrough), as the stream edits
   * them (ClientStream.edit), sampled for an estimate.
   * Each write is whole frames, and is sampled whole while the sample is short of SAMPLE_BYTES, so
   * the sample is whole frames too, however long the first one is (bounded by maxEventBytes).
   * A frame that is not one of the family's events (ClientStream.check) is not relayed: the frames
   * before it are, and the stream ends with the family's failure, as a failure of the channel.
   */
  private readonly relay = (bytes: Buffer) => {
    const stop = this.stream!.check?.(bytes) ?? -1;
    if (stop >= 0) {
      const end = frameEndAt(bytes, stop);
      const said = failureSaid(bytes.subarray(stop, end));
      if (said !== undefined) {
        // The upstream's own failure event: the client gets it as it came (its secrets aside), and nothing after it.
        this.forward(scrubBytes(bytes.subarray(0, end), this.upstream.secrets));
        throw this.upstreamFailed(said);
      }
      if (stop > 0) this.forward(bytes.subarray(0, stop));
      throw this.malformedEvent(bytes.subarray(stop));
    }
    this.forward(bytes);
  };

  private forward(bytes: Buffer): void {
    const edited = this.stream!.edit?.(bytes) ?? bytes.length;
    if (edited < bytes.length) bytes = bytes.subarray(0, edited);
    this.relayed += bytes.length;
    // Only traced exchanges read it. A view keeps its whole chunk alive: a large run (a backlog read
    // at once) keeps a copy of its end instead.
    if (this.pipeline.tracesCalls) this.tail[this.tailRuns++ % TAIL_RUNS] = bytes.length <= TAIL_RUN_BYTES ? bytes : Buffer.from(bytes.subarray(bytes.length - TAIL_RUN_BYTES));
    if (this.sampled < SAMPLE_BYTES) {
      this.sample.push(bytes);
      this.sampled += bytes.length;
    }
    this.write(bytes);
  }

  /** The failure for a passthrough stream event (the first in `frames`) that is not one of the family's; the channel is failing. */
  private malformedEvent(frames: Buffer): GatewayError {
    const end = frames.indexOf('\n\n');
    const event = end < 0 ? frames : frames.subarray(0, end);
    const what = sseLines(event) ? 'a stream event that is not JSON' : 'a line that is not a stream event';
    const err = new GatewayError('upstream_error', `Upstream \`${this.upstream.name}\` sent ${what}: ${scrubText(excerpt(event), this.upstream.secrets)}`);
    // The call is stopped here: once the failover has settled the attempt, it no longer knows the call.
    this.call?.abort();
    this.failover.failed(err, undefined, false);
    return err;
  }

  /** The upstream's failure event was relayed: the call stops here, and the failure is the channel's. */
  private upstreamFailed(said: string): GatewayError {
    const err = new GatewayError('upstream_error', `Upstream \`${this.upstream.name}\` failed midway: ${scrubText(said, this.upstream.secrets)}`);
    this.failureRelayed = true;
    this.call?.abort();
    this.failover.failed(err, undefined, false);
    return err;
  }

  private readonly visit = (frame: Buffer): boolean => {
    for (const plugin of this.framePlugins) plugin.frame!(this.ex, frame);
    if (this.keptReader) this.keepFrame(frame);
    return this.stream!.frame(frame);
  };

  /**
   * Reads a relayed frame into the kept answer. The client gets the frame whatever the reading
   * makes of it: a frame the dialect cannot read only lets the kept answer go.
   */
  private keepFrame(frame: Buffer): void {
    try {
      const data = frameData(frame);
      if (data !== null) this.keep(this.keptReader!.frame(data));
    } catch {
      this.letAnswerGo();
    }
  }

  /** Adds events to the kept answer; an answer with an error in it, or grown past its limit, is not kept. */
  private readonly keep = (events: Event[]): void => {
    for (const e of events) {
      if (!this.kept) return;
      if (e.type === 'error') return this.letAnswerGo();
      this.kept.add(e);
      if (this.kept.chars > this.ex.keptAnswerLimit!) return this.letAnswerGo();
    }
  };

  private letAnswerGo(): void {
    this.kept = undefined;
    this.keptReader = undefined;
  }

  /** Visits the renamed copy of a frame, kept to be written after the chunk (so frames stay in order). */
  private readonly visitRenamed = (frame: Buffer): boolean => {
    const renamed = this.rename!(frame);
    if (this.visit(renamed)) this.renamed.push(renamed);
    return false;
  };

  start(status: number, headers: Record<string, string | string[] | undefined>): void {
    const { ex, res } = this;
    // A stream's wait on the upstream ends here; a whole body's at its end.
    if (ex.stream) answered(ex);
    this.pipeline.attempt(ex, res, () => {
      this.status = status;
      if (status === 429 || status >= 500) this.retryAfter = headers['retry-after'];
      if (!ex.stream || status < 200 || status >= 300) return;
      if (String(headers['content-type'] ?? '').includes('text/event-stream')) this.startStream();
      else this.sniffing = true;
    });
  }

  private startStream(): void {
    const { ex, res } = this;
    // No other channel is tried once a stream began: the client's bytes are not needed again, and
    // a stream may last hours.
    ex.body = NO_BODY;
    const { passthrough } = this;
    if (ex.keptAnswerLimit !== undefined) this.kept = new AnswerCollector();
    if (passthrough) {
      this.stream = passthrough.stream(ex);
      if (this.kept) this.keptReader = this.dialect.streamReader(ex);
      else if (!this.rename && this.framePlugins.length === 0) this.sparse = this.stream.sparse;
      ex.set(deliveredOutput, () => (this.sampled ? passthrough.deliveredText(framesOf(Buffer.concat(this.sample, this.sampled))) : ''));
      ex.set(deliveredScale, () => (this.sampled ? this.relayed / this.sampled : 1));
    } else {
      this.stream = translating(ex, this.dialect, this.kept && this.keep, this.upstream.secrets);
    }
    ex.status = 200;
    ex.stage = 'streaming';
    res.startStream(200, { 'content-type': ex.clientFamily.streamContentType(ex), 'cache-control': 'no-cache', 'x-accel-buffering': 'no' });
  }

  data(chunk: Buffer): boolean {
    const { ex, res } = this;
    if (ex.over) return false;
    try {
      if (!this.stream) {
        this.collectedBytes += chunk.length;
        if (this.collectedBytes > this.pipeline.maxUpstreamBodyBytes) {
          throw new GatewayError('upstream_error', `Upstream \`${this.upstream.name}\` sent an answer larger than ${this.pipeline.maxUpstreamBodyBytes} bytes.`);
        }
        this.collected.push(chunk);
        if (!this.sniffing) return true;
        const head = this.collected.length === 1 ? chunk : Buffer.concat(this.collected, this.collectedBytes);
        const isEventStream = sniffEventStream(head);
        if (isEventStream === undefined) return true;
        this.sniffing = false;
        if (!isEventStream) return true;
        this.collected.length = 0;
        this.collectedBytes = 0;
        this.startStream();
        chunk = head;
      }
      this.writable = true;
      for (; this.sampleViews < this.sample.length; this.sampleViews++) this.sample[this.sampleViews] = Buffer.from(this.sample[this.sampleViews]!);
      const out = this.passthrough ? this.relay : this.write;
      if (this.sparse) this.splitter.pushSparse(chunk, this.sparse, this.visit, out);
      else this.splitter.push(chunk, this.rename ? this.visitRenamed : this.visit, out);
      this.writeRenamed();
      const own = this.stream!.take?.();
      if (own) this.write(own);
      // A translated stream's failure event has ended it for the client: the upstream is not
      // waited on to close (a silent one would hold the client until its idle deadline).
      if (ex.error && !this.passthrough) {
        this.call?.abort();
        this.end();
        return false;
      }
      if (!this.writable) res.onWritable(this.resume);
      return this.writable;
    } catch (err) {
      this.pipeline.crash(ex, res, err);
      return false;
    }
  }

  end(): void {
    const { ex, res } = this;
    answered(ex);
    this.pipeline.attempt(ex, res, () => {
      const stream = this.stream;
      if (stream) {
        // An unterminated last event is terminated, so the client's parser sees it (and nothing joins it).
        const rest = this.splitter.flush();
        if (rest && this.rename) this.visitRenamed(Buffer.concat([rest, this.splitter.delimiterOrDefault()]));
        else if (rest && this.visit(rest)) this.relay(Buffer.concat([rest, this.splitter.delimiterOrDefault()]));
        this.writeRenamed();
        const taken = stream.take?.() ?? '';
        let closing: string;
        try {
          closing = stream.end();
        } catch (err) {
          if (!(err instanceof GatewayError)) throw err;
          // Cut short before the family's last event: the client gets its failure, the channel the blame.
          if (taken) this.write(taken);
          this.failover.failed(err, undefined, false);
          this.failed(err);
          return this.pipeline.finish(ex, res);
        }
        res.end(taken + closing);
        ex.usage ??= stream.usage();
        if (this.keptReader) {
          try {
            this.keep(this.keptReader.end());
          } catch {
            this.letAnswerGo();
          }
        }
        // A stream that ended without saying why it stopped was cut short: not an answer to keep.
        if (this.kept?.finished && !ex.error) ex.answer = this.kept.answer();
        // A failure event inside the stream is the channel's failure too.
        if (ex.error) this.failover.failed(ex.error, undefined, false);
        else {
          if (ex.answer) ex.answeredBecause([ex.answer.finishReason]);
          else if (this.passthrough && this.pipeline.tracesCalls) ex.answeredBecause(() => this.finishReasonsOfTail());
          this.failover.succeeded();
        }
      } else {
        // An answer that came in one read is that read's own bytes (a Buffer of its own, never reused).
        const body = this.collected.length === 1 ? this.collected[0]! : Buffer.concat(this.collected, this.collectedBytes);
        let failure = this.channelFailure(body);
        // A translated answer is read before the channel is judged: a 200 the dialect cannot read
        // (an error in it, no answer) is the channel failing. A refusal (a blocked prompt) is not.
        let answer: Response | undefined;
        let refusal: unknown;
        // A passthrough answer is read too when a stream was asked for: it is written as one.
        if (!failure && (!this.passthrough || ex.stream) && this.status >= 200 && this.status < 300) {
          try {
            answer = restoreToolNames(this.dialect.readResponse(body, ex), ex.get(fittedToolNames));
          } catch (err) {
            if (err instanceof GatewayError && err.code === 'upstream_error') failure = scrubError(new GatewayError('upstream_error', `Upstream \`${this.upstream.name}\` answered ${this.status}: ${err.message}`), this.upstream.secrets);
            else refusal = err;
          }
        }
        // Nothing has reached the client yet: another channel may answer instead.
        if (failure && this.failover.failed(failure, this.retryAfterMs(failure), true, this.status === 429)) return;
        if (!failure) this.failover.succeeded();
        if (refusal) throw refusal;
        this.finishCollected(body, failure, answer);
      }
      this.pipeline.finish(ex, res);
    });
  }

  error(err: GatewayError): void {
    const { ex, res } = this;
    this.pipeline.attempt(ex, res, () => {
      if (this.failover.failed(err, undefined, !this.stream)) return;
      this.failed(err);
      this.pipeline.finish(ex, res);
    });
  }

  /**
   * The finish reason of a passthrough stream that ended cleanly: its last frames read by the
   * upstream dialect's stream reader, the last finish it reports. A reason that depends on earlier
   * frames (a Gemini or Responses tool call long before the end) may read as `stop`.
   */
  private finishReasonsOfTail(): FinishReason[] | undefined {
    const runs = this.tailRuns;
    const kept = Math.min(runs, TAIL_RUNS);
    const bytes = Buffer.concat(Array.from({ length: kept }, (_, i) => this.tail[(runs - kept + i) % TAIL_RUNS]!));
    return finishReasonOf(() => {
      const reader = this.dialect.streamReader(this.ex);
      let reason: FinishReason | undefined;
      const read = (events: Event[]) => {
        for (const e of events) if (e.type === 'finish') reason = e.reason;
      };
      for (const frame of framesOf(bytes)) {
        const data = frameData(frame);
        if (data !== null) read(reader.frame(data));
      }
      read(reader.end());
      return reason;
    });
  }

  private writeRenamed(): void {
    if (this.renamed.length === 0) return;
    this.relay(this.renamed.length === 1 ? this.renamed[0]! : Buffer.concat(this.renamed));
    this.renamed.length = 0;
  }

  /** The exchange failed midway: a stream ends with its family's failure event, anything else with an error reply. */
  failed(err: GatewayError): void {
    const { ex, res, stream } = this;
    // Whatever the upstream said, from any reader (a passthrough stream's check included), keeps its secrets out.
    err = scrubError(err, this.upstream.secrets);
    ex.failedWith(err);
    ex.usage ??= stream?.usage();
    if (!stream) return this.pipeline.fail(ex, res, err);
    if (!ex.aborted) res.end(this.failureRelayed ? '' : stream.fail(err));
  }

  /** The pipeline cut the exchange short (the upstream call is already aborted). */
  interrupted(outcome: Outcome): void {
    this.ex.usage ??= this.stream?.usage();
    if (outcome === 'shutdown') this.failed(new GatewayError('shutting_down', 'The gateway shut down before the answer was complete.'));
  }

  /**
   * A complete answer that says the channel is failing, not the client: a 5xx, a 429, a refusal of
   * the gateway's own credentials, or a passthrough 2xx that is not an answer of the family. Other
   * 4xx are the client's own mistake.
   */
  private channelFailure(body: Buffer): GatewayError | undefined {
    const failure = this.readChannelFailure(body);
    return failure && scrubError(failure, this.upstream.secrets);
  }

  private readChannelFailure(body: Buffer): GatewayError | undefined {
    const { status } = this;
    // A passthrough 2xx whose body is not the family's answer (cut short, text in place of JSON, an
    // error, JSON without the answer's fields) is the channel failing too; said as what it is.
    if (status >= 200 && status < 300) {
      if (!this.passthrough) return undefined;
      const answer = this.passthrough.isAnswer?.(body) !== false;
      if (!answer && !looksLikeJsonObject(body)) {
        return new GatewayError('upstream_error', `Upstream \`${this.upstream.name}\` answered ${status} with a body that is not JSON (${body.length} bytes): ${excerpt(body)}`);
      }
      const said = errorInAnswer(body);
      if (said !== undefined) return new GatewayError('upstream_error', `Upstream \`${this.upstream.name}\` answered ${status}: The upstream answered with an error: ${said}`);
      return answer ? undefined : new GatewayError('upstream_error', `Upstream \`${this.upstream.name}\` answered ${status} with JSON that is not an answer (${body.length} bytes): ${excerpt(body)}`);
    }
    if (status < 500 && status !== 429 && status !== 401 && status !== 403) return undefined;
    const err = this.dialect.readError(status, body);
    return new GatewayError('upstream_error', `Upstream \`${this.upstream.name}\` answered ${status}: ${err.message}`, null, undefined, undefined, err.retryAfterSeconds);
  }

  /** How long the upstream asked to wait, in ms: its Retry-After header, else what its error body says (Gemini's RetryInfo). */
  private retryAfterMs(err: GatewayError): number | undefined {
    return retryAfterMs(this.retryAfter) ?? (err.retryAfterSeconds !== undefined ? err.retryAfterSeconds * 1000 : undefined);
  }

  /** A complete upstream body: the answer in the client's family, or a failure in its terms. */
  private finishCollected(body: Buffer, failure: GatewayError | undefined, translated: Response | undefined): void {
    const { ex, res, upstream, dialect, status, passthrough } = this;
    if (status >= 200 && status < 300) {
      if (failure) return this.failed(failure);
      ex.status = status;
      ex.ttfbMs ??= ex.elapsedMs();
      if (passthrough && !ex.stream) {
        ex.usage = passthrough.bodyUsage(body);
        if (ex.keptAnswerLimit !== undefined) ex.answer = readKept(dialect, body, ex);
        // Without a count it can use (none, or an impossible one), the done phase estimates: from this answer's text.
        if (!ex.usage || implausibleCount(ex.usage)) ex.set(deliveredOutput, () => answerTextOf(ex.answer ?? readKept(dialect, body, ex)));
        if (ex.answer) ex.answeredBecause([ex.answer.finishReason]);
        else if (this.pipeline.tracesCalls) ex.answeredBecause(() => finishReasonOf(() => dialect.readResponse(body, ex).finishReason));
        res.reply(status, { 'content-type': 'application/json' }, this.rename ? this.rename(body) : body);
        return;
      }
      const answer: Response = translated!;
      answer.usage ??= estimateUsage(ex, answerText(answer));
      ex.usage = answer.usage;
      if (implausibleCount(answer.usage)) ex.set(deliveredOutput, () => answerText(answer));
      if (ex.keptAnswerLimit !== undefined) ex.answer = answer;
      ex.answeredBecause([answer.finishReason]);
      // A stream asked for and answered whole (the upstream ignored `stream`): the client still gets
      // the stream it asked for, not a body its SDK would read as no events at all.
      if (ex.stream) return writeAnswerStream(ex, res, answer);
      res.reply(status, { 'content-type': 'application/json' }, ex.clientFamily.writeResponse(answer, ex));
      return;
    }
    const read = scrubError(dialect.readError(status, body), upstream.secrets);
    // A 429's or a 503's wait reaches the client in its family's terms: the header, and the body's field where it has one.
    const waitMs = this.retryAfterMs(read);
    const retryAfter = waitMs === undefined ? undefined : Math.ceil(waitMs / 1000);
    const err = status === 429 ? withRetryAfter(read, retryAfter) : read;
    if (err.status === 401 || err.status === 403) {
      this.pipeline.fail(ex, res, new GatewayError('upstream_error', `Upstream \`${upstream.name}\` rejected the gateway's credentials (${status}).`));
    } else if (status >= 400 && status < 500) {
      // The client's own mistake as the upstream saw it: same status; the same body when the family
      // matches. Translated, the upstream's words name its own fields (`messages` for a Responses
      // `input`), so they are said as the upstream's, without a `param` the client's request lacks.
      const said = passthrough
        ? err
        : new GatewayError(err.code, `Upstream \`${upstream.name}\` answered ${status} to the request as translated for it: ${err.message}`, null, err.status, err.upstreamCode, err.retryAfterSeconds);
      ex.failedWith(said);
      ex.status = status;
      res.reply(status, errorHeaders(said), passthrough ? scrubBytes(body, upstream.secrets) : ex.clientFamily.errorBody(said));
    } else {
      const message = `Upstream \`${upstream.name}\` answered ${status}: ${err.message}`;
      // The dialect's reading of the status counts (Anthropic's 529, overloaded, is a 503).
      const code = err.status === 503 ? 'upstream_unavailable' : err.status === 504 ? 'upstream_timeout' : 'upstream_error';
      this.pipeline.fail(ex, res, new GatewayError(code, message, null, undefined, undefined, code === 'upstream_unavailable' ? retryAfter : undefined));
    }
  }
}

/** How many of a passthrough stream's last runs of frames are kept for its finish reason: the finish, a usage chunk, the end. */
const TAIL_RUNS = 4;
/**
 * Of a longer run only its end is kept (the frame it cuts reads as unreadable and is skipped):
 * a stream's finish sits in its last few frames, well within this.
 */
const TAIL_RUN_BYTES = 16 * 1024;

/** A finish reason read from an answer already relayed: none when it cannot be read. */
function finishReasonOf(read: () => FinishReason | undefined): FinishReason[] | undefined {
  try {
    const reason = read();
    return reason === undefined ? undefined : [reason];
  } catch {
    return undefined;
  }
}

/** The start of an upstream's bytes, quoted, for an error message: enough to tell what it sent. */
function excerpt(bytes: Buffer): string {
  const text = bytes.toString('utf8', 0, Math.min(bytes.length, 80)).trimEnd();
  return JSON.stringify(bytes.length > 80 ? `${text}…` : text);
}

/** The frames of a sample of relayed bytes. */
function framesOf(sample: Buffer): Buffer[] {
  const frames: Buffer[] = [];
  new SseSplitter().push(sample, (frame) => (frames.push(frame), true), () => {});
  return frames;
}

const answerTextOf = (answer: Response | undefined) => (answer ? answerText(answer) : '');

/**
 * A complete answer written as the stream the client asked for, by its family's stream writer:
 * whole, before the stream starts, so a writer that throws is an error reply, not half a stream.
 */
export function writeAnswerStream(ex: Exchange, res: ClientResponse, answer: Response): void {
  const family = ex.clientFamily;
  const writer = family.streamWriter(ex);
  let frames = '';
  for (const event of eventsOf(answer)) frames += writer.event(event);
  frames += writer.end();
  ex.stage = 'streaming';
  res.startStream(200, { 'content-type': family.streamContentType(ex), 'cache-control': 'no-cache', 'x-accel-buffering': 'no' });
  res.end(frames);
}

/** A relayed passthrough answer in canonical form, to keep; undefined when the dialect cannot read it as an answer. */
function readKept(dialect: UpstreamDialect, body: Buffer, ex: Exchange): Response | undefined {
  try {
    return dialect.readResponse(body, ex);
  } catch {
    return undefined;
  }
}

/**
 * Reads upstream frames into canonical events and writes them as client frames, one write per
 * chunk; `keep`, when the exchange keeps its answer, hears every event.
 */
function translating(ex: Exchange, dialect: UpstreamDialect, keep: ((events: Event[]) => void) | undefined, secrets: readonly string[] | undefined): ClientStream {
  const reader = dialect.streamReader(ex);
  const renamed = ex.get(fittedToolNames);
  const writer = ex.clientFamily.streamWriter(ex);
  let usage: Usage | undefined;
  let sample = '';
  let delivered = 0;
  let failed = false;
  let pending = '';
  ex.set(deliveredOutput, () => sample);
  ex.set(deliveredScale, () => (sample.length ? delivered / sample.length : 1));
  const emit = (events: Event[]): string => {
    keep?.(events);
    let out = '';
    for (const e of events) {
      if (failed) break;
      if (e.type === 'usage') usage = e.usage;
      else if (e.type === 'text' || e.type === 'reasoning' || e.type === 'tool_arguments') {
        delivered += e.delta.length;
        if (sample.length < SAMPLE_BYTES) sample += e.delta;
      } else if (e.type === 'finish') {
        ex.answeredBecause([e.reason]);
      } else if (e.type === 'error') {
        failed = true;
        const error = scrubError(e.error, secrets);
        ex.failedWith(error);
        out += writer.fail(error);
        break;
      }
      out += writer.event(e);
    }
    return out;
  };
  return {
    frame(frame) {
      const data = frameData(frame);
      if (data !== null) pending += emit(restoreEventNames(reader.frame(data), renamed));
      return false;
    },
    take() {
      const out = pending;
      pending = '';
      return out;
    },
    end: () => {
      let out = emit(restoreEventNames(reader.end(), renamed));
      // Every client gets usage: counted locally when the upstream reported none.
      if (!failed && !usage) out += emit([{ type: 'usage', usage: estimateUsage(ex) }]);
      return failed ? out : out + writer.end();
    },
    fail: (err) => (failed ? '' : ((failed = true), writer.fail(err))),
    usage: () => usage,
  };
}

/** The upstream call under way has answered: what the exchange waited on it stops counting. */
function answered(ex: Exchange): void {
  const call = ex.calls.at(-1);
  if (call && call.waitMs === undefined) call.waitMs = performance.now() - call.sentMark;
}
