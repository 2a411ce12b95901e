/** A config mistake is told as the one thing to fix, not as every branch the schema could have taken. */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { loadConfig } from '../src/config/load.js';
import { startTestGateway } from './helpers.js';

const dir = mkdtempSync(join(tmpdir(), 'sluice-config-errors-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));

/** The problems loadConfig reports for `yaml`, one per line. */
function problems(yaml: string): string[] {
  const file = join(dir, 'sluice.yaml');
  writeFileSync(file, yaml);
  try {
    loadConfig({ path: file, env: {} });
  } catch (err) {
    return (err as Error).message.split('\n').slice(1).map((l) => l.trim());
  }
  return [];
}

t.test('a Redis limiter without a fail mode: just that', async (t) => {
  t.same(problems('limiter: { kind: redis, url: "redis://127.0.0.1:6379" }\n'), ['/limiter: missing key "failMode"']);
});

t.test('a PostgreSQL store without a URL: just that', async (t) => {
  t.same(problems('store: { kind: postgres }\n'), ['/store: missing key "url"']);
});

t.test('an unknown kind names the kinds there are', async (t) => {
  t.same(problems('limiter: { kind: memcache }\n'), ['/limiter/kind: "memcache" is not one of "memory", "redis"']);
  t.same(problems('store: { url: "postgres://x" }\n'), ['/store: missing key "kind"']);
});

t.test('a key that belongs to the other kind is named as unknown', async (t) => {
  t.same(problems('limiter: { kind: memory, failMode: open }\n'), ['/limiter: unknown key "failMode"']);
});

t.test('valid sections still load', async (t) => {
  t.same(problems('limiter: { kind: redis, url: "redis://127.0.0.1:6379", failMode: closed }\nstore: { kind: sqlite }\n'), []);
});

/** The whole message loadConfig throws for `yaml` ('' when it loads). */
function message(yaml: string, env: NodeJS.ProcessEnv = {}): string {
  const file = join(dir, 'sluice.yaml');
  writeFileSync(file, yaml);
  try {
    loadConfig({ path: file, env });
  } catch (err) {
    return (err as Error).message.replace(file, 'FILE');
  }
  return '';
}

t.test('a YAML syntax error names the file, line and column, never the text of the line', async (t) => {
  const secret = 'sk-UPSTREAM-SECRET-0123456789';
  t.equal(
    message(`upstreams:\n  oa: { kind: openai-chat, baseUrl: "http://127.0.0.1:1/v1", apiKey: ${secret}\nmodels: [ { id: m, upstream: oa } ]\n`),
    'FILE: not valid YAML at line 3, column 1: Flow map in block collection must be sufficiently indented and end with a }',
  );
  // The parser quotes a token after a colon ("Not a YAML token: …", "… in YAML stream: \"…\"").
  for (const broken of [`apiKey: | ${secret}\n  x\n`, `server: { port: 1, apiKey: ${secret} } }\n`, `a: "${secret}\n`, `a: !${secret} x\nb: *${secret}\n`, `---\na: ${secret}\n---\nb: 1\n`]) {
    const said = message(broken);
    t.match(said, /^FILE: not valid YAML( at line \d+, column \d+)?: \S/, JSON.stringify(broken));
    t.notMatch(said, /SECRET/, `${JSON.stringify(broken)}: ${said}`);
  }
});

/** The message a gateway start on `yaml` fails with (undefined when it starts). */
const startError = (yaml: string) =>
  startTestGateway((dataDir) => `dataDir: ${dataDir}\n${yaml}`).then(
    async (gw) => void (await gw.stop()),
    (err: Error) => err.message,
  );

t.test('a family in a model\'s families that no plugin loaded (a typo) refuses the start', async (t) => {
  t.equal(
    await startError('upstreams:\n  sim: { kind: simulator }\nmodels:\n  - { id: m, upstream: sim, families: [chat, gemni] }\n'),
    'models.m.families: "gemni" is not a loaded family (loaded: chat, responses, gemini, messages)',
  );
  t.equal(await startError('upstreams:\n  sim: { kind: simulator }\nmodels:\n  - { id: m, upstream: sim, families: [chat, gemini] }\n'), undefined, 'loaded families start');
});

t.test('an upstream whose family no loaded plugin reads refuses the start, naming the plugin to add', async (t) => {
  t.equal(
    await startError('plugins: [auth, grant, codecs/chat, upstreams/simulator]\nupstreams:\n  sim: { kind: simulator, family: gemini }\nmodels:\n  - { id: m, upstream: sim }\n'),
    'upstreams.sim speaks the gemini family, but no loaded plugin reads its answers: add codecs/gemini to plugins',
  );
});

t.test('an empty config file is refused, not run as the built-in simulator', async (t) => {
  for (const empty of ['', '\n', '# nothing yet\n', '---\n']) {
    t.equal(message(empty), 'the config file FILE is empty: give it its settings (docs/configuration.md), or start without a config file for the built-in simulator', JSON.stringify(empty));
  }
});

t.test('a value outside an enum names the values there are', async (t) => {
  t.same(problems('log: { level: verbose }\n'), ['/log/level: must be one of "fatal", "error", "warn", "info", "debug", "trace", "silent"']);
  t.same(problems('upstreams: { sim: { kind: simulator } }\nmodels: [{ id: m, upstream: sim, strategy: fastest }]\n'), ['/models/0/strategy: must be one of "weighted", "least-latency", "least-busy"']);
});

t.test('SLUICE_LOG_LEVEL is checked as log.level is', async (t) => {
  t.equal(message('log: { level: info }\n', { SLUICE_LOG_LEVEL: 'verbose' }), 'SLUICE_LOG_LEVEL: "verbose" is not a log level (fatal, error, warn, info, debug, trace, silent)');
  t.equal(message('log: { level: info }\n', { SLUICE_LOG_LEVEL: 'debug' }), '', 'a level loads');
});

t.test('an unknown plugin name lists the plugins there are', async (t) => {
  t.match(
    await startError('extraPlugins: [nosuch-plugin]\nupstreams:\n  sim: { kind: simulator }\nmodels:\n  - { id: m, upstream: sim }\n'),
    /^plugins: there is no plugin "nosuch-plugin" \(there are: access-log, auth, codecs\/chat, .*, upstreams\/simulator, usage\); one of your own is \{ name: nosuch-plugin, module: \.\/its-file\.js \}$/,
  );
});

t.test('a missing environment variable names the file, where, and the two ways out', async (t) => {
  t.equal(
    message('upstreams:\n  oa: { kind: openai-chat, baseUrl: "http://127.0.0.1:1/v1", apiKey: "${UNSET_KEY}" }\n'),
    'FILE: /upstreams/oa/apiKey: environment variable UNSET_KEY is not set: export UNSET_KEY=… before starting, or write ${UNSET_KEY:-default} for a default',
  );
});

t.test('a placeholder left unquoted inside { … } is told to be quoted', async (t) => {
  t.equal(message('server: { port: ${PORT:-9900}, workers: 1 }\n'), 'FILE: not valid YAML at line 1, column 18: Unexpected flow-map-start at node end (inside { … } or [ … ], quote a placeholder: "${NAME}")');
  t.equal(message('server: { port: "${PORT:-9900}", workers: 1 }\n'), '', 'quoted, it loads, as a number');
});
