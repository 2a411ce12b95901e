/**
 * What the Messages family and dialect share: usage, stop reasons, error bodies, tool ids and the
 * opaque state that rides along with them.
 */
import { createHash } from 'node:crypto';
import { canonical as C, codeForStatus, eventFrame, GatewayError, jsonOrUndefined, type Usage } from '../../../src/plugin-api.js';

type Json = Record<string, any>; // any: not yet typed; the messages wire types (as chat's and gemini's wire.ts) are still to be written (issue 24)

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

export function writeMessagesUsage(u: Usage): Json {
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
export function mergeUsage(into: Json | undefined, u: unknown): Json | undefined {
  if (!u || typeof u !== 'object') return into;
  const out: Json = { ...into };
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
export function readMessagesError(status: number, body: Buffer | string | Json | undefined): GatewayError {
  const parsed: Json | undefined = body && typeof body === 'object' && !Buffer.isBuffer(body) ? body : jsonOrUndefined(body as Buffer | string | undefined);
  const error: Json | undefined = parsed?.type === 'error' ? parsed.error : (parsed?.error ?? parsed);
  const effective = status === 529 || error?.type === 'overloaded_error' ? 503 : status;
  const message = typeof error?.message === 'string' ? error.message : `Upstream answered ${status}.`;
  const type = typeof error?.type === 'string' ? error.type : undefined;
  return new GatewayError(codeForStatus(effective), message, null, effective, type);
}

const TOOL_ID = /^[A-Za-z0-9_-]+$/;
/** Splits a client's tool id from the opaque state it carries (never made by the sanitising below). */
const SIGNATURE_MARK = '__sig__';

/**
 * A tool id as Anthropic takes it (^[A-Za-z0-9_-]+$): others are made to match, the same id always
 * alike, so a call and its result still pair.
 */
export const safeToolId = (id: string): string =>
  TOOL_ID.test(id) ? id : `${id.replace(/[^A-Za-z0-9_-]+/g, '-')}-${createHash('sha256').update(id).digest('hex').slice(0, 8)}`;

/**
 * A canonical tool call's id as a Messages client sees it. A call's opaque signature (a Gemini
 * thought signature) rides in the id: clients replay tool ids exactly but drop fields the API does
 * not define.
 */
export function clientToolId(id: string, signature?: string): string {
  const safe = safeToolId(id);
  return signature ? `${safe}${SIGNATURE_MARK}${Buffer.from(signature).toString('base64url')}` : safe;
}

/** A client's tool id back as the canonical id and its signature. */
export function readClientToolId(id: string): { id: string; signature?: string } {
  const at = id.indexOf(SIGNATURE_MARK);
  if (at < 0) return { id };
  return { id: id.slice(0, at), signature: Buffer.from(id.slice(at + SIGNATURE_MARK.length), 'base64url').toString() };
}

/** Marks the thinking blocks of an Anthropic turn inside a canonical tool call's signature. */
const THINKING_KEY = 'sluice.anthropic.thinking';

/**
 * The thinking blocks of a turn as the opaque signature of its first tool call, so they survive a
 * round trip through a family that keeps one (Gemini's thought signatures): Anthropic needs them
 * back, unchanged, when the next turn continues the tool use. Base64, as Gemini requires.
 */
export function thinkingSignature(blocks: Json[]): string {
  return Buffer.from(JSON.stringify({ [THINKING_KEY]: blocks })).toString('base64');
}

/** The thinking blocks a signature carries, if it is one of ours. */
export function thinkingFromSignature(signature: string | undefined): Json[] | undefined {
  if (!signature) return undefined;
  const blocks = jsonOrUndefined(Buffer.from(signature, 'base64').toString())?.[THINKING_KEY];
  return Array.isArray(blocks) ? blocks : undefined;
}

/** Tool input is an object; arguments that are not one are kept whole under `value`, never lost. */
export function parsedInput(text: string): Json {
  try {
    const value = JSON.parse(text || '{}');
    return value && typeof value === 'object' && !Array.isArray(value) ? value : { value };
  } catch {
    return { value: text };
  }
}
