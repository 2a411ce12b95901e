/** A config mistake is told as the one thing to fix, not as every branch the schema could have taken. */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { loadConfig } from '../src/config/load.js';

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
