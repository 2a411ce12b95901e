/**
 * The MCP gateway: one authenticated `/mcp` endpoint in front of the MCP servers of the config
 * file's `mcp` section (docs/mcp.md). Without that section it serves nothing and loads nothing of
 * the MCP SDK; loaded to serve nothing (the CLI), it starts no server.
 */
import { definePlugin } from '../../src/plugin-api.js';

export default definePlugin(async (ctx) => {
  if (!ctx.config.mcp || !ctx.gateway) return { name: 'mcp' };
  const { startMcpGateway } = await import('./gateway.js');
  const gateway = await startMcpGateway(ctx.config.mcp, ctx, ctx.gateway);
  return { name: 'mcp', close: () => gateway.close() };
});
