/**
 * Real agents against a real gateway on the embedded default models: Codex CLI (Responses over HTTP
 * and WebSocket), Gemini CLI and Claude Code, each run as a new user would run it, offline, on
 * 127.0.0.1 only.
 *
 * Each agent is asked to read a file the test wrote, whose first line only that run knows. The
 * simulator calls the agent's file-reading tool with the path (Codex has none: its shell runs `cat`),
 * the agent runs the tool and sends the result back, and the simulator's answer repeats what the
 * tool returned. So each run proves the whole agent loop, and fails when the tool failed: the final
 * answer must carry the first line, and the agent's own report of the tool (Codex's command exit
 * code, Claude Code's tool_result, Gemini CLI's tool stats) must show no error.
 */
import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import { distRoot, eventually, startTestGateway, type TestGateway } from './helpers.js';

// Real agents start Node and native binaries: about two minutes alone (Gemini CLI's runs take longest), more on a busy machine.
t.setTimeout(240_000);

const bin = (name: string) => join(distRoot, '..', 'node_modules', '.bin', name);
const RUN_TIMEOUT_MS = 45_000;

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs an agent with only the environment given (no inherited keys or proxies), stdin closed. */
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

/** Why an agent cannot run here (not installed, or its binary does not start), or undefined. */
async function unavailable(name: string): Promise<string | undefined> {
  if (!existsSync(bin(name))) return `${name} is not installed (node_modules/.bin/${name} missing)`;
  const probe = await runAgent(bin(name), ['--version'], { HOME: tmpdir() }, tmpdir());
  return probe.code === 0 ? undefined : `${name} --version exited ${probe.code}: ${probe.stderr.trim().slice(0, 300)}`;
}

/** A file in `dir` whose first line names this run, and the prompt asking an agent for that line. */
function fileToRead(dir: string, run: string): { prompt: string; firstLine: string } {
  const firstLine = `Marker for ${run}: heron-742`;
  const path = join(dir, 'notes.txt');
  writeFileSync(path, `${firstLine}\nThe second line is not asked for.\n`);
  return { prompt: `Read the file ${path} and reply with its first line.`, firstLine };
}

const scratch = mkdtempSync(join(tmpdir(), 'sluice-agents-'));
t.teardown(() => rmSync(scratch, { recursive: true, force: true }));

const gw: TestGateway = await startTestGateway((dataDir) => `dataDir: ${dataDir}\nserver: { shutdownTimeoutMs: 2000 }\n`);
t.teardown(() => gw.stop());

/** Access-log lines written while `fn` ran. */
async function logged<T>(fn: () => Promise<T>): Promise<{ result: T; lines: Record<string, any>[] }> {
  const from = gw.logs.length;
  const result = await fn();
  return { result, lines: gw.logs.slice(from).filter((l) => l.plugin === 'access-log') };
}

/** A usage note of `model` matching `pattern`, once stored (usage is written asynchronously). */
function noted(model: string, pattern: RegExp): Promise<string> {
  return eventually(async () => {
    const records: { notes: string | null }[] = (await gw.admin('GET', `/admin/requests?model=${model}`)).body.data;
    return records.map((r) => r.notes).find((n): n is string => !!n && pattern.test(n));
  }, `a usage note of ${model} matching ${pattern}`);
}

function codexHome(model: string, websocket: boolean, url: string): string {
  const home = mkdtempSync(join(scratch, `codex-${model}-${websocket ? 'ws' : 'http'}-`));
  mkdirSync(join(home, '.codex'), { recursive: true });
  // As in docs/clients.md.
  writeFileSync(
    join(home, '.codex', 'config.toml'),
    `model = "${model}"
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
base_url = "${url}/v1"
wire_api = "responses"
env_key = "SLUICE_KEY"
supports_websockets = ${websocket}
`,
  );
  return home;
}

/** The JSON lines of an agent's output. */
function jsonLines(stdout: string): Record<string, any>[] {
  return stdout
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l));
}

async function codex(model: string, websocket: boolean, on: TestGateway = gw) {
  const home = codexHome(model, websocket, on.url);
  const work = join(home, 'work');
  mkdirSync(work);
  const { prompt, firstLine } = fileToRead(work, `Codex on ${model} over ${websocket ? 'WebSocket' : 'HTTP'}`);
  // A read-only sandbox is all `cat` needs, and it keeps any other command from changing anything.
  const args = ['exec', '--skip-git-repo-check', '--sandbox', 'read-only', '--ephemeral', '--json', '-C', work, prompt];
  const run = await runAgent(bin('codex'), args, { HOME: home, SLUICE_KEY: on.key, RUST_LOG: 'codex_api=info' }, work);
  const events = jsonLines(run.stdout);
  const answer = events.findLast((e) => e.type === 'item.completed' && e.item?.type === 'agent_message')?.item.text;
  const commands = events.filter((e) => e.type === 'item.completed' && e.item?.type === 'command_execution').map((e) => e.item);
  return { run, events, answer, commands, firstLine };
}

