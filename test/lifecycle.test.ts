/**
 * Sluice as a user runs it: the CLI on a data dir, `serve` as its own process, config errors,
 * and a graceful shutdown that lets a stream finish and loses no usage.
 */
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import OpenAI from 'openai';
import t from 'tap';
import { requireStoreData } from '../src/boot.js';
import { loadConfig } from '../src/config/load.js';
import { childEnv, distRoot, runCommand, watchProcess } from './helpers.js';

// Four gateway starts and a dozen CLI processes: close to a minute of CPU, so far more than tap's
// default 60 s on two busy cores. Waits follow readiness; this bounds only a hang.
t.setTimeout(480_000);

const run = runCommand;
const main = join(distRoot, 'src/main.js');
const dataDir = mkdtempSync(join(tmpdir(), 'sluice-life-'));
t.teardown(() => rmSync(dataDir, { recursive: true, force: true }));
const env = childEnv({ SLUICE_DATA_DIR: dataDir, SLUICE_LOG_LEVEL: 'warn' });
const cli = async (...args: string[]) => JSON.parse((await run(process.execPath, [main, ...args], { env })).stdout);

t.test('config errors name the key and the problem', async (t) => {
  const file = join(dataDir, 'bad.yaml');
  const load = (yaml: string, extraEnv: Record<string, string> = {}) => {
    writeFileSync(file, yaml);
    return () => loadConfig({ path: file, env: extraEnv });
  };
  t.throws(load('server: { port: "eighty" }'), { message: /\/server\/port: must be integer/ });
  t.throws(load('upstreams: { a: { kind: openai-chat } }\nmodels: [{ id: m }]'), { message: /\/models\/0: missing key "upstream"/ });
  t.throws(load('upstreams: { a: { kind: simulator } }\nmodels: [{ id: m, upstream: b }]'), { message: /models\[0\]\.upstream: no upstream named "b"/ });
  t.throws(load('bogus: 1'), { message: /unknown key "bogus"/ });
  t.throws(load('upstreams: { a: { kind: openai-chat, apiKey: "${NOPE_NOT_SET}" } }'), { message: /environment variable NOPE_NOT_SET is not set/ });
  const ok = load('upstreams: { a: { kind: openai-chat, baseUrl: "${BASE:-http://127.0.0.1:9/v1}", apiKey: "${KEY}" } }\nmodels: [{ id: m, upstream: a }]', { KEY: 'k1' })();
  t.equal(ok.upstreams.a!.apiKey, 'k1');
  t.equal(ok.upstreams.a!.baseUrl, 'http://127.0.0.1:9/v1');
  t.match(ok.models[0]!.features, { tools: true, jsonSchema: true, vision: true, temperature: true, reasoning: true, streamUsage: true, serverTools: [] });
});

t.test('a bad config file stops start-up with a readable message', async (t) => {
  const file = join(dataDir, 'broken.yaml');
  writeFileSync(file, 'models: [{ id: m, upstream: nowhere }]\nupstreams: { a: { kind: simulator } }\n');
  const err = await run(process.execPath, [main, 'serve', '--config', file], { env }).catch((e) => e);
  t.equal(err.code, 1);
  t.match(err.stderr, /invalid configuration: .*models\[0\]\.upstream: no upstream named "nowhere"/);
});

t.test('before the first start, the CLI refuses the data dir instead of making an empty one', async (t) => {
  const missing = join(dataDir, 'nodir', 'sub');
  const refused = (args: string[], dir: string) => run(process.execPath, [main, ...args], { env: { ...env, SLUICE_DATA_DIR: dir } }).then(() => ({ code: 0, stderr: '' }), (e: { code: number; stderr: string }) => e);
  const nowhere = await refused(['keys', 'list'], missing);
  t.equal(nowhere.code, 1);
  t.equal(nowhere.stderr, `sluice: no Sluice data in ${missing}: start the gateway once (\`npm start\`) or set SLUICE_DATA_DIR / --config to the gateway's\n`, 'one line: the dir and what to do');
  t.notOk(existsSync(join(dataDir, 'nodir')), 'the dir is not made');
  const empty = await refused(['groups', 'create', 'early', '--models', '*', '--families', 'chat'], dataDir);
  t.equal(empty.code, 1);
  t.match(empty.stderr, /^sluice: no Sluice data in /);
  t.same(readdirSync(dataDir).filter((f) => f.startsWith('sluice.db')), [], 'no database made, so the first start below still makes the demo key');
  // A PostgreSQL store keeps nothing in the data dir: nothing there is no reason to refuse.
  t.doesNotThrow(() => requireStoreData({ dataDir: missing, store: { kind: 'postgres', url: 'postgres://127.0.0.1:1/sluice', poolSize: 1 } }));
});

let demoKey = '';

