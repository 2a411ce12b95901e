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
  private closed = false;

  constructor(
    /** The key that opened it: only that key may use it. */
    readonly keyId: string,
    private readonly host: SessionHost,
    capabilities: { resources: boolean; prompts: boolean },
  ) {
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
        // An HTTP server is told the session is over (DELETE), not left to expire it.
        if (client.transport instanceof StreamableHTTPClientTransport) await client.transport.terminateSession().catch(() => undefined);
        await client.close().catch(() => undefined);
      }),
    );
    await this.server.close().catch(() => undefined);
  }

  /** Drops this session's upstream session with a server (an HTTP one is closed); the next use opens another. */
  private async forget(name: string): Promise<void> {
    const pending = this.upstream.get(name);
    if (!pending) return;
    this.upstream.delete(name);
    const client = await pending.catch(() => undefined);
    if (client && !this.host.server(name)?.isShared(client)) await client.close().catch(() => undefined);
  }

  /** This session's upstream session with `server`, opened on first use and then reused. */
  private session = (server: McpUpstream): Promise<Client> => {
    let pending = this.upstream.get(server.name);
    if (!pending) {
      pending = server.openSession();
      this.upstream.set(server.name, pending);
      pending.then(
        (client) => {
          // An HTTP session that closes (the server restarted, or expired it) is opened again next time.
          if (!server.isShared(client)) client.onclose = () => this.upstream.get(server.name) === pending && this.upstream.delete(server.name);
        },
        () => this.upstream.get(server.name) === pending && this.upstream.delete(server.name),
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
          unusable: () => entry && void this.forget(entry.server),
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
        if (!grantsServer(group.mcpTools, owner)) throw new RpcError(NOT_GRANTED, `MCP server "${owner}" is not granted to group "${group.name}" as a whole (grant "${owner}/*").`);
        const upstream = await this.ready(owner);
        const params = prompt ? { ...req.params, ref: { type: 'ref/prompt' as const, name: prompt.original } } : req.params;
        return upstream.complete(params, { signal: extra.signal, timeout: host.server(owner)!.config.timeoutMs });
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
          if (!grantsServer(group.mcpTools, owner)) throw new RpcError(NOT_GRANTED, `The resources of MCP server "${owner}" are not granted to group "${group.name}" (grant "${owner}/*").`);
          const upstream = await this.ready(owner);
          return upstream.readResource({ uri: req.params.uri }, { signal: extra.signal, timeout: host.server(owner)!.config.timeoutMs });
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
          if (!grantsServer(group.mcpTools, entry.server)) throw new RpcError(NOT_GRANTED, `The prompts of MCP server "${entry.server}" are not granted to group "${group.name}" (grant "${entry.server}/*").`);
          const upstream = await this.ready(entry.server);
          return upstream.getPrompt(
            { name: entry.original, ...(req.params.arguments && { arguments: req.params.arguments }) },
            { signal: extra.signal, timeout: host.server(entry.server)!.config.timeoutMs },
          );
        }),
      );
    }
  }

  private async ready(name: string): Promise<Client> {
    const server = this.host.server(name);
    if (!server || server.state !== 'ready') throw new RpcError(SERVER_UNAVAILABLE, `MCP server "${name}" is ${server?.state ?? 'unknown'}: try again shortly.`);
    return this.session(server);
  }

  /** Tells the client its lists changed (a server restarted or said so). */
  listsChanged(): void {
    if (this.closed) return;
    void this.server.sendToolListChanged().catch(() => undefined);
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
