/**
 * One configured MCP server, supervised: connected (and for stdio, started) at boot, its tools,
 * resources and prompts listed, and reconnected (restarted) with exponential backoff whenever its
 * connection closes. A server whose listing fails is `failed`, never `ready` with nothing in it.
 *
 * Sessions: a stdio server is one process and so one MCP session, which every client session
 * shares. An HTTP server gets one upstream session per client session (`openSession`), opened on
 * first use, reused for every call of that client session and closed with it; the supervisor's own
 * session only lists and watches.
 */
import { createInterface } from 'node:readline';
import type { Logger } from 'pino';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import type { Transport } from '@modelcontextprotocol/sdk/shared/transport.js';
import {
  PromptListChangedNotificationSchema,
  ResourceListChangedNotificationSchema,
  ToolListChangedNotificationSchema,
  type Prompt,
  type Resource,
  type ResourceTemplate,
  type Tool,
} from '@modelcontextprotocol/sdk/types.js';
import { scrubText, secretsOf, type McpServerConfig } from '../../src/plugin-api.js';
import { boundedFetch } from './bounded-fetch.js';

export type ServerState = 'starting' | 'ready' | 'failed' | 'restarting' | 'stopped';

/** What the gateway tells upstream servers it is. */
export const CLIENT_INFO = { name: 'sluice', version: '1' };

/** The first restart waits this long; each failure in a row doubles it, up to the most. */
const BACKOFF_FIRST_MS = 500;
const BACKOFF_MOST_MS = 30_000;
/** A connection that stayed up this long resets the backoff. */
const STABLE_MS = 60_000;
/**
 * How long connecting and the first listing may take: a start can take far longer than a call
 * (`npx` fetching a package), so it gets at least this, or the server's call timeout if longer.
 */
const START_TIMEOUT_MS = 60_000;
/** Longest stderr line logged as it is. */
const STDERR_LINE_CHARS = 2000;
/**
 * How often the supervisor's session of an HTTP server is pinged. Nothing else would notice that
 * the server went away or restarted: the SDK's HTTP transport reports a close only when it closes
 * itself, and a restarted server does not know the old session, so its list went stale for good.
 */
export const HEALTH_CHECK_MS = 10_000;

export interface ServerListing {
  tools: Tool[];
  resources: Resource[];
  resourceTemplates: ResourceTemplate[];
  prompts: Prompt[];
}

const emptyListing = (): ServerListing => ({ tools: [], resources: [], resourceTemplates: [], prompts: [] });

export class McpUpstream {
  state: ServerState = 'starting';
  /** Why it is failed or restarting. */
  error: string | undefined;
  listing: ServerListing = emptyListing();
  restarts = 0;
  /** When it was last ready, for /admin/mcp. */
  readySince: number | undefined;
  private client: Client | undefined;
  private failures = 0;
  private timer: NodeJS.Timeout | undefined;
  private stopping = false;
  /** The connect in progress, if any: stop() waits for it, so no start outlives a stop. */
  private connecting: Promise<void> | undefined;
  /** The client of that connect, closed by stop() so the connect ends now, not at its timeout. */
  private opening: Client | undefined;
  /** Runs after every change of state or listing (the catalog is rebuilt). */
  onChange: () => void = () => {};
  /**
   * The configured header values (HTTP) or environment values (stdio) long enough to be
   * credentials: a server or a proxy before it may echo them in its errors, which are relayed to
   * clients, logged and recorded.
   */
  readonly secrets: string[];
  /** Pings the supervisor's session of an HTTP server (see watchHealth). */
  private health: NodeJS.Timeout | undefined;

  constructor(
    readonly name: string,
    readonly config: McpServerConfig,
    private readonly log: Logger,
    /** `mcp.maxResultBytes`: what an HTTP server's answers are bounded by (bounded-fetch.ts). */
    private readonly maxResultBytes: number,
  ) {
    this.secrets = secretsOf(Object.values((config.transport === 'http' ? config.headers : config.env) ?? {}));
  }

  /** `text` with this server's secrets redacted. */
  scrub(text: string): string {
    return scrubText(text, this.secrets);
  }

