/**
 * Config reload without a restart: `POST /admin/reload` and `SIGHUP` apply a changed file to new
 * requests while a stream under way finishes on what it started with; a bad file is refused with
 * the start-up message and the running config stays.
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import OpenAI from 'openai';
import t from 'tap';
import { childEnv, distRoot, eventually, runCommand, startStack, watchProcess } from './helpers.js';

// Five failed starts and one gateway process, each start seconds of CPU, beside reloads and
// streams: more than tap's default 60 s on two busy cores. Waits follow readiness; this bounds a hang.
t.setTimeout(240_000);

const run = runCommand;
const main = join(distRoot, 'src/main.js');

const { sim, gw } = await startStack(
  (simUrl) => `upstreams:
  old: { kind: openai-chat, baseUrl: "${simUrl}/v1" }
  steady: { kind: openai-chat, baseUrl: "${simUrl}/v1" }
  tuned: { kind: openai-chat, baseUrl: "${simUrl}/v1" }
models:
  - { id: m-one, upstream: old, upstreamModel: first-name }
  - { id: m-gone, upstream: old, upstreamModel: sim-chat }
  - { id: m-steady, upstream: steady, upstreamModel: sim-chat }
  - { id: m-tuned, upstream: tuned, upstreamModel: sim-chat }
`,
);
const configFile = join(gw.dataDir, 'sluice.yaml');
/** Writes the config file as startStack did, with other upstreams and models. */
const writeConfig = (routing: string, server = '{"shutdownTimeoutMs":2000}') =>
  writeFileSync(configFile, `dataDir: ${gw.dataDir}\nserver: ${server}\n${routing}`);
const client = new OpenAI({ apiKey: gw.key, baseURL: `${gw.url}/v1`, maxRetries: 0 });
const ask = (model: string) => client.chat.completions.create({ model, messages: [{ role: 'user', content: 'hi' }] });
/** The model name the upstream was asked for on a call to `model`. */
const upstreamModel = async (model: string) => {
  await ask(model);
  return ((await (await fetch(`${sim.url}/stats`)).json()) as { lastRequest: { model: string } }).lastRequest.model;
};
const reload = () => gw.admin('POST', '/admin/reload');
const closedUpstreams = () => gw.logs.filter((l) => l.msg === 'retired upstream closed').map((l) => l.upstream);

const reloaded = `upstreams:
  steady: { kind: openai-chat, baseUrl: "${sim.url}/v1" }
  tuned: { kind: openai-chat, baseUrl: "${sim.url}/v1", timeouts: { firstByteMs: 4000 } }
  fresh: { kind: openai-chat, baseUrl: "${sim.url}/v1" }
models:
  - { id: m-one, upstream: fresh, upstreamModel: second-name }
  - { id: m-new, upstream: fresh, upstreamModel: sim-chat }
  - { id: m-steady, upstream: steady, upstreamModel: sim-chat }
  - { id: m-tuned, upstream: tuned, upstreamModel: sim-chat }
`;

t.test('POST /admin/reload changes models and upstreams; a stream on a removed upstream finishes', async (t) => {
  t.equal(await upstreamModel('m-one'), 'first-name');

  // A stream on the upstream about to be removed, under way when the reload lands.
  const stream = await client.chat.completions.create({
    model: 'm-gone',
    messages: [{ role: 'user', content: 'slow [[sim tokens=60 tps=30]]' }],
    stream: true,
    stream_options: { include_usage: true },
  });
  const chunks = stream[Symbol.asyncIterator]();
  const first = await chunks.next();
  t.notOk(first.done, 'the stream started');

  writeConfig(reloaded);
  const res = await reload();
  t.equal(res.status, 200);
  t.same(res.body, {
    applied: true,
    changes: {
      upstreams: { added: ['fresh'], removed: ['old'], changed: ['tuned'] },
      models: { added: ['m-new'], removed: ['m-gone'], changed: ['m-one'] },
    },
  });
  t.same(closedUpstreams(), [], 'nothing is closed while the stream still uses its upstream');

  // New requests see the new config at once.
  t.equal(await upstreamModel('m-one'), 'second-name');
  t.equal((await ask('m-new')).choices[0]!.finish_reason, 'stop');
  t.equal((await ask('m-tuned')).choices[0]!.finish_reason, 'stop', 'a replaced upstream serves through its new object');
  const gone = await ask('m-gone').catch((err) => err);
  t.equal(gone.status, 400);
  t.equal(gone.code, 'model_not_found');
  const listed = (await client.models.list()).data.map((m) => m.id);
  t.same(listed.sort(), ['m-new', 'm-one', 'm-steady', 'm-tuned']);
  const admin = (await gw.admin('GET', '/admin/models')).body;
  t.same(admin.data.map((m: { id: string }) => m.id).sort(), ['m-new', 'm-one', 'm-steady', 'm-tuned'], 'the admin API shows the new models');
  t.same(admin.upstreams.map((u: { name: string }) => u.name).sort(), ['fresh', 'steady', 'tuned']);
  t.match(admin.data.find((m: { id: string }) => m.id === 'm-one'), { upstream: 'fresh', upstreamModel: 'second-name' });

  // The stream finishes intact on the routing it began with.
  let tokens: number | undefined;
  let finish: string | null | undefined;
  for (let next = await chunks.next(); !next.done; next = await chunks.next()) {
    finish = next.value.choices[0]?.finish_reason ?? finish;
    tokens = next.value.usage?.completion_tokens ?? tokens;
  }
  t.equal(finish, 'stop', 'the stream on the removed upstream ended normally');
  t.equal(tokens, 60, 'and carried every token');

  // Then the removed and the replaced upstream are closed; the unchanged one is kept.
  await eventually(() => closedUpstreams().length === 2, 'the retired upstreams to close');
  t.same(closedUpstreams().sort(), ['old', 'tuned']);
  t.equal((await ask('m-steady')).choices[0]!.finish_reason, 'stop');

  const audit = (await gw.admin('GET', '/admin/audit?action=config.reload')).body.data;
  t.equal(audit.length, 1, 'the reload is audited');
  t.match(audit[0], { actor: /^admin-token@/, detail: /"added":\["fresh"\]/ });
});

