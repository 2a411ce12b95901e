/**
 * What the Messages family and dialect share: usage, stop reasons, error bodies, tool ids and the
 * opaque state that rides along with them.
 */
import { createHash } from 'node:crypto';
import { canonical as C, codeForStatus, eventFrame, GatewayError, type JsonObject, jsonOrUndefined, type Usage, toolIdWithSignature } from '../../../src/plugin-api.js';

// Blocks, tools and choices are hand-written: the schema (schema.ts) checks each block type with
// if/then so that types it does not know pass, and json-schema-to-ts derives only `{ type: string }`
// from that. These are the shapes the if/then branches check, as discriminated unions on `type`.

export interface CacheControl {
  type: string;
  ttl?: string;
}

export interface TextBlock {
  type: 'text';
  text: string;
  cache_control?: CacheControl;
}

export interface ImageBlock {
  type: 'image';
  source: { type: 'base64'; media_type: string; data: string } | { type: 'url'; url: string } | { type: 'file'; file_id: string };
  cache_control?: CacheControl;
}

export interface DocumentBlock {
  type: 'document';
  source:
    | { type: 'base64'; media_type: string; data: string }
    | { type: 'text'; data: string }
    | { type: 'url'; url: string }
    | { type: 'content'; content: string | unknown[] }
    | { type: 'file'; file_id: string };
  title?: string;
  cache_control?: CacheControl;
}

/** A search result the client supplies (not checked by the schema: its fields are read with care). */
export interface SearchResultBlock {
  type: 'search_result';
  title?: string;
  content?: unknown;
}

export interface ToolUseBlock {
  type: 'tool_use';
  id: string;
  name: string;
  input: JsonObject;
}

/** A block of a tool result's content. */
export type ResultBlock = TextBlock | ImageBlock | DocumentBlock | SearchResultBlock;

export interface ToolResultBlock {
  type: 'tool_result';
  tool_use_id: string;
  content?: string | ResultBlock[];
  is_error?: boolean;
}

export interface ThinkingBlock {
  type: 'thinking';
  thinking: string;
  signature: string;
}

export interface RedactedThinkingBlock {
  type: 'redacted_thinking';
  data: string;
}

export type ThinkingBlocks = (ThinkingBlock | RedactedThinkingBlock)[];

/**
 * A block of a client's message, of a type the codec knows. Others (server-tool history, new
 * betas) pass the schema unchecked: code that meets one reads no more than its `type`.
 */
export type MessagesBlock = TextBlock | ImageBlock | DocumentBlock | SearchResultBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock;

/** What every block has, whatever its type. */
export interface AnyBlock {
  type: string;
}

export interface MessagesMessage {
  role: 'user' | 'assistant' | 'system';
  content: string | MessagesBlock[];
}

/** A custom tool: `type` absent or `custom`. */
export interface CustomTool {
  type?: 'custom';
  name: string;
  description?: string;
  input_schema: JsonObject;
  strict?: boolean;
  cache_control?: CacheControl;
}

/** A server tool (`web_search_20250305`, …): run by a Messages upstream, named by its type. */
export interface ServerTool {
  type: string;
  name: string;
}

export type MessagesTool = CustomTool | ServerTool;

export const isCustomTool = (t: MessagesTool): t is CustomTool => t.type === undefined || t.type === 'custom';

export type MessagesToolChoice = { type: 'auto' | 'any' | 'none'; disable_parallel_tool_use?: boolean } | { type: 'tool'; name: string; disable_parallel_tool_use?: boolean };

export type MessagesThinking = { type: 'enabled'; budget_tokens: number; display?: string } | { type: 'adaptive' | 'disabled'; display?: string };

export interface MessagesOutputConfig {
  effort?: string;
  format?: { type: 'json_schema'; schema: JsonObject };
}

/** The usage a Messages answer carries, as the gateway writes it. */
export interface MessagesUsage {
  input_tokens: number;
  output_tokens: number;
  cache_creation_input_tokens: number;
  cache_read_input_tokens: number;
}

/** A block of an answer the gateway writes. Thinking from another family's upstream is unsigned (`''`). */
export type AnswerBlock = TextBlock | ThinkingBlock | ToolUseBlock;

/** A complete answer (`stream: false`). */
export interface MessagesAnswer {
  id: string;
  type: 'message';
  role: 'assistant';
  model: string;
  content: AnswerBlock[];
  stop_reason: string;
  stop_sequence: null;
  usage: MessagesUsage;
}

/** The delta of a `content_block_delta` the gateway writes. */
export type MessagesDelta = { type: 'text_delta'; text: string } | { type: 'thinking_delta'; thinking: string } | { type: 'input_json_delta'; partial_json: string };

/** Each event the gateway writes, by its type, without the `type` field that repeats it. */
export interface MessagesEvents {
  message_start: { message: Omit<MessagesAnswer, 'content' | 'stop_reason'> & { content: []; stop_reason: null } };
  ping: Record<string, never>;
  content_block_start: { index: number; content_block: AnswerBlock };
  content_block_delta: { index: number; delta: MessagesDelta };
  content_block_stop: { index: number };
  message_delta: { delta: { stop_reason: string; stop_sequence: null }; usage: MessagesUsage };
  message_stop: Record<string, never>;
}

