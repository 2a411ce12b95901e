/**
 * `extraPlugins` adds plugins after the list (the default one, or `plugins`) instead of replacing
 * it, so a plugin of one's own does not mean copying the default list out of
 * src/config/defaults.ts; a plugin listed twice is refused with where it was listed.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { loadConfig } from '../src/config/load.js';
import { defaultPlugins } from '../src/config/defaults.js';

const dir = mkdtempSync(join(tmpdir(), 'sluice-extra-plugins-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));

function load(yaml: string) {
  const file = join(dir, 'sluice.yaml');
  writeFileSync(file, yaml);
  return loadConfig({ path: file, env: {} });
}
const names = (yaml: string) => load(yaml).plugins.map((p) => p.name);

t.test('extraPlugins comes after the default list, its module relative to the config file', async (t) => {
  const config = load('extraPlugins:\n  - { name: tenant, module: ./tenant.js, options: { header: x-team } }\n');
  t.same(
    config.plugins.map((p) => p.name),
    [...defaultPlugins, 'tenant'],
  );
  t.same(config.plugins.at(-1), { name: 'tenant', options: { header: 'x-team' }, module: join(dir, 'tenant.js') });
});

t.test('extraPlugins comes after an explicit plugins list too', async (t) => {
  t.same(names('plugins: [auth, grant, codecs/chat, upstreams/simulator]\nextraPlugins: [metrics]\n'), ['auth', 'grant', 'codecs/chat', 'upstreams/simulator', 'metrics']);
});

t.test('a plugin listed twice is refused, naming where', async (t) => {
  t.throws(() => load('extraPlugins: [metrics]\n'), /plugin "metrics" is listed twice, in the default plugin list and extraPlugins \(which adds to it\): list it once/);
  t.throws(() => load('plugins: [auth, auth]\n'), /plugin "auth" is listed twice, in plugins: list it once/);
  t.throws(() => load('extraPlugins: [{ name: x, module: ./x.js }, { name: x, module: ./y.js }]\n'), /plugin "x" is listed twice, in extraPlugins: list it once/);
});

t.test('an extraPlugins entry of the wrong shape is told as such', async (t) => {
  t.throws(() => load('extraPlugins: [{ module: ./x.js }]\n'), /extraPlugins/);
});
