/**
 * The fetch an HTTP MCP server is reached through. The SDK's transport reads a JSON answer whole
 * (`response.json()`, an error's `response.text()`) and buffers an SSE event until its blank line,
 * with no bound: one server answering with an endless event, or 300 MB of JSON, filled the heap
 * until the process died. And a request the gateway stopped waiting for (a timeout, the client's
 * cancel) kept its POST open for as long as the server kept its stream open. So, here:
 *
 * - every body is bounded: a JSON answer by the request's cap, an SSE stream per event;
 * - an answer over its cap reaches the SDK as a JSON-RPC error for the request (`data.code`
 *   `result_too_large`), so the call fails at once with a message naming the setting, instead of
 *   waiting for its timeout;
 * - a request's POST is aborted when the SDK sends `notifications/cancelled` for it, which it does
 *   at a timeout and at the caller's cancel.
 *
 * One per transport: the requests in flight are those of one upstream session.
 */
import type { FetchLike } from '@modelcontextprotocol/sdk/shared/transport.js';
import { TOO_LARGE } from './errors.js';

/** Lists can be long (a server with many tools and large schemas): capped apart from results. */
export const LISTING_BYTES = 16 * 1024 * 1024;
/** Room for the JSON-RPC envelope around a result of `maxResultBytes`. */
const ENVELOPE_BYTES = 64 * 1024;
/** An error answer's words (a status other than 2xx): the SDK puts them in an error message. */
const ERROR_TEXT_BYTES = 4096;

type RequestId = string | number;
interface SentRequest {
  id: RequestId;
  method: string;
}

const LISTS = new Set(['tools/list', 'resources/list', 'resources/templates/list', 'prompts/list']);

export interface BoundedFetchOptions {
  /** The server's name, for the messages. */
  server: string;
  /** `mcp.maxResultBytes`: the largest result passed back. */
  maxResultBytes: number;
  /** The fetch underneath (the global one by default). */
  base?: FetchLike;
}

export function boundedFetch({ server, maxResultBytes, base = fetch }: BoundedFetchOptions): FetchLike {
  /** The POST of each request in flight, by JSON-RPC id. */
  const inFlight = new Map<RequestId, AbortController>();
  const capOf = (request: SentRequest | undefined) => (request && LISTS.has(request.method) ? Math.max(LISTING_BYTES, maxResultBytes) : maxResultBytes + ENVELOPE_BYTES);

  return async (url, init) => {
    const message = typeof init?.body === 'string' ? parsed(init.body) : undefined;
    if (message?.method === 'notifications/cancelled') {
      const id = (message.params as { requestId?: RequestId } | undefined)?.requestId;
      if (id !== undefined) inFlight.get(id)?.abort(new Error('the request was cancelled'));
    }
    const request = message && message.id !== undefined && typeof message.method === 'string' ? { id: message.id as RequestId, method: message.method } : undefined;
    let signal = init?.signal ?? undefined;
    let forget = () => {};
    if (request) {
      const controller = new AbortController();
      inFlight.get(request.id)?.abort(new Error('the request id was reused'));
      inFlight.set(request.id, controller);
      forget = () => void (inFlight.get(request.id) === controller && inFlight.delete(request.id));
      signal = signal ? AbortSignal.any([signal, controller.signal]) : controller.signal;
    }
    let response: Response;
    try {
      response = await base(url, { ...init, signal });
    } catch (err) {
      forget();
      throw err;
    }
    if (!response.body) {
      forget();
      return response;
    }
    const cap = capOf(request);
    const tooLarge = () => tooLargeAnswer(request, server, cap);
    // A stream no request waits on (the server's own, opened by GET) is just ended.
    if (mediaType(response) === 'text/event-stream' && response.ok) {
      return new Response(eventsWithin(response.body, cap, request && tooLarge, forget), { status: response.status, statusText: response.statusText, headers: response.headers });
    }
    try {
      if (!response.ok) return finished(await boundedText(response, ERROR_TEXT_BYTES), response);
      const text = await boundedText(response, cap);
      return finished(text.over ? { text: JSON.stringify(tooLarge()) } : text, response);
    } finally {
      // Read whole, or failed (the request cancelled under it, the connection reset): over either way.
      forget();
    }
  };
}

