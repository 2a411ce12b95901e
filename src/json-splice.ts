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
