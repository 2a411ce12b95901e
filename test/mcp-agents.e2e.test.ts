/**
 * Claude Code uses a tool from an MCP server behind Sluice: `claude -p` with Sluice as its model
 * (the simulator) and Sluice's `/mcp` as its only MCP server (`--mcp-config`, the key in a
 * header), server-filesystem behind it on a scratch folder. The simulator asks for the file
 * reading tool; Claude Code calls it through /mcp; the gateway logs the call under the key.
 */
import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { distRoot, startTestGateway } from './helpers.js';
import { filesystemEntry, nodeServer } from './mcp-helpers.js';

t.setTimeout(240_000);
const claude = join(distRoot, '..', 'node_modules', '.bin', 'claude');

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs Claude Code with only the environment given, stdin closed. */
function run(args: string[], env: Record<string, string>, cwd: string): Promise<Run> {
  return new Promise((resolve) => {
    const child = execFile(claude, args, { cwd, env: { PATH: process.env.PATH ?? '/usr/bin:/bin', ...env }, timeout: 90_000, killSignal: 'SIGKILL', maxBuffer: 16 << 20 }, (err, stdout, stderr) =>
      resolve({ code: err ? (typeof err.code === 'number' ? err.code : null) : 0, stdout, stderr }),
    );
    child.stdin?.end();
  });
}

const scratch = mkdtempSync(join(tmpdir(), 'sluice-mcp-agents-'));
t.teardown(() => rmSync(scratch, { recursive: true, force: true }));

t.test('Claude Code calls a tool of a server behind /mcp', async (t) => {
  if (!existsSync(claude)) return t.plan(0, 'Claude Code is not installed (node_modules/.bin/claude missing)');
  const probe = await run(['--version'], { HOME: scratch }, scratch);
  if (probe.code !== 0) return t.plan(0, `Claude Code cannot run here: ${probe.stderr.slice(0, 300)}`);

  const work = mkdtempSync(join(scratch, 'work-'));
  const firstLine = 'Marker for the MCP run: heron-742';
  writeFileSync(join(work, 'notes.txt'), `${firstLine}\nThe second line is not asked for.\n`);
  const gw = await startTestGateway((dataDir) => `dataDir: ${dataDir}\nmcp:\n  servers:\n    files: ${nodeServer(filesystemEntry, [work])}\n`);
  t.teardown(() => gw.stop());
  await gw.admin('PATCH', '/admin/groups/default', { mcpTools: ['files/*'] });

  const mcpConfig = JSON.stringify({ mcpServers: { sluice: { type: 'http', url: `${gw.url}/mcp`, headers: { Authorization: `Bearer ${gw.key}` } } } });
  // Its own tools off: the only way to read the file is through Sluice's /mcp.
  const args = ['-p', `Read the file ${join(work, 'notes.txt')} and reply with its first line.`, '--mcp-config', mcpConfig, '--strict-mcp-config', '--tools', '', '--allowedTools', 'mcp__sluice', '--output-format', 'stream-json', '--verbose'];
  const env = { HOME: mkdtempSync(join(scratch, 'home-')), ANTHROPIC_BASE_URL: gw.url, ANTHROPIC_API_KEY: gw.key, ANTHROPIC_MODEL: 'sim-messages', CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1' };
  const result = await run(args, env, work);
  t.equal(result.code, 0, `claude exits 0 (stderr: ${result.stderr.slice(-500)})`);
  const messages = result.stdout
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as { type: string; message?: { content?: { type: string; name?: string; content?: unknown; is_error?: boolean }[] }; result?: string; mcp_servers?: { name: string; status: string }[] });
  t.match(messages.find((m) => m.mcp_servers)?.mcp_servers, [{ name: 'sluice', status: 'connected' }], 'Claude Code connected to /mcp with the key');
  const blocks = messages.flatMap((m) => m.message?.content ?? []);
  const use = blocks.find((b) => b.type === 'tool_use');
  t.match(use?.name, /^mcp__sluice__files_read/, `it called a file tool of the server behind Sluice (${use?.name})`);
  const toolResult = blocks.find((b) => b.type === 'tool_result');
  t.notOk(toolResult?.is_error, 'the tool result is no error');
  t.ok(JSON.stringify(toolResult?.content).includes(firstLine), 'the tool result holds the file');
  t.ok(messages.find((m) => m.type === 'result')?.result?.includes(firstLine), "the answer carries the file's first line");
  t.ok(
    gw.logs.some((l) => (l.mcp as { server?: string; outcome?: string } | undefined)?.server === 'files' && (l.mcp as { outcome: string }).outcome === 'ok'),
    'the gateway logged the tool call',
  );
});
