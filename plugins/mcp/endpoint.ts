/**
 * `/mcp`: the streamable HTTP transport in front of every client session. Each request is
 * authenticated with a Sluice key before its body is read, matched to its session
 * (`Mcp-Session-Id`, which only the key that opened it may use), and handed to that session's
 * SDK transport as a Web `Request`; the `Response` goes back as it is, JSON or a stream of
 * server-sent events. POST carries JSON-RPC, GET opens the server's own event stream, DELETE ends
 * the session. Sessions unused for `mcp.sessionIdleSeconds` are closed.
 */
import type { Logger } from 'pino';
import type { CachedStore, JsonHandler, JsonReply, JsonRequest, McpConfig } from '../../src/plugin-api.js';
import type { Catalog } from './catalog.js';
import type { ToolCalls } from './calls.js';
import { jsonRpcError } from './errors.js';
import { authenticate, isRefusal } from './grants.js';
import { ClientSession } from './session.js';
import type { McpUpstream } from './upstream.js';

/** Sessions open at once; beyond it a new one is refused with a 503 until others end. */
const MAX_SESSIONS = 10_000;
/** Sessions one key may hold open: one key cannot take every session there is. */
const MAX_SESSIONS_PER_KEY = 100;
/** Slack for the JSON-RPC envelope around the largest arguments, so they are refused as JSON-RPC, not as HTTP. */
const ENVELOPE_BYTES = 64 * 1024;

export interface EndpointHost {
  config: McpConfig;
  store: CachedStore;
  log: Logger;
  calls: ToolCalls;
  catalog(): Catalog;
  server(name: string): McpUpstream | undefined;
  /** Whether any server offers resources, prompts: the capabilities a new session announces. */
  offers(): { resources: boolean; prompts: boolean };
}

export class McpEndpoint {
  readonly sessions = new Map<string, ClientSession>();
  private readonly sweeper: NodeJS.Timeout;
  readonly maxBodyBytes: number;

  constructor(private readonly host: EndpointHost) {
    this.maxBodyBytes = 2 * host.config.maxArgumentBytes + ENVELOPE_BYTES;
    const every = Math.max(50, Math.min(30_000, host.config.sessionIdleMs / 4));
    this.sweeper = setInterval(() => this.sweep(), every);
    this.sweeper.unref();
  }

  handler(): JsonHandler {
    const handler: JsonHandler = (req) => this.serve(req);
    handler.maxBodyBytes = this.maxBodyBytes;
    // A caller without a valid key is refused before any body byte is read.
    handler.beforeBody = async (req) => {
      if (req.path !== '/mcp') return notFound(req.path);
      const who = await authenticate(this.host.store, req.headers.authorization);
      return isRefusal(who) ? refused(who.status, who.message) : undefined;
    };
    return handler;
  }

  /** Ends every session (shutdown). */
  async close(): Promise<void> {
    clearInterval(this.sweeper);
    await Promise.all([...this.sessions.values()].map((s) => s.close()));
  }

  /** Every session learns that the lists changed (tools, and resources and prompts where offered). */
  listsChanged(): void {
    for (const session of this.sessions.values()) session.listsChanged();
  }

