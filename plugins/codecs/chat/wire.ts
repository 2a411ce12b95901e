/**
 * Chat completions wire shapes other than the request (schema.ts): what the gateway writes to its
 * clients, and what it reads from upstreams. Upstream bodies are not validated, so what is read
 * from them has every field optional and is checked where a wrong type would matter.
 */
import type { ChatRequest } from './schema.js';

export interface ChatUsage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  prompt_tokens_details: { cached_tokens: number; cache_write_tokens?: number };
  completion_tokens_details: { reasoning_tokens: number };
}

export interface ChatToolCall {
  id: string;
  type: 'function';
  function: { name: string; arguments: string };
}

/** A complete answer (`stream: false`). */
export interface ChatCompletion {
  id: string;
  object: 'chat.completion';
  created: number;
  model: string;
  choices: {
    index: number;
    message: { role: 'assistant'; content: string | null; refusal: null; reasoning_content?: string; tool_calls?: ChatToolCall[] };
    logprobs: null;
    finish_reason: string;
  }[];
  usage?: ChatUsage;
}

/** What opens every chunk of a stream. */
export interface ChatChunkHead {
  id: string;
  object: 'chat.completion.chunk';
  created: number;
  model: string;
}

/** The delta of a chunk the gateway writes. */
export type ChatDelta =
  | { role: 'assistant'; content: '' }
  | { content: string }
  | { reasoning_content: string }
  | { tool_calls: [{ index: number; id: string; type: 'function'; function: { name: string; arguments: '' } }] }
  | { tool_calls: [{ index: number; function: { arguments: string } }] }
  | Record<string, never>;

/** The usage-only chunk at the end of a stream whose client asked for usage. */
export interface ChatUsageChunk extends ChatChunkHead {
  choices: [];
  usage: ChatUsage;
}

/**
 * A content part sent upstream. Looser than a client's (schema.ts): a part from another family may
 * be in any role (an image in a tool result) and carry any detail (Responses' `original`).
 */
export type ChatUpstreamPart =
  | { type: 'text'; text: string }
  | { type: 'image_url'; image_url: { url: string; detail?: string } }
  | { type: 'file'; file: { file_id?: string; file_data?: string; filename?: string } }
  | { type: 'input_audio'; input_audio: { data: string; format: string } };

export type ChatUpstreamMessage =
  | { role: 'system' | 'user'; content: string | ChatUpstreamPart[] }
  | { role: 'assistant'; content: string | ChatUpstreamPart[] | null; tool_calls?: ChatToolCall[] }
  | { role: 'tool'; tool_call_id: string; content: string | ChatUpstreamPart[] };

/** A body sent to a chat upstream, translated from another family. */
export interface ChatUpstreamBody
  extends Pick<ChatRequest, 'tools' | 'tool_choice' | 'parallel_tool_calls' | 'response_format' | 'temperature' | 'top_p' | 'seed' | 'presence_penalty' | 'frequency_penalty' | 'user'> {
  model: string;
  messages: ChatUpstreamMessage[];
  max_completion_tokens?: number;
  /** Canonically any number of stop sequences; a chat upstream allows four. */
  stop?: string[];
  reasoning_effort?: string;
  metadata?: Record<string, string>;
  stream?: true;
  stream_options?: { include_usage: true };
}

/** Usage as an upstream sends it. */
export type UpstreamChatUsage = Partial<{
  prompt_tokens: number;
  completion_tokens: number;
  prompt_tokens_details: { cached_tokens?: number; cache_write_tokens?: number } | null;
  completion_tokens_details: { reasoning_tokens?: number } | null;
}>;

interface UpstreamToolCall {
  index?: number;
  id?: string;
  type?: string;
  function?: { name?: string; arguments?: string };
}

/** A complete answer from an upstream. */
export interface UpstreamChatCompletion {
  id?: string;
  model?: string;
  created?: number;
  choices?: { message?: { content?: unknown; refusal?: unknown; reasoning_content?: unknown; tool_calls?: UpstreamToolCall[] }; finish_reason?: unknown }[];
  usage?: UpstreamChatUsage | null;
}

/** A stream chunk from an upstream (an `error` instead, when it fails midway). */
export interface UpstreamChatChunk {
  id?: string;
  model?: string;
  created?: number;
  error?: unknown;
  choices?: { index?: number; delta?: { content?: unknown; refusal?: unknown; reasoning_content?: unknown; tool_calls?: UpstreamToolCall[] }; finish_reason?: unknown }[];
  usage?: UpstreamChatUsage | null;
}
