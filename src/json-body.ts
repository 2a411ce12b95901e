/** Reading JSON bodies, and editing a request body while keeping the client's bytes wherever possible. */
import { GatewayError } from './errors.js';
import type { JsonObject, JsonValue } from './json-value.js';
import { checkCounts, checkDepth, type RequestCaps, type RequestShape } from './request-caps.js';

/**
 * Adds or replaces top-level fields. New fields are spliced in before the closing brace so the
 * rest of the body stays byte for byte as the client sent it; replacing a field re-serialises.
 */
export function withFields(raw: Buffer, parsed: Record<string, unknown>, fields: Record<string, unknown>): Buffer {
  const names = Object.keys(fields);
  if (names.length === 0) return raw;
  if (names.some((n) => n in parsed)) return Buffer.from(JSON.stringify({ ...parsed, ...fields }));
  let end = raw.length - 1;
  while (end > 0 && raw[end] !== 0x7d) end--;
  const added = names.map((n) => `,${JSON.stringify(n)}:${JSON.stringify(fields[n])}`).join('');
  return Buffer.concat([raw.subarray(0, end), Buffer.from(added), raw.subarray(end)]);
}

/**
 * A client's request body, which must be a JSON object within the request caps. Depth is checked
 * on the bytes, before parsing, so no recursive routine ever sees a body nested too deep.
 */
export function parseRequestJson(body: Buffer, shape: RequestShape, caps: RequestCaps, beforeChecks?: (parsed: JsonObject) => void): JsonObject {
  checkDepth(body, caps);
  let parsed: unknown;
  try {
    parsed = JSON.parse(body.toString('utf8'));
  } catch {
    throw new GatewayError('invalid_json', 'We could not parse the JSON body of your request. Send valid JSON.');
  }
  if (!parsed || typeof parsed !== 'object' || Array.isArray(parsed)) {
    throw new GatewayError('invalid_request', 'The request body must be a JSON object.');
  }
  // A family that reads alternate spellings (Gemini's snake_case fields) makes them its own first.
  beforeChecks?.(parsed as JsonObject);
  checkCounts(parsed as Record<string, any>, shape, caps);
  return parsed as JsonObject;
}

/**
 * JSON text parsed, or undefined when it is not JSON (for bodies and frames that may be anything).
 * `T` is what the caller reads it as (an upstream's answer, an event): nothing checks it, so its
 * fields are optional where the wire does not promise them.
 */
export function jsonOrUndefined<T = JsonValue>(text: string | Buffer | null | undefined): T | undefined {
  if (text === null || text === undefined) return undefined;
  try {
    return JSON.parse(text.toString()) as T;
  } catch {
    return undefined;
  }
}

const isJsonSpace = (byte: number | undefined) => byte === 0x20 || byte === 0x0a || byte === 0x0d || byte === 0x09;

/**
 * Whether `body` is outlined like a JSON object: `{` first and `}` last, whitespace aside. A few
 * bytes at both ends, no parse: an answer cut short (a dropped connection, a proxy's size limit)
 * or a page of text in its place fails it, which is how a failing upstream's 200 looks.
 */
export function looksLikeJsonObject(body: Buffer): boolean {
  let first = 0;
  let last = body.length - 1;
  while (isJsonSpace(body[first])) first++;
  while (last > first && isJsonSpace(body[last])) last--;
  return last > first && body[first] === 0x7b && body[last] === 0x7d;
}

/** An upstream's complete answer body. */
export function parseUpstreamJson(body: Buffer): JsonObject {
  let parsed: any;
  try {
    parsed = JSON.parse(body.toString('utf8'));
  } catch {
    throw new GatewayError('upstream_error', 'The upstream answered with a body that is not JSON.');
  }
  if (!parsed || typeof parsed !== 'object' || Array.isArray(parsed)) throw new GatewayError('upstream_error', 'The upstream answered with JSON that is not an object.');
  const said = errorSaid(parsed);
  if (said !== undefined) throw new GatewayError('upstream_error', `The upstream answered with an error: ${said}`);
  return parsed;
}

/**
 * What an answer or event that is an error says: its `error`, or that error's `message`; undefined
 * when it has none. A success status around an error (`{"error": {…}}`, Anthropic's
 * `{"type": "error", …}`, a failed response) is a failure: no family's answer carries an error
 * otherwise (Responses' is null).
 */
export function errorSaid(parsed: { error?: unknown }): string | undefined {
  const error = parsed.error as { message?: unknown } | string | undefined;
  if (!error) return undefined;
  return typeof error === 'string' ? error : typeof error.message === 'string' ? error.message : JSON.stringify(error).slice(0, 200);
}

/**
 * What a complete passthrough answer says when it is an error in place of an answer; undefined
 * for an answer. Every family's answer begins with another key (`id`, `candidates`), so a look at
 * the first key's first letter settles nearly every body; only one beginning `"e` or `"t` is parsed.
 */
export function errorInAnswer(body: Buffer): string | undefined {
  let at = 0;
  while (isJsonSpace(body[at])) at++;
  if (body[at++] !== 0x7b) return undefined;
  while (isJsonSpace(body[at])) at++;
  if (body[at] !== 0x22 || (body[at + 1] !== 0x65 && body[at + 1] !== 0x74)) return undefined;
  const parsed = jsonOrUndefined<{ error?: unknown }>(body);
  return parsed && typeof parsed === 'object' ? errorSaid(parsed) : undefined;
}

/** A positive number from a client's field, or undefined. */
export function positiveNumber(value: unknown): number | undefined {
  return typeof value === 'number' && value > 0 ? value : undefined;
}
