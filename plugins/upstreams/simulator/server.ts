/**
 * The simulator as its own HTTP process (for benchmarks and tests against a real socket):
 *   node dist/plugins/upstreams/simulator/server.js --port N [--host 127.0.0.1]
 * Prints `simulator listening on http://HOST:PORT` once it listens. Serves POST /v1/chat/completions,
 * POST /v1/responses, POST /v1/messages and /v1/messages/count_tokens (these two want a credential
 * and `anthropic-version`, as Anthropic does), GET /v1/models (Anthropic's list and GET
 * /v1/models/{id} when the request carries `anthropic-version`, else OpenAI's), the Gemini API under
 * /v1beta (POST /v1beta/models/{model}:generateContent, :streamGenerateContent, :countTokens; GET
 * /v1beta/models, GET /v1beta/models/{id}), GET /healthz and GET /stats (what tests check the
 * gateway sent); `cut_after` drops the connection without ending the response (Messages: fails it
 * with an `error` event). POST /faults sets faults that fail every generation request of this
 * process until cleared (faults.ts).
 */
import { STATUS_CODES } from 'node:http';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { loadUws, type HttpRequest, type HttpResponse, type TemplatedApp } from '../../../src/plugin-api.js';
import { DEFAULT_MODELS } from './chat.js';
import { parseFaults, faulted, type Faults } from './faults.js';
import { DEFAULT_GEMINI_MODELS, geminiError, geminiFault, geminiNotFound, routeGemini } from './gemini.js';
import { playReply, routeSimulator, type SimulatorRoutes } from './index.js';
import { DEFAULT_MESSAGES_MODELS, anthropicError, messagesFault, messagesHeaderProblem } from './messages.js';
import { errorReply, faultReply, notFound, type SimReply } from './reply.js';

export interface SimulatorServerOptions {
  /** Defaults to 127.0.0.1. */
  host?: string;
  /** 0 (the default) picks a free port. */
  port?: number;
  /** Ids listed by GET /v1/models. */
  models?: string[];
  /** Ids listed by GET /v1beta/models. */
  geminiModels?: string[];
  /** Ids listed by GET /v1/models with `anthropic-version`. */
  messagesModels?: string[];
}

export interface SimulatorServer {
  port: number;
  close(): void;
}

const MAX_BODY_BYTES = 64 * 1024 * 1024;
/** The generation endpoints /stats counts. */
const GENERATION_PATHS = new Set(['/v1/chat/completions', '/v1/responses', '/v1/messages']);
const MESSAGES_PATHS = new Set(['/v1/messages', '/v1/messages/count_tokens']);
/** Request headers the Messages routes read, and /stats reports for the latest generation request. */
const ANTHROPIC_HEADERS = ['x-api-key', 'authorization', 'anthropic-version', 'anthropic-beta'];
const GEMINI_GENERATION = /^\/v1beta\/models\/.+:(generateContent|streamGenerateContent)$/;
const GEMINI_ROOT = '/v1beta/';

function isGeneration(url: string): boolean {
  if (GENERATION_PATHS.has(url)) return true;
  if (!url.startsWith(GEMINI_ROOT)) return false;
  try {
    return GEMINI_GENERATION.test(decodeURIComponent(url));
  } catch {
    return false;
  }
}

/** Counters behind GET /stats. */
interface Stats {
  /** Generation requests received (chat completions, responses, Gemini content generation). */
  requests: number;
  /** Exchanges the client dropped before the response was complete. */
  aborted: number;
  /** Raw body of the latest generation request, parsed only when asked for. */
  lastBody?: Buffer;
  /** Of the latest generation request, the ANTHROPIC_HEADERS it carried. */
  lastHeaders?: Record<string, string>;
  faults: Faults;
}

export function startSimulatorServer(options: SimulatorServerOptions = {}): Promise<SimulatorServer> {
  const host = options.host ?? '127.0.0.1';
  const port = options.port ?? 0;
  const routes: ServerRoutes = {
    models: options.models ?? DEFAULT_MODELS,
    geminiModels: options.geminiModels ?? DEFAULT_GEMINI_MODELS,
    messagesModels: options.messagesModels ?? DEFAULT_MESSAGES_MODELS,
  };
  // close() exists at runtime (it also drops open connections) but is missing from the typings.
  const uWS = loadUws();
  const app: TemplatedApp & { close?(): void } = uWS.App();
  const stats: Stats = { requests: 0, aborted: 0, faults: {} };
  app.any('/*', (res, req) => handle(res, req, routes, stats));
  return new Promise((resolve, reject) => {
    app.listen(host, port, (listenSocket) => {
      if (!listenSocket) {
        reject(new Error(`simulator: cannot listen on ${host}:${port}`));
        return;
      }
      resolve({
        port: uWS.us_socket_local_port(listenSocket),
        close: () => {
          uWS.us_listen_socket_close(listenSocket);
          app.close?.();
        },
      });
    });
  });
}

type ServerRoutes = Required<Pick<SimulatorRoutes, 'models' | 'geminiModels' | 'messagesModels'>>;

