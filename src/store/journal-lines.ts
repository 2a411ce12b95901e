/**
 * The usage journal's lines, and the records as they travel to the SQLite writer thread: one JSON
 * array per line, a tag then the fields by position. A record is `[1, time, requestId, …]` in
 * RECORD_FIELDS order, an exchange that began and has no record yet `[0, time, requestId, …]` in
 * OPEN_FIELDS order. Arrays rather than objects because every record is written on the serving
 * thread and read back on the writer's: without the keys a line is 143 bytes instead of 404, and
 * `JSON.stringify` takes 0.6 µs instead of 1.1 and `JSON.parse` 0.45 instead of 1.0 (Node 20, a
 * loop over a plain completion's record). Lines of earlier versions, `{…record}` and
 * `{"open":{…}}`, are still read, so a journal left by one replays in this one.
 *
 * A field added later goes at the end of its list: a shorter line, written before it existed,
 * reads it as null.
 */
import type { OpenExchange, UsageRecord } from './store.js';

const OPEN = 0;
const RECORD = 1;

/** Positions of a record line's fields, after the tag. `encodeRecord` writes them in this order. */
const RECORD_FIELDS: ReadonlyArray<keyof UsageRecord> = [
  'time', 'requestId', 'keyId', 'group', 'model', 'upstream', 'family', 'status', 'promptTokens', 'completionTokens',
  'cachedInputTokens', 'cacheWriteTokens', 'reasoningTokens', 'cost', 'channel', 'attempts', 'estimated', 'latencyMs',
  'ttfbMs', 'streamed', 'outcome', 'error', 'notes',
];
/** Positions of an open line's fields, after the tag. */
const OPEN_FIELDS: ReadonlyArray<keyof OpenExchange> = ['time', 'requestId', 'keyId', 'group', 'model', 'upstream', 'family', 'streamed'];

/**
 * A record's line, without its newline. An array literal, not a loop over RECORD_FIELDS: a read
 * by a computed name per field costs more than the whole encoding saves (the round-trip test in
 * test/durability.test.ts holds the two orders together).
 */
export const encodeRecord = (r: UsageRecord): string =>
  JSON.stringify([
    RECORD, r.time, r.requestId, r.keyId, r.group, r.model, r.upstream, r.family, r.status, r.promptTokens, r.completionTokens,
    r.cachedInputTokens, r.cacheWriteTokens, r.reasoningTokens, r.cost, r.channel, r.attempts, r.estimated, r.latencyMs,
    r.ttfbMs, r.streamed, r.outcome, r.error, r.notes,
  ]);

/** An open exchange's line, without its newline. */
export const encodeOpen = (o: OpenExchange): string =>
  JSON.stringify([OPEN, o.time, o.requestId, o.keyId, o.group, o.model, o.upstream, o.family, o.streamed]);

export type JournalEntry = { record: UsageRecord } | { open: OpenExchange };

/** What a line says, or undefined when it is not a line of the journal (an append torn by a crash, say). Never throws. */
export function decodeLine(line: string): JournalEntry | undefined {
  let value: unknown;
  try {
    value = JSON.parse(line);
  } catch {
    return undefined;
  }
  if (Array.isArray(value)) {
    if (typeof value[2] !== 'string') return undefined;
    if (value[0] === RECORD) return { record: fromFields(value, RECORD_FIELDS) as unknown as UsageRecord };
    if (value[0] === OPEN) return { open: fromFields(value, OPEN_FIELDS) as unknown as OpenExchange };
    return undefined;
  }
  // An earlier version's object lines.
  const entry = value as { requestId?: unknown; open?: { requestId?: unknown } } | null;
  if (typeof entry?.requestId === 'string') return { record: entry as UsageRecord };
  if (typeof entry?.open?.requestId === 'string') return { open: entry.open as OpenExchange };
  return undefined;
}

/** Where a record field sits in a record line, the tag being at 0: `recordLinePosition('time')` is 1. */
export const recordLinePosition = (field: keyof UsageRecord): number => RECORD_FIELDS.indexOf(field) + 1;

/**
 * A record line as its array, the tag then the fields in RECORD_FIELDS order, for a reader that
 * binds them by position (the SQLite writer thread, sent only what `encodeRecord` wrote): no object
 * per record, which cost that thread 1.4 µs of its 6 per record (Node 20, 256-record batches).
 * Throws on a line that is not a record's.
 */
export function recordLineValues(line: string): unknown[] {
  let value: unknown;
  try {
    value = JSON.parse(line);
  } catch {
    value = undefined;
  }
  if (Array.isArray(value) && value[0] === RECORD && typeof value[2] === 'string') return value;
  throw new Error(`not a usage record line: ${line.slice(0, 80)}`);
}

function fromFields(values: unknown[], fields: ReadonlyArray<string>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (let i = 0; i < fields.length; i++) out[fields[i]!] = values[i + 1] ?? null;
  return out;
}