/** Codex ran `cat` on the file, the command succeeded, and the final message carries the first line. */
function readByCodex(t: Test, result: Awaited<ReturnType<typeof codex>>): void {
  t.equal(result.run.code, 0, `codex exits 0 (stderr: ${result.run.stderr.slice(-500)})`);
  t.ok(result.commands.length > 0, 'Codex ran a command');
  for (const command of result.commands) {
    t.match(command, { exit_code: 0, status: 'completed' }, `\`${command.command}\` succeeded (output: ${JSON.stringify(command.aggregated_output)})`);
  }
  t.ok(result.commands.some((c) => c.aggregated_output.includes(result.firstLine)), 'the command printed the file');
  t.match(result.answer, /^The tool returned: /, "the simulator's answer to the tool result is Codex's final message");
  t.ok(result.answer?.includes(result.firstLine), `the final message carries the first line (${JSON.stringify(result.answer)})`);
}

t.test('Codex CLI', async (t) => {
  const why = await unavailable('codex');
  if (why) return t.plan(0, `Codex CLI cannot run here: ${why}`);

  for (const model of ['sim-responses', 'sim-chat']) {
    t.test(`over HTTP on ${model}`, async (t) => {
      const { result, lines } = await logged(() => codex(model, false));
      readByCodex(t, result);
      t.ok(result.events.some((e) => e.type === 'turn.completed' && e.usage.output_tokens > 0), 'the turn reports usage');
      t.notOk(lines.some((l) => l.method === 'WS' || l.status === 101), 'no WebSocket');
      const posts = lines.filter((l) => l.method === 'POST' && l.path === '/v1/responses' && l.model === model);
      t.ok(posts.length >= 2, 'a tool call and the answer to its result, both over HTTP');
      t.ok(posts.every((l) => l.status === 200), 'every request succeeded');
    });
  }

  t.test('sim-chat drops the web_search tool Codex always sends, and notes it', async (t) => {
    t.equal(await noted('sim-chat', /web_search/), 'dropped tools: web_search');
  });

  t.test('over WebSocket on sim-responses', async (t) => {
    const { result, lines } = await logged(() => codex('sim-responses', true));
    readByCodex(t, result);
    t.match(result.run.stderr, /successfully connected to Responses WebSocket/, 'Codex says it used the WebSocket');
    t.notOk(lines.some((l) => l.method === 'POST'), 'no fallback to HTTP');
    const turns = lines.filter((l) => l.method === 'WS');
    t.ok(turns.length >= 3, 'warm-up, tool call and answer are WebSocket turns');
    t.ok(turns.every((l) => l.status === 200 && l.model === 'sim-responses'), 'every turn succeeded');
    const warmUp = turns.find((l) => l.turn === 1);
    t.same(warmUp?.tokens, { in: 0, out: 0 }, 'the first turn is the warm-up: no model output');
    t.equal(warmUp?.upstream, undefined, 'the warm-up never reaches the upstream');
  });

  t.test('falls back to HTTP at once when the WebSocket channel is switched off (426)', async (t) => {
    const off = await startTestGateway((dataDir) => `dataDir: ${dataDir}\nserver: { shutdownTimeoutMs: 2000, websocket: { enabled: false } }\n`);
    t.teardown(() => off.stop());
    const from = off.logs.length;
    const result = await codex('sim-responses', true, off);
    const lines = off.logs.slice(from).filter((l) => l.plugin === 'access-log');
    readByCodex(t, result);
    t.equal(lines.filter((l) => l.method === 'GET' && l.status === 426).length, 1, 'one refused upgrade, no retries');
    t.notOk(lines.some((l) => l.method === 'WS'));
    t.ok(lines.filter((l) => l.method === 'POST' && l.status === 200).length >= 2, 'the turns went over HTTP');
  });
});

