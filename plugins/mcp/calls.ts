/**
 * The policy on every tool call: the grant, the argument cap, the key's rpm and concurrency in a
 * scope of their own (`mcp:key:ID`, so tool calls use none of the key's model limits), the
 * server's timeout, the result cap; then one log line and one usage record per call (server,
 * tool, key, duration, outcome, bytes), and an audit entry for a call refused for want of a grant.
 */
import type { Logger } from 'pino';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { McpError, type CallToolResult, type Progress } from '@modelcontextprotocol/sdk/types.js';
import { NO_TOKENS, newId, type CachedStore, type Limiter, type LimitScope, type McpConfig } from '../../src/plugin-api.js';
import type { CatalogEntry } from './catalog.js';
import { ErrorCode, NOT_GRANTED, RATE_LIMITED, RpcError, SERVER_UNAVAILABLE, TOO_LARGE } from './errors.js';
import { grantsTool, type Principal } from './grants.js';
import type { McpUpstream } from './upstream.js';
import { StreamableHTTPError } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import type { Tool } from '@modelcontextprotocol/sdk/types.js';

/**
 * Each outcome as an HTTP status, for the request log (`/admin/requests`) where tool calls sit
 * beside model calls: a tool that ran and failed is still a 200, as MCP answers it.
 */
const outcomeStatus: Record<string, number> = {
  ok: 200,
  tool_error: 200,
  unknown_tool: 404,
  not_granted: 403,
  too_large: 413,
  rate_limited: 429,
  cancelled: 499,
  result_too_large: 502,
  error: 502,
  timeout: 504,
};

/**
 * Whether a failed call means its upstream session is gone: the server does not know it (a 404,
 * as the spec says, or a 400, as servers built on the SDK's examples answer an unknown session;
 * the gateway's own requests are well formed) or the connection closed. Anything else (a 429, 500
 * or 413 on one POST, a brief network error) fails that call alone; the session, shared by the
 * calls in flight beside it, is kept.
 */
export function sessionLost(err: unknown): boolean {
  if (err instanceof McpError) return err.code === ErrorCode.ConnectionClosed;
  return sessionUnknown(err);
}

/**
 * The server refused the request for its session alone, so it never ran: the spec's client then
 * starts a new session, and the request may be sent again on it.
 */
const sessionUnknown = (err: unknown) => err instanceof StreamableHTTPError && (err.code === 404 || err.code === 400);

/** The longest requested tool name logged and recorded as it came (MCP's own limit on a name is 128). */
const SHOWN_NAME_CHARS = 128;
const shownName = (name: string) => (name.length > SHOWN_NAME_CHARS ? `${name.slice(0, SHOWN_NAME_CHARS)}…` : name);

/** A tool call's timeout may be restarted by progress notifications up to this many times its length in all. */
export const PROGRESS_TOTAL_TIMEOUTS = 10;

type Recorder = (outcome: string, extra?: { resultBytes?: number; error?: string }) => void;

/** A denied call is audited at most once a minute per key and tool: a key cannot flood the audit log. */
const AUDIT_EVERY_MS = 60_000;
const AUDIT_MEMORY = 10_000;

export interface CallContext {
  principal: Principal;
  /** The client's cancellation of this one call. */
  signal: AbortSignal;
  /** Set when the client asked for progress: each upstream progress notification is passed on. */
  onProgress?: (progress: Progress) => void;
  /** The upstream session `client` failed beneath the protocol (closed, expired): the next call opens another. */
  unusable?: (client: Client) => void;
}

export class ToolCalls {
  private readonly audited = new Map<string, number>();
  /** Calls sent upstream and not yet answered (for /admin/mcp). */
  inFlight = 0;

  constructor(
    private readonly config: McpConfig,
    private readonly limiter: Limiter,
    private readonly store: CachedStore,
    private readonly log: Logger,
  ) {}

