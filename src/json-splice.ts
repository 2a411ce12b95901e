/**
 * Byte-level edits of JSON the gateway relays without parsing: the value of one string field is
 * replaced in place, so the rest of the bytes go out exactly as the upstream wrote them.
 */

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const SPACE = 0x20;
const COLON = 0x3a;

/**
 * `json` with the value of the first `"key": "…"` string field replaced by `value` (already JSON
 * text, quotes included), or `json` itself when it has no such field. `quotedKey` is the key's
 * bytes with their quotes. An unescaped quote only ever delimits a JSON string, so the first match
 * followed by a colon is a key, never text inside a value.
 */
export function replaceStringField(json: Buffer, quotedKey: Buffer, value: Buffer): Buffer {
  for (let at = json.indexOf(quotedKey); at >= 0; at = json.indexOf(quotedKey, at + 1)) {
    let i = at + quotedKey.length;
    while (json[i] === SPACE) i++;
    if (json[i++] !== COLON) continue;
    while (json[i] === SPACE) i++;
    if (json[i] !== QUOTE) return json;
    let end = i + 1;
    while (end < json.length && json[end] !== QUOTE) end += json[end] === BACKSLASH ? 2 : 1;
    if (end >= json.length) return json;
    return Buffer.concat([json.subarray(0, i), value, json.subarray(end + 1)]);
  }
  return json;
}