t.test('a bad file is refused with the start-up message and the running config stays', async (t) => {
  const servedBefore = await upstreamModel('m-one');
  const scratch = mkdtempSync(join(tmpdir(), 'sluice-reload-start-'));
  t.teardown(() => rmSync(scratch, { recursive: true, force: true }));
  const cases: Record<string, string> = {
    'YAML error': 'models: [ { id: m-one',
    'schema error': `${reloaded}bogus: 1\n`,
    'unknown upstream kind': reloaded.replace('fresh: { kind: openai-chat', 'fresh: { kind: telepathy'),
    'upstream option error': reloaded.replace(`fresh: { kind: openai-chat, baseUrl: "${sim.url}/v1" }`, 'fresh: { kind: openai-chat, baseUrl: "ftp://nowhere" }'),
    'model on an unknown upstream': reloaded.replace('upstream: fresh, upstreamModel: sim-chat', 'upstream: nowhere'),
  };
  for (const [what, routing] of Object.entries(cases)) {
    writeConfig(routing);
    // What `sluice serve` says about the same file.
    const start = await run(process.execPath, [main, 'serve', '--config', configFile], { env: childEnv({ SLUICE_DATA_DIR: scratch, SLUICE_PORT: '0' }) }).catch((e) => e);
    t.equal(start.code, 1, `${what}: start-up fails`);
    const res = await reload();
    t.equal(res.status, 400, `${what}: refused`);
    t.equal(res.body.error.code, 'invalid_config');
    t.equal(res.body.error.reasons.length, 1);
    t.ok(start.stderr.includes(res.body.error.reasons[0]), `${what}: the start-up message (${res.body.error.reasons[0].split('\n')[0]})`);
    t.equal(await upstreamModel('m-one'), servedBefore, `${what}: the running config still serves`);
  }
  t.ok(
    gw.logs.some((l) => l.msg === 'config reload refused; the running config stays' && l.level === 50),
    'a refused reload is logged as an error',
  );
});

t.test('a YAML syntax error is refused by line and column: the line, and the key on it, are not repeated', async (t) => {
  const secret = 'sk-UPSTREAM-SECRET-reload-0123456789';
  writeConfig(reloaded.replace(`fresh: { kind: openai-chat, baseUrl: "${sim.url}/v1" }`, `fresh: { apiKey: ${secret}, kind: openai-chat, baseUrl: "${sim.url}/v1"`));
  const logged = gw.logs.length;
  const res = await reload();
  t.equal(res.status, 400);
  t.match(res.body.error.reasons, [/: not valid YAML at line 7, column 1: Flow map in block collection must be sufficiently indented and end with a \}$/]);
  t.notMatch(JSON.stringify(res.body), secret, 'not in the answer (the console shows it)');
  const refusal = gw.logs.slice(logged).find((l) => l.msg === 'config reload refused; the running config stays');
  t.ok(refusal, 'the refusal is logged');
  t.notMatch(JSON.stringify(refusal), secret, 'not in the log line');
});