  /**
   * One call of `entry` (undefined: no such tool) with `args`, through `session` (the client
   * session's upstream session for the entry's server). Throws RpcError with what went wrong.
   */
  async call(
    requested: string,
    entry: CatalogEntry<Tool> | undefined,
    args: Record<string, unknown> | undefined,
    server: McpUpstream | undefined,
    session: (server: McpUpstream) => Promise<Client>,
    ctx: CallContext,
  ): Promise<CallToolResult> {
    const argumentBytes = args === undefined ? 0 : Buffer.byteLength(JSON.stringify(args));
    // A name no catalog holds can be as long as the body: it is cut before it is logged or recorded.
    const record = this.recorder({ method: 'tools/call', server: entry?.server, name: entry?.original ?? shownName(requested), requested: shownName(requested) }, ctx.principal, argumentBytes);
    const { group } = ctx.principal;
    if (!entry || !server) {
      record('unknown_tool');
      throw new RpcError(ErrorCode.InvalidParams, `Unknown tool: ${shownName(requested)}. Call tools/list for the tools this key may use.`);
    }
    if (!grantsTool(group.mcpTools, entry.server, entry.original)) {
      record('not_granted');
      this.audit(ctx.principal, `${entry.server}/${entry.original}`);
      throw new RpcError(
        NOT_GRANTED,
        `Tool ${requested} is not granted to this key's group "${group.name}". An admin can grant it with mcpTools: ["${entry.server}/${entry.original}"] (or "${entry.server}/*").`,
        { code: 'tool_not_granted' },
      );
    }
    if (argumentBytes > this.config.maxArgumentBytes) {
      record('too_large');
      throw new RpcError(TOO_LARGE, `The arguments of ${requested} are ${argumentBytes} bytes of JSON, more than the ${this.config.maxArgumentBytes} allowed (mcp.maxArgumentBytes).`, {
        code: 'request_too_large',
      });
    }
    const timeout = server.config.timeoutMs;
    const result = await this.run(requested, server, session, ctx, record, (client) =>
      client.callTool({ name: entry.original, ...(args !== undefined && { arguments: args }) }, undefined, {
        signal: ctx.signal,
        timeout,
        // Progress restarts the clock, up to a bound: a server cannot keep a call open for ever.
        maxTotalTimeout: timeout * PROGRESS_TOTAL_TIMEOUTS,
        ...(ctx.onProgress && { onprogress: ctx.onProgress, resetTimeoutOnProgress: true }),
      }) as Promise<CallToolResult>,
    );
    return result;
  }

  /**
   * A request other than tools/call that reaches a server (resources/read, prompts/get,
   * completion/complete), already granted by the caller: under the same policy as a tool call
   * (the key's rpm and concurrency, the server's timeout, the result cap, the log line and usage).
   */
  async request<R>(
    method: string,
    target: { server: string; name: string },
    server: McpUpstream,
    session: (server: McpUpstream) => Promise<Client>,
    ctx: CallContext,
    send: (client: Client, options: { signal: AbortSignal; timeout: number }) => Promise<R>,
  ): Promise<R> {
    const record = this.recorder({ method, ...target, requested: target.name }, ctx.principal, 0);
    return this.run(`${method} ${target.name}`, server, session, ctx, record, (client) => send(client, { signal: ctx.signal, timeout: server.config.timeoutMs }));
  }

