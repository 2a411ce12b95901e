/**
 * The tools and prompts clients see: each server's, named `server_name` so two servers' tools
 * cannot be confused, sorted by that name (a stable order keeps a provider's prompt cache valid
 * from one listing to the next), and refused when a name would pass the 64 characters that model
 * providers allow for a tool or when two names would be the same.
 */
import type { Prompt, Resource, ResourceTemplate, Tool } from '@modelcontextprotocol/sdk/types.js';
import type { McpUpstream } from './upstream.js';

/** The longest tool name OpenAI, Anthropic and Bedrock accept. */
export const MAX_TOOL_NAME_CHARS = 64;

export interface CatalogEntry<T> {
  /** The name clients see. */
  name: string;
  server: string;
  /** The name the server knows it by. */
  original: string;
  item: T;
}

export interface Catalog {
  tools: Map<string, CatalogEntry<Tool>>;
  prompts: Map<string, CatalogEntry<Prompt>>;
  /** Resources by URI, and templates, each with the server that offers it. */
  resources: Map<string, { server: string; item: Resource }>;
  templates: { server: string; item: ResourceTemplate }[];
  /** Servers whose names could not be placed, with why (refused at boot, `failed` later). */
  conflicts: Map<string, string>;
}

export const exposedName = (server: string, name: string) => `${server}_${name}`;

/** The catalog of the servers that are ready, in server-name order. */
export function buildCatalog(servers: McpUpstream[]): Catalog {
  const catalog: Catalog = { tools: new Map(), prompts: new Map(), resources: new Map(), templates: [], conflicts: new Map() };
  const ordered = [...servers].filter((s) => s.state === 'ready').sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  for (const server of ordered) {
    const problem = placeNames(server, catalog);
    if (problem) {
      catalog.conflicts.set(server.name, problem);
      continue;
    }
    for (const tool of server.listing.tools) catalog.tools.set(exposedName(server.name, tool.name), { name: exposedName(server.name, tool.name), server: server.name, original: tool.name, item: tool });
    for (const prompt of server.listing.prompts) {
      catalog.prompts.set(exposedName(server.name, prompt.name), { name: exposedName(server.name, prompt.name), server: server.name, original: prompt.name, item: prompt });
    }
    for (const resource of server.listing.resources) if (!catalog.resources.has(resource.uri)) catalog.resources.set(resource.uri, { server: server.name, item: resource });
    for (const template of server.listing.resourceTemplates) catalog.templates.push({ server: server.name, item: template });
  }
  catalog.tools = sortedByKey(catalog.tools);
  catalog.prompts = sortedByKey(catalog.prompts);
  return catalog;
}

/** Why a server's tools cannot join the catalog as it stands, naming both sides; undefined when they can. */
function placeNames(server: McpUpstream, catalog: Catalog): string | undefined {
  const seen = new Map<string, string>();
  for (const tool of server.listing.tools) {
    const name = exposedName(server.name, tool.name);
    if (name.length > MAX_TOOL_NAME_CHARS) {
      return `tool "${tool.name}" of MCP server "${server.name}" would be named "${name}" (${name.length} characters), longer than the ${MAX_TOOL_NAME_CHARS} model providers allow: give the server a shorter name in mcp.servers`;
    }
    const taken = catalog.tools.get(name);
    if (taken) {
      return `tool "${tool.name}" of MCP server "${server.name}" and tool "${taken.original}" of MCP server "${taken.server}" would both be named "${name}": rename one of the servers in mcp.servers`;
    }
    const twice = seen.get(name);
    if (twice !== undefined) return `MCP server "${server.name}" lists tool "${tool.name}" twice`;
    seen.set(name, tool.name);
  }
  return undefined;
}

function sortedByKey<T>(map: Map<string, T>): Map<string, T> {
  return new Map([...map.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
}
