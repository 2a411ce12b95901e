/**
 * Responses wire shapes other than what the schema derives (schema.ts): input items, tools and
 * tool choices as the codec reads them, what the gateway writes (response objects, output items,
 * stream events, bodies for Responses upstreams) and what it reads from upstreams. Upstream bodies
 * are not validated, so what is read from them has every field optional.
 */
import type { JsonObject, JsonValue } from '../../../src/plugin-api.js';

// Input items, tools and tool choices are hand-written: the schema checks each item against the
// schema of its type (itemSchemas) and tools and choices with if/then, so that types it does not
// know pass; json-schema-to-ts derives only `{ type: string }` or open objects from that. These are
// the shapes those checks hold, as discriminated unions on `type`.

export type InputPart =
  | { type: 'input_text'; text: string }
  | { type: 'input_image'; image_url?: string; file_id?: string; detail?: 'low' | 'high' | 'auto' | 'original' }
  | { type: 'input_file'; file_id?: string; file_url?: string; file_data?: string; filename?: string }
  | { type: 'input_audio'; input_audio?: { data: string; format: string } };

export type OutputPart = { type: 'output_text'; text: string; annotations?: JsonValue[] } | { type: 'refusal'; refusal: string };

/** A message item: `type` may be left out. */
export type MessageItem = { type?: 'message' } & (
  | { role: 'assistant'; content: string | OutputPart[] }
  | { role: 'user' | 'system' | 'developer'; content: string | InputPart[] }
);

export interface FunctionCallItem {
  type: 'function_call';
  call_id: string;
  name: string;
  arguments: string;
  namespace?: string;
}

export interface CustomToolCallItem {
  type: 'custom_tool_call';
  call_id: string;
  name: string;
  input: string;
}

export interface CallOutputItem {
  type: 'function_call_output' | 'custom_tool_call_output';
  call_id: string;
  output: string | InputPart[];
}

export interface ReasoningInputItem {
  type: 'reasoning';
  summary?: JsonValue[];
}

export interface ItemReference {
  type: 'item_reference';
  id: string;
}

/**
 * An input item of a type the codec knows. Others pass the schema unchecked; the codec dispatches
 * on `itemType`, the same function that chose the schema decode checked the item against.
 */
export type InputItem = MessageItem | FunctionCallItem | CustomToolCallItem | CallOutputItem | ReasoningInputItem | ItemReference;

export interface FunctionTool {
  type: 'function';
  name: string;
  description?: string | null;
  parameters?: JsonObject | null;
  strict?: boolean | null;
}

export interface CustomTool {
  type: 'custom';
  name: string;
  description?: string;
  format?: { type: 'text' } | { type: 'grammar'; syntax: string; definition: string };
}

export interface NamespaceTool {
  type: 'namespace';
  name: string;
  tools: ResponsesTool[];
}

/** A tool the upstream runs (web_search, file_search, …), of a type the schema does not check: only its type is read. */
export interface HostedTool {
  type: string;
}

export type ResponsesTool = FunctionTool | CustomTool | NamespaceTool | HostedTool;

/** A tool or choice named by function or custom tool. */
export interface NamedChoice {
  type: 'function' | 'custom';
  name: string;
  namespace?: string;
}

export interface AllowedToolsChoice {
  type: 'allowed_tools';
  mode: 'auto' | 'required';
  tools: (NamedChoice | HostedTool)[];
}

export type ResponsesToolChoice = 'none' | 'auto' | 'required' | NamedChoice | AllowedToolsChoice | HostedTool;

/**
 * Whether a value of a union that also holds types the schema lets through unchecked (`{ type: string }`)
 * is one of the named types: comparing `type` alone does not narrow such a union.
 */
export const isOfType = <U extends { type?: string }, T extends string>(value: U, ...types: T[]): value is Extract<U, { type: T }> =>
  types.includes(value.type as T);

/** The format of `text`, as the schema checks it, with what it passes on unchecked. */
export type TextFormat = { type: 'text' } | { type: 'json_object' } | { type: 'json_schema'; name: string; schema: JsonObject; strict?: boolean | null; description?: string };

/** `reasoning.effort`, as the request schema (schema.ts) allows it. */
export type ReasoningEffort = 'none' | 'minimal' | 'low' | 'medium' | 'high' | 'xhigh' | 'max';

export interface ResponsesUsage {
  input_tokens: number;
  input_tokens_details: { cached_tokens: number; cache_write_tokens?: number };
  output_tokens: number;
  output_tokens_details: { reasoning_tokens: number };
  total_tokens: number;
}

export interface OutputText {
  type: 'output_text';
  text: string;
  annotations: [];
}

export interface SummaryText {
  type: 'summary_text';
  text: string;
}

export interface OutputMessage {
  type: 'message';
  id: string;
  status: string;
  role: 'assistant';
  content: OutputText[];
}

export interface OutputReasoning {
  type: 'reasoning';
  id: string;
  summary: SummaryText[];
}

export interface OutputFunctionCall {
  type: 'function_call';
  id: string;
  call_id: string;
  name: string;
  namespace?: string;
  arguments: string;
  status: string;
}

export interface OutputCustomToolCall {
  type: 'custom_tool_call';
  id: string;
  call_id: string;
  name: string;
  input: string;
  status: string;
}

/** An output item the gateway writes. */
export type OutputItem = OutputMessage | OutputReasoning | OutputFunctionCall | OutputCustomToolCall;

