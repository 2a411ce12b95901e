/**
 * What every route and response of one server shares: the pipeline, the in-flight body budget, the
 * writers one timer probes, whether the server is draining or full; and the small helpers every
 * route uses. Its own module so that the route tables, the body reader and the response machine
 * each import it, and none of them another.
 */
import { STATUS_CODES } from 'node:http';
import { GatewayError } from '../errors.js';
import type { LiveItem, LiveSet } from '../live-set.js';
import type { Pipeline } from '../pipeline.js';
import type { HttpRequest } from '../uws.js';

export const statusLine = (status: number) => `${status} ${STATUS_CODES[status] ?? ''}`;

/** What every response of one server shares: limits, the body budget, the writers under way. */
export interface ServerContext {
  pipeline: Pipeline;
  maxBodyBytes: number;
  maxInFlightBodyBytes: number;
  bodyBytesInFlight: number;
  writeStallMs: number;
  /** Answers carry `x-sluice-overhead-ms` (`server.overheadHeader`). */
  overheadHeader: boolean;
  /** Streams and large replies under way: one timer probes those whose client is behind and heartbeats the quiet ones. */
  writers: LiveSet<Writer>;
  /** Set when the drain begins: new exchanges are refused. */
  draining: boolean;
  /** Admin, console and metrics requests under way: they count against maxConnections too. */
  jsonInFlight: number;
  /** In-flight exchanges, open sockets and JSON requests have reached `server.maxConnections`. */
  overloaded(): boolean;
}

/** A response the stall timer probes while it writes. */
export interface Writer extends LiveItem {
  tick(now: number): void;
}

export function copyHeaders(req: HttpRequest): { headers: Record<string, string>; repeated: Set<string> | undefined } {
  const headers: Record<string, string> = {};
  let repeated: Set<string> | undefined;
  req.forEach((k, v) => {
    if (k in headers) (repeated ??= new Set()).add(k);
    headers[k] = v;
  });
  return { headers, repeated };
}

export const atCapacity = () => new GatewayError('overloaded', 'The gateway is at capacity; try again shortly.', null, undefined, undefined, 1);
export const bodiesOverloaded = () => new GatewayError('overloaded', 'Too many request bodies are being received; try again shortly.', null, undefined, undefined, 1);

/** Takes `bytes` of the in-flight body budget shared by every route; false when it is spent. */
export function takeBodyBudget(context: ServerContext, bytes: number): boolean {
  if (context.bodyBytesInFlight + bytes > context.maxInFlightBodyBytes) return false;
  context.bodyBytesInFlight += bytes;
  return true;
}
