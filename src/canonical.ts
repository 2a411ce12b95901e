/**
 * The canonical pivot between wire families. A request, answer or stream from family A reaches
 * an upstream of family B as `family[A] → canonical → dialect[B]` (and back): N of each, not N²
 * converters. It carries what every family can express; what only one family can say stays in
 * passthrough.
 */
import type { Usage } from './usage.js';
import { GatewayError } from './errors.js';

export type Part =
  | { type: 'text'; text: string }
  /** `url` may be a `data:` URL; `where` is the client's parameter, for messages. */
  | { type: 'image'; url: string; detail?: string; mimeType?: string; where?: string }
  /** `data` is a `data:` URL (`data:application/pdf;base64,…`), as chat, Responses and Messages clients send it. */
  | { type: 'file'; fileId?: string; url?: string; data?: string; filename?: string; mimeType?: string }
  | { type: 'audio'; data: string; format: string };

export interface ToolCall {
  /** The id the client uses to pair the result with the call (chat `id`, Responses `call_id`). */
  id: string;
  name: string;
  /** JSON text. */
  arguments: string;
  /** Opaque provider state that must survive a round trip (Gemini thought signatures). */
  signature?: string;
}

export type Message =
  | { role: 'system'; content: Part[] }
  | { role: 'user'; content: Part[] }
  | { role: 'assistant'; content: Part[]; toolCalls: ToolCall[] }
  | { role: 'tool'; toolCallId: string; name?: string; content: Part[] };

export interface Tool {
  name: string;
  description?: string;
  /** JSON Schema of the arguments object. */
  parameters?: Record<string, unknown>;
  strict?: boolean;
}

export type ToolChoice = 'auto' | 'none' | 'required' | { name: string } | { allowed: string[]; mode: 'auto' | 'required' };

export type OutputFormat =
  | { type: 'text' }
  | { type: 'json_object' }
  | { type: 'json_schema'; name: string; schema?: Record<string, unknown>; strict?: boolean; description?: string };

/** A tool the upstream must run itself (a web search), as the client asked for it. */
export interface ServerTool {
  /** The client's name for the tool (`web_search`, `googleSearch`). */
  type: string;
  /** The client's parameter, for messages (`tools[2]`). */
  param: string;
}

/** Canonical fields and extra parameters by the names the model rules and the config use. */
export type ParamName = 'tools' | 'format' | 'reasoning' | 'maxOutputTokens' | SamplingParam;
/** Canonical sampling fields, some of which an upstream dialect may have no way to send. */
export type SamplingParam = 'temperature' | 'topP' | 'topK' | 'stop' | 'seed' | 'presencePenalty' | 'frequencyPenalty';

export interface Request {
  /** The upstream's name for the model. */
  model: string;
  messages: Message[];
  tools: Tool[];
  toolChoice?: ToolChoice;
  parallelToolCalls?: boolean;
  format?: OutputFormat;
  maxOutputTokens?: number;
  temperature?: number;
  topP?: number;
  /** Gemini's `topK`, Anthropic's `top_k`: OpenAI's families have no such setting (their dialects list it as unsendable). */
  topK?: number;
  stop?: string[];
  seed?: number;
  presencePenalty?: number;
  frequencyPenalty?: number;
  reasoning?: { effort?: string; summary?: string };
  metadata?: Record<string, string>;
  user?: string;
  stream: boolean;
  /** Server-side tools the client asked for; only a native upstream that offers them can run them. */
  serverTools?: ServerTool[];
  /**
   * Client parameters with no canonical field (e.g. `safetySettings`), by their family-neutral name, with
   * the client's parameter path: a native upstream takes them as sent; others cannot.
   */
  extra?: Record<string, string>;
  /** The client's parameter path for canonical fields it set, where it differs from the field name. */
  params?: Partial<Record<ParamName, string>>;
}

export type FinishReason = 'stop' | 'length' | 'tool_calls' | 'content_filter';

/** A complete (non-streamed) answer. */
export interface Response {
  id?: string;
  model?: string;
  /** Unix seconds. */
  created?: number;
  text: string;
  reasoning?: string;
  toolCalls: ToolCall[];
  finishReason: FinishReason;
  usage?: Usage;
}

/** One step of a streamed answer. Tool calls are numbered from 0 in order of appearance. */
export type Event =
  | { type: 'start'; id?: string; model?: string; created?: number }
  | { type: 'text'; delta: string }
  | { type: 'reasoning'; delta: string }
  | { type: 'tool_call'; index: number; id: string; name: string; signature?: string }
  | { type: 'tool_arguments'; index: number; delta: string }
  /** `assumed`: the upstream never said why it stopped (a stream cut short); the reason is a reader's guess. */
  | { type: 'finish'; reason: FinishReason; assumed?: boolean }
  | { type: 'usage'; usage: Usage }
  | { type: 'error'; error: GatewayError };

