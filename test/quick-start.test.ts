/**
 * The README's Quick start as a newcomer runs it: `npm start` from a fresh clone, where no data
 * directory exists yet, then one request per family with the demo key the banner prints. The
 * gateway runs as its own process with the `start` script's command line (read from package.json)
 * in an empty working directory, with the default worker threads, so `./data` is made by the start.
 */
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { childEnv, distRoot, spawnGateway, startedGateway, watchProcess } from './helpers.js';

// Two worker threads start on a busy machine: readiness is the banner (helpers bound a hang).
t.setTimeout(240_000);

const scratch = mkdtempSync(join(tmpdir(), 'sluice-quick-start-'));
t.teardown(() => rmSync(scratch, { recursive: true, force: true }));

async function post(url: string, headers: Record<string, string>, body: unknown) {
  const res = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) });
  return { status: res.status, body: (await res.json()) as Record<string, any> };
}

t.test('npm start in a fresh clone makes ./data and serves every family', async (t) => {
  const clone = mkdtempSync(join(scratch, 'clone-'));
  // The default worker threads, as a newcomer has them.
  const started = await startedGateway({}, clone);
  t.teardown(() => started.stop());
  const { url } = started;
  const demoKey = started.demoKey!;
  t.match(demoKey, /^sk-/, 'the banner shows the demo key');
  t.match(started.stdout(), /\(data in \.\/data\)/, 'the banner names the data directory');
  t.ok(statSync(join(clone, 'data')).isDirectory(), './data was made');
  t.equal(statSync(join(clone, 'data')).mode & 0o777, 0o700, 'and only its owner may read it');

  const chat = await post(`${url}/v1/chat/completions`, { authorization: `Bearer ${demoKey}` }, { model: 'sim-chat', messages: [{ role: 'user', content: 'Hello!' }] });
  t.equal(chat.status, 200, 'chat completions');
  t.match(chat.body.choices?.[0]?.message?.content, /\S/);

  const responses = await post(`${url}/v1/responses`, { authorization: `Bearer ${demoKey}` }, { model: 'sim-responses', input: 'Hello!' });
  t.equal(responses.status, 200, 'Responses');
  t.equal(responses.body.status, 'completed');

  const gemini = await post(`${url}/v1beta/models/sim-gemini:generateContent`, { 'x-goog-api-key': demoKey }, { contents: [{ role: 'user', parts: [{ text: 'Hello!' }] }] });
  t.equal(gemini.status, 200, 'content generation');
  t.match(gemini.body.candidates?.[0]?.content?.parts?.[0]?.text, /\S/);

  const messages = await post(
    `${url}/v1/messages`,
    { 'x-api-key': demoKey, 'anthropic-version': '2023-06-01' },
    { model: 'sim-messages', max_tokens: 64, messages: [{ role: 'user', content: 'Hello!' }] },
  );
  t.equal(messages.status, 200, 'Messages');
  t.equal(messages.body.type, 'message');
});

t.test('a data directory several levels deep is made with its parents', async (t) => {
  const dataDir = join(scratch, 'deep', 'er', 'data');
  const started = await startedGateway({ SLUICE_DATA_DIR: dataDir, SLUICE_WORKERS: '1' }, scratch);
  t.teardown(() => started.stop());
  t.ok(statSync(join(dataDir, 'sluice.db')).isFile(), 'the store is in it');
  t.ok(statSync(join(dataDir, 'admin-token')).isFile(), 'so is the admin token');
});

t.test('a data directory that cannot be made is refused in one sentence', async (t) => {
  const file = join(scratch, 'a-file');
  writeFileSync(file, 'not a directory');
  const gateway = spawnGateway({ SLUICE_DATA_DIR: join(file, 'data') }, scratch);
  t.equal(await gateway.exited, 1, 'it exits');
  t.match(gateway.stderr(), /^sluice: cannot use the data directory ".*a-file\/data" \(ENOTDIR\): .*SLUICE_DATA_DIR/);
  t.notMatch(gateway.stderr(), /\n\s+at /, 'no stack trace');
});

t.test('npm start under a supervisor: a SIGTERM to npm drains the gateway, which frees its port', async (t) => {
  const dataDir = mkdtempSync(join(scratch, 'npm-start-'));
  // Its own process group, so that a gateway npm left behind is still killed at the end.
  const npm = spawn('npm', ['start'], {
    cwd: join(distRoot, '..'),
    env: childEnv({ SLUICE_DATA_DIR: dataDir, SLUICE_PORT: '0', SLUICE_WORKERS: '1', npm_config_update_notifier: 'false' }),
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: true,
  });
  t.teardown(() => {
    try {
      process.kill(-npm.pid!, 'SIGKILL');
    } catch {
      // The group is gone: everything in it exited.
    }
  });
  const watched = watchProcess(npm);
  const port = Number((await watched.waitFor(/Sluice listening on http:\/\/127\.0\.0\.1:(\d+)/, 'the banner'))[1]);
  const npmExit = once(npm, 'exit');
  // What a supervisor (systemd, a container runtime) signals: npm alone, not its children.
  npm.kill('SIGTERM');
  await npmExit;
  // npm waits for its script; with `exec` the script is the gateway, so it has exited by now.
  const refused = await new Promise<string | undefined>((done) => {
    const socket = connect(port, '127.0.0.1', () => (socket.destroy(), done(undefined)));
    socket.on('error', (err: NodeJS.ErrnoException) => done(err.code));
  });
  t.equal(refused, 'ECONNREFUSED', 'nothing listens on the port once npm has exited');
  if (refused !== 'ECONNREFUSED') return;
  await watched.exited;
  t.match(watched.stdout(), /"msg":"shutdown complete"/, 'the gateway drained and closed');
});