  private async serve(req: JsonRequest): Promise<JsonReply> {
    if (req.path !== '/mcp') return notFound(req.path);
    const who = await authenticate(this.host.store, req.headers.authorization);
    if (isRefusal(who)) return refused(who.status, who.message);
    if (req.method !== 'POST' && req.method !== 'GET' && req.method !== 'DELETE') {
      return { status: 405, headers: { allow: 'GET, POST, DELETE' }, body: jsonRpcError(-32000, `${req.method} is not allowed on /mcp: POST JSON-RPC, GET the event stream, DELETE the session.`) };
    }
    const sessionId = req.headers['mcp-session-id'];
    let session: ClientSession | undefined;
    if (sessionId !== undefined) {
      session = this.sessions.get(sessionId);
      // Another key's session is as unknown as an ended one: its existence is not revealed.
      if (!session || session.keyId !== who.keyId) {
        return { status: 404, body: jsonRpcError(-32001, 'Session not found: it ended or idled out. Initialize a new session.') };
      }
    } else {
      if (req.method !== 'POST') return { status: 400, body: jsonRpcError(-32000, 'Bad Request: no Mcp-Session-Id header. Initialize a session with a POST first.') };
      if (this.sessions.size >= MAX_SESSIONS) return { status: 503, headers: { 'retry-after': '5' }, body: jsonRpcError(-32000, 'Too many MCP sessions are open: try again shortly.') };
      if (this.sessionsOf(who.keyId) >= MAX_SESSIONS_PER_KEY) {
        return {
          status: 429,
          headers: { 'retry-after': '5' },
          body: jsonRpcError(-32029, `This key holds ${MAX_SESSIONS_PER_KEY} open MCP sessions: end some (DELETE /mcp with their Mcp-Session-Id) or let them idle out.`),
        };
      }
      session = new ClientSession(who.keyId, { ...this.host, maxBodyBytes: this.maxBodyBytes, ended: (s) => s.id && this.sessions.delete(s.id) }, this.host.offers());
      await session.open();
    }
    session.lastUsed = Date.now();
    const response = await session.transport.handleRequest(toWebRequest(req), { authInfo: { token: '', clientId: who.keyId, scopes: [], extra: { principal: who } } });
    // A new transport that did not initialize (not an initialize request) is not kept.
    if (sessionId === undefined) {
      if (session.id) this.sessions.set(session.id, session);
      else void session.close();
    }
    return toReply(response, req.signal);
  }

  private sessionsOf(keyId: string): number {
    let n = 0;
    for (const session of this.sessions.values()) if (session.keyId === keyId) n++;
    return n;
  }

  private sweep(): void {
    const now = Date.now();
    for (const session of this.sessions.values()) {
      if (session.busy === 0 && now - session.lastUsed >= this.host.config.sessionIdleMs) {
        this.host.log.info({ mcpSession: session.id, key: session.keyId }, 'mcp session idled out');
        void session.close();
      }
    }
  }
}

const notFound = (path: string): JsonReply => ({ status: 404, body: { error: { message: `no route for ${path}`, code: 'not_found' } } });

const refused = (status: number, message: string): JsonReply => ({
  status,
  headers: status === 401 ? { 'www-authenticate': 'Bearer realm="sluice"' } : {},
  body: jsonRpcError(-32001, message, { code: status === 401 ? 'invalid_api_key' : 'store_unavailable' }),
});

const OPENING_COMMENT = Buffer.from(':\n\n');

/** The uWS request as the Web `Request` the SDK's transport reads (the host does not matter to it). */
function toWebRequest(req: JsonRequest): Request {
  const headers = new Headers();
  for (const [name, value] of Object.entries(req.headers)) headers.set(name, value);
  const query = req.query.toString();
  return new Request(`http://sluice${req.path}${query ? `?${query}` : ''}`, {
    method: req.method,
    headers,
    ...(req.method === 'POST' && { body: req.body }),
    ...(req.signal && { signal: req.signal }),
  });
}

/** The transport's Web `Response` as a plain-route reply: a stream stays a stream, stopped if the client leaves. */
async function toReply(response: Response, signal: AbortSignal | undefined): Promise<JsonReply> {
  const headers: Record<string, string> = {};
  response.headers.forEach((value, name) => {
    if (name !== 'content-type' && name !== 'content-length' && name !== 'transfer-encoding') headers[name] = value;
  });
  const contentType = response.headers.get('content-type') ?? 'application/json';
  if (!response.body) return { status: response.status, headers, raw: { contentType, data: '' } };
  if (!contentType.startsWith('text/event-stream')) {
    return { status: response.status, headers, raw: { contentType, data: Buffer.from(await response.arrayBuffer()) } };
  }
  const reader = response.body.getReader();
  // A pending read ends at once when the client goes away (the transport then forgets the stream);
  // a client already gone by now (the listener would never run) has it cancelled here, or the
  // transport would keep the stream and refuse the session's next GET with 409.
  const stop = () => void reader.cancel().catch(() => undefined);
  if (signal?.aborted) stop();
  else signal?.addEventListener('abort', stop, { once: true });
  async function* chunks(): AsyncGenerator<Uint8Array> {
    // An SSE comment at once, so the status and headers leave now: a GET stream may have nothing
    // to say for a long while, and a client waits for the headers before it goes on.
    yield OPENING_COMMENT;
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) return;
        yield value;
      }
    } finally {
      await reader.cancel().catch(() => undefined);
    }
  }
  return { status: response.status, headers, stream: { contentType, chunks: chunks() } };
}
