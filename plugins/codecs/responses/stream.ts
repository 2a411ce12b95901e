/** Responses event streams: passthrough scanning, and reading/writing canonical events (2.7–2.9, 7.4, 7.5). */
import {
  canonical as C,
  type ClientStream,
  eventFrame,
  firstFrameToStopAt,
  type Exchange,
  frameData,
  GatewayError,
  HOLE,
  hasObjectField,
  jsonOrUndefined,
  jsonTemplate,
  newId,
  unixNow,
  unreadableEvent,
  type Usage,
} from '../../../src/plugin-api.js';
import {
  callItem,
  finishFromStatus,
  messageItem,
  readResponsesUsage,
  reasoningItem,
  responseObject,
  statusOf,
  toolMapping,
  writeResponsesUsage,
} from './canonical.js';
import type { OutputItem, ResponseObject, ResponsesEvents, UpstreamResponsesEvent } from './wire.js';

const USAGE_KEY = Buffer.from('"usage"');
/** A terminal event, named by its `event:` line or its data's `type`; `error` ends a stream too. */
const TERMINAL_TYPE = /^event: ?(?:response\.(?:completed|incomplete|failed|done)|error)\b|"type": ?"(?:response\.(?:completed|incomplete|failed|done)|error)"/;

const errorOf = (err: GatewayError) => ({ code: err.upstreamCode ?? err.code, message: err.message });

/** Each open item's kind of delta event. */
const DELTA = { message: 'response.output_text.delta', reasoning: 'response.reasoning_summary_text.delta' } as const;

/** The terminal failure event, so a stream never just stops (2.6, pitfall 9). */
function failedFrame(ex: Exchange, sequence: number, id: string, createdAt: number, err: GatewayError, output: OutputItem[]): string {
  const response = responseObject(ex, { id, created_at: createdAt, status: 'failed', error: errorOf(err), output });
  return eventFrame('response.failed', JSON.stringify({ type: 'response.failed', sequence_number: sequence, response }));
}

/**
 * Relays a native Responses stream as it is. It parses only the first frame (for the response id)
 * and the frame that carries usage; it counts frames so a failure can continue the numbering.
 */
export function responsesPassthrough(ex: Exchange): ClientStream {
  let frames = 0;
  let id: string | undefined;
  let createdAt = unixNow();
  let usage: Usage | undefined;
  /** The last frame seen: a whole stream's is its terminal event. */
  let last: Buffer | undefined;
  const parse = (frame: Buffer): UpstreamResponsesEvent | undefined => jsonOrUndefined(frameData(frame));
  return {
    // Every relayed frame must be outlined as a JSON object, or the stream ends with response.failed; the upstream's own failure event ends it too.
    check: (run) => firstFrameToStopAt(run, '[DONE]'),
    frame(frame) {
      frames++;
      last = frame;
      if (id === undefined) {
        const event = parse(frame);
        id = event?.response?.id ?? '';
        createdAt = event?.response?.created_at ?? createdAt;
      }
      if (hasObjectField(frame, USAGE_KEY)) usage = readResponsesUsage(parse(frame)?.response?.usage) ?? usage;
      return true;
    },
    end() {
      // Searched once, in the last frame only: its event names itself near the start.
      if (!last || !TERMINAL_TYPE.test(last.toString('latin1', 0, Math.min(last.length, 200)))) {
        throw new GatewayError('upstream_error', 'The upstream ended the stream before response.completed: it was cut short.');
      }
      return '';
    },
    fail: (err) => failedFrame(ex, frames, id || newId('resp_'), createdAt, err, []),
    usage: () => usage,
  };
}

