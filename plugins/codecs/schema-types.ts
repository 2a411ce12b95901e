/**
 * Request types derived from the codecs' JSON Schemas (json-schema-to-ts, types only): the schema
 * ajv checks a request against is the one source of truth for the type the codec reads it as.
 */
import type { FromSchema, JSONSchema } from 'json-schema-to-ts';

/** The keys an object type names, without its index signature. */
type NamedKeys<T> = keyof { [K in keyof T as string extends K ? never : number extends K ? never : K]: 0 };

/**
 * A type without the `[x: string]: unknown` FromSchema gives every object whose schema allows
 * other fields. The schemas let unknown fields through (they reach a same-family upstream in the
 * client's bytes), but the codecs read only what the schema names: without the index signature a
 * misspelt field is a compile error rather than an `unknown`. An object whose schema names no
 * field (a tool's JSON Schema) keeps its index signature: it is open-ended JSON.
 */
export type Closed<T> = T extends readonly (infer U)[]
  ? Closed<U>[]
  : T extends object
    ? [NamedKeys<T>] extends [never]
      ? T
      : { [K in keyof T as string extends K ? never : number extends K ? never : K]: Closed<T[K]> }
    : T;

/** What a request that passed `schema` is, as a codec reads it. */
export type RequestOf<S extends JSONSchema> = Closed<FromSchema<S>>;
