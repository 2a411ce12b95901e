/**
 * Byte-level edits of JSON the gateway relays without parsing: the value of one string field is
 * replaced in place, so the rest of the bytes go out exactly as the upstream wrote them.
 */

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const COLON = 0x3a;
const OPEN_OBJECT = 0x7b;
const CLOSE_OBJECT = 0x7d;
const OPEN_ARRAY = 0x5b;
const CLOSE_ARRAY = 0x5d;

const isSpace = (byte: number | undefined) => byte === 0x20 || byte === 0x09 || byte === 0x0a || byte === 0x0d;

/**
 * `json` with the value of the first `"key": "…"` string field replaced by `value` (already JSON
 * text, quotes included), or `json` itself when it has no such field. `quotedKey` is the key's
 * bytes with their quotes. Only a key in the outer object or in an object directly inside it
 * counts (`model` of a chat chunk, `response.model` of a Responses event), never one inside an
 * array: tool arguments (a Gemini `functionCall.args` object) can have a field of the same name.
 * The text before the JSON (an SSE frame's `data: `) is skipped.
 */
export function replaceStringField(json: Buffer, quotedKey: Buffer, value: Buffer): Buffer {
  let objects = 0;
  let arrays = 0;
  /** True right after `{` or `,` inside an object: the next string is a key. */
  let expectKey = false;
  let i = json.indexOf(OPEN_OBJECT);
  if (i < 0) return json;
  for (; i < json.length; i++) {
    const byte = json[i]!;
    if (byte === QUOTE) {
      const start = i;
      i++;
      while (i < json.length && json[i] !== QUOTE) i += json[i] === BACKSLASH ? 2 : 1;
      if (i >= json.length) return json;
      if (!expectKey || arrays > 0 || objects > 2 || i + 1 - start !== quotedKey.length || !json.subarray(start, i + 1).equals(quotedKey)) {
        expectKey = false;
        continue;
      }
      let at = i + 1;
      while (isSpace(json[at])) at++;
      if (json[at++] !== COLON) return json;
      while (isSpace(json[at])) at++;
      if (json[at] !== QUOTE) return json;
      let end = at + 1;
      while (end < json.length && json[end] !== QUOTE) end += json[end] === BACKSLASH ? 2 : 1;
      if (end >= json.length) return json;
      return Buffer.concat([json.subarray(0, at), value, json.subarray(end + 1)]);
    }
    if (byte === OPEN_OBJECT) {
      objects++;
      expectKey = arrays === 0;
    } else if (byte === CLOSE_OBJECT) {
      objects--;
    } else if (byte === OPEN_ARRAY) {
      arrays++;
    } else if (byte === CLOSE_ARRAY) {
      arrays--;
    } else if (byte === 0x2c) {
      expectKey = arrays === 0;
    }
  }
  return json;
}

const LF = 0x0a;
const CR = 0x0d;
const COMMA = 0x2c;
const NULL = Buffer.from('null');

/**
 * Blanks out the `"key": null` fields of `frames` (whole SSE frames of JSON events), in place: an
 * upstream asked for usage on the client's behalf writes `"usage":null` in every chunk, which the
 * client did not ask for. The field and its comma become spaces, which JSON ignores, so nothing is
 * copied. Servers write it last in the event (OpenAI), so each `data:` line is checked at its end
 * first, a few byte compares; a line that does not end so is searched. The raw bytes `"key"`
 * cannot occur inside a JSON string (its quotes would be escaped), so every hit is a field.
 */
export function blankNullFields(frames: Buffer, quotedKey: Buffer): void {
  /** The next occurrence of the key at or after the current line, once searched (-2: not yet). */
  let nextKey = -2;
  let lineStart = 0;
  for (let lf = frames.indexOf(LF); lf >= 0; lineStart = lf + 1, lf = frames.indexOf(LF, lineStart)) {
    let end = lf;
    if (frames[end - 1] === CR) end--;
    if (end <= lineStart || frames[end - 1] !== CLOSE_OBJECT) continue;
    const start = nullFieldBefore(frames, end - 1, quotedKey, lineStart);
    if (start >= 0) {
      blank(frames, start, end - 1);
      continue;
    }
    // One search serves every line up to its hit, so a run is searched once however many lines it has.
    if (nextKey !== -1 && nextKey < lineStart) nextKey = frames.indexOf(quotedKey, lineStart);
    if (nextKey < 0) return;
    if (nextKey < end) blank(frames, ...(nullFieldIn(frames, nextKey, end, quotedKey) ?? [0, 0]));
  }
}

/** A few bytes are set faster one by one than by a native fill. */
function blank(buf: Buffer, from: number, to: number): void {
  for (let i = from; i < to; i++) buf[i] = 0x20;
}

/** Where the field `, "key": null` ending right before `close` (an object's `}`) starts, comma included, or -1. */
function nullFieldBefore(json: Buffer, close: number, quotedKey: Buffer, min: number): number {
  let at = close;
  while (isSpace(json[at - 1])) at--;
  if (at - NULL.length < min || !occursAt(json, NULL, at - NULL.length)) return -1;
  at -= NULL.length;
  while (isSpace(json[at - 1])) at--;
  if (json[--at] !== COLON) return -1;
  while (isSpace(json[at - 1])) at--;
  const keyStart = at - quotedKey.length;
  if (keyStart < min || !occursAt(json, quotedKey, keyStart)) return -1;
  let comma = keyStart;
  while (isSpace(json[comma - 1])) comma--;
  return json[comma - 1] === COMMA ? comma - 1 : -1;
}

/** The first `"key": null` field within [from, to) (`from` is where the key first occurs), with the comma that separates it, as [start, end). */
function nullFieldIn(json: Buffer, from: number, to: number, quotedKey: Buffer): [number, number] | undefined {
  for (let key = from; key >= 0 && key < to; key = json.indexOf(quotedKey, key + 1)) {
    let at = key + quotedKey.length;
    while (isSpace(json[at])) at++;
    if (json[at++] !== COLON) continue;
    while (isSpace(json[at])) at++;
    if (!occursAt(json, NULL, at)) continue;
    at += NULL.length;
    let before = key;
    while (isSpace(json[before - 1])) before--;
    // `, "key": null` goes with the comma before it; a first field `{"key": null, …` with the one after.
    if (json[before - 1] === COMMA) return [before - 1, at];
    while (isSpace(json[at])) at++;
    if (json[at] === COMMA) return [key, at + 1];
    if (json[at] === CLOSE_OBJECT) return [key, at];
  }
  return undefined;
}

/** Whether `bytes` occur in `buf` at `offset`: compared in place (a view and a native compare cost more for a few bytes). */
export function occursAt(buf: Buffer, bytes: Buffer, offset: number): boolean {
  if (offset < 0 || offset + bytes.length > buf.length) return false;
  for (let i = 0; i < bytes.length; i++) if (buf[offset + i] !== bytes[i]) return false;
  return true;
}