/** Upstream Responses events → canonical events, for a client of another family. */
export function responsesStreamReader(): C.StreamReader {
  // Keyed as sent: an upstream that leaves ids or indexes out finds its calls by `undefined`.
  const calls = new Map<string | undefined, { index: number; streamed: boolean }>();
  const byOutputIndex = new Map<number | undefined, string | undefined>();
  const call = (e: UpstreamResponsesEvent) => calls.get(e.item_id ?? byOutputIndex.get(e.output_index));
  let ended = false;
  let refused = false;
  return {
    frame(data) {
      const e: UpstreamResponsesEvent | undefined = jsonOrUndefined(data);
      if (!e) return [unreadableEvent()];
      // An error without a type (`{"error": {…}}`) is still one: the SDKs raise it.
      if (e.type === undefined && e.error) {
        return [{ type: 'error', error: new GatewayError('upstream_error', e.error.message ?? 'The upstream failed.', null, undefined, e.error.code) }];
      }
      switch (e.type) {
        case 'response.created':
          return [{ type: 'start', id: e.response?.id, model: e.response?.model, created: e.response?.created_at }];
        case 'response.output_text.delta':
          return e.delta ? [{ type: 'text', delta: e.delta }] : [];
        // A refusal has no event in the other families: it is said as text, and the finish is a filter's.
        case 'response.refusal.delta':
          refused = true;
          return e.delta ? [{ type: 'text', delta: e.delta }] : [];
        case 'response.reasoning_summary_text.delta':
        case 'response.reasoning_text.delta':
          return e.delta ? [{ type: 'reasoning', delta: e.delta }] : [];
        case 'response.output_item.added': {
          const item = e.item ?? {};
          if (item.type !== 'function_call' && item.type !== 'custom_tool_call') return [];
          const index = calls.size;
          calls.set(item.id ?? item.call_id, { index, streamed: false });
          byOutputIndex.set(e.output_index, item.id ?? item.call_id);
          // A call's id and name are read as sent: an upstream that leaves them out gives the client what it gave.
          return [{ type: 'tool_call', index, id: (item.call_id ?? item.id)!, name: item.name! }];
        }
        case 'response.function_call_arguments.delta': {
          const c = call(e);
          if (!c || !e.delta) return [];
          c.streamed = true;
          return [{ type: 'tool_arguments', index: c.index, delta: e.delta }];
        }
        case 'response.output_item.done': {
          // Upstreams that deliver a call whole, without deltas, still owe its arguments.
          const item = e.item ?? {};
          const c = calls.get(item.id ?? item.call_id);
          if (!c || c.streamed) return [];
          c.streamed = true;
          // A function without parameters may come with no arguments at all: other families need the JSON `{}`.
          const args = item.type === 'custom_tool_call' ? JSON.stringify({ input: item.input }) : item.arguments || '{}';
          return [{ type: 'tool_arguments', index: c.index, delta: args }];
        }
        case 'response.completed':
        case 'response.incomplete':
        case 'response.done': {
          ended = true;
          const r = e.response ?? {};
          const reason = refused && calls.size === 0 ? 'content_filter' : finishFromStatus(r.status, r.incomplete_details?.reason, calls.size);
          const events: C.Event[] = [{ type: 'finish', reason }];
          const usage = readResponsesUsage(r.usage);
          if (usage) events.push({ type: 'usage', usage });
          return events;
        }
        case 'response.failed': {
          const error = e.response?.error ?? {};
          return [{ type: 'error', error: new GatewayError('upstream_error', error.message ?? 'The upstream failed.', null, undefined, error.code) }];
        }
        case 'error':
          return [{ type: 'error', error: new GatewayError('upstream_error', e.message ?? e.error?.message ?? 'The upstream failed.', null, undefined, e.code ?? e.error?.code) }];
        default:
          return [];
      }
    },
    // Without its terminal event the stream was cut short: the client gets the failure, not a completion.
    end: () => (ended ? [] : [{ type: 'error', error: new GatewayError('upstream_error', 'The upstream stream ended before response.completed: it was cut short.') }]),
  };
}

interface OpenItem {
  kind: 'message' | 'reasoning';
  index: number;
  id: string;
  text: string;
  /** Its delta events' JSON around the sequence number and the delta (see `delta`). */
  deltaTemplate: string[];
}

interface CallState {
  index: number;
  call: C.ToolCall;
  itemId: string;
  custom: boolean;
}

/**
 * Canonical events → the full Responses event sequence (2.8): created, in_progress, items with
 * their parts and deltas, then exactly one terminal event. Output indexes are contiguous from 0
 * and item ids unique, as the official SDK's accumulator demands.
 */