  get shared(): boolean {
    return this.config.transport === 'stdio';
  }

  /** Connects and lists; resolves when the first attempt has succeeded or failed (a failure schedules a retry). */
  async start(): Promise<void> {
    await this.connect();
  }

  /** The session a client session calls this server through (see the module comment). */
  async openSession(): Promise<Client> {
    if (this.state !== 'ready' || !this.client) throw new Error(`MCP server "${this.name}" is ${this.state}${this.error ? `: ${this.error}` : ''}`);
    if (this.shared) return this.client;
    const client = new Client(CLIENT_INFO, { capabilities: {} });
    await client.connect(this.transport(), { timeout: this.config.timeoutMs });
    return client;
  }

  /** Whether a session from openSession is the supervisor's own (not to be closed by a client session). */
  isShared(client: Client): boolean {
    return client === this.client && this.shared;
  }

  async stop(): Promise<void> {
    this.stopping = true;
    clearTimeout(this.timer);
    clearInterval(this.health);
    this.state = 'stopped';
    const client = this.client;
    this.client = undefined;
    await client?.close().catch(() => undefined);
    await this.opening?.close().catch(() => undefined);
    // A connect under way sees `stopping` after its next await and closes what it opened.
    await this.connecting;
  }

  private transport(): Transport {
    const c = this.config;
    if (c.transport === 'http') {
      return new StreamableHTTPClientTransport(new URL(c.url), { requestInit: { headers: c.headers }, fetch: boundedFetch({ server: this.name, maxResultBytes: this.maxResultBytes }) });
    }
    const transport = new StdioClientTransport({ command: c.command, args: c.args, env: c.env, ...(c.cwd && { cwd: c.cwd }), stderr: 'pipe' });
    // Each stderr line goes to the log under the server's name, as it comes.
    const stderr = transport.stderr;
    if (stderr) {
      createInterface({ input: stderr as unknown as NodeJS.ReadableStream, crlfDelay: Infinity }).on('line', (line) => {
        const shown = this.scrub(line.length > STDERR_LINE_CHARS ? `${line.slice(0, STDERR_LINE_CHARS)}…` : line);
        this.log.warn({ mcpServer: this.name, stderr: shown }, 'mcp server stderr');
      });
    }
    return transport;
  }

  private connect(): Promise<void> {
    if (this.stopping) return Promise.resolve();
    const attempt = this.attempt().finally(() => {
      if (this.connecting === attempt) {
        this.connecting = undefined;
        this.opening = undefined;
      }
    });
    this.connecting = attempt;
    return attempt;
  }

  private async attempt(): Promise<void> {
    const client = new Client(CLIENT_INFO, { capabilities: {} });
    this.opening = client;
    const connectedAt = Date.now();
    let up = false;
    client.onclose = () => {
      if (this.client !== client || this.stopping) return;
      this.client = undefined;
      clearInterval(this.health);
      if (Date.now() - connectedAt >= STABLE_MS) this.failures = 0;
      this.scheduleRestart(up ? 'the connection closed' : this.error ?? 'the connection closed');
    };
    try {
      const timeout = Math.max(START_TIMEOUT_MS, this.config.timeoutMs);
      await client.connect(this.transport(), { timeout });
      // Stopped while starting: what was opened is closed, and the server stays stopped.
      if (this.stopping) return void (await client.close().catch(() => undefined));
      this.client = client;
      this.watch(client);
      const listing = await this.list(client, timeout);
      if (this.stopping) {
        this.client = undefined;
        return void (await client.close().catch(() => undefined));
      }
      this.listing = listing;
      up = true;
      this.state = 'ready';
      this.error = undefined;
      this.readySince = Date.now();
      this.log.info({ mcpServer: this.name, tools: this.listing.tools.length }, 'mcp server ready');
      if (!this.shared) this.watchHealth(client);
      this.onChange();
    } catch (err) {
      // Listing failed or never connected: failed, not connected with nothing.
      const message = err instanceof Error ? err.message : String(err);
      this.client = undefined;
      await client.close().catch(() => undefined);
      if (this.stopping) return;
      this.scheduleRestart(`${this.state === 'starting' ? 'start' : 'restart'} failed: ${message}`, true);
    }
  }

