/**
 * W3C Trace Context (https://www.w3.org/TR/trace-context/): every exchange belongs to a trace, the
 * client's when it sent a valid `traceparent`, a new one otherwise. The gateway is one span of it:
 * upstream calls carry the same trace id with the gateway's span id as their parent, and the access
 * log names both. When a plugin records traces (the tracing plugin), each upstream call is a span
 * of its own and its `traceparent` names that span instead (Plugin.callSpan). This module exports
 * nothing itself; it costs a few string operations per exchange. */
import { randomFillSync } from 'node:crypto';

export interface TraceContext {
  /** 32 lowercase hex digits, not all zero. */
  traceId: string;
  /** The gateway's span for this exchange: 16 lowercase hex digits, not all zero. */
  spanId: string;
  /** The client's span, when it sent a valid `traceparent`. */
  parentId: string | undefined;
  /** The caller recorded its span (the `sampled` flag); passed on as it came. */
  sampled: boolean;
  /** The client's `tracestate`, passed on unchanged with a valid `traceparent`. */
  state: string | undefined;
}

/** What a `traceparent` header says. */
export interface Traceparent {
  traceId: string;
  parentId: string;
  sampled: boolean;
}

/**
 * Version, trace id, parent id and flags; a version above 00 may carry more fields after another
 * dash, which a reader of version 00 ignores (the spec's forward compatibility).
 */
const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-[\s\S]*)?$/;
const ZERO_TRACE = '0'.repeat(32);
const ZERO_SPAN = '0'.repeat(16);
/** Printable ASCII only: anything else could make the upstream request itself invalid. */
const PRINTABLE = /^[\x20-\x7e]*$/;
/** The spec's recommended minimum for `tracestate`; a longer one is dropped rather than cut. */
const MAX_TRACESTATE = 512;

/** The `traceparent` header's meaning, or undefined when it is absent or invalid. Never throws. */
export function parseTraceparent(value: string | undefined): Traceparent | undefined {
  if (typeof value !== 'string' || value.length < 55) return undefined;
  const m = TRACEPARENT.exec(value);
  if (!m) return undefined;
  const [, version, traceId, parentId, flags, more] = m as unknown as [string, string, string, string, string, string | undefined];
  // ff is forbidden; version 00 has exactly four fields.
  if (version === 'ff' || (version === '00' && more !== undefined)) return undefined;
  if (traceId === ZERO_TRACE || parentId === ZERO_SPAN) return undefined;
  return { traceId, parentId, sampled: (parseInt(flags, 16) & 1) === 1 };
}

/** A version 00 `traceparent`; only the sampled flag is defined, so every other flag is zero. */
export function formatTraceparent(traceId: string, parentId: string, sampled: boolean): string {
  return `00-${traceId}-${parentId}-${sampled ? '01' : '00'}`;
}

/** The trace of an exchange from its request headers: the client's, or a new one. */
export function traceOf(headers: Record<string, string>): TraceContext {
  const parent = parseTraceparent(headers.traceparent);
  if (!parent) return { traceId: randomId(16, ZERO_TRACE), spanId: randomId(8, ZERO_SPAN), parentId: undefined, sampled: false, state: undefined };
  const state = headers.tracestate;
  return {
    traceId: parent.traceId,
    spanId: randomId(8, ZERO_SPAN),
    parentId: parent.parentId,
    sampled: parent.sampled,
    state: state && state.length <= MAX_TRACESTATE && PRINTABLE.test(state) ? state : undefined,
  };
}

/**
 * The `traceparent` an upstream call carries: the exchange's trace, with the span recorded for the
 * call as parent, sampled since it is being recorded (a trace the gateway started as well as the
 * client's); without one, the gateway's own span and the client's flag as it came.
 */
export const upstreamTraceparent = (trace: TraceContext, callSpan?: string) =>
  callSpan ? formatTraceparent(trace.traceId, callSpan, true) : formatTraceparent(trace.traceId, trace.spanId, trace.sampled);

// Random ids are cut from a pool filled 4 KB at a time: one system call per ~170 exchanges.
const pool = Buffer.allocUnsafe(4096);
let used = pool.length;

/** `bytes` random bytes in hex, never `zero` (all zeros is invalid). */
function randomId(bytes: number, zero: string): string {
  for (;;) {
    if (used + bytes > pool.length) {
      randomFillSync(pool);
      used = 0;
    }
    const id = pool.toString('hex', used, (used += bytes));
    if (id !== zero) return id;
  }
}
