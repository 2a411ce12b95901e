/** Messages streams: passthrough scanning, and reading/writing canonical events. */
import {
  canonical as C,
  type ClientStream,
  estimateDeliveredOutput,
  estimateTokens,
  eventFrame,
  type Exchange,
  firstFrameToStopAt,
  frameData,
  GatewayError,
  HOLE,
  hasObjectField,
  jsonOrUndefined,
  jsonTemplate,
  newId,
  ObjectKeyNeedle,
  type SparseScan,
  unreadableEvent,
  type Usage,
} from '../../../src/plugin-api.js';
import type { JsonTool } from './request.js';
import { jsonToolText } from './response.js';
import {
  type AnswerBlock,
  clientToolId,
  type MessagesDelta,
  type MessagesEvents,
  mergeUsage,
  messagesErrorEvent,
  readMessagesError,
  readMessagesUsage,
  readStopReason,
  type ThinkingBlock,
  type ThinkingBlocks,
  thinkingSignature,
  type UpstreamMessagesBlock,
  type UpstreamMessagesEvent,
  type UpstreamMessagesUsage,
  writeMessagesUsage,
  writeStopReason,
} from './wire.js';

const USAGE_KEY = Buffer.from('"usage"');
/** Usage frames, and each chunk's last frame: whether the stream ended properly is read from it. */
/** `"usage":{`: in a stream's frames, and in a complete answer (family.ts's bodyUsage). */
export const USAGE_OBJECT = new ObjectKeyNeedle('usage');
const USAGE_AND_LAST_FRAMES: SparseScan = { key: USAGE_OBJECT, lastFrame: true };
/** How the last events of a complete stream begin (Anthropic writes the event line first). */
const LAST_EVENTS = ['event: message_stop', 'event: error'].map((s) => Buffer.from(s));

/**
 * Relays a same-family stream as it is. Only the frames that carry usage are parsed (message_start
 * has the input figures, message_delta the cumulative output and sometimes final input totals). An
 * upstream that closes before message_stop gets an error event added: clients would otherwise
 * take the cut answer for a whole one.
 */
export function messagesPassthrough(ex: Exchange): ClientStream {
  let raw: UpstreamMessagesUsage | undefined;
  let complete = false;
  /** message_delta carries the output count; message_start's is only the first token or two. */
  let finalUsage = false;
  return {
    sparse: USAGE_AND_LAST_FRAMES,
    // Every relayed frame must be outlined as a JSON object, or the stream ends with an error event; the upstream's own error event ends it too.
    check: (run) => firstFrameToStopAt(run, '[DONE]'),
    frame(frame) {
      complete = LAST_EVENTS.some((start) => frame.subarray(0, start.length).equals(start));
      if (!hasObjectField(frame, USAGE_KEY)) return true;
      const event: UpstreamMessagesEvent | undefined = jsonOrUndefined(frameData(frame));
      if (event?.type === 'message_delta') finalUsage = true;
      raw = mergeUsage(raw, event?.type === 'message_start' ? event.message?.usage : event?.usage);
      return true;
    },
    end() {
      if (!complete) throw new GatewayError('upstream_error', 'The upstream ended the stream before message_stop.');
      return '';
    },
    fail: messagesErrorEvent,
    usage: () => {
      const usage = readMessagesUsage(raw);
      if (!usage || finalUsage) return usage;
      // Cut before message_delta (the client left): the real input, and the output delivered, counted here.
      return { ...usage, outputTokens: Math.max(usage.outputTokens, estimateDeliveredOutput(ex)), estimated: true };
    },
  };
}

/** One content block of an upstream message, as the reader follows it. */
type Block =
  | { kind: 'text' | 'other' }
  | { kind: 'thinking'; block: ThinkingBlock }
  | { kind: 'tool'; call: number; arguments: boolean }
  | { kind: 'json'; buffered: string };

/**
 * Upstream Messages events → canonical events. Tool calls are numbered 0, 1, … in order; the
 * turn's thinking blocks ride on its first call's signature. The forced JSON tool's input becomes
 * text. A stream that ends before its message_delta ended early: that is an error, not an answer.
 */