/** The Response object the gateway writes, echoing the request as OpenAI does. */
export interface ResponseObject {
  id: string;
  object: 'response';
  created_at: number;
  status: string;
  error: { code: string; message: string } | null;
  incomplete_details: { reason: string } | null;
  instructions: string | null;
  max_output_tokens: number | null;
  model: string;
  output: OutputItem[];
  parallel_tool_calls: boolean;
  previous_response_id: null;
  /** The request's `reasoning` echoed (the values the request schema allows), or nulls. */
  reasoning: { effort?: ReasoningEffort | null; summary?: 'auto' | 'concise' | 'detailed' | null };
  store: false;
  temperature: number;
  text: { format?: TextFormat };
  tool_choice: ResponsesToolChoice;
  tools: ResponsesTool[];
  top_p: number;
  truncation: 'disabled';
  usage: ResponsesUsage | null;
  metadata: Record<string, string>;
  completed_at?: number;
}

interface ItemRef {
  item_id: string;
  output_index: number;
}

/** Each event the gateway writes, by its type, without the `type` and `sequence_number` that open it. */
export interface ResponsesEvents {
  'response.created': { response: ResponseObject };
  'response.in_progress': { response: ResponseObject };
  'response.output_item.added': { output_index: number; item: OutputItem };
  'response.output_item.done': { output_index: number; item: OutputItem };
  'response.content_part.added': ItemRef & { content_index: number; part: OutputText };
  'response.content_part.done': ItemRef & { content_index: number; part: OutputText };
  'response.output_text.delta': ItemRef & { content_index: number; delta: string; logprobs: [] };
  'response.output_text.done': ItemRef & { content_index: number; text: string; logprobs: [] };
  'response.reasoning_summary_part.added': ItemRef & { summary_index: number; part: SummaryText };
  'response.reasoning_summary_part.done': ItemRef & { summary_index: number; part: SummaryText };
  'response.reasoning_summary_text.delta': ItemRef & { summary_index: number; delta: string };
  'response.reasoning_summary_text.done': ItemRef & { summary_index: number; text: string };
  'response.function_call_arguments.delta': ItemRef & { delta: string };
  'response.function_call_arguments.done': ItemRef & { name: string; arguments: string };
  'response.custom_tool_call_input.delta': ItemRef & { delta: string };
  'response.custom_tool_call_input.done': ItemRef & { input: string };
  'response.completed': { response: ResponseObject };
  'response.incomplete': { response: ResponseObject };
  'response.failed': { response: ResponseObject };
}

/** An input item sent to a Responses upstream, translated from another family. */
export type UpstreamBoundItem =
  | { role: 'user'; content: UpstreamBoundPart[] }
  | { role: 'assistant'; content: UpstreamBoundPart[] }
  | { type: 'function_call'; call_id: string; name: string; arguments: string }
  | { type: 'function_call_output'; call_id: string; output: string | UpstreamBoundPart[] };

/** A part sent upstream: an image may carry any detail canonically. */
export type UpstreamBoundPart =
  | OutputText
  | { type: 'input_text'; text: string }
  | { type: 'input_image'; image_url: string; detail: string }
  | { type: 'input_file'; file_id?: string; file_url?: string; file_data?: string; filename?: string }
  | { type: 'input_audio'; input_audio: { data: string; format: string } };

/** A body sent to a Responses upstream, translated from another family. */
export interface ResponsesUpstreamBody {
  model: string;
  input: UpstreamBoundItem[];
  store: false;
  instructions?: string;
  tools?: { type: 'function'; name: string; description: string | null; parameters: Record<string, unknown> | null; strict: boolean }[];
  tool_choice?: 'auto' | 'none' | 'required' | { type: 'function'; name: string } | { type: 'allowed_tools'; mode: 'auto' | 'required'; tools: { type: 'function'; name: string }[] };
  parallel_tool_calls?: boolean;
  text?: { format: { type: 'json_schema'; name: string; schema: Record<string, unknown>; description?: string; strict?: boolean } | { type: 'json_object' } };
  max_output_tokens?: number;
  temperature?: number;
  top_p?: number;
  reasoning?: { effort?: string; summary?: string };
  metadata?: Record<string, string>;
  user?: string;
  stream?: true;
}

/** An output item from an upstream. */
export interface UpstreamOutputItem {
  type?: string;
  id?: string;
  call_id?: string;
  name?: string;
  arguments?: string;
  input?: unknown;
  content?: { type?: string; text?: string; refusal?: string }[];
  summary?: { text?: string }[];
}

/** Usage as an upstream sends it: not validated. */
export type UpstreamResponsesUsage = Partial<{
  input_tokens: number;
  output_tokens: number;
  input_tokens_details: { cached_tokens?: number; cache_write_tokens?: number } | null;
  output_tokens_details: { reasoning_tokens?: number } | null;
}>;

export interface UpstreamError {
  message?: string;
  code?: string;
}

/** A Response from an upstream: a complete answer, or the response of a stream event. */
export interface UpstreamResponse {
  id?: string;
  model?: string;
  created_at?: number;
  status?: string;
  incomplete_details?: { reason?: string } | null;
  output?: UpstreamOutputItem[];
  usage?: UpstreamResponsesUsage | null;
  error?: UpstreamError | null;
}

/** A stream event from an upstream (an `error` event has `message` and `code`, or an `error`). */
export interface UpstreamResponsesEvent extends UpstreamError {
  type?: string;
  response?: UpstreamResponse;
  item?: UpstreamOutputItem;
  item_id?: string;
  output_index?: number;
  delta?: string;
  error?: UpstreamError;
}
