/**
 * Caps on the shape of a request, checked before anything walks it: a body nested too deep would
 * overflow the stack of every recursive routine after the parser (ajv, JSON.stringify, schema
 * conversion), and huge lists cost memory and CPU out of proportion to anything a client needs.
 * Each family's codec says where its messages, tools and content parts live; the checks are here.
 */
import { GatewayError } from './errors.js';

export interface RequestCaps {
  /** Conversation entries: chat `messages`, Responses `input` items, Gemini `contents`. */
  messages: number;
  /** Tool declarations. */
  tools: number;
  /** Content parts over the whole request. */
  contentParts: number;
  /** JSON nesting depth of the body. */
  depth: number;
  /** Characters in the model id. */
  modelIdLength: number;
}

/** OpenAI's own limits where it has them (2048 messages, 128 tools). */
export const defaultRequestCaps: RequestCaps = { messages: 2048, tools: 128, contentParts: 10_000, depth: 64, modelIdLength: 256 };

/** What a family's request holds, counted by its codec without recursion. */
export interface RequestCounts {
  messages: number;
  tools: number;
  contentParts: number;
}

/** Where a family keeps what the caps count. */
export interface RequestShape {
  /** The family's name for its conversation list (`messages`, `input`, `contents`). */
  messagesField: string;
  toolsField: string;
  count(body: Record<string, any>): RequestCounts;
}

const exceeded = (what: string, cap: keyof RequestCaps, limit: number, param: string | null = null) =>
  new GatewayError('invalid_request', `${what}; the limit is ${limit} (server.requestCaps.${cap}).`, param);

const QUOTE = 0x22;
const BACKSLASH = 0x5c;

/**
 * The deepest nesting of arrays and objects in JSON text, read without parsing; stops counting
 * once past `limit`. Strings are skipped with indexOf, so long prompts cost little.
 */
function jsonDepth(bytes: Uint8Array, limit: number): number {
  let depth = 0;
  let deepest = 0;
  for (let i = 0; i < bytes.length; i++) {
    const c = bytes[i];
    if (c === QUOTE) {
      // Find the closing quote: one preceded by an even number of backslashes.
      for (;;) {
        const close = bytes.indexOf(QUOTE, i + 1);
        if (close < 0) return deepest;
        let slashes = 0;
        while (bytes[close - 1 - slashes] === BACKSLASH) slashes++;
        i = close;
        if (slashes % 2 === 0) break;
      }
    } else if (c === 0x5b || c === 0x7b) {
      depth++;
      if (depth > deepest) {
        deepest = depth;
        if (deepest > limit) return deepest;
      }
    } else if (c === 0x5d || c === 0x7d) depth--;
  }
  return deepest;
}

/** Throws when the body is nested deeper than the cap. */
export function checkDepth(bytes: Uint8Array, caps: RequestCaps): void {
  if (jsonDepth(bytes, caps.depth) > caps.depth) {
    throw exceeded(`The request is nested more than ${caps.depth} levels deep`, 'depth', caps.depth);
  }
}

/** Throws when a parsed body holds more messages, tools or content parts than the caps allow. */
export function checkCounts(body: Record<string, any>, shape: RequestShape, caps: RequestCaps): void {
  const counts = shape.count(body);
  if (counts.messages > caps.messages) {
    throw exceeded(`${shape.messagesField} has ${counts.messages} items`, 'messages', caps.messages, shape.messagesField);
  }
  if (counts.tools > caps.tools) throw exceeded(`${shape.toolsField} has ${counts.tools} tools`, 'tools', caps.tools, shape.toolsField);
  if (counts.contentParts > caps.contentParts) {
    throw exceeded(`The request has ${counts.contentParts} content parts`, 'contentParts', caps.contentParts);
  }
}

/** Throws when a model id is longer than the cap; the id itself is not echoed. */
export function checkModelId(id: unknown, caps: RequestCaps, param = 'model'): void {
  if (typeof id === 'string' && id.length > caps.modelIdLength) {
    throw exceeded(`${param} is ${id.length} characters long`, 'modelIdLength', caps.modelIdLength, param);
  }
}

/** A string the client chose (a model id that is not configured, a method), as errors may echo it. */
export function echoed(text: string, max = 64): string {
  return text.length > max ? `${text.slice(0, max)}…` : text;
}

/** A path parameter as the client meant it (`openai%2Fgpt-4o` is `openai/gpt-4o`); as it came when it is not valid percent-encoding. */
export function decodedParam(param: string): string {
  try {
    return decodeURIComponent(param);
  } catch {
    return param;
  }
}

/** Length of an array, 0 for anything else: counting runs before the schema is checked. */
export const lengthOf = (value: unknown): number => (Array.isArray(value) ? value.length : 0);

/** A content field's part count: a string is one part, an array one per element. */
export const partsIn = (content: unknown): number => (typeof content === 'string' ? 1 : lengthOf(content));