  /** Admits, sends through the client session's upstream session, caps the result, records the outcome. */
  private async run<R>(
    what: string,
    server: McpUpstream,
    session: (server: McpUpstream) => Promise<Client>,
    ctx: CallContext,
    record: Recorder,
    send: (client: Client) => Promise<R>,
  ): Promise<R> {
    const lease = await this.admit(ctx.principal, what, record);
    let outcome = 'error';
    let resultBytes = 0;
    let errorText: string | undefined;
    this.inFlight++;
    try {
      if (server.state !== 'ready') throw new RpcError(SERVER_UNAVAILABLE, `MCP server "${server.name}" is ${server.state}${server.error ? ` (${server.error})` : ''}: try again shortly.`, { code: 'server_unavailable' });
      /** The session the last try went through. */
      let used: Client | undefined;
      const sendOnce = async () => {
        used = await session(server).catch((err: unknown) => {
          if (err instanceof RpcError) throw err;
          throw new RpcError(SERVER_UNAVAILABLE, server.scrub(`MCP server "${server.name}" cannot be reached: ${err instanceof Error ? err.message : String(err)}`), { code: 'server_unavailable' });
        });
        return send(used);
      };
      const result = await sendOnce()
        .catch((err: unknown) => {
          // A session the server no longer knows (it restarted, or expired it): the request never
          // ran there, so it goes once more, on a new session. A connection that closed mid-call
          // may have run it, and is not sent again.
          if (ctx.signal.aborted || !sessionUnknown(err) || !used) throw err;
          ctx.unusable?.(used);
          return sendOnce();
        })
        .catch((err: unknown) => {
          if (!ctx.signal.aborted && sessionLost(err) && used) ctx.unusable?.(used);
          throw this.upstreamError(err, server, what, ctx.signal);
        });
      resultBytes = Buffer.byteLength(JSON.stringify(result));
      if (resultBytes > this.config.maxResultBytes) {
        outcome = 'result_too_large';
        throw new RpcError(TOO_LARGE, `The result of ${what} is ${resultBytes} bytes of JSON, more than the ${this.config.maxResultBytes} allowed (mcp.maxResultBytes).`, {
          code: 'result_too_large',
        });
      }
      outcome = (result as { isError?: boolean }).isError ? 'tool_error' : 'ok';
      return result;
    } catch (err) {
      if (ctx.signal.aborted) outcome = 'cancelled';
      else if (err instanceof RpcError && err.code === ErrorCode.RequestTimeout) outcome = 'timeout';
      // The server's answer was over its cap (bounded-fetch.ts).
      else if (err instanceof RpcError && err.code === TOO_LARGE) outcome = 'result_too_large';
      errorText = err instanceof Error ? err.message : String(err);
      throw err;
    } finally {
      this.inFlight--;
      record(outcome, { resultBytes, ...(errorText && { error: errorText }) });
      if (lease !== undefined) {
        const settled = this.limiter.settle(lease, { tokens: 0, cost: 0 });
        if (settled instanceof Promise) settled.catch((err) => this.log.error({ err }, 'settling an mcp limiter lease failed'));
      }
    }
  }

  /** One log line and one usage record per request, whatever its outcome. */
  private recorder(target: { method: string; server: string | undefined; name: string; requested: string }, principal: Principal, argumentBytes: number): Recorder {
    const started = performance.now();
    const time = Date.now();
    const { key, group } = principal;
    return (outcome, extra = {}) => {
      const durationMs = Math.round((performance.now() - started) * 10) / 10;
      const reached = target.server !== undefined && outcome !== 'unknown_tool' && outcome !== 'not_granted' && outcome !== 'too_large' && outcome !== 'rate_limited';
      this.store.recordUsage({
        time,
        requestId: newId('mcp_', 12),
        keyId: key.id,
        group: group.name,
        model: target.server !== undefined ? `${target.server}/${target.name}` : target.requested,
        upstream: target.server ?? null,
        family: 'mcp',
        status: outcomeStatus[outcome] ?? 502,
        ...NO_TOKENS,
        channel: null,
        attempts: reached ? 1 : 0,
        estimated: false,
        latencyMs: durationMs,
        ttfbMs: null,
        streamed: false,
        outcome: outcome === 'cancelled' ? 'aborted' : outcome === 'ok' || outcome === 'tool_error' ? 'finished' : 'error',
        error: extra.error ? `${outcome}: ${extra.error}`.slice(0, 500) : outcome === 'ok' || outcome === 'tool_error' ? null : outcome,
        notes: `${target.method}: ${outcome}; arguments ${argumentBytes} bytes${extra.resultBytes ? `; result ${extra.resultBytes} bytes` : ''}`,
      });
      this.log.info(
        {
          mcp: {
            method: target.method,
            server: target.server,
            tool: target.name,
            key: key.id,
            group: group.name,
            durationMs,
            outcome,
            argumentBytes,
            ...extra,
          },
        },
        target.method === 'tools/call' ? 'mcp tool call' : 'mcp request',
      );
    };
  }

