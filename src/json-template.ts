/**
 * Templates for the frames a stream writer sends most: one per token. Serialising a whole event
 * object per token spent as long on the fields that never change as on the token; a template is
 * that object's JSON cut where the values change, so a frame costs the JSON of those values only,
 * with the bytes, fields and order the object would have had (test/stream-writer-frames.test.ts).
 */

/** Stands for a value a template leaves out: a string no event holds (it starts with a NUL). */
export const HOLE = '\u0000sluice:hole\u0000';
const QUOTED_HOLE = JSON.stringify(HOLE);

/**
 * `JSON.stringify(value)` cut at each HOLE in it: n holes give n + 1 pieces, to be joined with the
 * JSON text of the values that fill them (`pieces[0] + JSON.stringify(text) + pieces[1]`).
 */
export function jsonTemplate(value: unknown): string[] {
  return JSON.stringify(value).split(QUOTED_HOLE);
}