  private scheduleRestart(unscrubbed: string, failed = false): void {
    if (this.stopping) return;
    const why = this.scrub(unscrubbed);
    const wait = Math.min(BACKOFF_MOST_MS, BACKOFF_FIRST_MS * 2 ** this.failures);
    this.failures++;
    this.state = failed ? 'failed' : 'restarting';
    this.error = why;
    this.listing = emptyListing();
    this.readySince = undefined;
    this.log.error({ mcpServer: this.name, err: why, retryInMs: wait }, 'mcp server down; reconnecting');
    this.onChange();
    clearTimeout(this.timer);
    this.timer = setTimeout(() => {
      this.restarts++;
      void this.connect();
    }, wait);
    this.timer.unref();
  }

  /**
   * Pings an HTTP server's supervisor session every HEALTH_CHECK_MS. A ping that fails (the
   * server is gone, or restarted and no longer knows the session) is taken as the connection's
   * close: the server is reconnected with backoff and listed again.
   */
  private watchHealth(client: Client): void {
    clearInterval(this.health);
    let pinging = false;
    this.health = setInterval(() => {
      if (pinging || this.client !== client) return;
      pinging = true;
      client.ping({ timeout: this.config.timeoutMs }).then(
        () => void (pinging = false),
        (err: unknown) => {
          pinging = false;
          if (this.client !== client || this.stopping) return;
          this.client = undefined;
          clearInterval(this.health);
          // As at a close: a connection that stayed up long enough starts the backoff afresh.
          if (this.readySince !== undefined && Date.now() - this.readySince >= STABLE_MS) this.failures = 0;
          void client.close().catch(() => undefined);
          this.scheduleRestart(`it did not answer a ping: ${err instanceof Error ? err.message : String(err)}`);
        },
      );
    }, HEALTH_CHECK_MS);
    this.health.unref();
  }

  /** A server that says its lists changed is listed again. */
  private watch(client: Client): void {
    const relist = () => {
      if (this.client !== client) return;
      this.list(client).then(
        (listing) => {
          this.listing = listing;
          this.onChange();
        },
        (err) => this.log.error({ mcpServer: this.name, err: this.scrub(String(err)) }, 'mcp server listing failed after a change'),
      );
    };
    client.setNotificationHandler(ToolListChangedNotificationSchema, relist);
    client.setNotificationHandler(ResourceListChangedNotificationSchema, relist);
    client.setNotificationHandler(PromptListChangedNotificationSchema, relist);
  }

  /** Every page of every list the server offers; tools are required, the rest only where offered. */
  private async list(client: Client, timeout = this.config.timeoutMs): Promise<ServerListing> {
    const options = { timeout };
    const caps = client.getServerCapabilities() ?? {};
    const listing = emptyListing();
    const pages = async <T>(fetchPage: (cursor: string | undefined) => Promise<{ items: T[]; nextCursor?: string | undefined }>): Promise<T[]> => {
      const all: T[] = [];
      let cursor: string | undefined;
      do {
        const page = await fetchPage(cursor);
        all.push(...page.items);
        cursor = page.nextCursor;
      } while (cursor);
      return all;
    };
    const params = (cursor: string | undefined) => (cursor ? { cursor } : {});
    listing.tools = await pages(async (c) => {
      const r = await client.listTools(params(c), options);
      return { items: r.tools, nextCursor: r.nextCursor };
    });
    if (caps.resources) {
      listing.resources = await pages(async (c) => {
        const r = await client.listResources(params(c), options);
        return { items: r.resources, nextCursor: r.nextCursor };
      });
      listing.resourceTemplates = await pages(async (c) => {
        const r = await client.listResourceTemplates(params(c), options);
        return { items: r.resourceTemplates, nextCursor: r.nextCursor };
      }).catch(() => []);
    }
    if (caps.prompts) {
      listing.prompts = await pages(async (c) => {
        const r = await client.listPrompts(params(c), options);
        return { items: r.prompts, nextCursor: r.nextCursor };
      });
    }
    return listing;
  }
}
