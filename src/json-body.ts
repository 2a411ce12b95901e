/** Editing a JSON request body while keeping the client's bytes wherever possible. */

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

/** Parses a request body that must be a JSON object; returns an error message otherwise. */
export function parseJsonObject(body: Buffer): Record<string, any> | 'not_json' | 'not_object' {
  let parsed: unknown;
  try {
    parsed = JSON.parse(body.toString('utf8'));
  } catch {
    return 'not_json';
  }
  return parsed && typeof parsed === 'object' && !Array.isArray(parsed) ? (parsed as Record<string, any>) : 'not_object';
}