t.test('settings read only at start: a file that changes them is refused, naming each', async (t) => {
  writeConfig(`log: { level: debug }\n${reloaded.replace('second-name', 'third-name')}`, '{"shutdownTimeoutMs":2000,"maxBodyBytes":4096,"websocket":{"enabled":false}}');
  const res = await reload();
  t.equal(res.status, 400);
  t.same(res.body.error.reasons, [
    'server.maxBodyBytes: changes only at restart',
    'server.websocket.enabled: changes only at restart',
    'log.level: changes only at restart',
  ]);
  t.equal(await upstreamModel('m-one'), 'second-name', 'nothing of the file was applied');
});

t.test('the admin token is required, no body is taken, and two reloads at once apply once', async (t) => {
  writeConfig(reloaded.replace('second-name', 'fourth-name'));
  for (const authorization of [undefined, 'Bearer wrong-token-0123456789']) {
    const res = await fetch(`${gw.url}/admin/reload`, { method: 'POST', headers: authorization ? { authorization } : {} });
    t.equal(res.status, 401, `${authorization ? 'a wrong' : 'no'} admin token`);
  }
  t.equal(await upstreamModel('m-one'), 'second-name', 'an unauthorized reload applied nothing');

  const withBody = await gw.admin('POST', '/admin/reload', { models: [] });
  t.equal(withBody.status, 400);
  t.match(withBody.body.error.message, 'takes no body');

  const [a, b] = await Promise.all([reload(), reload()]);
  t.equal(a.status, 200);
  t.equal(b.status, 200);
  const changed = [a, b].map((r) => r.body.changes.models.changed);
  t.same(changed.flat(), ['m-one'], 'one reload applied the change, the other found nothing left to change');
  t.equal(await upstreamModel('m-one'), 'fourth-name');
});

t.test('SIGHUP makes `sluice serve` reload its config file', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sluice-sighup-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const file = join(dir, 'sluice.yaml');
  const config = (models: string) => `upstreams:\n  sim: { kind: simulator }\nmodels:\n${models}`;
  writeFileSync(file, config('  - { id: alpha, upstream: sim }\n'));
  const child = spawn(process.execPath, [main, 'serve'], {
    env: childEnv({ SLUICE_CONFIG: file, SLUICE_DATA_DIR: dir, SLUICE_PORT: '0', SLUICE_LOG_LEVEL: 'info' }),
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  t.teardown(() => void (child.exitCode === null && child.kill('SIGKILL')));
  const watched = watchProcess(child, { echoStderr: true });
  const exited = watched.exited;
  const port = Number((await watched.waitFor(/"url":"http:\/\/127\.0\.0\.1:(\d+)"/, "the gateway's listening line"))[1]);
  const demoKey = /demo key[^:]*: (sk-\S+)/.exec(watched.stdout())![1]!;
  const childClient = new OpenAI({ apiKey: demoKey, baseURL: `http://127.0.0.1:${port}/v1`, maxRetries: 0 });
  const logLines = () => watched.stdout().split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l));

  writeFileSync(file, config('  - { id: alpha, upstream: sim }\n  - { id: beta, upstream: sim, upstreamModel: sim-chat }\n'));
  child.kill('SIGHUP');
  const applied = await eventually(() => logLines().find((l) => l.msg === 'config reloaded'), 'the reload log line');
  t.match(applied, { level: 30, via: 'SIGHUP', changes: { models: { added: ['beta'] } } });
  t.same((await childClient.models.list()).data.map((m) => m.id).sort(), ['alpha', 'beta']);
  const answer = await childClient.chat.completions.create({ model: 'beta', messages: [{ role: 'user', content: 'hi' }] });
  t.match(answer, { model: 'beta', choices: [{ finish_reason: 'stop' }] }, 'the new model answers');
  const adminToken = readFileSync(join(dir, 'admin-token'), 'utf8').trim();
  const audit = (await (await fetch(`http://127.0.0.1:${port}/admin/audit?action=config.reload`, { headers: { authorization: `Bearer ${adminToken}` } })).json()) as { data: unknown[] };
  t.match(audit.data, [{ actor: 'signal:SIGHUP', action: 'config.reload', detail: /beta/ }], 'a reload by signal is audited');

  writeFileSync(file, config('  - { id: gamma, upstream: nowhere }\n'));
  child.kill('SIGHUP');
  const refused = await eventually(() => logLines().find((l) => l.msg === 'config reload refused; the running config stays'), 'the refusal log line');
  t.match(refused, { level: 50, via: 'SIGHUP', reasons: [/models\[0\]\.upstream: no upstream named "nowhere"/] });
  t.same((await childClient.models.list()).data.map((m) => m.id).sort(), ['alpha', 'beta'], 'still serving the last good config');

  child.kill('SIGTERM');
  t.equal(await exited, 0, 'and it still shuts down cleanly');
});
