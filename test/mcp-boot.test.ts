/**
 * The MCP gateway's start: tool names that collide or pass 64 characters refuse the start with
 * both names; a server whose tool listing fails is shown failed (never ready with no tools) and
 * retried while the rest serve; the config's mcp section is checked.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { loadConfig } from '../src/config/load.js';
import { eventually, startTestGateway } from './helpers.js';
import { everythingEntry, faultyEntry, mcpClient, nodeServer } from './mcp-helpers.js';

const base = (dataDir: string) => `dataDir: ${dataDir}\nupstreams:\n  sim: { kind: simulator }\nmodels:\n  - { id: m, upstream: sim }\n`;
const startError = (yaml: string) =>
  startTestGateway((dataDir) => base(dataDir) + yaml).then(
    async (gw) => {
      await gw.stop();
      return undefined;
    },
    (err: Error) => err,
  );

t.test('two tools that would share a name refuse the start, naming both', async (t) => {
  const err = await startError(`mcp:
  servers:
    f: ${nodeServer(faultyEntry, [], 'env: { EXTRA_TOOL: x_pid }')}
    f_x: ${nodeServer(faultyEntry)}
`);
  t.ok(err, 'the start failed');
  t.match(err?.message, /tool "pid" of MCP server "f_x" and tool "x_pid" of MCP server "f" would both be named "f_x_pid"/);
});

t.test('a tool name longer than 64 characters with its prefix refuses the start', async (t) => {
  const err = await startError(`mcp:
  servers:
    faulty: ${nodeServer(faultyEntry, [], `env: { EXTRA_TOOL: ${'t'.repeat(60)} }`)}
`);
  t.match(err?.message, /would be named "faulty_t+" \(67 characters\), longer than the 64 model providers allow/);
});

t.test('a server whose listing fails is failed, not ready with no tools; the others serve', async (t) => {
  const gw = await startTestGateway(
    (dataDir) =>
      base(dataDir) +
      `mcp:
  servers:
    broken: ${nodeServer(faultyEntry, [], 'env: { FAIL_LISTING: "1" }')}
    everything: ${nodeServer(everythingEntry, ['stdio'])}
`,
  );
  t.teardown(() => gw.stop());
  const broken = (await gw.admin('GET', '/admin/mcp')).body.servers.find((s: { name: string }) => s.name === 'broken');
  t.match(broken, { state: 'failed', error: /listing is broken on purpose/, tools: [] });
  await eventually(async () => (await gw.admin('GET', '/admin/mcp')).body.servers.find((s: { name: string }) => s.name === 'broken').restarts >= 1, 'a retry');
  await gw.admin('PATCH', '/admin/groups/default', { mcpTools: ['broken/*', 'everything/echo'] });
  const client = await mcpClient(gw.url, gw.key);
  t.teardown(() => client.close());
  t.same((await client.listTools()).tools.map((x) => x.name), ['everything_echo'], 'the failed server offers nothing');
});

t.test('the mcp section is checked', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sluice-mcp-config-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const load = (yaml: string, env: Record<string, string> = {}) => {
    const path = join(dir, 'sluice.yaml');
    writeFileSync(path, `upstreams:\n  sim: { kind: simulator }\nmodels:\n  - { id: m, upstream: sim }\n${yaml}`);
    return loadConfig({ path, env });
  };
  const ok = load('mcp:\n  servers:\n    a: { transport: stdio, command: node }\n    b: { transport: http, url: "http://127.0.0.1:1/mcp", timeoutSeconds: 5 }\n');
  t.match(ok.mcp, {
    servers: { a: { transport: 'stdio', command: 'node', args: [], env: {}, timeoutMs: 60_000 }, b: { transport: 'http', url: 'http://127.0.0.1:1/mcp', headers: {}, timeoutMs: 5000 } },
    maxArgumentBytes: 1024 * 1024,
    maxResultBytes: 4 * 1024 * 1024,
    sessionIdleMs: 600_000,
  });
  t.equal(ok.server.workers, 1, 'one thread serves by default with mcp');
  t.throws(() => load('mcp:\n  servers:\n    a: { transport: stdio }\n'), /command/);
  t.throws(() => load('mcp:\n  servers:\n    "a/b": { transport: stdio, command: node }\n'), /mcp/);
  t.throws(() => load('mcp:\n  servers:\n    a: { transport: smoke-signals }\n'), /transport/);
  t.throws(() => load('server: { workers: 2 }\nmcp:\n  servers:\n    a: { transport: stdio, command: node }\n'), /mcp needs server\.workers: 1/);
  t.throws(() => load('plugins: [auth, codecs/chat, upstreams/simulator]\nmcp:\n  servers:\n    a: { transport: stdio, command: node }\n'), /the mcp plugin is not in plugins: add mcp/);
});