t.test('serve: first start prints the admin token and a demo key once; graceful shutdown', async (t) => {
  const child = spawn(process.execPath, [main, 'serve'], { env: { ...env, SLUICE_PORT: '0', SLUICE_LOG_LEVEL: 'info' }, stdio: ['ignore', 'pipe', 'pipe'] });
  t.teardown(() => void (child.exitCode === null && child.kill('SIGKILL')));
  const watched = watchProcess(child);
  const port = Number((await watched.waitFor(/"url":"http:\/\/127\.0\.0\.1:(\d+)"/, 'the gateway\'s listening line'))[1]);
  let out = watched.stdout();
  t.match(out, `Sluice listening on http://127.0.0.1:${port} (data in ${dataDir})`);
  t.match(out, `console:     http://127.0.0.1:${port}/console`);
  t.match(out, `admin token: sluice-admin-`);
  demoKey = /demo key[^:]*: (sk-\S+)/.exec(out)![1]!;
  t.equal(statSync(join(dataDir, 'admin-token')).mode & 0o777, 0o600, 'the admin token file is private');

  const health = await fetch(`http://127.0.0.1:${port}/healthz`);
  t.same(await health.json(), { status: 'ok' });

  // A slow stream is in flight when SIGTERM arrives: it must finish, and its usage must be kept.
  const openai = new OpenAI({ apiKey: demoKey, baseURL: `http://127.0.0.1:${port}/v1`, maxRetries: 0 });
  const stream = await openai.chat.completions.create({ model: 'sim-chat', messages: [{ role: 'user', content: 'slow [[sim tokens=30 tps=60]]' }], stream: true });
  let chunks = 0;
  let finish: string | null | undefined;
  for await (const chunk of stream) {
    if (++chunks === 2) child.kill('SIGTERM');
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  t.equal(finish, 'stop', 'the in-flight stream finished');
  t.equal(await watched.exited, 0, 'exit code 0');
  out = watched.stdout();
  t.equal(out.split(demoKey).length, 2, 'the demo key is printed exactly once');

  const usage = await cli('usage');
  t.equal(usage.totals.requests, 1, 'the usage record was flushed on shutdown');
  t.match(usage.records[0], { model: 'sim-chat', completionTokens: 30, outcome: 'finished', streamed: true });
});

/** Starts `serve` with extra environment, stops it once it listens, and returns all it printed. */
async function startOutput(extraEnv: Record<string, string> = {}): Promise<string> {
  const child = spawn(process.execPath, [main, 'serve'], { env: { ...env, SLUICE_PORT: '0', SLUICE_LOG_LEVEL: 'info', ...extraEnv }, stdio: ['ignore', 'pipe', 'pipe'] });
  t.teardown(() => void (child.exitCode === null && child.kill('SIGKILL')));
  const watched = watchProcess(child);
  await watched.waitFor(/sluice listening/, "the gateway's listening log line");
  child.kill('SIGINT');
  await watched.exited;
  return watched.stdout();
}

t.test('later starts print where to go and where the admin token is, but no secret', async (t) => {
  const adminToken = readFileSync(join(dataDir, 'admin-token'), 'utf8').trim();
  const out = await startOutput();
  t.match(out, /Sluice listening on http:\/\/127\.0\.0\.1:\d+ /);
  t.match(out, /console: +http:\/\/127\.0\.0\.1:\d+\/console/);
  t.match(out, `admin token: in ${join(dataDir, 'admin-token')}`);
  t.notOk(out.includes(adminToken), 'the admin token itself is not printed');
  t.notMatch(out, /demo key|sk-/);

  const fromEnv = await startOutput({ SLUICE_ADMIN_TOKEN: 'an-admin-token-from-the-environment' });
  t.match(fromEnv, 'admin token: from SLUICE_ADMIN_TOKEN');
  t.notMatch(fromEnv, /an-admin-token-from-the-environment/);
});

t.test('CLI: groups and keys on the data dir', async (t) => {
  const group = await cli('groups', 'create', 'team-a', '--models', 'sim-chat', '--families', 'chat');
  t.match(group, { name: 'team-a', models: ['sim-chat'], families: ['chat'] });
  const key = await cli('keys', 'create', '--group', 'team-a', '--name', 'ci-bot');
  t.match(key, { group: 'team-a', name: 'ci-bot', key: /^sk-/ });
  const keys = await cli('keys', 'list');
  t.equal(keys.length, 2);
  t.notOk(JSON.stringify(keys).includes(key.key), 'listing never shows a secret');
  t.match(await cli('keys', 'disable', key.id), { disabled: true });
  t.match(await cli('keys', 'enable', key.id), { disabled: false });

  const badModel = await run(process.execPath, [main, 'groups', 'create', 'x', '--models', 'gpt-9', '--families', 'chat'], { env }).catch((e) => e);
  t.equal(badModel.code, 2);
  t.match(badModel.stderr, /unknown model "gpt-9"/);
  const inUse = await run(process.execPath, [main, 'groups', 'delete', 'team-a'], { env }).catch((e) => e);
  t.match(inUse.stderr, /still has keys/);
  t.match(await cli('keys', 'delete', key.id), { deleted: true });
  t.match(await cli('groups', 'delete', 'team-a'), { deleted: true });
});

t.test('`sluice` is the installed command (npx sluice), and its output is only its own', async (t) => {
  const project = join(distRoot, '..');
  const pkg = JSON.parse(readFileSync(join(project, 'package.json'), 'utf8'));
  const bin = join(project, pkg.bin.sluice);
  t.equal(bin, main, 'package.json bin points at the built CLI');
  t.match(readFileSync(bin, 'utf8'), /^#!\/usr\/bin\/env node\n/, 'with a shebang');
  t.ok(statSync(bin).mode & 0o111, 'executable');
  const csv = (await run(process.execPath, [main, 'usage', '--csv'], { env })).stdout;
  t.match(csv, /^[a-zA-Z]+(,[a-zA-Z]+)+\r\n.*sim-chat/s, 'a CSV header and the recorded request');
  // Run as npx runs it: the bin itself, no npm in between to print a banner. (Running npx here
  // would link this project into npx's cache and run its `prepare` build under the other tests.)
  const direct = await run(bin, ['usage', '--csv'], { env });
  t.equal(direct.stdout, csv, 'the command prints exactly the CSV');
});
