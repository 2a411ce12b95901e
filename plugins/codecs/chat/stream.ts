/** Chat completions streams: passthrough scanning, and reading/writing canonical events. */
import {
  canonical as C,
  type ClientStream,
  dataFrame,
  estimateUsage,
  type Exchange,
  firstFrameToStopAt,
  frameData,
  GatewayError,
  HOLE,
  jsonOrUndefined,
  jsonTemplate,
  LF,
  newId,
  ObjectKeyNeedle,
  occursAt,
  removeNullFields,
  type SparseScan,
  toolIdWithSignature,
  unixNow,
  unreadableEvent,
  type Usage,
} from '../../../src/plugin-api.js';
import { readOpenAiError } from '../openai-common.js';
import { chatFinishReason, readChatUsage, readFinishReason, writeChatUsage } from './canonical.js';
import type { ChatRequest } from './schema.js';
import type { ChatChunkHead, ChatDelta, ChatUsageChunk, UpstreamChatChunk } from './wire.js';

const USAGE_KEY = Buffer.from('"usage"');
/** `"usage":{`: the chunk that carries a stream's usage, and a complete answer's usage (family.ts's bodyUsage). */
export const USAGE_OBJECT = new ObjectKeyNeedle('usage');
const USAGE_FRAMES: SparseScan = { key: USAGE_OBJECT, lastFrame: false };
/** Usage frames, and each chunk's last frame: where `[DONE]` is, to be held back while usage is owed. */
const USAGE_AND_LAST_FRAMES: SparseScan = { key: USAGE_OBJECT, lastFrame: true };
const DONE_DATA = '[DONE]';
const DONE = `data: ${DONE_DATA}\n\n`;
const DATA_FIELD = Buffer.from('data:');
const DONE_BYTES = Buffer.from(DONE_DATA);

export const chatErrorFrame = (body: string) => dataFrame(body);

/** A `data: [DONE]` frame, told by its first bytes. */
const isDone = (frame: Buffer) => occursAt(frame, DATA_FIELD, 0) && occursAt(frame, DONE_BYTES, frame[5] === 0x20 ? 6 : 5);

/**
 * Relays a same-family stream. Only a frame that carries a usage object is parsed; the usage-only
 * chunk Sluice asked for on the client's behalf is kept from the client. When the client asked for
 * usage and none came by `[DONE]` (an upstream that cannot send it, or one that was asked and
 * stayed silent), `[DONE]` is held back so an estimated usage chunk goes first. Every relayed frame
 * must be `[DONE]` or outlined as a JSON object: anything else ends the stream with an error frame.
 * The upstream's own error frame ends it too, with nothing after it.
 */
export function chatPassthrough(
  ex: Exchange,
  { dropUsageChunk, wantsUsage }: { dropUsageChunk: boolean; wantsUsage: boolean },
  errorBody: (err: GatewayError) => string,
): ClientStream {
  let usage: Usage | undefined;
  /** The first chunk relayed, for the id of an estimated usage chunk. */
  let first: UpstreamChatChunk | undefined;
  let heldDone = false;
  /** The last run of frames relayed: its last event says whether the stream ended whole. */
  let lastRun: Buffer | undefined;
  return {
    // Only usage frames; owing the client usage, also each chunk's last frame, where [DONE] is.
    sparse: wantsUsage ? USAGE_AND_LAST_FRAMES : USAGE_FRAMES,
    // Asked for on the client's behalf, usage is not the client's to see, not even as the null of every chunk.
    ...(dropUsageChunk && { edit: (frames: Buffer) => removeNullFields(frames, USAGE_KEY) }),
    check(frames) {
      // Every relayed frame passes here, the first too (a sparse scan may visit none but [DONE]).
      if (wantsUsage && !first) first = jsonOrUndefined(frameData(frames.subarray(0, frames.indexOf(LF))));
      lastRun = frames;
      return firstFrameToStopAt(frames, DONE_DATA);
    },
    frame(frame) {
      if (wantsUsage && !usage && isDone(frame)) return !(heldDone = true);
      // The sparse scan's own test: a usage object, not the null every chunk carries.
      if (USAGE_OBJECT.find(frame, 0) < 0) return true;
      const chunk: UpstreamChatChunk | undefined = jsonOrUndefined(frameData(frame));
      if (!chunk) return true;
      usage = readChatUsage(chunk.usage) ?? usage;
      return !(dropUsageChunk && Array.isArray(chunk.choices) && chunk.choices.length === 0);
    },
    end() {
      // Closed before [DONE], the usage chunk or a finish_reason: cut short, not a whole answer.
      if (!heldDone && !usage && !endsWhole(lastRun)) throw new GatewayError('upstream_error', 'The upstream ended the stream before [DONE] or a finish_reason: it was cut short.');
      if (!wantsUsage || usage) return heldDone ? DONE : '';
      usage = estimateUsage(ex);
      const head: ChatChunkHead = { id: first?.id ?? newId('chatcmpl-', 12), object: 'chat.completion.chunk', created: first?.created ?? unixNow(), model: ex.modelId };
      const out = dataFrame(JSON.stringify({ ...head, choices: [], usage: writeChatUsage(usage) } satisfies ChatUsageChunk));
      return heldDone ? out + DONE : out;
    },
    fail: (err) => chatErrorFrame(errorBody(err)),
    usage: () => usage,
  };
}

/** The last event of a whole chat stream: [DONE], or the chunk with a finish_reason or the usage after it. */
const WHOLE_END = /data: ?\[DONE\]|"finish_reason": ?"|"choices": ?\[\]/;