/** A block sent to a Messages upstream, translated from another family. */
export type UpstreamBoundBlock =
  | TextBlock
  | { type: 'image'; source: { type: 'base64'; media_type: string; data: string } | { type: 'url'; url: string } }
  | { type: 'document'; source: { type: 'base64'; media_type: string; data: string } | { type: 'url'; url: string } }
  | ToolUseBlock
  | { type: 'tool_result'; tool_use_id: string; content?: UpstreamBoundBlock[] }
  | ThinkingBlock
  | RedactedThinkingBlock;

export interface UpstreamBoundMessage {
  role: 'user' | 'assistant';
  content: UpstreamBoundBlock[];
}

/** A body sent to a Messages upstream, translated from another family. */
export interface MessagesUpstreamBody {
  model: string;
  max_tokens: number;
  messages: UpstreamBoundMessage[];
  system?: TextBlock[];
  tools?: { name: string; description?: string; input_schema: Record<string, unknown> }[];
  tool_choice?: MessagesToolChoice;
  thinking?: { type: 'enabled'; budget_tokens: number };
  temperature?: number;
  top_p?: number;
  top_k?: number;
  stop_sequences?: string[];
  metadata?: { user_id: string };
  /** Anthropic's own structured output: used when the request also offers tools (a forced tool would make them uncallable). */
  output_config?: { format: { type: 'json_schema'; schema: Record<string, unknown> } };
  stream?: true;
}

/** A block of an upstream's answer (or of its `content_block_start`): not validated, every field optional. */
export interface UpstreamMessagesBlock {
  type?: string;
  text?: string;
  thinking?: string;
  signature?: string;
  data?: string;
  id?: string;
  name?: string;
  input?: unknown;
}

/** A complete answer from an upstream. */
export interface UpstreamMessagesAnswer {
  id?: string;
  type?: string;
  model?: string;
  content?: (UpstreamMessagesBlock | null)[];
  stop_reason?: unknown;
  usage?: UpstreamMessagesUsage | null;
}

/** A stream event from an upstream. */
export interface UpstreamMessagesEvent {
  type?: string;
  index?: number;
  message?: { id?: string; model?: string; usage?: UpstreamMessagesUsage | null };
  content_block?: UpstreamMessagesBlock;
  delta?: { type?: string; text?: string; thinking?: string; signature?: string; partial_json?: string; stop_reason?: unknown };
  usage?: UpstreamMessagesUsage | null;
  error?: UpstreamMessagesError;
}

/** Anthropic's error object. */
export interface UpstreamMessagesError {
  type?: unknown;
  message?: unknown;
}

/** An error body (`{type: 'error', error}`), or the error object itself. */
type UpstreamErrorBody = UpstreamMessagesError & { error?: UpstreamMessagesError };

const count = (value: unknown) => (typeof value === 'number' && value > 0 ? value : 0);

/**
 * Anthropic's usage in family-neutral terms. Its `input_tokens` leave out the tokens read from and
 * written to the prompt cache; Sluice's input tokens include them.
 */
/** Usage as an upstream sends it: not validated, every count checked by `count`. */
export type UpstreamMessagesUsage = Partial<Record<'input_tokens' | 'output_tokens' | 'cache_read_input_tokens' | 'cache_creation_input_tokens', unknown>> & {
  output_tokens_details?: { thinking_tokens?: unknown } | null;
};

export function readMessagesUsage(u: UpstreamMessagesUsage | null | undefined): Usage | undefined {
  if (!u || typeof u !== 'object' || (typeof u.input_tokens !== 'number' && typeof u.output_tokens !== 'number')) return undefined;
  const read = count(u.cache_read_input_tokens);
  const write = count(u.cache_creation_input_tokens);
  const thinking = count(u.output_tokens_details?.thinking_tokens);
  return {
    inputTokens: count(u.input_tokens) + read + write,
    outputTokens: count(u.output_tokens),
    ...(read && { cachedTokens: read }),
    ...(write && { cacheWriteTokens: write }),
    ...(thinking && { reasoningTokens: thinking }),
  };
}

export function writeMessagesUsage(u: Usage): MessagesUsage {
  const read = u.cachedTokens ?? 0;
  const write = u.cacheWriteTokens ?? 0;
  return {
    input_tokens: Math.max(0, u.inputTokens - read - write),
    output_tokens: u.outputTokens,
    cache_creation_input_tokens: write,
    cache_read_input_tokens: read,
  };
}

/** Usage fields of a later event over an earlier one's (message_delta totals over message_start's). */
export function mergeUsage(into: UpstreamMessagesUsage | undefined, u: unknown): UpstreamMessagesUsage | undefined {
  if (!u || typeof u !== 'object') return into;
  const out: Record<string, unknown> = { ...into };
  for (const [key, value] of Object.entries(u)) if (value !== null && value !== undefined) out[key] = value;
  return out;
}

