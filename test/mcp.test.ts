/**
 * The MCP gateway with real parts: server-everything and server-filesystem over stdio, a fixture
 * server that hangs, dies and answers big, and the SDK's own client through `/mcp` with real keys.
 * Grants, the key's limits, the caps, the timeout, a server dying mid-call, cancellation of one
 * call of two, and each refusal as a JSON-RPC error.
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import {
  PromptListChangedNotificationSchema,
  ResourceListChangedNotificationSchema,
  ToolListChangedNotificationSchema,
  type CallToolResult,
} from '@modelcontextprotocol/sdk/types.js';
import { eventually, startTestGateway } from './helpers.js';
import { everythingEntry, faultyEntry, filesystemEntry, mcpClient, nodeServer, rpcError } from './mcp-helpers.js';

const scratch = mkdtempSync(join(tmpdir(), 'sluice-mcp-files-'));
writeFileSync(join(scratch, 'hello.txt'), 'hello from the scratch folder\n');
t.teardown(() => rmSync(scratch, { recursive: true, force: true }));

const mcpYaml = `mcp:
  maxArgumentBytes: 2000
  maxResultBytes: 100000
  servers:
    everything: ${nodeServer(everythingEntry, ['stdio'])}
    files: ${nodeServer(filesystemEntry, [scratch])}
    faulty: ${nodeServer(faultyEntry, [], 'timeoutSeconds: 2')}
    patient: ${nodeServer(faultyEntry, [], 'timeoutSeconds: 120')}
`;
const gw = await startTestGateway((dataDir) => `dataDir: ${dataDir}\nupstreams:\n  sim: { kind: simulator }\nmodels:\n  - { id: m, upstream: sim }\n${mcpYaml}`);
t.teardown(() => gw.stop());

/** A key in a new group with these grants (and limits). */
async function keyWith(group: string, mcpTools: string[], limits?: Record<string, number>): Promise<string> {
  const created = await gw.admin('POST', '/admin/groups', { name: group, models: ['*'], families: ['chat'], mcpTools, ...(limits && { limits }) });
  if (created.status !== 201) throw new Error(`group: ${JSON.stringify(created.body)}`);
  const key = await gw.admin('POST', '/admin/keys', { group });
  return key.body.key as string;
}

const text = (result: unknown) => ((result as CallToolResult).content[0] as { text: string }).text;
const allTools = await keyWith('all', ['everything/*', 'files/*', 'faulty/*', 'patient/*']);

t.test('tools/list is the union of the granted tools, namespaced and sorted; none by default', async (t) => {
  const client = await mcpClient(gw.url, allTools);
  t.teardown(() => client.close());
  const { tools } = await client.listTools();
  const names = tools.map((x) => x.name);
  t.ok(names.includes('everything_echo'), 'server-everything over stdio');
  t.ok(names.includes('files_read_text_file'), 'server-filesystem over stdio');
  t.ok(names.includes('faulty_hang'), 'the fixture server');
  t.same(names, [...names].sort(), 'in a stable, sorted order');
  t.ok(names.every((n) => n.length <= 64), 'every name within 64 characters');
  t.same((await client.listTools()).tools.map((x) => x.name), names, 'the same order the second time');

  const plain = await mcpClient(gw.url, gw.key);
  t.teardown(() => plain.close());
  t.same((await plain.listTools()).tools, [], 'the default group is granted no tool');
  const narrow = await mcpClient(gw.url, await keyWith('echo-only', ['everything/echo']));
  t.teardown(() => narrow.close());
  t.same((await narrow.listTools()).tools.map((x) => x.name), ['everything_echo'], 'a grant of one tool lists that tool alone');
});

t.test('tools/call reaches the server: everything echoes, filesystem reads and writes the scratch folder', async (t) => {
  const client = await mcpClient(gw.url, allTools);
  t.teardown(() => client.close());
  t.equal(text(await client.callTool({ name: 'everything_echo', arguments: { message: 'hi there' } })), 'Echo: hi there');
  const read = await client.callTool({ name: 'files_read_text_file', arguments: { path: join(scratch, 'hello.txt') } });
  t.match(text(read), /hello from the scratch folder/);
  await client.callTool({ name: 'files_write_file', arguments: { path: join(scratch, 'made.txt'), content: 'written through sluice' } });
  t.equal(readFileSync(join(scratch, 'made.txt'), 'utf8'), 'written through sluice', 'the file is on disk');
  const outside = await client.callTool({ name: 'files_read_text_file', arguments: { path: '/etc/hostname' } });
  t.ok(outside.isError, "the server's own refusal (outside its folder) comes back as the tool's error");
  const logged = await eventually(async () => {
    const res = await gw.admin('GET', `/admin/requests?model=${encodeURIComponent('files/write_file')}`);
    return (res.body.data as Record<string, unknown>[] | undefined)?.[0];
  }, 'the call in the request log');
  t.match(logged, { family: 'mcp', upstream: 'files', status: 200, outcome: 'finished', notes: /tools\/call: ok; arguments \d+ bytes; result \d+ bytes/ }, 'each call is in the request log');
});

