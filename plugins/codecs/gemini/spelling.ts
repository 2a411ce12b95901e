/**
 * Google's JSON parser takes each field in lowerCamelCase or in snake_case (`system_instruction`,
 * `generation_config.candidate_count`), and Google's own curl examples use both. The gateway reads
 * the camelCase spelling, so a snake_case one is respelled before anything reads the request.
 * Before, it passed by every check (a `candidate_count` of 8 past a budget sized for one answer, a
 * `system_instruction` past the token limits) and reached the upstream, which read it.
 */
import { GatewayError } from '../../../src/plugin-api.js';

/** Fields whose value is the caller's own data (arguments, a tool's result, JSON Schema, labels): never respelled. */
const OPAQUE = new Set(['args', 'response', 'parametersJsonSchema', 'responseJsonSchema', 'labels', 'example', 'default', 'partMetadata']);

/** Respells `body`'s snake_case field names in place; true when it changed any. Bodies are depth-checked before. */
export function camelCaseFields(body: unknown): boolean {
  let changed = false;
  const walk = (value: unknown): void => {
    if (Array.isArray(value)) {
      for (const item of value) walk(item);
      return;
    }
    if (value === null || typeof value !== 'object') return;
    const object = value as Record<string, unknown>;
    let snake: string[] | undefined;
    for (const key in object) {
      if (key.includes('_')) (snake ??= []).push(key);
      else if (!OPAQUE.has(key)) walkField(key, object[key]);
    }
    // Renamed after the loop (a `for…in` over an object being changed is unspecified), then walked.
    for (const key of snake ?? []) {
      const name = key.replace(/_([a-z0-9])/g, (_, c: string) => c.toUpperCase());
      if (name !== key) {
        if (Object.hasOwn(object, name)) throw new GatewayError('invalid_request', `Both '${key}' and '${name}' are set: send one of them.`, name);
        object[name] = object[key];
        delete object[key];
        changed = true;
      }
      if (!OPAQUE.has(name)) walkField(name, object[name]);
    }
  };
  const walkField = (name: string, child: unknown): void => {
    // A Schema's `properties` are named by the caller; each of them is a Schema again.
    if (name === 'properties' && child !== null && typeof child === 'object' && !Array.isArray(child)) {
      for (const property of Object.values(child)) walk(property);
    } else walk(child);
  };
  walk(body);
  return changed;
}