function parsed(body: string): Record<string, unknown> | undefined {
  try {
    const value: unknown = JSON.parse(body);
    return value !== null && typeof value === 'object' && !Array.isArray(value) ? (value as Record<string, unknown>) : undefined;
  } catch {
    return undefined;
  }
}

const mediaType = (response: Response) => (response.headers.get('content-type') ?? '').split(';')[0]!.trim().toLowerCase();

/** The JSON-RPC error the SDK gets in place of an answer over its cap. */
function tooLargeAnswer(request: SentRequest | undefined, server: string, cap: number) {
  return {
    jsonrpc: '2.0',
    id: request?.id ?? null,
    error: {
      code: TOO_LARGE,
      message: `MCP server "${server}" answered ${request?.method ?? 'a request'} with more than ${cap} bytes; the answer was dropped (mcp.maxResultBytes bounds a result).`,
      data: { code: 'result_too_large' },
    },
  };
}

/** A body read whole, up to `cap` bytes: over it, the rest is cancelled and `over` is set. */
async function boundedText(response: Response, cap: number): Promise<{ text: string; over: boolean }> {
  const reader = response.body!.getReader();
  const chunks: Uint8Array[] = [];
  let bytes = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    bytes += value.byteLength;
    if (bytes > cap) {
      await reader.cancel().catch(() => undefined);
      const kept = Buffer.concat(chunks).toString('utf8');
      return { text: `${kept}…`, over: true };
    }
    chunks.push(value);
  }
  return { text: Buffer.concat(chunks).toString('utf8'), over: false };
}

/** The answer again with `text` as its body (its length is no longer the server's). */
function finished(body: { text: string }, response: Response): Response {
  const headers = new Headers(response.headers);
  headers.delete('content-length');
  headers.delete('content-encoding');
  return new Response(body.text, { status: response.status, statusText: response.statusText, headers });
}

const LF = 10;
const CR = 13;

/**
 * An SSE body passed on as it comes, each event at most `cap` bytes. An event that grows past it
 * ends the stream: the SDK gets the event cut short (which it cannot parse, and drops), then the
 * request's error, then the end, and the server's stream is cancelled.
 */
function eventsWithin(body: ReadableStream<Uint8Array>, cap: number, tooLarge: (() => object) | undefined, forget: () => void): ReadableStream<Uint8Array> {
  const reader = body.getReader();
  /** Bytes of the event under way. */
  let eventBytes = 0;
  /** The line under way has something on it (so the next LF ends a line, not the event). */
  let lineOpen = false;
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      let read: Awaited<ReturnType<typeof reader.read>>;
      try {
        read = await reader.read();
      } catch (err) {
        forget();
        throw err;
      }
      if (read.done) {
        forget();
        return controller.close();
      }
      const chunk = read.value;
      for (let i = 0; i < chunk.length; i++) {
        const byte = chunk[i]!;
        if (byte === CR) continue;
        if (byte === LF) {
          if (!lineOpen) eventBytes = 0;
          lineOpen = false;
          continue;
        }
        lineOpen = true;
        if (++eventBytes > cap) {
          controller.enqueue(chunk.subarray(0, i));
          controller.enqueue(new TextEncoder().encode(tooLarge ? `\n\nevent: message\ndata: ${JSON.stringify(tooLarge())}\n\n` : '\n\n'));
          controller.close();
          forget();
          await reader.cancel().catch(() => undefined);
          return;
        }
      }
      controller.enqueue(chunk);
    },
    cancel(reason) {
      forget();
      return reader.cancel(reason);
    },
  });
}
