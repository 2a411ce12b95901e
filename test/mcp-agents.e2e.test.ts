/**
 * Real agents use a tool of an MCP server behind Sluice's `/mcp`, with a Sluice key, in print mode:
 * Claude Code (added with `claude mcp add --transport http`) and Codex (`[mcp_servers]` with a
 * bearer token variable). Each asks for a file the test wrote, through server-filesystem's
 * `read_text_file`; the simulator calls the tool the prompt names, the agent calls it through the
 * gateway, and the answer repeats what the tool returned. It passes only when the agent's own
 * report shows the MCP call succeeding, the answer carries the file's line, and the gateway's
 * request log has the call.
 */
import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { distRoot, eventually, startTestGateway } from './helpers.js';
import { filesystemEntry, nodeServer } from './mcp-helpers.js';

// Agents start Node and native binaries: well over a minute on a busy machine.
t.setTimeout(240_000);

const bin = (name: string) => join(distRoot, '..', 'node_modules', '.bin', name);
const RUN_TIMEOUT_MS = 60_000;

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs an agent with only the environment given, stdin closed. */
function runAgent(file: string, args: string[], env: Record<string, string>, cwd: string): Promise<Run> {
  return new Promise((resolve) => {
    const child = execFile(
      file,
      args,
      { cwd, env: { PATH: process.env.PATH ?? '/usr/bin:/bin', ...env }, timeout: RUN_TIMEOUT_MS, killSignal: 'SIGKILL', maxBuffer: 16 << 20 },
      (err, stdout, stderr) => resolve({ code: err ? (typeof err.code === 'number' ? err.code : null) : 0, stdout, stderr }),
    );
    child.stdin?.end();
  });
}

const jsonLines = (stdout: string): Record<string, any>[] =>
  stdout
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l));

const scratch = mkdtempSync(join(tmpdir(), 'sluice-mcp-agents-'));
t.teardown(() => rmSync(scratch, { recursive: true, force: true }));
// The folder server-filesystem may read: each run's file goes in it.
const shared = join(scratch, 'shared');
mkdirSync(shared);

const gw = await startTestGateway((dataDir) => `dataDir: ${dataDir}\nserver: { shutdownTimeoutMs: 2000 }\nmcp:\n  servers:\n    files: ${nodeServer(filesystemEntry, [shared])}\n`);
t.teardown(() => gw.stop());
const group = await gw.admin('POST', '/admin/groups', { name: 'agents', models: ['*'], families: ['chat', 'responses', 'messages'], mcpTools: ['files/read_text_file'] });
if (group.status !== 201) throw new Error(`the agents' group: ${JSON.stringify(group.body)}`);
const key = (await gw.admin('POST', '/admin/keys', { group: 'agents', name: 'agent key' })).body.key as string;

/** A file only this run knows the first line of. */
function fileFor(run: string): { path: string; firstLine: string } {
  const firstLine = `Marker for ${run}: kestrel-${Math.floor(Math.random() * 1e6)}`;
  const path = join(shared, `${run.replace(/\W+/g, '-')}.txt`);
  writeFileSync(path, `${firstLine}\nThe second line is not asked for.\n`);
  return { path, firstLine };
}

/** The gateway's request-log records of successful calls of `files/read_text_file` by the agents' key. */
async function callsLogged(): Promise<Record<string, any>[]> {
  const rows = (await gw.admin('GET', `/admin/requests?model=${encodeURIComponent('files/read_text_file')}&group=agents`)).body.data as Record<string, any>[];
  return rows.filter((r) => r.status === 200 && r.outcome === 'finished');
}

/** The record of one more call than `before`, once it is stored. */
const oneMoreCall = (before: number) => eventually(async () => ((await callsLogged()).length > before ? (await callsLogged())[0] : undefined), 'the tool call in the request log');