/** What a reader reports for a stream event that is not JSON. */
export const unreadableEvent = (): Event => ({ type: 'error', error: new GatewayError('upstream_error', 'The upstream sent a stream event that is not JSON.') });

/** Turns an upstream stream of one family into canonical events. */
export interface StreamReader {
  frame(data: string): Event[];
  /** The upstream ended; anything still pending. */
  end(): Event[];
}

/** Turns canonical events into a client stream of one family (SSE frame text). */
export interface StreamWriter {
  event(e: Event): string;
  /** The upstream ended cleanly: the closing frames. */
  end(): string;
  /** The upstream failed midway: the family's stream-failure frames. */
  fail(err: GatewayError): string;
}

/**
 * A file's name: its own, or for inline data one made from its type (`document.pdf`), since
 * OpenAI's APIs want a name with `file_data` and Gemini and Messages documents may have none.
 */
export function fileNameOf(file: Extract<Part, { type: 'file' }>): string | undefined {
  if (file.filename || !file.data) return file.filename;
  const type = file.mimeType ?? /^data:([^;,]+)/.exec(file.data)?.[1] ?? 'application/pdf';
  return `document.${type.split('/')[1]?.replace(/[^a-z0-9]+/gi, '') || 'bin'}`;
}

/**
 * A system message's text for an upstream that takes one string: its parts are separate blocks
 * (Claude Code sends three), so they are joined as separate messages are, with a blank line;
 * glued, "S1" and "S2" read as "S1S2".
 */
export function systemTextOf(parts: Part[]): string {
  let out = '';
  for (const p of parts) if (p.type === 'text' && p.text !== '') out += out === '' ? p.text : `\n\n${p.text}`;
  return out;
}

/** The text of text parts, joined. */
export function textOf(parts: Part[]): string {
  let out = '';
  for (const p of parts) if (p.type === 'text') out += p.text;
  return out;
}

/**
 * Gathers a canonical event stream into a complete answer, one event at a time: what a stream
 * said, kept as one answer (a non-stream client of a streamed upstream, the response cache).
 */
export class AnswerCollector {
  private readonly res: Response = { text: '', toolCalls: [], finishReason: 'stop' };
  /** Whether the stream said why it stopped: one that ended without a finish was cut short. */
  finished = false;
  /** Characters of text, reasoning and tool arguments so far. */
  chars = 0;

  /** Adds one event; an `error` event throws its error. */
  add(e: Event): void {
    const res = this.res;
    switch (e.type) {
      case 'start':
        Object.assign(res, { id: e.id, model: e.model, created: e.created });
        break;
      case 'text':
        res.text += e.delta;
        this.chars += e.delta.length;
        break;
      case 'reasoning':
        res.reasoning = (res.reasoning ?? '') + e.delta;
        this.chars += e.delta.length;
        break;
      case 'tool_call':
        res.toolCalls[e.index] = { id: e.id, name: e.name, arguments: '', ...(e.signature && { signature: e.signature }) };
        break;
      case 'tool_arguments':
        res.toolCalls[e.index]!.arguments += e.delta;
        this.chars += e.delta.length;
        break;
      case 'finish':
        res.finishReason = e.reason;
        if (!e.assumed) this.finished = true;
        break;
      case 'usage':
        res.usage = e.usage;
        break;
      case 'error':
        throw e.error;
    }
  }

  /** The answer so far. */
  answer(): Response {
    return this.res;
  }
}

/** Collects a canonical event stream into a complete answer. */
export function collect(events: Iterable<Event>): Response {
  const collector = new AnswerCollector();
  for (const e of events) collector.add(e);
  return collector.answer();
}

/** A complete answer as the events of a stream that says the same (a stored answer replayed as a stream). */
export function eventsOf(res: Response): Event[] {
  const events: Event[] = [{ type: 'start', id: res.id, model: res.model, created: res.created }];
  if (res.reasoning) events.push({ type: 'reasoning', delta: res.reasoning });
  if (res.text) events.push({ type: 'text', delta: res.text });
  res.toolCalls.forEach((call, index) => {
    events.push({ type: 'tool_call', index, id: call.id, name: call.name, ...(call.signature && { signature: call.signature }) });
    if (call.arguments) events.push({ type: 'tool_arguments', index, delta: call.arguments });
  });
  events.push({ type: 'finish', reason: res.finishReason });
  if (res.usage) events.push({ type: 'usage', usage: res.usage });
  return events;
}
