/**
 * Real agents against a real gateway on the embedded default models: Codex CLI (Responses over HTTP
 * and WebSocket), Gemini CLI and Claude Code, each run as a new user would run it, offline, on
 * 127.0.0.1 only.
 *
 * The simulator calls the first tool an agent offers, then answers the tool result with text that
 * starts `The tool returned:`. So each run proves the whole agent loop: a tool call, the agent's
 * tool result sent back, and the final text. Codex runs with a read-only sandbox so the sampled
 * command (`sample`) can change nothing even where the sandbox can start.
 */
import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { distRoot, eventually, startTestGateway, type TestGateway } from './helpers.js';

// Real agents start Node and native binaries: slower than the other end-to-end files on a busy machine.
t.setTimeout(150_000);

const bin = (name: string) => join(distRoot, '..', 'node_modules', '.bin', name);
const RUN_TIMEOUT_MS = 45_000;
const PROMPT = 'Say hello in one sentence.';

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
  // As in the README's client section.
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

async function codex(model: string, websocket: boolean, on: TestGateway = gw) {
  const home = codexHome(model, websocket, on.url);
  const work = join(home, 'work');
  mkdirSync(work);
  const args = ['exec', '--skip-git-repo-check', '--sandbox', 'read-only', '--ephemeral', '--json', '-C', work, PROMPT];
  const run = await runAgent(bin('codex'), args, { HOME: home, SLUICE_KEY: on.key, RUST_LOG: 'codex_api=info' }, work);
  const events = run.stdout
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l));
  const answer = events.findLast((e) => e.type === 'item.completed' && e.item?.type === 'agent_message')?.item.text;
  return { run, events, answer };
}

t.test('Codex CLI', async (t) => {
  const why = await unavailable('codex');
  if (why) return t.plan(0, `Codex CLI cannot run here: ${why}`);

  for (const model of ['sim-responses', 'sim-chat']) {
    t.test(`over HTTP on ${model}`, async (t) => {
      const { result, lines } = await logged(() => codex(model, false));
      t.equal(result.run.code, 0, `codex exits 0 (stderr: ${result.run.stderr.slice(-500)})`);
      t.match(result.answer, /^The tool returned: \S/, "the simulator's answer to the tool result is Codex's final message");
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
    t.equal(result.run.code, 0, `codex exits 0 (stderr: ${result.run.stderr.slice(-500)})`);
    t.match(result.answer, /^The tool returned: \S/);
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
    t.equal(result.run.code, 0, `codex exits 0 (stderr: ${result.run.stderr.slice(-500)})`);
    t.match(result.answer, /^The tool returned: \S/);
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
  // As in the README's client section.
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
      const { result: run, lines } = await logged(() => runAgent(bin('gemini'), ['-m', model, '-p', PROMPT, '--output-format', 'json'], env, work));
      t.equal(run.code, 0, `gemini exits 0 (stderr: ${run.stderr.slice(-500)})`);
      const out = JSON.parse(run.stdout);
      t.match(out.response, /^The tool returned: \S/, "the simulator's answer to the tool result is Gemini CLI's response");
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

  // As in the README's client section: the base URL without /v1, a Sluice key, a model, and no
  // traffic to the vendor. `--tools Read` offers one read-only tool for the simulator to call.
  const home = join(scratch, 'claude');
  mkdirSync(home);
  const env = {
    HOME: home,
    ANTHROPIC_BASE_URL: gw.url,
    ANTHROPIC_API_KEY: gw.key,
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1',
  };
  for (const model of ['sim-messages', 'sim-chat', 'sim-gemini']) {
    t.test(`on ${model}`, async (t) => {
      const work = join(home, `work-${model}`);
      mkdirSync(work);
      const args = ['-p', 'Read a file for me.', '--output-format', 'json', '--tools', 'Read'];
      const { result: run, lines } = await logged(() => runAgent(bin('claude'), args, { ...env, ANTHROPIC_MODEL: model }, work));
      t.equal(run.code, 0, `claude exits 0 (stderr: ${run.stderr.slice(-500)})`);
      const out = JSON.parse(run.stdout);
      t.match(out, { subtype: 'success', is_error: false, num_turns: 2 }, 'a tool call, then the answer to its result');
      t.match(out.result, /^The tool returned: \S/, "the simulator's answer to the tool result is Claude Code's result");
      t.ok(out.usage.input_tokens > 0 && out.usage.output_tokens > 0, 'Claude Code read the usage');
      const calls = lines.filter((l) => l.path === '/v1/messages' && l.model === model);
      t.ok(calls.length >= 2, 'both turns went through /v1/messages');
      t.ok(calls.every((l) => l.status === 200), 'every request succeeded');
    });
  }
});