export function responsesStreamWriter(ex: Exchange): C.StreamWriter {
  const mapping = ex.get(toolMapping);
  const id = newId('resp_');
  const createdAt = unixNow();
  const output: (OutputItem | undefined)[] = [];
  const calls: CallState[] = [];
  let sequence = 0;
  let started = false;
  let open: OpenItem | undefined;
  let finish: C.FinishReason = 'stop';
  let usage: Usage | undefined;

  const frame = <T extends keyof ResponsesEvents>(type: T, payload: ResponsesEvents[T]) => eventFrame(type, JSON.stringify({ type, sequence_number: sequence++, ...payload }));
  // Deltas of text are most of a stream: each open item's delta event is a template (jsonTemplate),
  // so a delta costs the JSON of its text, where `frame` spent as long on the other fields.
  const deltaTemplate = (kind: OpenItem['kind'], id: string, index: number) =>
    jsonTemplate(
      kind === 'message'
        ? { type: DELTA.message, sequence_number: HOLE, item_id: id, output_index: index, content_index: 0, delta: HOLE, logprobs: [] }
        : { type: DELTA.reasoning, sequence_number: HOLE, item_id: id, output_index: index, summary_index: 0, delta: HOLE },
    );
  const delta = (item: OpenItem, text: string) => {
    const [head, middle, tail] = item.deltaTemplate;
    return eventFrame(DELTA[item.kind], head + sequence++ + middle + JSON.stringify(text) + tail);
  };
  const snapshot = (status: string, extra: Partial<ResponseObject> = {}) =>
    responseObject(ex, { id, created_at: createdAt, status, output: output.filter((x): x is OutputItem => !!x), ...extra });
  const opening = () => {
    if (started) return '';
    started = true;
    return frame('response.created', { response: snapshot('in_progress') }) + frame('response.in_progress', { response: snapshot('in_progress') });
  };
  const closeOpen = (status = 'completed') => {
    if (!open) return '';
    const { kind, index, id: itemId, text } = open;
    open = undefined;
    let out: string;
    let item: OutputItem;
    if (kind === 'message') {
      const part = { type: 'output_text' as const, text, annotations: [] as [] };
      item = messageItem(itemId, text, status);
      out =
        frame('response.output_text.done', { item_id: itemId, output_index: index, content_index: 0, text, logprobs: [] }) +
        frame('response.content_part.done', { item_id: itemId, output_index: index, content_index: 0, part });
    } else {
      const part = { type: 'summary_text' as const, text };
      item = reasoningItem(itemId, text);
      out =
        frame('response.reasoning_summary_text.done', { item_id: itemId, output_index: index, summary_index: 0, text }) +
        frame('response.reasoning_summary_part.done', { item_id: itemId, output_index: index, summary_index: 0, part });
    }
    output[index] = item;
    return out + frame('response.output_item.done', { output_index: index, item });
  };
  const openItem = (kind: OpenItem['kind']) => {
    let out = opening() + closeOpen();
    const index = output.length;
    output.push(undefined);
    if (kind === 'message') {
      const id = newId('msg_');
      open = { kind, index, id, text: '', deltaTemplate: deltaTemplate(kind, id, index) };
      out +=
        frame('response.output_item.added', { output_index: index, item: { type: 'message', id: open.id, status: 'in_progress', role: 'assistant', content: [] } }) +
        frame('response.content_part.added', { item_id: open.id, output_index: index, content_index: 0, part: { type: 'output_text', text: '', annotations: [] } });
    } else {
      const id = newId('rs_');
      open = { kind, index, id, text: '', deltaTemplate: deltaTemplate(kind, id, index) };
      out +=
        frame('response.output_item.added', { output_index: index, item: { type: 'reasoning', id: open.id, summary: [] } }) +
        frame('response.reasoning_summary_part.added', { item_id: open.id, output_index: index, summary_index: 0, part: { type: 'summary_text', text: '' } });
    }
    return out;
  };
  const closeCalls = (status = 'completed') => {
    let out = '';
    for (const c of calls) {
      const item = callItem(c.call, mapping, status, c.itemId);
      if (item.type === 'custom_tool_call') {
        out +=
          frame('response.custom_tool_call_input.delta', { item_id: c.itemId, output_index: c.index, delta: item.input }) +
          frame('response.custom_tool_call_input.done', { item_id: c.itemId, output_index: c.index, input: item.input });
      } else {
        out += frame('response.function_call_arguments.done', { item_id: c.itemId, output_index: c.index, name: item.name, arguments: c.call.arguments });
      }
      output[c.index] = item;
      out += frame('response.output_item.done', { output_index: c.index, item });
    }
    calls.length = 0;
    return out;
  };

  return {
    event(e) {
      switch (e.type) {
        case 'start':
          return opening();
        case 'text': {
          const out = open?.kind === 'message' ? '' : openItem('message');
          open!.text += e.delta;
          return out + delta(open!, e.delta);
        }
        case 'reasoning': {
          const out = open?.kind === 'reasoning' ? '' : openItem('reasoning');
          open!.text += e.delta;
          return out + delta(open!, e.delta);
        }
        case 'tool_call': {
          const out = opening() + closeOpen();
          const index = output.length;
          output.push(undefined);
          const custom = mapping?.custom.has(e.name) ?? false;
          const state: CallState = { index, call: { id: e.id, name: e.name, arguments: '', ...(e.signature && { signature: e.signature }) }, itemId: newId(custom ? 'ctc_' : 'fc_'), custom };
          calls[e.index] = state;
          const item = callItem(state.call, mapping, 'in_progress', state.itemId);
          return out + frame('response.output_item.added', { output_index: index, item: item.type === 'custom_tool_call' ? { ...item, input: '' } : item });
        }
        case 'tool_arguments': {
          const c = calls[e.index];
          if (!c) return '';
          c.call.arguments += e.delta;
          return c.custom ? '' : frame('response.function_call_arguments.delta', { item_id: c.itemId, output_index: c.index, delta: e.delta });
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
      const { status, incomplete_details } = statusOf(finish);
      // An answer cut by its ceiling or a filter leaves its last item incomplete too, as OpenAI marks it.
      const out = opening() + closeOpen(status) + closeCalls(status);
      const type = status === 'incomplete' ? 'response.incomplete' : 'response.completed';
      const response = snapshot(status, { incomplete_details, usage: usage ? writeResponsesUsage(usage) : null, ...(status === 'completed' && { completed_at: unixNow() }) });
      return out + frame(type, { response });
    },
    fail(err) {
      // Items cut short are closed as incomplete, so the failed response still accounts for them.
      const out = opening() + closeOpen('incomplete') + closeCalls('incomplete');
      return out + failedFrame(ex, sequence++, id, createdAt, err, output.filter((x): x is OutputItem => !!x));
    },
  };
}