const stopReasons: Record<string, C.FinishReason> = {
  end_turn: 'stop',
  stop_sequence: 'stop',
  pause_turn: 'stop',
  max_tokens: 'length',
  model_context_window_exceeded: 'length',
  tool_use: 'tool_calls',
  refusal: 'content_filter',
};

export const readStopReason = (reason: unknown): C.FinishReason => stopReasons[String(reason)] ?? 'stop';

export function writeStopReason(reason: C.FinishReason, toolCalls: number): string {
  if (toolCalls > 0) return 'tool_use';
  return reason === 'length' ? 'max_tokens' : reason === 'content_filter' ? 'refusal' : 'end_turn';
}

const errorTypes: Record<number, string> = {
  400: 'invalid_request_error',
  401: 'authentication_error',
  402: 'billing_error',
  403: 'permission_error',
  404: 'not_found_error',
  413: 'request_too_large',
  429: 'rate_limit_error',
  500: 'api_error',
  503: 'overloaded_error',
  504: 'timeout_error',
  529: 'overloaded_error',
};

/** Anthropic answers a model it does not know with a 404; the catalog says 400, as OpenAI's does. */
export const messagesErrorStatus = (err: GatewayError): number => (err.code === 'model_not_found' ? 404 : err.status);

const errorObject = (err: GatewayError) => {
  const status = messagesErrorStatus(err);
  return { type: errorTypes[status] ?? (status >= 500 ? 'api_error' : 'invalid_request_error'), message: err.message };
};

/** `{"type":"error","error":{type, message}}`, as the Anthropic SDK reads it. */
export const messagesErrorBody = (err: GatewayError): string => JSON.stringify({ type: 'error', error: errorObject(err) });

/** A stream's failure after it started: an `error` event with the same body. */
export const messagesErrorEvent = (err: GatewayError): string => eventFrame('error', messagesErrorBody(err));

/** A Messages error (a body, or the `error` object of a stream event) in the gateway's terms; 529 (overloaded) becomes a 503. */
export function readMessagesError(status: number, body: Buffer | string | UpstreamErrorBody | undefined): GatewayError {
  const parsed: UpstreamErrorBody | undefined = body && typeof body === 'object' && !Buffer.isBuffer(body) ? body : jsonOrUndefined(body as Buffer | string | undefined);
  const error: UpstreamMessagesError | undefined = parsed?.type === 'error' ? parsed.error : (parsed?.error ?? parsed);
  const effective = status === 529 || error?.type === 'overloaded_error' ? 503 : status;
  const message = typeof error?.message === 'string' ? error.message : `Upstream answered ${status}.`;
  const type = typeof error?.type === 'string' ? error.type : undefined;
  return new GatewayError(codeForStatus(effective), message, null, effective, type);
}

const TOOL_ID = /^[A-Za-z0-9_-]+$/;
/**
 * A tool id as Anthropic takes it (^[A-Za-z0-9_-]+$): others are made to match, the same id always
 * alike, so a call and its result still pair.
 */
export const safeToolId = (id: string): string =>
  TOOL_ID.test(id) ? id : `${id.replace(/[^A-Za-z0-9_-]+/g, '-')}-${createHash('sha256').update(id).digest('hex').slice(0, 8)}`;

/** A canonical tool call's id as a Messages client sees it: Anthropic's charset, and its signature (src/tool-call-ids.ts). */
export const clientToolId = (id: string, signature?: string): string => toolIdWithSignature(safeToolId(id), signature);

/** Marks the thinking blocks of an Anthropic turn inside a canonical tool call's signature. */
const THINKING_KEY = 'sluice.anthropic.thinking';

/**
 * The thinking blocks of a turn as the opaque signature of its first tool call, so they survive a
 * round trip through a family that keeps one (Gemini's thought signatures): Anthropic needs them
 * back, unchanged, when the next turn continues the tool use. Base64, as Gemini requires.
 */
export function thinkingSignature(blocks: ThinkingBlocks): string {
  return Buffer.from(JSON.stringify({ [THINKING_KEY]: blocks })).toString('base64');
}

/**
 * The thinking blocks a signature carries, if it is one of ours. Not checked further: they go back
 * as they came to the kind of upstream that wrote them, which checks them.
 */
export function thinkingFromSignature(signature: string | undefined): ThinkingBlocks | undefined {
  if (!signature) return undefined;
  const blocks = jsonOrUndefined<Record<string, unknown>>(Buffer.from(signature, 'base64').toString())?.[THINKING_KEY];
  return Array.isArray(blocks) ? blocks : undefined;
}

/** Tool input is an object; arguments that are not one are kept whole under `value`, never lost. */
export function parsedInput(text: string): JsonObject {
  try {
    const value = JSON.parse(text || '{}');
    return value && typeof value === 'object' && !Array.isArray(value) ? value : { value };
  } catch {
    return { value: text };
  }
}
