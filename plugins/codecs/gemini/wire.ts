/**
 * Gemini wire shapes other than the request (schema.ts): what the gateway writes (answers, stream
 * chunks, bodies for Gemini upstreams) and what it reads from upstreams. Upstream bodies are not
 * validated, so what is read from them has every field optional.
 */
import type { JsonObject } from '../../../src/plugin-api.js';
import type { GeminiRequest } from './schema.js';

export interface GeminiUsage {
  promptTokenCount: number;
  candidatesTokenCount: number;
  totalTokenCount: number;
  thoughtsTokenCount?: number;
  cachedContentTokenCount?: number;
}

/**
 * A part the gateway writes. Looser than a client's (schema.ts): a call's `args` are whatever the
 * arguments' JSON was, not always an object.
 */
export type GeminiPart =
  | { text: string; thought?: true }
  | { inlineData: { mimeType: string; data: string } }
  | { fileData: { mimeType: string; fileUri: string } }
  | { functionCall: { id?: string; name: string; args: unknown }; thoughtSignature?: string }
  | { functionResponse: { name: string; response: JsonObject; parts?: GeminiPart[] } };

export interface GeminiContent {
  role: 'user' | 'model';
  parts: GeminiPart[];
}

/** An answer, or one stream chunk: chunks have the same shape, usage and finish on the last. */
export interface GeminiAnswer {
  candidates: [{ content: GeminiContent; index: 0; finishReason?: string }];
  usageMetadata?: GeminiUsage;
  modelVersion: string;
  responseId: string;
}

export interface GeminiGenerationOut {
  maxOutputTokens?: number;
  temperature?: number;
  topP?: number;
  topK?: number;
  stopSequences?: string[];
  seed?: number;
  presencePenalty?: number;
  frequencyPenalty?: number;
  responseMimeType?: 'application/json';
  responseJsonSchema?: Record<string, unknown>;
  thinkingConfig?: { thinkingBudget?: number; includeThoughts?: true };
}

/** A body sent to a Gemini upstream, translated from another family. */
export interface GeminiUpstreamBody {
  contents: GeminiContent[];
  systemInstruction?: { parts: [{ text: string }] };
  tools?: [{ functionDeclarations: { name: string; description?: string; parametersJsonSchema?: Record<string, unknown> }[] }];
  toolConfig?: { functionCallingConfig: NonNullable<NonNullable<GeminiRequest['toolConfig']>['functionCallingConfig']> };
  generationConfig?: GeminiGenerationOut;
}

/** A part from an upstream answer. */
export interface UpstreamGeminiPart {
  text?: unknown;
  thought?: boolean;
  thoughtSignature?: string;
  functionCall?: { id?: string; name: string; args?: unknown };
}

export type UpstreamGeminiUsage = Partial<Record<'promptTokenCount' | 'toolUsePromptTokenCount' | 'candidatesTokenCount' | 'thoughtsTokenCount' | 'cachedContentTokenCount', number>>;

/** A complete answer or a stream chunk from an upstream (`error` when a stream fails midway). */
export interface UpstreamGeminiAnswer {
  candidates?: { content?: { parts?: UpstreamGeminiPart[] }; finishReason?: string }[];
  promptFeedback?: { blockReason?: string };
  usageMetadata?: UpstreamGeminiUsage | null;
  modelVersion?: string;
  responseId?: string;
  error?: UpstreamGeminiError;
}

/** Google's error object (google.rpc.Status). */
export interface UpstreamGeminiError {
  message?: string;
  status?: string;
  details?: unknown;
}