t.test('an ungranted tool and an unknown tool are JSON-RPC errors; the denial is audited', async (t) => {
  const client = await mcpClient(gw.url, await keyWith('echo-too', ['everything/echo']));
  t.teardown(() => client.close());
  const denied = await rpcError(client.callTool({ name: 'everything_get-sum', arguments: { a: 1, b: 2 } }));
  t.equal(denied.code, -32003, 'not granted');
  t.match(denied.message, /not granted .*everything\/get-sum/);
  const unknown = await rpcError(client.callTool({ name: 'nowhere_tool', arguments: {} }));
  t.equal(unknown.code, -32602, 'unknown tool: invalid params');
  t.match(unknown.message, /Unknown tool: nowhere_tool/);
  const audit = await eventually(async () => {
    const res = await gw.admin('GET', '/admin/audit?action=mcp.denied');
    return (res.body.data as { target: string }[]).find((e) => e.target === 'everything/get-sum');
  }, 'the audit entry');
  t.match(audit, { action: 'mcp.denied', actor: /^key:/ });
  // A server's prompts and resources, refused the same way, with the same data.code.
  const everything = await mcpClient(gw.url, allTools);
  t.teardown(() => everything.close());
  const prompt = (await everything.listPrompts()).prompts[0]!.name;
  t.match(await rpcError(client.getPrompt({ name: prompt })), { code: -32003, data: { code: 'tool_not_granted' } }, 'an ungranted prompt');
  const uri = (await everything.listResources()).resources[0]!.uri;
  t.match(await rpcError(client.readResource({ uri })), { code: -32003, data: { code: 'tool_not_granted' } }, 'an ungranted resource');
  t.equal(text(await client.callTool({ name: 'everything_echo', arguments: { message: 'still fine' } })), 'Echo: still fine', 'the session goes on');
});

t.test('401 for a missing or wrong key, as a JSON-RPC error body', async (t) => {
  const init = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'x', version: '1' } } });
  const headers = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' };
  for (const [what, auth] of [['no key', undefined], ['a wrong key', 'Bearer sk-wrong-key-0000000000']] as const) {
    const res = await fetch(`${gw.url}/mcp`, { method: 'POST', headers: { ...headers, ...(auth && { authorization: auth }) }, body: init });
    t.equal(res.status, 401, what);
    t.match(await res.json(), { jsonrpc: '2.0', error: { code: -32001, message: /API key/ }, id: null }, `${what}: JSON-RPC error body`);
  }
});

t.test("the key's rpm applies to tool calls in a scope of their own", async (t) => {
  const key = await keyWith('slowpoke', ['everything/*'], { rpm: 2 });
  const client = await mcpClient(gw.url, key);
  t.teardown(() => client.close());
  await client.callTool({ name: 'everything_echo', arguments: { message: '1' } });
  await client.callTool({ name: 'everything_echo', arguments: { message: '2' } });
  const limited = await rpcError(client.callTool({ name: 'everything_echo', arguments: { message: '3' } }));
  t.equal(limited.code, -32029, 'over the rpm: a rate-limit error');
  t.match(limited.data, { code: 'rate_limit_exceeded', retryAfterSeconds: Number });
  const model = await fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'hi' }] }),
  });
  t.equal(model.status, 200, "the key's model calls are not counted with its tool calls");
});

t.test("resources/read, prompts/get and completion/complete: the key's limits, logged", async (t) => {
  const key = await keyWith('reader', ['everything/*'], { rpm: 2 });
  const client = await mcpClient(gw.url, key);
  t.teardown(() => client.close());
  const { resources } = await client.listResources();
  const uri = resources[0]!.uri;
  await client.readResource({ uri });
  const { prompts } = await client.listPrompts();
  await client.getPrompt({ name: prompts.find((p) => !p.arguments?.some((a) => a.required))!.name });
  const limited = await rpcError(client.readResource({ uri }));
  t.equal(limited.code, -32029, 'over the rpm: a rate-limit error');
  t.ok(gw.logs.some((l) => (l.mcp as { method?: string; outcome?: string } | undefined)?.method === 'resources/read' && (l.mcp as { outcome?: string }).outcome === 'ok'), 'the read is logged');
  t.ok(gw.logs.some((l) => (l.mcp as { method?: string } | undefined)?.method === 'prompts/get'), 'the prompt is logged');
});

