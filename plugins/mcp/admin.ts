/**
 * `GET /admin/mcp` (the admin token or a console session): each server's state (starting, ready, failed with its error,
 * restarting), its tools as clients see them, and each group's grants with the tools they reach.
 * Read only: servers come from the config file alone, so there is nothing here to add one with.
 */
import type { CachedStore, GatewayView, JsonHandler, JsonReply } from '../../src/plugin-api.js';
import { exposedName, type Catalog } from './catalog.js';
import { grantsServer, grantsTool } from './grants.js';
import type { McpUpstream } from './upstream.js';

const failure = (status: number, code: string, message: string): JsonReply => ({ status, body: { error: { message, code } } });

export interface AdminView {
  servers(): McpUpstream[];
  catalog(): Catalog;
  sessions(): number;
  callsInFlight(): number;
}

/** The route, for the admin token or a console session (as every admin call). */
export function adminRoute(view: AdminView, store: CachedStore, gateway: GatewayView): JsonHandler {
  const handler: JsonHandler = async (req) => {
    if (req.path !== '/admin/mcp') return failure(404, 'not_found', `no route for ${req.method} ${req.path}`);
    // A GET has no body, so the server calls no beforeBody for it: the caller is checked here too.
    const refused = await gateway.authorizeAdmin(req);
    if (refused) return refused;
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      return failure(405, 'method_not_allowed', `${req.method} is not allowed on /admin/mcp: MCP servers are set in the config file's mcp section only, and read at start`);
    }
    return { status: 200, headers: { 'cache-control': 'no-store' }, body: await report(view, store) };
  };
  handler.beforeBody = (req) => gateway.authorizeAdmin(req);
  return handler;
}

async function report(view: AdminView, store: CachedStore) {
  const catalog = view.catalog();
  const servers = view.servers().map((s) => ({
    name: s.name,
    transport: s.config.transport,
    ...(s.config.transport === 'stdio' ? { command: s.config.command } : { url: s.config.url }),
    state: catalog.conflicts.has(s.name) ? 'failed' : s.state,
    error: catalog.conflicts.get(s.name) ?? s.error ?? null,
    restarts: s.restarts,
    readySince: s.readySince === undefined ? null : new Date(s.readySince).toISOString(),
    timeoutSeconds: s.config.timeoutMs / 1000,
    tools: s.listing.tools.map((t) => ({ name: exposedName(s.name, t.name), tool: t.name, ...(t.description && { description: t.description }) })),
    resources: s.listing.resources.length,
    prompts: s.listing.prompts.length,
  }));
  const groups = (await store.listGroups()).map((g) => ({
    name: g.name,
    mcpTools: g.mcpTools,
    tools: [...catalog.tools.values()].filter((e) => grantsTool(g.mcpTools, e.server, e.original)).map((e) => e.name),
    servers: view.servers().filter((s) => grantsServer(g.mcpTools, s.name)).map((s) => s.name),
  }));
  return { servers, groups, sessions: view.sessions(), callsInFlight: view.callsInFlight() };
}