  /** The key's rpm and concurrency (its group's as defaults), in the tool-call scope. */
  private async admit(principal: Principal, tool: string, record: Recorder): Promise<unknown> {
    const { key, group } = principal;
    const { rpm, concurrency } = { ...group.limits, ...key.limits };
    if (rpm === undefined && concurrency === undefined) return undefined;
    const scope: LimitScope = { id: `mcp:key:${key.id}`, limits: { ...(rpm !== undefined && { rpm }), ...(concurrency !== undefined && { concurrency }) } };
    const decision = await this.limiter.acquire([scope], { tokens: 0, cost: 0 });
    if (decision.granted) return decision.lease;
    record('rate_limited');
    const retryAfterSeconds = Math.max(1, Math.ceil(decision.retryAfterMs / 1000));
    const what = decision.reason === 'concurrency' ? `${decision.limit} tool calls at once` : decision.reason === 'requests' ? `${decision.limit} tool calls per minute` : decision.reason;
    throw new RpcError(RATE_LIMITED, `Rate limit reached for tool calls of key ${key.id}: ${what}. Try again in ${retryAfterSeconds}s.`, {
      code: 'rate_limit_exceeded',
      tool,
      retryAfterSeconds,
    });
  }

  /** An upstream failure as the client should see it, naming the server. */
  private upstreamError(err: unknown, server: McpUpstream, tool: string, signal: AbortSignal): RpcError {
    const said = this.said(err, server, tool, signal);
    const message = server.scrub(said.message);
    return message === said.message ? said : new RpcError(said.code, message, said.data);
  }

  private said(err: unknown, server: McpUpstream, tool: string, signal: AbortSignal): RpcError {
    if (signal.aborted) return new RpcError(ErrorCode.RequestTimeout, `The call of ${tool} was cancelled.`, { code: 'cancelled' });
    if (err instanceof McpError) {
      if (err.code === ErrorCode.RequestTimeout) {
        return new RpcError(ErrorCode.RequestTimeout, `MCP server "${server.name}" did not answer ${tool} within ${server.config.timeoutMs / 1000}s (its timeoutSeconds).`, { code: 'timeout' });
      }
      if (err.code === ErrorCode.ConnectionClosed) {
        return new RpcError(ErrorCode.InternalError, `MCP server "${server.name}" went away during the call of ${tool}; it is being ${server.shared ? 'restarted' : 'reconnected'}.`, { code: 'server_gone' });
      }
      // The server's own JSON-RPC error, as it sent it.
      const message = err.message.replace(/^MCP error -?\d+: /, '');
      return new RpcError(err.code, message, err.data !== undefined && typeof err.data === 'object' && err.data !== null ? (err.data as Record<string, unknown>) : undefined);
    }
    if (err instanceof RpcError) return err;
    return new RpcError(ErrorCode.InternalError, `MCP server "${server.name}" failed the call of ${tool}: ${err instanceof Error ? err.message : String(err)}`, { code: 'server_error' });
  }

  private audit(principal: Principal, target: string): void {
    const mark = `${principal.key.id} ${target}`;
    const now = Date.now();
    const last = this.audited.get(mark);
    if (last !== undefined && now - last < AUDIT_EVERY_MS) return;
    if (this.audited.size >= AUDIT_MEMORY) this.audited.clear();
    this.audited.set(mark, now);
    this.store
      .recordAudit({ time: now, actor: `key:${principal.key.id}`, action: 'mcp.denied', target, detail: `tools/call refused: not granted to group ${principal.group.name}` })
      .catch((err: unknown) => this.log.error({ err }, 'writing an mcp audit entry failed'));
  }
}
