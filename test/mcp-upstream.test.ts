/**
 * One supervised MCP server on its own (plugins/mcp/upstream.ts), the fixture server over stdio:
 * a server stopped while it starts stays stopped, its process and session closed.
 */
import pino from 'pino';
import t from 'tap';
import { McpUpstream } from '../plugins/mcp/upstream.js';
import { faultyEntry } from './mcp-helpers.js';

const config = { transport: 'stdio' as const, command: process.execPath, args: [faultyEntry], env: {}, timeoutMs: 10_000 };

t.test('a server stopped while starting stays stopped', async (t) => {
  const server = new McpUpstream('faulty', config, pino({ level: 'silent' }), 4 * 1024 * 1024);
  const starting = server.start();
  await server.stop();
  await starting;
  t.equal(server.state, 'stopped', 'not ready after its stop');
  await t.rejects(server.openSession(), /is stopped/, 'no session to open');
});

