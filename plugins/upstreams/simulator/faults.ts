/**
 * Process-wide faults of the standalone simulator, set with `POST /faults` (for failover tests: a
 * `[[sim …]]` directive travels with the prompt, so it fails every channel alike, while a fault
 * set here fails only this simulator, until it is cleared with `POST /faults {}`).
 */
import type { ReplyStep, SimReply } from './reply.js';

export interface Faults {
  /** Every generation request is answered with this status (the `error=` directive's body). */
  status?: number;
  /** Seconds sent as `Retry-After` with `status`. */
  retryAfter?: number;
  /** Every generation request gets its connection dropped, with no answer. */
  reset?: boolean;
  /** Every generation answer (not a dropped connection) is held this long before its first byte. */
  delayMs?: number;
}

/** The faults in a `POST /faults` body; throws on anything else. */
export function parseFaults(body: Buffer | undefined): Faults {
  const input: unknown = JSON.parse(body?.toString('utf8') || '{}');
  if (!input || typeof input !== 'object' || Array.isArray(input)) throw new Error('the body must be a JSON object');
  const { status, retryAfter, reset, delayMs, ...rest } = input as Record<string, unknown>;
  const unknown = Object.keys(rest)[0];
  if (unknown) throw new Error(`unknown fault "${unknown}"`);
  const whole = (v: unknown, min: number, max: number) => v === undefined || (Number.isInteger(v) && (v as number) >= min && (v as number) <= max);
  if (!whole(status, 400, 599)) throw new Error('status must be an HTTP error status');
  if (!whole(retryAfter, 0, 86_400) || !whole(delayMs, 0, 600_000)) throw new Error('retryAfter and delayMs must be whole numbers');
  if (reset !== undefined && typeof reset !== 'boolean') throw new Error('reset must be true or false');
  return input as Faults;
}

/**
 * `reply` as the faults change it: replaced by an error (`fault` renders it in the family's shape)
 * or a dropped connection, or held back.
 */
export function faulted(faults: Faults, reply: () => SimReply, fault: (status: number) => SimReply): SimReply {
  let out: SimReply;
  if (faults.reset) out = { status: 200, headers: {}, steps: [], cut: true };
  else if (faults.status !== undefined) {
    out = fault(faults.status);
    if (faults.retryAfter !== undefined) out.headers['retry-after'] = String(faults.retryAfter);
  } else out = reply();
  return faults.delayMs ? delayed(out, faults.delayMs) : out;
}

/** `reply` with its first step held `ms` longer; a streamed reply's steps are still made as played. */
function delayed(reply: SimReply, ms: number): SimReply {
  const { play } = reply;
  if (!play) {
    const [first, ...rest] = reply.steps;
    return first ? { ...reply, steps: [{ ...first, delayMs: first.delayMs + ms }, ...rest] } : reply;
  }
  let whole: ReplyStep[] | undefined;
  return {
    status: reply.status,
    headers: reply.headers,
    cut: reply.cut,
    get steps(): ReplyStep[] {
      return (whole ??= [...heldFirst(reply.steps[Symbol.iterator](), ms)]);
    },
    set steps(steps: ReplyStep[]) {
      whole = steps;
    },
    play: () => (whole ? whole[Symbol.iterator]() : heldFirst(play(), ms)),
  };
}

function* heldFirst(steps: Iterator<ReplyStep>, ms: number): Generator<ReplyStep, void, undefined> {
  let first = true;
  try {
    for (let next = steps.next(); !next.done; next = steps.next()) {
      yield first ? { ...next.value, delayMs: next.value.delayMs + ms } : next.value;
      first = false;
    }
  } finally {
    steps.return?.();
  }
}