t.test('oversize arguments and an oversize result are refused', async (t) => {
  const client = await mcpClient(gw.url, allTools);
  t.teardown(() => client.close());
  const args = await rpcError(client.callTool({ name: 'everything_echo', arguments: { message: 'x'.repeat(3000) } }));
  t.equal(args.code, -32013);
  t.match(args.message, /more than the 2000 allowed \(mcp\.maxArgumentBytes\)/);
  const result = await rpcError(client.callTool({ name: 'faulty_big', arguments: { bytes: 200_000 } }));
  t.equal(result.code, -32013);
  t.match(result.message, /mcp\.maxResultBytes/);
  t.equal(text(await client.callTool({ name: 'faulty_big', arguments: { bytes: 10 } })), 'xxxxxxxxxx', 'a small one passes');
});

t.test('a server that hangs times out with a JSON-RPC error', async (t) => {
  const client = await mcpClient(gw.url, allTools);
  t.teardown(() => client.close());
  const hung = await rpcError(client.callTool({ name: 'faulty_hang', arguments: {} }, undefined, { timeout: 60_000 }));
  t.equal(hung.code, -32001);
  t.match(hung.message, /did not answer faulty_hang within 2s/);
  t.match(gw.logs.find((l) => (l.mcp as { tool?: string } | undefined)?.tool === 'hang'), { mcp: { server: 'faulty', outcome: 'timeout', key: String } }, 'the call is logged');
});

t.test('one cancelled call does not cancel another', async (t) => {
  const client = await mcpClient(gw.url, allTools);
  t.teardown(() => client.close());
  const cancel = new AbortController();
  // A server of its own with a long timeout: the other call is not racing one on a busy machine.
  const long = client.callTool({ name: 'patient_slow', arguments: { ms: 60_000 } }, undefined, { signal: cancel.signal, timeout: 120_000 });
  // Long enough to be under way when the other is cancelled.
  const other = client.callTool({ name: 'patient_slow', arguments: { ms: 1500 } }, undefined, { timeout: 120_000 });
  other.catch(() => undefined);
  await eventually(async () => (await gw.admin('GET', '/admin/mcp')).body.callsInFlight === 2, 'both calls under way upstream');
  cancel.abort('changed my mind');
  await t.rejects(long, 'the cancelled call ends');
  await eventually(() => gw.logs.find((l) => (l.mcp as { outcome?: string } | undefined)?.outcome === 'cancelled'), 'the cancelled call logged');
  // The fixture answers "cancelled" when its own call is cancelled: this one was not.
  t.equal(text(await other), 'slept 1500', 'the other call runs to its end');
});

t.test('progress notifications pass through', async (t) => {
  const client = await mcpClient(gw.url, allTools);
  t.teardown(() => client.close());
  const progress: number[] = [];
  const result = await client.callTool({ name: 'everything_trigger-long-running-operation', arguments: { duration: 0.6, steps: 3 } }, undefined, {
    onprogress: (p) => progress.push(p.progress),
  });
  t.match(text(result), /Long running operation completed/);
  // The SDK's client handles a notification a tick after a response that came with it, so the
  // last step's progress can be lost on either hop (it is without the gateway too): the first
  // steps, each in order, are what must arrive.
  t.ok(progress.length >= 1, `progress reached the client (${progress.join(', ')})`);
  t.same(progress, [1, 2, 3].slice(0, progress.length), 'each step in order');
});

t.test('a server that dies mid-call: an error, then it is restarted', async (t) => {
  const client = await mcpClient(gw.url, allTools);
  t.teardown(() => client.close());
  const changed = new Set<string>();
  for (const schema of [ToolListChangedNotificationSchema, ResourceListChangedNotificationSchema, PromptListChangedNotificationSchema]) {
    client.setNotificationHandler(schema, (n) => void changed.add(n.method));
  }
  const before = text(await client.callTool({ name: 'faulty_pid', arguments: {} }));
  const died = await rpcError(client.callTool({ name: 'faulty_die', arguments: {} }, undefined, { timeout: 60_000 }));
  t.equal(died.code, -32603);
  t.match(died.message, /MCP server "faulty" went away during the call of faulty_die/);
  const after = await eventually(async () => {
    const r = await client.callTool({ name: 'faulty_pid', arguments: {} }).catch(() => undefined);
    return r && !r.isError && text(r);
  }, 'the restarted server answering');
  t.not(after, before, 'a new process answers');
  await eventually(() => changed.size === 3, `every list announced as changing is said to have changed (${[...changed].join(', ')})`);
  const report = await gw.admin('GET', '/admin/mcp');
  t.match(report.body.servers.find((s: { name: string }) => s.name === 'faulty'), { state: 'ready', restarts: Number });
  t.ok(report.body.servers.find((s: { name: string }) => s.name === 'faulty').restarts >= 1, 'the restart is counted');
});

