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