function handle(res: HttpResponse, req: HttpRequest, options: ServerRoutes, stats: Stats): void {
  // Everything from req must be read now: it is only valid during this callback.
  const method = req.getMethod().toUpperCase();
  const url = req.getUrl();
  const query = req.getQuery();
  const headers: Record<string, string> = {};
  for (const name of ANTHROPIC_HEADERS) {
    const value = req.getHeader(name);
    if (value) headers[name] = value;
  }
  const gemini = url.startsWith(GEMINI_ROOT);
  const messages = MESSAGES_PATHS.has(url);
  const exchange = new Exchange(res, () => stats.aborted++);
  res.onAborted(() => exchange.abort());

  const route = (body?: Buffer): SimReply => {
    if (method === 'GET' && url === '/healthz') return json({ status: 'ok' });
    if (method === 'GET' && url === '/stats') {
      return json({ requests: stats.requests, aborted: stats.aborted, lastRequest: parsed(stats.lastBody), lastHeaders: stats.lastHeaders ?? null });
    }
    if (method === 'POST' && url === '/faults') {
      try {
        return json((stats.faults = parseFaults(body)));
      } catch (err) {
        return errorReply(400, (err as Error).message, 'invalid_request_error', null, null);
      }
    }
    if (method === 'POST' && isGeneration(url) && body) {
      stats.requests++;
      stats.lastBody = body;
      stats.lastHeaders = headers;
      return faulted(stats.faults, () => generate(body), gemini ? geminiFault : messages ? messagesFault : faultReply);
    }
    return generate(body);
  };
  const generate = (body?: Buffer): SimReply => {
    const search = query ? `?${query}` : '';
    // The Gemini API root serves only Gemini routes, with Google-shaped errors.
    if (gemini) return routeGemini(method, url.slice(GEMINI_ROOT.length - 1) + search, body, { models: options.geminiModels }) ?? geminiNotFound(method, url);
    const problem = messages ? messagesHeaderProblem(headers) : undefined;
    if (problem) return problem;
    // Anthropic's clients list models with the version header; OpenAI's do not send it.
    const routes: SimulatorRoutes = headers['anthropic-version'] ? { ...options, listing: 'anthropic' } : options;
    const reply = url.startsWith('/v1/') ? routeSimulator(method, url.slice(3) + search, body, routes, headers) : undefined;
    return reply ?? notFound(method, url);
  };
  if (method !== 'POST') {
    exchange.play(route());
    return;
  }
  const chunks: Buffer[] = [];
  let size = 0;
  res.onData((chunk, isLast) => {
    if (size > MAX_BODY_BYTES) return;
    size += chunk.byteLength;
    if (size > MAX_BODY_BYTES) {
      // Google refuses an oversized payload with a 400; OpenAI and Anthropic with a 413.
      exchange.play(
        gemini
          ? geminiError(400, `Request payload size exceeds the limit: ${MAX_BODY_BYTES} bytes.`)
          : messages
            ? anthropicError(413, 'Request exceeds the maximum allowed number of bytes.')
            : errorReply(413, 'The request body is too large.', 'invalid_request_error', null, null),
      );
      return;
    }
    // The ArrayBuffer is neutered when this callback returns: copy it.
    chunks.push(Buffer.from(new Uint8Array(chunk)));
    if (isLast) exchange.play(route(Buffer.concat(chunks)));
  });
}

function json(body: unknown): SimReply {
  return { status: 200, headers: { 'content-type': 'application/json' }, steps: [{ delayMs: 0, bytes: JSON.stringify(body) }], cut: false };
}

function parsed(body: Buffer | undefined): unknown {
  try {
    return body ? (JSON.parse(body.toString('utf8')) as unknown) : null;
  } catch {
    return null;
  }
}

/** One HTTP response being played: headers go out with the first step, writes honour backpressure. */
class Exchange {
  private aborted = false;
  /** The response is complete (or deliberately cut): a later onAborted is no client drop. */
  private done = false;
  private call: { abort(): void } | undefined;

  constructor(
    private readonly res: HttpResponse,
    private readonly onDropped: () => void,
  ) {}

  /** The client went away (or our own cut closed the socket). */
  abort(): void {
    if (this.aborted) return;
    this.aborted = true;
    if (!this.done) this.onDropped();
    this.call?.abort();
  }

  play(reply: SimReply): void {
    if (this.aborted || this.call) return;
    const { res } = this;
    let head: string | undefined;
    const call = playReply(reply, {
      start: (status) => {
        head = `${status} ${STATUS_CODES[status] ?? 'Unknown'}`;
      },
      data: (bytes, final) => {
        let ok = true;
        res.cork(() => {
          if (head !== undefined) {
            res.writeStatus(head);
            for (const [name, value] of Object.entries(reply.headers)) res.writeHeader(name, value);
            head = undefined;
          }
          if (final) {
            this.done = true;
            res.end(bytes);
          } else ok = res.write(bytes);
        });
        return ok;
      },
      finish: (cut) => {
        if (this.done) return;
        this.done = true;
        res.cork(() => (cut ? res.close() : res.end()));
      },
    });
    this.call = call;
    // A write that hit backpressure pauses the script; a drained socket lets it go on.
    res.onWritable(() => {
      call.resume();
      return true;
    });
  }
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: { port: { type: 'string', default: '0' }, host: { type: 'string', default: '127.0.0.1' } },
  });
  const port = Number(values.port);
  if (!Number.isInteger(port) || port < 0 || port > 65535) {
    process.stderr.write(`simulator: --port must be an integer from 0 to 65535, got ${values.port}\n`);
    process.exit(2);
  }
  let server: SimulatorServer | undefined;
  const stop = () => {
    server?.close();
    process.exit(0);
  };
  process.once('SIGTERM', stop);
  process.once('SIGINT', stop);
  const host = values.host;
  server = await startSimulatorServer({ host, port });
  const shown = host.includes(':') ? `[${host}]` : host;
  process.stdout.write(`simulator listening on http://${shown}:${server.port}\n`);
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  main().catch((err: unknown) => {
    process.stderr.write(`simulator: ${err instanceof Error ? err.message : String(err)}\n`);
    process.exit(1);
  });
}