export function messagesStreamReader(jsonTool: JsonTool | undefined): C.StreamReader {
  /** By the upstream's block index (read as sent: an event without one finds the block started without one). */
  const blocks = new Map<number | undefined, Block>();
  const thinking: ThinkingBlocks = [];
  let calls = 0;
  let usage: UpstreamMessagesUsage | undefined;
  let finished = false;
  let answeredByJsonTool = false;

  const blockStart = (index: number | undefined, b: UpstreamMessagesBlock): C.Event[] => {
    switch (b.type) {
      case 'text':
        blocks.set(index, { kind: 'text' });
        return b.text ? [{ type: 'text', delta: b.text }] : [];
      case 'thinking': {
        const block: ThinkingBlock = { type: 'thinking', thinking: b.thinking ?? '', signature: b.signature ?? '' };
        thinking.push(block);
        blocks.set(index, { kind: 'thinking', block });
        return b.thinking ? [{ type: 'reasoning', delta: b.thinking }] : [];
      }
      case 'redacted_thinking':
        // Kept as the upstream wrote it: it goes back to one like it, which checks it.
        thinking.push({ type: 'redacted_thinking', data: b.data! });
        blocks.set(index, { kind: 'other' });
        return [];
      case 'tool_use': {
        if (jsonTool && b.name === jsonTool.name) {
          answeredByJsonTool = true;
          blocks.set(index, { kind: 'json', buffered: '' });
          return [];
        }
        const call = calls++;
        blocks.set(index, { kind: 'tool', call, arguments: false });
        const signature = call === 0 && thinking.length ? thinkingSignature(thinking) : undefined;
        // A call's id and name are read as sent: an upstream that leaves them out gives the client what it gave.
        return [{ type: 'tool_call', index: call, id: b.id!, name: b.name!, ...(signature && { signature }) }];
      }
      default:
        // Server-tool blocks: their upstream ran them; other families have nothing to show for them.
        blocks.set(index, { kind: 'other' });
        return [];
    }
  };

  const blockDelta = (block: Block | undefined, d: NonNullable<UpstreamMessagesEvent['delta']>): C.Event[] => {
    switch (d.type) {
      case 'text_delta':
        return block?.kind === 'text' && d.text ? [{ type: 'text', delta: d.text }] : [];
      case 'thinking_delta':
        if (block?.kind !== 'thinking' || !d.thinking) return [];
        block.block.thinking += d.thinking;
        return [{ type: 'reasoning', delta: d.thinking }];
      case 'signature_delta':
        if (block?.kind === 'thinking') block.block.signature = d.signature!;
        return [];
      case 'input_json_delta':
        if (!d.partial_json) return [];
        if (block?.kind === 'json') {
          // An object answer streams as it is; a wrapped one is unwrapped whole at the block's end.
          if (!jsonTool!.wrapped) return [{ type: 'text', delta: d.partial_json }];
          block.buffered += d.partial_json;
          return [];
        }
        if (block?.kind !== 'tool') return [];
        block.arguments = true;
        return [{ type: 'tool_arguments', index: block.call, delta: d.partial_json }];
      default:
        return [];
    }
  };

  const blockStop = (block: Block | undefined): C.Event[] => {
    if (block?.kind === 'tool' && !block.arguments) return [{ type: 'tool_arguments', index: block.call, delta: '{}' }];
    if (block?.kind === 'json' && jsonTool!.wrapped) return [{ type: 'text', delta: jsonToolText(jsonOrUndefined(block.buffered), jsonTool!) }];
    return [];
  };

  return {
    frame(data) {
      const e: UpstreamMessagesEvent | undefined = jsonOrUndefined(data);
      if (!e || typeof e !== 'object') return [unreadableEvent()];
      switch (e.type) {
        case 'message_start':
          usage = mergeUsage(usage, e.message?.usage);
          return [{ type: 'start', id: e.message?.id, model: e.message?.model }];
        case 'content_block_start':
          return blockStart(e.index, e.content_block ?? {});
        case 'content_block_delta':
          return blockDelta(blocks.get(e.index), e.delta ?? {});
        case 'content_block_stop':
          return blockStop(blocks.get(e.index));
        case 'message_delta': {
          usage = mergeUsage(usage, e.usage);
          finished = true;
          const reason = answeredByJsonTool && calls === 0 ? 'stop' : readStopReason(e.delta?.stop_reason);
          const events: C.Event[] = [{ type: 'finish', reason }];
          const total = readMessagesUsage(usage);
          if (total) events.push({ type: 'usage', usage: total });
          return events;
        }
        case 'error':
          return [{ type: 'error', error: readMessagesError(502, e) }];
        default:
          // ping, message_stop, and event types added later.
          return [];
      }
    },
    end: () => (finished ? [] : [{ type: 'error', error: new GatewayError('upstream_error', 'The upstream stream ended before its message_delta.') }]),
  };
}

