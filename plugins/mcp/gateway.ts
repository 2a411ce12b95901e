/**
 * Starts the configured MCP servers, waits for each one's first connection (or failure), builds
 * the catalog (refusing the start when two tool names collide or one is too long), and serves
 * `/mcp` and `/admin/mcp`. A server that changes later (restarted, relisted) rebuilds the
 * catalog; one whose names no longer fit is shown failed, and the others go on.
 */
import type { BootContext, GatewayView, McpConfig } from '../../src/plugin-api.js';
import { adminRoute } from './admin.js';
import { buildCatalog, type Catalog } from './catalog.js';
import { ToolCalls } from './calls.js';
import { McpEndpoint } from './endpoint.js';
import { McpUpstream } from './upstream.js';

export interface McpGateway {
  close(): Promise<void>;
}

export async function startMcpGateway(config: McpConfig, ctx: BootContext, gateway: GatewayView): Promise<McpGateway> {
  // Already bound to the plugin's name by the gateway.
  const log = ctx.log;
  const servers = new Map(Object.entries(config.servers).map(([name, c]) => [name, new McpUpstream(name, c, log, config.maxResultBytes)]));
  let catalog: Catalog = buildCatalog([]);
  let booted = false;
  const calls = new ToolCalls(config, ctx.limiter, ctx.store, log);
  const endpoint = new McpEndpoint({
    config,
    store: ctx.store,
    log,
    calls,
    catalog: () => catalog,
    server: (name) => servers.get(name),
    // Announced by every session whatever the servers' states now: a server that comes up later may offer them.
    offers: () => ({ resources: true, prompts: true }),
  });
  const rebuild = () => {
    catalog = buildCatalog([...servers.values()]);
    for (const [name, why] of catalog.conflicts) log.error({ mcpServer: name, err: why }, 'mcp server left out of the catalog');
    if (booted) endpoint.listsChanged();
  };
  for (const server of servers.values()) server.onChange = rebuild;

  await Promise.all([...servers.values()].map((s) => s.start()));
  rebuild();
  if (catalog.conflicts.size > 0) {
    await Promise.all([...servers.values()].map((s) => s.stop()));
    await endpoint.close();
    throw new Error(`mcp: ${[...catalog.conflicts.values()].join('; ')}`);
  }
  booted = true;
  const states = [...servers.values()].map((s) => `${s.name}: ${s.state}`);
  log.info({ servers: states, tools: catalog.tools.size }, 'mcp gateway serving /mcp');

  ctx.addRoute('/mcp', endpoint.handler());
  ctx.addRoute(
    '/admin/mcp',
    adminRoute({ servers: () => [...servers.values()], catalog: () => catalog, sessions: () => endpoint.sessions.size, callsInFlight: () => calls.inFlight }, ctx.store, gateway),
  );
  return {
    async close() {
      // Side by side: a stdio server's shared session needs nothing from the client sessions' ends.
      await Promise.all([endpoint.close(), ...[...servers.values()].map((s) => s.stop())]);
    },
  };
}
