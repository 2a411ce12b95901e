/**
 * Gemini's `Schema` (an OpenAPI 3.0 subset with upper-case type names and `nullable`) to JSON
 * Schema, for upstreams of other families. The other way needs no cleaning: Sluice sends JSON
 * Schema to Gemini as `parametersJsonSchema` / `responseJsonSchema`, which take it as it is.
 */

const keep = new Set([
  'format', 'title', 'description', 'enum', 'required', 'minItems', 'maxItems', 'minLength', 'maxLength',
  'minProperties', 'maxProperties', 'minimum', 'maximum', 'pattern', 'default', 'example', 'propertyOrdering',
]);

/**
 * The keywords Google's Schema types as int64, which its JSON carries as strings (`"minItems": "1"`,
 * as the js-genai types declare them); JSON Schema wants integers.
 */
const INT64_KEYWORDS = new Set(['minItems', 'maxItems', 'minLength', 'maxLength', 'minProperties', 'maxProperties']);

export function geminiSchemaToJsonSchema(value: unknown, depth = 0): Record<string, unknown> {
  if (!value || typeof value !== 'object' || depth > 64) return {};
  // Any JSON object: each keyword is checked before it is read.
  const schema = value as Record<string, unknown>;
  const out: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(schema)) {
    if (!keep.has(key) || key === 'propertyOrdering' || key === 'example') continue;
    out[key] = INT64_KEYWORDS.has(key) && typeof value === 'string' && /^\d+$/.test(value) ? Number(value) : value;
  }
  if (typeof schema.type === 'string' && schema.type !== 'TYPE_UNSPECIFIED') {
    const type = schema.type.toLowerCase();
    out.type = schema.nullable && type !== 'null' ? [type, 'null'] : type;
  }
  if (schema.properties && typeof schema.properties === 'object') {
    out.properties = Object.fromEntries(Object.entries(schema.properties).map(([k, v]) => [k, geminiSchemaToJsonSchema(v, depth + 1)]));
  }
  if (schema.items) out.items = geminiSchemaToJsonSchema(schema.items, depth + 1);
  if (Array.isArray(schema.anyOf)) out.anyOf = schema.anyOf.map((s) => geminiSchemaToJsonSchema(s, depth + 1));
  return out;
}
