/**
 * Content-generation streams. Clients ask for SSE (`?alt=sse`, data-only events) or, without it,
 * get the real API's streamed JSON array. Upstream Gemini streams are always requested as SSE.
 */
import {
  canonical as C,
  type ClientStream,
  dataFrame,
  estimateUsage,
  type Exchange,
  firstFrameToStopAt,
  frameData,
  GatewayError,
  hasObjectField,
  HOLE,
  jsonOrUndefined,
  jsonTemplate,
  newId,
  ObjectKeyNeedle,
  type SparseScan,
  StateKey,
  unreadableEvent,
  type Usage,
} from '../../../src/plugin-api.js';
import { blockedPrompt, hasGeminiUsage, readFinishReason, readGeminiUsage, readParts, writeAnswerParts, writeFinishReason, writeGeminiUsage } from './canonical.js';
import type { GeminiAnswer, GeminiPart, GeminiUsage, UpstreamGeminiAnswer, UpstreamGeminiUsage } from './wire.js';


/** Set when the client asked for SSE; otherwise it gets a JSON array. */
export const sseMode = new StateKey<boolean>('gemini sse');

const USAGE_KEY = Buffer.from('"usageMetadata"');
/** `"usageMetadata":{`: in a stream's frames, and in a complete answer (family.ts's bodyUsage). */
export const USAGE_METADATA = new ObjectKeyNeedle('usageMetadata');
const USAGE_FRAMES: SparseScan = { key: USAGE_METADATA, lastFrame: false };

/**
 * What a frame that says why a stream ends holds: a candidate's `finishReason`, or a blocked
 * prompt's `blockReason` (such a stream has no candidate). Searched with their colon, which an
 * escaped quote inside a text can never be followed by.
 */
