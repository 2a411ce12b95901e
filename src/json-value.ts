/**
 * Any JSON value, as `JSON.parse` gives it: for what a family passes on without reading (a tool's
 * JSON Schema, fields it does not know). What a family reads has a type of its own.
 */
export type JsonValue = string | number | boolean | null | JsonValue[] | JsonObject;
export interface JsonObject {
  [key: string]: JsonValue;
}