t.test('Gemini CLI', async (t) => {
  const why = await unavailable('gemini');
  if (why) return t.plan(0, `Gemini CLI cannot run here: ${why}`);

  const home = join(scratch, 'gemini');
  mkdirSync(join(home, '.gemini'), { recursive: true });
  // As in docs/clients.md.
  const settings = {
    security: { auth: { selectedType: 'gemini-api-key' } },
    privacy: { usageStatisticsEnabled: false },
    telemetry: { enabled: false },
    general: { enableAutoUpdate: false, enableAutoUpdateNotification: false },
  };
  writeFileSync(join(home, '.gemini', 'settings.json'), JSON.stringify(settings));
  const env = { HOME: home, GEMINI_API_KEY: gw.key, GOOGLE_GEMINI_BASE_URL: gw.url, GEMINI_CLI_TRUST_WORKSPACE: 'true' };

  for (const model of ['sim-gemini', 'sim-chat']) {
    t.test(`on ${model}`, async (t) => {
      const work = join(home, `work-${model}`);
      mkdirSync(work);
      const { prompt, firstLine } = fileToRead(work, `Gemini CLI on ${model}`);
      const { result: run, lines } = await logged(() => runAgent(bin('gemini'), ['-m', model, '-p', prompt, '--output-format', 'json'], env, work));
      t.equal(run.code, 0, `gemini exits 0 (stderr: ${run.stderr.slice(-500)})`);
      const out = JSON.parse(run.stdout);
      t.match(out.response, /^The tool returned: /, "the simulator's answer to the tool result is Gemini CLI's response");
      t.ok(out.response.includes(firstLine), `the response carries the first line (${JSON.stringify(out.response)})`);
      t.match(out.stats.tools, { totalFail: 0, byName: { read_file: { success: 1 } } }, 'Gemini CLI read the file with read_file, and no tool failed');
      t.equal(out.stats.models[model]?.api.totalErrors, 0);
      const calls = lines.filter((l) => l.path === `/v1beta/models/${model}:streamGenerateContent`);
      t.ok(calls.length >= 2, 'a tool call and the answer to its result');
      t.ok(calls.every((l) => l.status === 200), 'every request succeeded');
    });
  }

  t.test('sim-chat drops the topK Gemini CLI always sends, and notes it', async (t) => {
    t.equal(await noted('sim-chat', /topK/), 'dropped parameters: generationConfig.topK');
  });
});

t.test('Claude Code', async (t) => {
  const why = await unavailable('claude');
  if (why) return t.plan(0, `Claude Code cannot run here: ${why}`);

  // As in docs/clients.md: the base URL without /v1, a Sluice key, a model, and no
  // traffic to the vendor. The default tools and `--tools Read` both offer a deferred
  // (`defer_loading`) placeholder the simulator must not call; with `--tools Read` it comes first.
  // The file sits in the working folder, which Claude Code may read without asking.
  const home = join(scratch, 'claude');
  mkdirSync(home);
  const env = {
    HOME: home,
    ANTHROPIC_BASE_URL: gw.url,
    ANTHROPIC_API_KEY: gw.key,
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1',
  };
  const runs: [model: string, tools: string[]][] = [
    ['sim-messages', []],
    ['sim-messages', ['--tools', 'Read']],
    ['sim-chat', []],
    ['sim-gemini', []],
  ];
  for (const [model, tools] of runs) {
    const offered = tools.length > 0 ? `with ${tools.join(' ')}` : 'default tools';
    t.test(`on ${model}, ${offered}`, async (t) => {
      const work = mkdtempSync(join(home, `work-${model}-`));
      const { prompt, firstLine } = fileToRead(work, `Claude Code on ${model}, ${offered}`);
      // stream-json shows every message, so the tool_result Claude Code sent back can be checked.
      const args = ['-p', prompt, '--output-format', 'stream-json', '--verbose', ...tools];
      const { result: run, lines } = await logged(() => runAgent(bin('claude'), args, { ...env, ANTHROPIC_MODEL: model }, work));
      t.equal(run.code, 0, `claude exits 0 (stderr: ${run.stderr.slice(-500)})`);
      const messages = jsonLines(run.stdout);
      const blocks = (type: string) => messages.flatMap((m) => (Array.isArray(m.message?.content) ? m.message.content : [])).filter((b) => b.type === type);
      const uses = blocks('tool_use').map((b) => [b.name, b.input]);
      t.same(uses, [['Read', { file_path: join(work, 'notes.txt') }]], 'the simulator called Read with the path, and only the path');
      const results = blocks('tool_result');
      t.equal(results.length, 1, 'Claude Code sent one tool result back');
      for (const r of results) {
        t.notOk(r.is_error, `the tool result is no error (${JSON.stringify(r.content).slice(0, 300)})`);
        t.ok(JSON.stringify(r.content).includes(firstLine), 'the tool result holds the file');
      }
      const out = messages.find((m) => m.type === 'result');
      t.match(out, { subtype: 'success', is_error: false, num_turns: 2 }, 'a tool call, then the answer to its result');
      t.match(out?.result, /^The tool returned: /, "the simulator's answer to the tool result is Claude Code's result");
      t.ok(out?.result.includes(firstLine), `the result carries the first line (${JSON.stringify(out?.result)})`);
      t.ok(out?.usage.input_tokens > 0 && out?.usage.output_tokens > 0, 'Claude Code read the usage');
      const calls = lines.filter((l) => l.path === '/v1/messages' && l.model === model);
      t.ok(calls.length >= 2, 'both turns went through /v1/messages');
      t.ok(calls.every((l) => l.status === 200), 'every request succeeded');
    });
  }
});
