/**
 * An MCP server over streamable HTTP behind the gateway: server-everything's own HTTP launcher
 * (kept on 127.0.0.1 by a preload). One upstream session per client session, reused by every
 * call of it and ended (DELETE) when the client's session ends or idles out.
 */
import { spawn } from 'node:child_process';
import t from 'tap';
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { READY_BOUND_MS, childEnv, eventually, startTestGateway, watchProcess } from './helpers.js';
import { everythingEntry, loopbackPreload, mcpClient } from './mcp-helpers.js';

// Two server starts and a reconnection with backoff: more than tap's 60 s on two busy cores. This bounds only a hang.
t.setTimeout(240_000);

const startUpstream = (port = 0) =>
  watchProcess(spawn(process.execPath, ['--import', loopbackPreload, everythingEntry, 'streamableHttp'], { env: childEnv({ LOOPBACK_PORT: String(port) }), stdio: ['ignore', 'pipe', 'pipe'] }));
let upstream = startUpstream();
t.teardown(() => void upstream.child.kill());
const port = Number((await upstream.waitFor(/LISTENING (\d+)/, 'server-everything listening'))[1]);

const gw = await startTestGateway(
  (dataDir) => `dataDir: ${dataDir}
upstreams:
  sim: { kind: simulator }
models:
  - { id: m, upstream: sim }
mcp:
  sessionIdleSeconds: 5
  servers:
    remote: { transport: http, url: "http://127.0.0.1:${port}/mcp", timeoutSeconds: 30 }
`,
);
t.teardown(() => gw.stop());
await gw.admin('PATCH', '/admin/groups/default', { mcpTools: ['remote/*'] });

/** The upstream session ids the server saw, in order, and those it saw a DELETE for. */
const upstreamSessions = () => {
  const lines = [...upstream.stdout().matchAll(/^REQUEST (\w+) (\S+)$/gm)];
  return { used: [...new Set(lines.map((m) => m[2]!).filter((id) => id !== '-'))], deleted: lines.filter((m) => m[1] === 'DELETE').map((m) => m[2]!) };
};
const text = (result: unknown) => ((result as CallToolResult).content[0] as { text: string }).text;

t.test('tools of an HTTP server, called through one upstream session per client session', async (t) => {
  const report = await gw.admin('GET', '/admin/mcp');
  t.match(report.body.servers, [{ name: 'remote', transport: 'http', state: 'ready' }]);
  const before = upstreamSessions().used.length;
  const client = await mcpClient(gw.url, gw.key);
  const names = (await client.listTools()).tools.map((x) => x.name);
  t.ok(names.includes('remote_echo'));
  t.same(names, [...names].sort(), 'sorted');
  for (const word of ['one', 'two', 'three']) t.equal(text(await client.callTool({ name: 'remote_echo', arguments: { message: word } })), `Echo: ${word}`);
  const during = upstreamSessions().used;
  t.equal(during.length, before + 1, 'three calls, one new upstream session');
  const mine = during.at(-1)!;

  const second = await mcpClient(gw.url, gw.key);
  await second.callTool({ name: 'remote_echo', arguments: { message: 'other' } });
  t.equal(upstreamSessions().used.length, before + 2, 'another client session, another upstream session');

  await (client.transport as unknown as { terminateSession(): Promise<void> }).terminateSession();
  await client.close();
  await eventually(() => upstreamSessions().deleted.includes(mine), "the client's end ends its upstream session");
  const theirs = upstreamSessions().used.at(-1)!;
  await eventually(() => upstreamSessions().deleted.includes(theirs), 'an idle session ends its upstream session too');
  await second.close();
});

t.test('a restarted HTTP server: the client session goes on with a new upstream session', async (t) => {
  // A gateway of its own, without the short idle time above: this session waits through a restart.
  const steady = await startTestGateway(
    (dataDir) => `dataDir: ${dataDir}\nmcp:\n  servers:\n    remote: { transport: http, url: "http://127.0.0.1:${port}/mcp", timeoutSeconds: 30 }\n`,
  );
  t.teardown(() => steady.stop());
  await steady.admin('PATCH', '/admin/groups/default', { mcpTools: ['remote/*'] });
  const client = await mcpClient(steady.url, steady.key);
  t.teardown(() => client.close());
  t.equal(text(await client.callTool({ name: 'remote_echo', arguments: { message: 'before' } })), 'Echo: before');
  upstream.child.kill('SIGKILL');
  await upstream.exited;
  upstream = startUpstream(port);
  await upstream.waitFor(/LISTENING/, 'server-everything back on its port');
  // The first calls may meet the old session (unknown to the new process) or a server the gateway
  // is still reconnecting to, with a backoff that a slow restart on a busy machine lengthens.
  const after = await eventually(
    async () => {
      const r = await client.callTool({ name: 'remote_echo', arguments: { message: 'after' } }).catch(() => undefined);
      return r && text(r);
    },
    'a call through the restarted server',
    READY_BOUND_MS,
  );
  t.equal(after, 'Echo: after', 'the same client session works again');
});
