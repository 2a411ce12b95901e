/**
 * The README's Quick start as a newcomer runs it: `npm start` from a fresh clone, where no data
 * directory exists yet, then one request per family with the demo key the banner prints. The
 * gateway runs as its own process with the `start` script's command line (read from package.json)
 * in an empty working directory, with the default worker threads, so `./data` is made by the start.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { distRoot } from './helpers.js';

// Two worker threads start on a busy machine: readiness is the banner, this only bounds a hang.
t.setTimeout(240_000);
const READY_BOUND_MS = 120_000;

const root = join(distRoot, '..');
const scratch = mkdtempSync(join(tmpdir(), 'sluice-quick-start-'));
t.teardown(() => rmSync(scratch, { recursive: true, force: true }));

/** `npm start` without npm: the start script's own arguments, run from `cwd`. */
function startArgs(): string[] {
  const script: string = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')).scripts.start;
  const [node, ...args] = script.split(/\s+/);
  if (node !== 'node') throw new Error(`the start script no longer begins with node: ${script}`);
  return args.map((a) => (a.startsWith('dist/') ? join(root, a) : a));
}

/** The environment a newcomer has: none of Sluice's variables but a free port (8080 may be taken here). */
function cleanEnv(extra: Record<string, string>): NodeJS.ProcessEnv {
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('SLUICE_')));
  return { ...env, SLUICE_PORT: '0', ...extra };
}

interface Started {
  child: ChildProcess;
  url: string;
  demoKey: string;
  stdout: string;
}

/** Starts the gateway and waits for its banner (the URL and the demo key), or for it to exit. */
function start(cwd: string, env: Record<string, string> = {}): Promise<Started | { exitCode: number | null; stderr: string }> {
  const child = spawn(process.execPath, startArgs(), { cwd, env: cleanEnv(env), stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  return new Promise((resolve, reject) => {
    const bound = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`no banner after ${READY_BOUND_MS} ms; stdout: ${stdout} stderr: ${stderr.slice(-2000)}`));
    }, READY_BOUND_MS);
    child.stdout.on('data', (d) => {
      stdout += d;
      const url = /Sluice listening on (http:\/\/\S+)/.exec(stdout)?.[1];
      const demoKey = /demo key \(group "default", shown only now\): (\S+)/.exec(stdout)?.[1];
      if (url && demoKey) {
        clearTimeout(bound);
        resolve({ child, url, demoKey, stdout });
      }
    });
    child.stderr.on('data', (d) => (stderr += d));
    child.on('exit', (exitCode) => {
      clearTimeout(bound);
      resolve({ exitCode, stderr });
    });
  });
}

function stop(child: ChildProcess): Promise<void> {
  return new Promise((resolve) => {
    if (child.exitCode !== null) return resolve();
    child.once('exit', () => resolve());
    child.kill('SIGTERM');
  });
}

async function post(url: string, headers: Record<string, string>, body: unknown) {
  const res = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) });
  return { status: res.status, body: (await res.json()) as Record<string, any> };
}

t.test('npm start in a fresh clone makes ./data and serves every family', async (t) => {
  const clone = mkdtempSync(join(scratch, 'clone-'));
  const started = await start(clone);
  if (!('child' in started)) return t.fail(`the gateway exited ${started.exitCode}: ${started.stderr}`);
  t.teardown(() => stop(started.child));
  const { url, demoKey } = started;
  t.match(started.stdout, /\(data in \.\/data\)/, 'the banner names the data directory');
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
  const started = await start(scratch, { SLUICE_DATA_DIR: dataDir, SLUICE_WORKERS: '1' });
  if (!('child' in started)) return t.fail(`the gateway exited ${started.exitCode}: ${started.stderr}`);
  t.teardown(() => stop(started.child));
  t.ok(statSync(join(dataDir, 'sluice.db')).isFile(), 'the store is in it');
  t.ok(statSync(join(dataDir, 'admin-token')).isFile(), 'so is the admin token');
});

t.test('a data directory that cannot be made is refused in one sentence', async (t) => {
  const file = join(scratch, 'a-file');
  writeFileSync(file, 'not a directory');
  const started = await start(scratch, { SLUICE_DATA_DIR: join(file, 'data') });
  if ('child' in started) {
    await stop(started.child);
    return t.fail('the gateway started on a data directory inside a file');
  }
  t.equal(started.exitCode, 1);
  t.match(started.stderr, /^sluice: cannot use the data directory ".*a-file\/data" \(ENOTDIR\): .*SLUICE_DATA_DIR/);
  t.notMatch(started.stderr, /\n\s+at /, 'no stack trace');
});