t.test('Claude Code uses a tool behind Sluice', async (t) => {
  if (!existsSync(bin('claude'))) return t.plan(0, 'Claude Code is not installed');
  const home = join(scratch, 'claude');
  const work = join(home, 'work');
  mkdirSync(work, { recursive: true });
  const env = { HOME: home, ANTHROPIC_BASE_URL: gw.url, ANTHROPIC_API_KEY: key, ANTHROPIC_MODEL: 'sim-messages', CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1', ENABLE_TOOL_SEARCH: 'false' };
  // As docs/mcp.md says.
  const added = await runAgent(bin('claude'), ['mcp', 'add', '--transport', 'http', 'sluice', `${gw.url}/mcp`, '--header', `Authorization: Bearer ${key}`], env, work);
  t.equal(added.code, 0, `claude mcp add exits 0 (${added.stderr.slice(-300)})`);
  const { path, firstLine } = fileFor('Claude Code');
  const before = (await callsLogged()).length;
  const tool = 'mcp__sluice__files_read_text_file';
  // Tool search off: the MCP tools are offered at once, so the simulator can call the one named.
  const run = await runAgent(bin('claude'), ['-p', `Show the file ${path} using ${tool}, then reply with its first line.`, '--output-format', 'stream-json', '--verbose', '--allowedTools', tool], env, work);
  t.equal(run.code, 0, `claude exits 0 (stderr: ${run.stderr.slice(-500)})`);
  const messages = jsonLines(run.stdout);
  const init = messages.find((m) => m.subtype === 'init');
  t.match(init?.mcp_servers, [{ name: 'sluice', status: 'connected' }], 'Claude Code connected to /mcp');
  t.same(init?.tools.filter((n: string) => n.startsWith('mcp__sluice__')), [tool], 'it lists the one tool the group is granted');
  const blocks = (type: string) => messages.flatMap((m) => (Array.isArray(m.message?.content) ? m.message.content : [])).filter((b) => b.type === type);
  t.same(blocks('tool_use').map((b) => [b.name, b.input]), [[tool, { path }]], 'the MCP tool was called with the path');
  const results = blocks('tool_result');
  t.equal(results.length, 1, 'one tool result');
  t.notOk(results[0]?.is_error, `the tool result is no error (${JSON.stringify(results[0]?.content).slice(0, 300)})`);
  t.ok(JSON.stringify(results[0]?.content).includes(firstLine), 'the tool result holds the file');
  const out = messages.find((m) => m.type === 'result');
  t.match(out, { subtype: 'success', is_error: false }, 'the run succeeded');
  t.ok(out?.result.includes(firstLine), `the answer carries the first line (${JSON.stringify(out?.result)})`);
  t.match(await oneMoreCall(before), { family: 'mcp', upstream: 'files' }, 'the gateway logged the call');
});

t.test('Codex uses a tool behind Sluice', async (t) => {
  if (!existsSync(bin('codex'))) return t.plan(0, 'Codex is not installed');
  const home = join(scratch, 'codex');
  const work = join(home, 'work');
  mkdirSync(join(home, '.codex'), { recursive: true });
  mkdirSync(work);
  // As docs/clients.md and docs/mcp.md say; on a chat model, so the Responses bridge flattens Codex's MCP namespace into function tools and back.
  writeFileSync(
    join(home, '.codex', 'config.toml'),
    `model = "sim-chat"
model_provider = "sluice"
check_for_update_on_startup = false

[analytics]
enabled = false

[features]
plugins = false
apps = false
remote_plugin = false
tool_suggest = false

[model_providers.sluice]
name = "Sluice"
base_url = "${gw.url}/v1"
wire_api = "responses"
env_key = "SLUICE_KEY"
supports_websockets = false

[mcp_servers.sluice]
url = "${gw.url}/mcp"
bearer_token_env_var = "SLUICE_KEY"
`,
  );
  const { path, firstLine } = fileFor('Codex');
  const before = (await callsLogged()).length;
  const prompt = `Show the file ${path} using mcp__sluice__files_read_text_file, then reply with its first line.`;
  const run = await runAgent(bin('codex'), ['exec', '--skip-git-repo-check', '--sandbox', 'read-only', '--ephemeral', '--json', '-C', work, prompt], { HOME: home, SLUICE_KEY: key }, work);
  t.equal(run.code, 0, `codex exits 0 (stderr: ${run.stderr.slice(-500)})`);
  const items = jsonLines(run.stdout)
    .filter((e) => e.type === 'item.completed')
    .map((e) => e.item);
  const calls = items.filter((i) => i.type === 'mcp_tool_call');
  t.equal(calls.length, 1, 'one MCP tool call');
  t.match(calls[0], { server: 'sluice', tool: 'files_read_text_file', arguments: { path }, error: null, status: 'completed' }, 'called through Sluice, without error');
  t.ok(JSON.stringify(calls[0]?.result).includes(firstLine), 'its result holds the file');
  t.notOk(items.some((i) => i.type === 'command_execution'), 'no shell command stood in for it');
  const answer = items.findLast((i) => i.type === 'agent_message')?.text ?? '';
  t.ok(answer.includes(firstLine), `the answer carries the first line (${JSON.stringify(answer)})`);
  t.match(await oneMoreCall(before), { family: 'mcp', upstream: 'files' }, 'the gateway logged the call');
});