/** Whether the last event with data in `run` (read in its last KB, where such an event's markers are) ends a stream. */
function endsWhole(run: Buffer | undefined): boolean {
  if (!run) return false;
  const events = run.toString('latin1', Math.max(0, run.length - 1024)).split(/\r?\n\r?\n/).filter((frame) => frame.includes('data:'));
  return WHOLE_END.test(events.at(-1) ?? '');
}

/** Upstream chat chunks → canonical events. Tool calls are renumbered 0, 1, … by first sight. */
export function chatStreamReader(): C.StreamReader {
  let started = false;
  let finished = false;
  let refused = false;
  const toolIndex = new Map<number, number>();
  const withArguments = new Set<number>();
  return {
    frame(data) {
      // [DONE] ends a stream as surely as a finish_reason does.
      if (data === '[DONE]') return ((finished = true), []);
      const chunk: UpstreamChatChunk | undefined = jsonOrUndefined(data);
      if (!chunk) return [unreadableEvent()];
      if (chunk.error) return [{ type: 'error', error: readOpenAiError(502, data) }];
      const events: C.Event[] = [];
      if (!started) {
        started = true;
        events.push({ type: 'start', id: chunk.id, model: chunk.model, created: chunk.created });
      }
      const choice = chunk.choices?.find((c) => (c.index ?? 0) === 0);
      const delta = choice?.delta;
      if (delta) {
        if (typeof delta.reasoning_content === 'string' && delta.reasoning_content) events.push({ type: 'reasoning', delta: delta.reasoning_content });
        if (typeof delta.content === 'string' && delta.content) events.push({ type: 'text', delta: delta.content });
        // A refusal has no event in the other families: it is said as text, and the finish is a filter's.
        if (typeof delta.refusal === 'string' && delta.refusal) {
          refused = true;
          events.push({ type: 'text', delta: delta.refusal });
        }
        for (const call of delta.tool_calls ?? []) {
          const upstreamIndex = call.index ?? 0;
          let index = toolIndex.get(upstreamIndex);
          if (index === undefined) {
            index = toolIndex.size;
            toolIndex.set(upstreamIndex, index);
            events.push({ type: 'tool_call', index, id: call.id ?? newId('call_', 12), name: call.function?.name ?? '' });
          }
          if (call.function?.arguments) {
            withArguments.add(index);
            events.push({ type: 'tool_arguments', index, delta: call.function.arguments });
          }
        }
      }
      if (choice?.finish_reason) {
        // Some servers send no arguments for a tool without parameters; other families need the JSON `{}`.
        for (const index of toolIndex.values()) if (!withArguments.has(index)) events.push({ type: 'tool_arguments', index, delta: '{}' });
        events.push({ type: 'finish', reason: refused ? 'content_filter' : readFinishReason(choice.finish_reason) });
        finished = true;
      }
      const usage = readChatUsage(chunk.usage);
      if (usage) events.push({ type: 'usage', usage });
      return events;
    },
    // A stream that ended with neither was cut short: the client gets the failure, not a finish.
    end: () => (finished ? [] : [{ type: 'error', error: new GatewayError('upstream_error', 'The upstream stream ended before its finish_reason or [DONE]: it was cut short.') }]),
  };
}

/** Canonical events → chat chunks for the client, as OpenAI streams them. */
export function chatStreamWriter(ex: Exchange, errorBody: (err: GatewayError) => string): C.StreamWriter {
  const includeUsage = (ex.request as ChatRequest).stream_options?.include_usage === true;
  const head: ChatChunkHead = { id: newId('chatcmpl-', 12), object: 'chat.completion.chunk', created: unixNow(), model: ex.modelId };
  let started = false;
  let finished = false;
  let toolCalls = 0;
  let usage: Usage | undefined;
  // Every chunk is the same JSON around its delta and finish reason, and a text delta the same
  // around its text: templates of it (jsonTemplate), so an event costs the JSON of what changes.
  const chunkOf = (delta: unknown, finish: unknown) => ({ ...head, choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }], ...(includeUsage && { usage: null }) });
  const [before, between, after] = jsonTemplate(chunkOf(HOLE, HOLE));
  const chunk = (delta: ChatDelta, finish: string | null = null) => dataFrame(before + JSON.stringify(delta) + between + JSON.stringify(finish) + after);
  const [contentBefore, contentAfter] = jsonTemplate(chunkOf({ content: HOLE }, null));
  const [reasoningBefore, reasoningAfter] = jsonTemplate(chunkOf({ reasoning_content: HOLE }, null));
  const opening = () => (started ? '' : ((started = true), chunk({ role: 'assistant', content: '' })));

  return {
    event(e) {
      switch (e.type) {
        case 'start':
          return opening();
        case 'text':
          return opening() + dataFrame(contentBefore + JSON.stringify(e.delta) + contentAfter);
        case 'reasoning':
          return opening() + dataFrame(reasoningBefore + JSON.stringify(e.delta) + reasoningAfter);
        case 'tool_call':
          toolCalls++;
          return opening() + chunk({ tool_calls: [{ index: e.index, id: toolIdWithSignature(e.id, e.signature), type: 'function', function: { name: e.name, arguments: '' } }] });
        case 'tool_arguments':
          return chunk({ tool_calls: [{ index: e.index, function: { arguments: e.delta } }] });
        case 'finish':
          if (finished) return '';
          finished = true;
          return opening() + chunk({}, chatFinishReason(e.reason, toolCalls));
        case 'usage':
          usage = e.usage;
          return '';
        case 'error':
          return '';
      }
    },
    end() {
      let out = opening();
      if (!finished) out += chunk({}, chatFinishReason('stop', toolCalls));
      if (includeUsage && usage) out += dataFrame(JSON.stringify({ ...head, choices: [], usage: writeChatUsage(usage) } satisfies ChatUsageChunk));
      return out + DONE;
    },
    fail: (err) => chatErrorFrame(errorBody(err)),
  };
}