/**
 * Canonical events → a Messages stream, exactly as Anthropic orders it: message_start (with the
 * prompt's input tokens, counted locally until the upstream's figures arrive in message_delta), then
 * each block started, filled and stopped before the next, then message_delta and message_stop.
 */
export function messagesStreamWriter(ex: Exchange): C.StreamWriter {
  const id = newId('msg_', 12);
  let started = false;
  /** Index of the last block started; the open one when `open` is set. */
  let index = -1;
  let open: 'text' | 'thinking' | 'tool' | undefined;
  /** Block index of each canonical tool call. */
  const toolBlocks = new Map<number, number>();
  let finish: C.FinishReason = 'stop';
  let usage: Usage | undefined;

  const event = <T extends keyof MessagesEvents>(type: T, payload: MessagesEvents[T]) => eventFrame(type, JSON.stringify({ type, ...payload }));
  const opening = () => {
    if (started) return '';
    started = true;
    const usage = { input_tokens: estimateTokens(ex.clientFamily.promptText(ex)), output_tokens: 0, cache_creation_input_tokens: 0, cache_read_input_tokens: 0 };
    const message: MessagesEvents['message_start']['message'] = { id, type: 'message', role: 'assistant', model: ex.modelId, content: [], stop_reason: null, stop_sequence: null, usage };
    return event('message_start', { message }) + event('ping', {});
  };
  const close = () => {
    if (!open) return '';
    open = undefined;
    return event('content_block_stop', { index });
  };
  const begin = (kind: NonNullable<typeof open>, block: AnswerBlock) => {
    const out = opening() + close();
    open = kind;
    index++;
    return out + event('content_block_start', { index, content_block: block });
  };
  const delta = (delta: MessagesDelta) => event('content_block_delta', { index, delta });
  // Deltas of text are most of a stream: templates of `delta`'s event (jsonTemplate), so a delta
  // costs the JSON of its text, where `delta` spent as long on the event's other fields.
  const deltaTemplate = (delta: MessagesDelta) => jsonTemplate({ type: 'content_block_delta', index: HOLE, delta });
  const [textHead, textMiddle, textTail] = deltaTemplate({ type: 'text_delta', text: HOLE });
  const [thinkingHead, thinkingMiddle, thinkingTail] = deltaTemplate({ type: 'thinking_delta', thinking: HOLE });

  return {
    event(e) {
      switch (e.type) {
        case 'start':
          return opening();
        case 'text':
          if (!e.delta) return opening();
          return (open === 'text' ? '' : begin('text', { type: 'text', text: '' })) + eventFrame('content_block_delta', textHead + index + textMiddle + JSON.stringify(e.delta) + textTail);
        case 'reasoning':
          if (!e.delta) return opening();
          return (open === 'thinking' ? '' : begin('thinking', { type: 'thinking', thinking: '', signature: '' })) + eventFrame('content_block_delta', thinkingHead + index + thinkingMiddle + JSON.stringify(e.delta) + thinkingTail);
        case 'tool_call': {
          const out = begin('tool', { type: 'tool_use', id: clientToolId(e.id, e.signature), name: e.name, input: {} });
          toolBlocks.set(e.index, index);
          return out;
        }
        case 'tool_arguments': {
          if (!e.delta) return '';
          // Blocks cannot be reopened: arguments of a call whose block is closed would be lost.
          if (open !== 'tool' || toolBlocks.get(e.index) !== index) {
            throw new GatewayError('upstream_error', 'The upstream interleaved the arguments of several tool calls.');
          }
          return delta({ type: 'input_json_delta', partial_json: e.delta });
        }
        case 'finish':
          finish = e.reason;
          return '';
        case 'usage':
          usage = e.usage;
          return '';
        case 'error':
          return '';
      }
    },
    end() {
      const out = opening() + close();
      const stop = writeStopReason(finish, toolBlocks.size);
      return (
        out +
        event('message_delta', { delta: { stop_reason: stop, stop_sequence: null }, usage: writeMessagesUsage(usage ?? { inputTokens: 0, outputTokens: 0 }) }) +
        event('message_stop', {})
      );
    },
    fail: messagesErrorEvent,
  };
}