t.test("stdio servers' stderr goes to the log with the server's name", async (t) => {
  t.ok(gw.logs.some((l) => l.mcpServer === 'faulty' && /faulty server \d+ starting/.test(String(l.stderr))));
});

t.test('DELETE ends a session; its id is then unknown', async (t) => {
  const client = await mcpClient(gw.url, allTools);
  const transport = client.transport as unknown as { sessionId: string; terminateSession(): Promise<void> };
  const id = transport.sessionId;
  t.ok(id, 'the session has an id');
  await transport.terminateSession();
  const res = await fetch(`${gw.url}/mcp`, {
    method: 'POST',
    headers: { authorization: `Bearer ${allTools}`, 'mcp-session-id': id, 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 2, method: 'tools/list' }),
  });
  t.equal(res.status, 404);
  t.match(await res.json(), { error: { code: -32001, message: /Session not found/ } });
  await client.close();
  const other = await mcpClient(gw.url, allTools);
  t.teardown(() => other.close());
  const stolen = await fetch(`${gw.url}/mcp`, {
    method: 'POST',
    headers: { authorization: `Bearer ${gw.key}`, 'mcp-session-id': (other.transport as unknown as { sessionId: string }).sessionId, 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 2, method: 'tools/list' }),
  });
  t.equal(stolen.status, 404, "another key cannot use a session it did not open");
});

t.test('/admin/mcp shows servers, tools and grants; nothing adds a server', async (t) => {
  const report = await gw.admin('GET', '/admin/mcp');
  t.equal(report.status, 200);
  const everything = report.body.servers.find((s: { name: string }) => s.name === 'everything');
  t.match(everything, { transport: 'stdio', state: 'ready', error: null });
  t.ok(everything.tools.some((x: { name: string }) => x.name === 'everything_echo'), 'its tools');
  t.match(report.body.groups.find((g: { name: string }) => g.name === 'echo-only'), { mcpTools: ['everything/echo'], tools: ['everything_echo'] });
  t.equal((await fetch(`${gw.url}/admin/mcp`)).status, 401, 'the admin token is required');
  const signIn = await fetch(`${gw.url}/admin/session`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ token: gw.adminToken }) });
  const cookie = signIn.headers.getSetCookie().map((c) => c.split(';')[0]).join('; ');
  t.equal((await fetch(`${gw.url}/admin/mcp`, { headers: { cookie } })).status, 200, 'or a console session (the console reads it)');

  const add = await gw.admin('POST', '/admin/mcp', { servers: { evil: { transport: 'stdio', command: 'touch', args: [join(scratch, 'pwned')] } } });
  t.equal(add.status, 405, 'POST /admin/mcp is refused');
  const sneak = await gw.admin('PATCH', '/admin/groups/all', { mcpServers: { evil: { command: 'touch' } } });
  t.equal(sneak.status, 400, 'a group takes no server');
  const badGrant = await gw.admin('PATCH', '/admin/groups/all', { mcpTools: ['not a grant'] });
  t.equal(badGrant.status, 400, 'a grant must read server/tool or server/*');

  // A reload that adds a server is refused whole: a reload never starts a command.
  const file = join(gw.dataDir, 'sluice.yaml');
  writeFileSync(file, readFileSync(file, 'utf8').replace('  servers:\n', `  servers:\n    evil: { transport: stdio, command: touch, args: [${JSON.stringify(join(scratch, 'pwned'))}] }\n`));
  const reload = await gw.admin('POST', '/admin/reload');
  t.equal(reload.status, 400, 'the reload is refused');
  t.match(reload.body, { error: { code: 'invalid_config', reasons: [/^mcp\.servers\.evil: changes only at restart/] } });
  const after = await gw.admin('GET', '/admin/mcp');
  t.same(after.body.servers.map((s: { name: string }) => s.name).sort(), ['everything', 'faulty', 'files', 'patient']);
  t.throws(() => readFileSync(join(scratch, 'pwned')), 'the command never ran');
});