const ENDING_KEYS = [Buffer.from('"finishReason":'), Buffer.from('"blockReason":')];
const saysWhyItEnds = (bytes: Buffer) => ENDING_KEYS.some((key) => bytes.includes(key));
/** A JSON object's outline: `{` first, `}` last, whitespace aside. */
const OBJECT_OUTLINE = /^\s*\{[^]*\}\s*$/;
/** An event that is Google's error: `{"error": {…}}`. */
const ERROR_EVENT = /^\s*\{\s*"error"\s*:/;

/** Frames events as SSE, or as the elements of one JSON array. */
export class GeminiFraming {
  private opened = false;
  constructor(private readonly sse: boolean) {}

  event(payload: string): string {
    if (this.sse) return dataFrame(payload);
    const out = (this.opened ? ',\r\n' : '[') + payload;
    this.opened = true;
    return out;
  }

  close(): string {
    return this.sse ? '' : this.opened ? ']' : '[]';
  }
}

/**
 * Relays a Gemini upstream stream. SSE clients get the bytes as they are; array clients get each
 * event's JSON. Usage totals are cumulative, so only the last frame that carries them is parsed;
 * when none did, a last event carries an estimate, so the client always gets usage.
 */
export function geminiPassthrough(ex: Exchange, errorBody: (err: GatewayError) => string): ClientStream {
  const sse = ex.get(sseMode) === true;
  const framing = new GeminiFraming(sse);
  let lastUsageFrame: Buffer | undefined;
  let pending = '';
  let estimate: Usage | undefined;
  /** A frame said why the stream ends: a finishReason, or a blocked prompt's reason (a stream with no candidate). */
  let saidWhy = false;
  return {
    // As SSE the frames pass unchanged and only usage frames matter; as a JSON array each is rewritten.
    // Every relayed frame must be outlined as a JSON object, or the stream ends with the error event; the upstream's own error event ends it too.
    ...(sse && {
      sparse: USAGE_FRAMES,
      check(run: Buffer) {
        saidWhy ||= saysWhyItEnds(run);
        return firstFrameToStopAt(run, '[DONE]');
      },
    }),
    frame(frame) {
      // A copy: a view would pin the whole upstream chunk for the rest of the stream.
      if (hasObjectField(frame, USAGE_KEY)) lastUsageFrame = Buffer.from(frame);
      if (sse) return true;
      const data = frameData(frame);
      if (!data) return false;
      // An event that is not a JSON object would break the array the client parses: the failure event instead.
      if (!OBJECT_OUTLINE.test(data)) throw new GatewayError('upstream_error', `The upstream sent a stream event that is not JSON: ${data.slice(0, 80)}`);
      // The upstream's own failure event is a reason too (as SSE, the relay stops at it).
      saidWhy ||= ERROR_EVENT.test(data) || saysWhyItEnds(frame);
      pending += framing.event(data);
      return false;
    },
    take() {
      const out = pending;
      pending = '';
      return out;
    },
    end() {
      // Closed before any frame said why it stops: cut short, not a whole answer.
      if (!saidWhy) throw new GatewayError('upstream_error', 'The upstream ended the stream before a finishReason: it was cut short.');
      if (lastUsageFrame) return framing.close();
      estimate = estimateUsage(ex);
      return framing.event(JSON.stringify({ usageMetadata: writeGeminiUsage(estimate), modelVersion: ex.modelId })) + framing.close();
    },
    // The frames read before the failure come first: it may be thrown from `frame`, before they were taken.
    fail(err) {
      const before = pending;
      pending = '';
      return before + framing.event(errorBody(err)) + framing.close();
    },
    usage: () => estimate ?? (lastUsageFrame && readGeminiUsage(jsonOrUndefined<{ usageMetadata?: UpstreamGeminiUsage }>(frameData(lastUsageFrame))?.usageMetadata)),
  };
}

/** Upstream Gemini events → canonical events. Call indexes keep counting across chunks (7.11 item 1). */
export function geminiStreamReader(): C.StreamReader {
  let started = false;
  let calls = 0;
  let finish: string | undefined;
  let usageMetadata: UpstreamGeminiUsage | undefined;
  return {
    frame(data) {
      const chunk: UpstreamGeminiAnswer | undefined = jsonOrUndefined(data);
      if (!chunk) return [unreadableEvent()];
      if (chunk.error) {
        const e = chunk.error;
        // UNAVAILABLE is Google's overloaded: a 503, as Anthropic's overloaded_error is, so a Messages client gets its overloaded_error.
        const code = e.status === 'UNAVAILABLE' ? 'upstream_unavailable' : 'upstream_error';
        return [{ type: 'error', error: new GatewayError(code, e.message ?? 'The upstream failed.', null, undefined, e.status) }];
      }
      const blocked = blockedPrompt(chunk);
      if (blocked) return [{ type: 'error', error: blocked }];
      const events: C.Event[] = [];
      if (!started) {
        started = true;
        events.push({ type: 'start', id: chunk.responseId, model: chunk.modelVersion });
      }
      const candidate = chunk.candidates?.[0];
      const { text, reasoning, calls: found } = readParts(candidate?.content?.parts ?? [], () => calls++);
      if (reasoning) events.push({ type: 'reasoning', delta: reasoning });
      if (text) events.push({ type: 'text', delta: text });
      for (const call of found) {
        events.push({ type: 'tool_call', index: call.index, id: call.id, name: call.name, ...(call.signature && { signature: call.signature }) });
        events.push({ type: 'tool_arguments', index: call.index, delta: call.arguments });
      }
      if (candidate?.finishReason) finish = candidate.finishReason;
      // Totals are cumulative: a chunk without them must not erase what is known (7.11 item 5).
      // Every chunk carries them, so only the last is read, once, at the end.
      if (hasGeminiUsage(chunk.usageMetadata)) usageMetadata = chunk.usageMetadata;
      return events;
    },
    end() {
      // A stream that never said why it stopped was cut short: the client gets the failure, not a finish.
      if (finish === undefined) return [{ type: 'error', error: new GatewayError('upstream_error', 'The upstream stream ended before its finishReason: it was cut short.') }];
      const events: C.Event[] = [{ type: 'finish', reason: readFinishReason(finish, calls) }];
      const usage = readGeminiUsage(usageMetadata);
      if (usage) events.push({ type: 'usage', usage });
      return events;
    },
  };
}

/**
 * Canonical events → Gemini increments. Text goes out as it comes; a call goes out whole, as
 * Gemini sends them; the last event carries the finish reason and the usage totals.
 */
export function geminiStreamWriter(ex: Exchange, errorBody: (err: GatewayError) => string): C.StreamWriter {
  const framing = new GeminiFraming(ex.get(sseMode) === true);
  const responseId = newId('', 12);
  const calls: C.ToolCall[] = [];
  let finish: C.FinishReason = 'stop';
  let usage: Usage | undefined;
  const increment = (parts: GeminiPart[], extra: { candidate?: { finishReason: string }; top?: { usageMetadata?: GeminiUsage } } = {}): GeminiAnswer => ({
    candidates: [{ content: { role: 'model', parts }, ...extra.candidate, index: 0 }],
    ...extra.top,
    modelVersion: ex.modelId,
    responseId,
  });
  const chunk = (...args: Parameters<typeof increment>) => framing.event(JSON.stringify(increment(...args)));
  // A token's increment is the same JSON around its text: a template (jsonTemplate), so a token
  // costs the JSON of its text, where serialising the increment took as long as reading it.
  const [textBefore, textAfter] = jsonTemplate(increment([{ text: HOLE }]));
  const [thoughtBefore, thoughtAfter] = jsonTemplate(increment([{ text: HOLE, thought: true }]));
  return {
    event(e) {
      switch (e.type) {
        case 'text':
          return framing.event(textBefore + JSON.stringify(e.delta) + textAfter);
        case 'reasoning':
          return framing.event(thoughtBefore + JSON.stringify(e.delta) + thoughtAfter);
        case 'tool_call':
          calls[e.index] = { id: e.id, name: e.name, arguments: '', ...(e.signature && { signature: e.signature }) };
          return '';
        case 'tool_arguments':
          if (calls[e.index]) calls[e.index]!.arguments += e.delta;
          return '';
        case 'finish':
          finish = e.reason;
          return '';
        case 'usage':
          usage = e.usage;
          return '';
        default:
          return '';
      }
    },
    end() {
      const parts = calls.length ? writeAnswerParts('', undefined, calls) : [{ text: '' }];
      const last = chunk(parts, { candidate: { finishReason: writeFinishReason(finish) }, top: usage ? { usageMetadata: writeGeminiUsage(usage) } : {} });
      return last + framing.close();
    },
    fail: (err) => framing.event(errorBody(err)) + framing.close(),
  };
}
