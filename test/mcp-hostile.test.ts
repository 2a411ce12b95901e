/**
 * An HTTP MCP server that misbehaves (test/fixtures/mcp-hostile-http.ts) behind the gateway: an
 * answer that never ends, JSON or SSE, is cut at the result cap and fails the call at once (it
 * filled the heap until the process died); a call the gateway stops waiting for has its POST
 * closed; a server that echoes its credentials has them redacted; a session the server forgot is
 * replaced without failing the call; a server that restarts is noticed and listed again; and a
 * requested tool name of any length is cut before it is logged or recorded.
 */
import { spawn } from 'node:child_process';
import t from 'tap';
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { READY_BOUND_MS, childEnv, distRoot, eventually, startTestGateway, watchProcess } from './helpers.js';
import { mcpClient, rpcError } from './mcp-helpers.js';

// Two server starts and a reconnection with backoff on two busy cores. This bounds only a hang.
t.setTimeout(240_000);

const fixture = `${distRoot}/test/fixtures/mcp-hostile-http.js`;
const startServer = (env: Record<string, string> = {}) => watchProcess(spawn(process.execPath, [fixture], { env: childEnv(env), stdio: ['ignore', 'pipe', 'pipe'] }));
let server = startServer();
t.teardown(() => void server.child.kill());
const port = Number((await server.waitFor(/LISTENING (\d+)/, 'the hostile MCP server listening'))[1]);

const SECRET = 'Bearer mcp-upstream-secret-4f9c2a7e1b';
const gw = await startTestGateway(
  (dataDir) => `dataDir: ${dataDir}
upstreams:
  sim: { kind: simulator }
models:
  - { id: m, upstream: sim }
mcp:
  maxResultBytes: 100000
  servers:
    hostile: { transport: http, url: "http://127.0.0.1:${port}/mcp", headers: { authorization: "${SECRET}" }, timeoutSeconds: 3 }
`,
);
t.teardown(() => gw.stop());
await gw.admin('PATCH', '/admin/groups/default', { mcpTools: ['hostile/*'] });
const client = await mcpClient(gw.url, gw.key);
t.teardown(() => client.close());

const text = (result: unknown) => ((result as CallToolResult).content[0] as { text: string }).text;
const call = (name: string, signal?: AbortSignal) => client.callTool({ name: `hostile_${name}`, arguments: {} }, undefined, signal && { signal });

t.test('an answer that never ends fails the call as too large, at once, and the server serves on', async (t) => {
  for (const tool of ['endless_json', 'endless_event']) {
    const err = await rpcError(call(tool));
    // Unbounded, the call would have ended at its 3 s timeout (-32001), if the heap held out.
    t.equal(err.code, -32013, `${tool}: the result cap's error, not the timeout's`);
    t.match(err.data, { code: 'result_too_large' }, `${tool}: data.code says why`);
    t.match(err.message, /more than \d+ bytes.*mcp\.maxResultBytes/, `${tool}: the message names the setting`);
    t.equal(text(await call('echo')), 'called echo', `${tool}: the next call is answered`);
  }
  const { body } = await gw.admin('GET', '/admin/requests?limit=20');
  const outcomes = (body.data as { model: string; error: string | null }[]).filter((r) => /endless/.test(r.model)).map((r) => r.error?.split(':')[0]);
  t.same(outcomes, ['result_too_large', 'result_too_large'], 'recorded as too large');
});

t.test("a call the gateway stops waiting for has its POST closed: at its timeout, and at the client's cancel", async (t) => {
  const timedOut = await rpcError(call('hang'));
  t.equal(timedOut.code, -32001, 'the server never answers: the call times out');
  const cancel = new AbortController();
  const cancelled = call('hang', cancel.signal).catch(() => 'cancelled');
  setTimeout(() => cancel.abort(), 200).unref();
  t.equal(await cancelled, 'cancelled');
  // Before, both stayed open for as long as the client session lasted.
  await eventually(async () => text(await call('open_calls')) === '0', "the server's answers to both are closed");
});

t.test('a server that echoes its credentials in an error has them redacted everywhere they go', async (t) => {
  const err = await rpcError(call('leak'));
  t.match(err.message, /request was:/, "the server's words are passed on");
  t.notMatch(err.message, /mcp-upstream-secret/, 'not the credential');
  t.match(err.message, /\[redacted\]/);
  const { body } = await gw.admin('GET', '/admin/requests?limit=50');
  t.notMatch(JSON.stringify(body), /mcp-upstream-secret/, 'nor the request log');
  t.notMatch(JSON.stringify(gw.logs), /mcp-upstream-secret/, 'nor the log');
});

t.test('a session the server forgot is replaced, and the call goes through on the new one', async (t) => {
  t.equal(text(await call('forget_sessions')), 'forgotten');
  // Before, this call failed with the server's 404, and only the next one worked.
  t.equal(text(await call('echo')), 'called echo', 'the first call after is answered');
});

t.test('a requested tool name of any length is cut before it is recorded or logged', async (t) => {
  const long = 'Z'.repeat(80_000);
  const err = await rpcError(client.callTool({ name: long, arguments: {} }));
  t.match(err.message, /Unknown tool: Z{128}…\. Call tools\/list/);
  t.ok(err.message.length < 400, 'the answer does not echo it whole');
  const { body } = await gw.admin('GET', '/admin/requests?limit=5');
  const recorded = (body.data as { model: string }[]).find((r) => r.model.startsWith('ZZZ'));
  t.equal(recorded?.model.length, 129, 'the record holds 128 characters and an ellipsis');
  t.notMatch(JSON.stringify(gw.logs), /Z{200}/, 'the log line is cut too');
});

t.test('a server that went away and came back is noticed and listed again', async (t) => {
  server.child.kill('SIGKILL');
  await server.exited;
  server = startServer({ PORT: String(port), EXTRA_TOOL: 'fresh' });
  await server.waitFor(/LISTENING/, 'the server back on its port, with a new tool');
  // Before, the gateway kept the old list (and `ready`) for good: nothing told it the server had gone.
  await eventually(
    async () => (await client.listTools()).tools.some((tool) => tool.name === 'hostile_fresh'),
    'the new tool listed',
    READY_BOUND_MS,
  );
  t.equal(text(await call('fresh')), 'called fresh', 'and callable');
});
