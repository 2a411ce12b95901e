/**
 * One client session of `/mcp`: the MCP server the client sees (the SDK's `Server` on the SDK's
 * Web-standard streamable HTTP transport), answering from the catalog what the caller's group is
 * granted and routing calls to the servers behind, through this session's upstream sessions.
 * Each request runs in its own handler with its own AbortSignal, so cancelling one call stops
 * that call alone.
 */
import { randomUUID } from 'node:crypto';
import type { Logger } from 'pino';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import { WebStandardStreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/webStandardStreamableHttp.js';
import {
  CallToolRequestSchema,
  CompleteRequestSchema,
  SetLevelRequestSchema,
  GetPromptRequestSchema,
  ListPromptsRequestSchema,
  ListResourcesRequestSchema,
  ListResourceTemplatesRequestSchema,
  ListToolsRequestSchema,
  ReadResourceRequestSchema,
  type Progress,
  type ServerNotification,
} from '@modelcontextprotocol/sdk/types.js';
import type { AuthInfo } from '@modelcontextprotocol/sdk/server/auth/types.js';
import type { Catalog } from './catalog.js';
import type { ToolCalls } from './calls.js';
import { ErrorCode, NOT_GRANTED, RpcError, SERVER_UNAVAILABLE } from './errors.js';
import { grantsServer, grantsTool, type Principal } from './grants.js';
import type { McpUpstream } from './upstream.js';

/**
 * How long an HTTP server is given to acknowledge the end of a session (its DELETE): one that
 * does not answer must not hold up a DELETE of ours, nor the gateway's shutdown.
 */
const TERMINATE_WAIT_MS = 5_000;

/** Waits for `work` (its failure ignored), but no longer than `ms`. */
async function withinTime(work: Promise<unknown>, ms: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  const timeUp = new Promise<void>((resolve) => {
    timer = setTimeout(resolve, ms);
    timer.unref();
  });
  await Promise.race([work.catch(() => undefined), timeUp]);
  clearTimeout(timer);
}

const sessionEnded = () => new RpcError(SERVER_UNAVAILABLE, 'This MCP session has ended: open a new one.', { code: 'session_ended' });

/** What a session needs of the gateway around it. */
export interface SessionHost {
  catalog(): Catalog;
  server(name: string): McpUpstream | undefined;
  calls: ToolCalls;
  log: Logger;
  /** Largest request body the transport reads itself. */
  maxBodyBytes: number;
  /** Called once when the session ends (DELETE, idle, shutdown). */
  ended(session: ClientSession): void;
}

/** The caller of the request being handled, as the endpoint authenticated it. */
const principalOf = (authInfo: AuthInfo | undefined): Principal => {
  const principal = authInfo?.extra?.principal as Principal | undefined;
  if (!principal) throw new RpcError(ErrorCode.InternalError, 'The request carries no authenticated caller.');
  return principal;
};

export class ClientSession {
  readonly transport: WebStandardStreamableHTTPServerTransport;
  readonly server: Server;
  lastUsed = Date.now();
  /** Requests being handled now: a session busy with a call is not idle. */
  busy = 0;
  private readonly upstream = new Map<string, Promise<Client>>();
  /** The client each upstream session promise gave, once it did: which session a failed call used. */
  private readonly opened = new WeakMap<Promise<Client>, Client>();
  private closed = false;

  constructor(
    /** The key that opened it: only that key may use it. */
    readonly keyId: string,
    private readonly host: SessionHost,
    private readonly offers: { resources: boolean; prompts: boolean },
  ) {
    const capabilities = offers;
    this.transport = new WebStandardStreamableHTTPServerTransport({
      sessionIdGenerator: () => randomUUID(),
      maxRequestBodySize: host.maxBodyBytes,
      onsessionclosed: () => void this.close(),
    });
    this.server = new Server(
      { name: 'sluice', version: '1' },
      {
        capabilities: {
          tools: { listChanged: true },
          // Accepted so clients that set a level work; the servers' own log messages stay in their logs.
          logging: {},
          completions: {},
          ...(capabilities.resources && { resources: { listChanged: true } }),
          ...(capabilities.prompts && { prompts: { listChanged: true } }),
        },
        instructions: 'Tools of the MCP servers behind this Sluice gateway, named server_tool.',
      },
    );
    this.handle(capabilities);
  }

  get id(): string | undefined {
    return this.transport.sessionId;
  }

  async open(): Promise<void> {
    await this.server.connect(this.transport);
  }

  /** Ends the session and its upstream sessions (a stdio server's shared one stays). */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.host.ended(this);
    const sessions = [...this.upstream.entries()];
    this.upstream.clear();
    await Promise.all(
      sessions.map(async ([name, pending]) => {
        const client = await pending.catch(() => undefined);
        if (!client || this.host.server(name)?.isShared(client)) return;
        await this.endUpstream(client);
      }),
    );
    await this.server.close().catch(() => undefined);
  }

  /** Ends one upstream session of this client session's own. */
  private async endUpstream(client: Client): Promise<void> {
    // An HTTP server is told the session is over (DELETE), not left to expire it.
    if (client.transport instanceof StreamableHTTPClientTransport) await withinTime(client.transport.terminateSession(), TERMINATE_WAIT_MS);
    await client.close().catch(() => undefined);
  }

  /**
   * Drops this session's upstream session with a server (an HTTP one is closed); the next use
   * opens another. With `failed`, only if that is still the one in use: calls failing side by side
   * must not close the session another of them has just opened.
   */
  private async forget(name: string, failed?: Client): Promise<void> {
    const pending = this.upstream.get(name);
    if (!pending) return;
    // At once (the caller may open the next session right after), and only the one that failed.
    if (failed && this.opened.get(pending) !== failed) return;
    this.upstream.delete(name);
    const client = await pending.catch(() => undefined);
    if (client && !this.host.server(name)?.isShared(client)) await client.close().catch(() => undefined);
  }

  /** This session's upstream session with `server`, opened on first use and then reused. */
  private session = (server: McpUpstream): Promise<Client> => {
    // A call that waited (on the limiter) while the session was ended opens nothing.
    if (this.closed) return Promise.reject(sessionEnded());
    let pending = this.upstream.get(server.name);
    if (!pending) {
      const opening = server.openSession();
      pending = opening.then(async (client) => {
        if (!this.closed || server.isShared(client)) return client;
        // The session ended while this one opened: close() did not see it, so it is closed here.
        await this.endUpstream(client);
        throw sessionEnded();
      });
      const mine = pending;
      this.upstream.set(server.name, mine);
      mine.then(
        (client) => {
          this.opened.set(mine, client);
          // An HTTP session that closes (the server restarted, or expired it) is opened again next time.
          if (!server.isShared(client)) client.onclose = () => this.upstream.get(server.name) === mine && this.upstream.delete(server.name);
        },
        () => this.upstream.get(server.name) === mine && this.upstream.delete(server.name),
      );
    }
    return pending.then((client) => {
      // A stdio server's shared session is replaced when the server restarts.
      if (server.isShared(client) || !server.shared) return client;
      this.upstream.delete(server.name);
      return this.session(server);
    });
  };

  private handle(capabilities: { resources: boolean; prompts: boolean }): void {
    const { server, host } = this;
    const track = <A extends unknown[], R>(fn: (...args: A) => Promise<R>) => async (...args: A): Promise<R> => {
      this.busy++;
      this.lastUsed = Date.now();
      try {
        return await fn(...args);
      } finally {
        this.busy--;
        this.lastUsed = Date.now();
      }
    };

    server.setRequestHandler(
      ListToolsRequestSchema,
      track(async (_req, extra) => {
        const { group } = principalOf(extra.authInfo);
        const tools = [...host.catalog().tools.values()].filter((e) => grantsTool(group.mcpTools, e.server, e.original)).map((e) => ({ ...e.item, name: e.name }));
        return { tools };
      }),
    );

    server.setRequestHandler(
      CallToolRequestSchema,
      track(async (req, extra) => {
        const principal = principalOf(extra.authInfo);
        const entry = host.catalog().tools.get(req.params.name);
        const progressToken = req.params._meta?.progressToken;
        // Progress passed on before the result, which would otherwise overtake the last of it.
        const sent: Promise<void>[] = [];
        const onProgress =
          progressToken === undefined
            ? undefined
            : (p: Progress) =>
                void sent.push(extra.sendNotification({ method: 'notifications/progress', params: { ...p, progressToken } } as ServerNotification).catch(() => undefined));
        const result = await host.calls.call(req.params.name, entry, req.params.arguments, entry && host.server(entry.server), this.session, {
          principal,
          signal: extra.signal,
          ...(onProgress && { onProgress }),
          unusable: (client) => entry && void this.forget(entry.server, client),
        });
        await Promise.all(sent);
        return result;
      }),
    );

    server.setRequestHandler(SetLevelRequestSchema, async () => ({}));

    // Argument completion for a prompt or a resource template, from the server that offers it.
    server.setRequestHandler(
      CompleteRequestSchema,
      track(async (req, extra) => {
        const { group } = principalOf(extra.authInfo);
        const catalog = host.catalog();
        const { ref } = req.params;
        const prompt = ref.type === 'ref/prompt' ? catalog.prompts.get(ref.name) : undefined;
        const owner = prompt?.server ?? (ref.type === 'ref/resource' ? catalog.templates.find((t) => t.item.uriTemplate === ref.uri)?.server : undefined);
        if (!owner) throw new RpcError(ErrorCode.InvalidParams, `Nothing to complete for ${ref.type === 'ref/prompt' ? `prompt ${ref.name}` : `resource ${ref.uri}`}.`);
        if (!grantsServer(group.mcpTools, owner)) throw new RpcError(NOT_GRANTED, `MCP server "${owner}" is not granted to group "${group.name}" as a whole (grant "${owner}/*").`, { code: 'tool_not_granted' });
        const params = prompt ? { ...req.params, ref: { type: 'ref/prompt' as const, name: prompt.original } } : req.params;
        const name = prompt ? prompt.original : ref.type === 'ref/resource' ? ref.uri : '';
        return this.upstreamRequest('completion/complete', owner, name, extra, (client, options) => client.complete(params, options));
      }),
    );

    if (capabilities.resources) {
      server.setRequestHandler(
        ListResourcesRequestSchema,
        track(async (_req, extra) => {
          const { group } = principalOf(extra.authInfo);
          return { resources: [...host.catalog().resources.values()].filter((r) => grantsServer(group.mcpTools, r.server)).map((r) => r.item) };
        }),
      );
      server.setRequestHandler(
        ListResourceTemplatesRequestSchema,
        track(async (_req, extra) => {
          const { group } = principalOf(extra.authInfo);
          return { resourceTemplates: host.catalog().templates.filter((t) => grantsServer(group.mcpTools, t.server)).map((t) => t.item) };
        }),
      );
      server.setRequestHandler(
        ReadResourceRequestSchema,
        track(async (req, extra) => {
          const { group } = principalOf(extra.authInfo);
          const catalog = host.catalog();
          const owner = catalog.resources.get(req.params.uri)?.server ?? templateOwner(catalog, req.params.uri);
          if (!owner) throw new RpcError(-32002, `Resource not found: ${req.params.uri}. Call resources/list for the resources this key may read.`);
          if (!grantsServer(group.mcpTools, owner)) throw new RpcError(NOT_GRANTED, `The resources of MCP server "${owner}" are not granted to group "${group.name}" (grant "${owner}/*").`, { code: 'tool_not_granted' });
          return this.upstreamRequest('resources/read', owner, req.params.uri, extra, (client, options) => client.readResource({ uri: req.params.uri }, options));
        }),
      );
    }

    if (capabilities.prompts) {
      server.setRequestHandler(
        ListPromptsRequestSchema,
        track(async (_req, extra) => {
          const { group } = principalOf(extra.authInfo);
          return { prompts: [...host.catalog().prompts.values()].filter((p) => grantsServer(group.mcpTools, p.server)).map((p) => ({ ...p.item, name: p.name })) };
        }),
      );
      server.setRequestHandler(
        GetPromptRequestSchema,
        track(async (req, extra) => {
          const { group } = principalOf(extra.authInfo);
          const entry = host.catalog().prompts.get(req.params.name);
          if (!entry) throw new RpcError(ErrorCode.InvalidParams, `Unknown prompt: ${req.params.name}. Call prompts/list for the prompts this key may use.`);
          if (!grantsServer(group.mcpTools, entry.server)) throw new RpcError(NOT_GRANTED, `The prompts of MCP server "${entry.server}" are not granted to group "${group.name}" (grant "${entry.server}/*").`, { code: 'tool_not_granted' });
          return this.upstreamRequest('prompts/get', entry.server, entry.original, extra, (client, options) =>
            client.getPrompt({ name: entry.original, ...(req.params.arguments && { arguments: req.params.arguments }) }, options),
          );
        }),
      );
    }
  }

  /** A granted request to server `name` under the tool calls' policy (limits, timeout, result cap, usage). */
  private upstreamRequest<R>(
    method: string,
    name: string,
    target: string,
    extra: { authInfo?: AuthInfo | undefined; signal: AbortSignal },
    send: (client: Client, options: { signal: AbortSignal; timeout: number }) => Promise<R>,
  ): Promise<R> {
    if (this.closed) throw sessionEnded();
    const server = this.host.server(name);
    if (!server) throw new RpcError(SERVER_UNAVAILABLE, `MCP server "${name}" is unknown: try again shortly.`);
    return this.host.calls.request(method, { server: name, name: target }, server, this.session, {
      principal: principalOf(extra.authInfo),
      signal: extra.signal,
      unusable: (client) => void this.forget(name, client),
    }, send);
  }

  /** Tells the client its lists changed (a server restarted or said so). */
  listsChanged(): void {
    if (this.closed) return;
    // Each list this session announced as changing: a restarted server may change any of them.
    void this.server.sendToolListChanged().catch(() => undefined);
    if (this.offers.resources) void this.server.sendResourceListChanged().catch(() => undefined);
    if (this.offers.prompts) void this.server.sendPromptListChanged().catch(() => undefined);
  }
}

/** The server whose resource template the URI fits (its literal start before the first `{`), if any. */
function templateOwner(catalog: Catalog, uri: string): string | undefined {
  for (const { server, item } of catalog.templates) {
    const literal = item.uriTemplate.split('{')[0]!;
    if (literal && uri.startsWith(literal)) return server;
  }
  return undefined;
}
