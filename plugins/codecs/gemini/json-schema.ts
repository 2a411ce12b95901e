/**
 * Gemini's `Schema` (an OpenAPI 3.0 subset with upper-case type names and `nullable`) to JSON
 * Schema, for upstreams of other families. The other way needs no cleaning: Sluice sends JSON
 * Schema to Gemini as `parametersJsonSchema` / `responseJsonSchema`, which take it as it is.
 */
type Json = Record<string, any>;

const keep = new Set([
  'format', 'title', 'description', 'enum', 'required', 'minItems', 'maxItems', 'minLength', 'maxLength',
  'minProperties', 'maxProperties', 'minimum', 'maximum', 'pattern', 'default', 'example', 'propertyOrdering',
]);

export function geminiSchemaToJsonSchema(schema: Json, depth = 0): Json {
  if (!schema || typeof schema !== 'object' || depth > 64) return {};
  const out: Json = {};
  for (const [key, value] of Object.entries(schema)) if (keep.has(key) && key !== 'propertyOrdering' && key !== 'example') out[key] = value;
  if (typeof schema.type === 'string' && schema.type !== 'TYPE_UNSPECIFIED') {
    const type = schema.type.toLowerCase();
    out.type = schema.nullable && type !== 'null' ? [type, 'null'] : type;
  }
  if (schema.properties && typeof schema.properties === 'object') {
    out.properties = Object.fromEntries(Object.entries(schema.properties).map(([k, v]) => [k, geminiSchemaToJsonSchema(v as Json, depth + 1)]));
  }
  if (schema.items) out.items = geminiSchemaToJsonSchema(schema.items, depth + 1);
  if (Array.isArray(schema.anyOf)) out.anyOf = schema.anyOf.map((s: Json) => geminiSchemaToJsonSchema(s, depth + 1));
  return out;
}
