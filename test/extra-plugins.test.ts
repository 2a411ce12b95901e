/**
 * `extraPlugins` adds plugins after the list (the default one, or `plugins`) instead of replacing
 * it, so a plugin of one's own does not mean copying the default list out of
 * src/config/defaults.ts; a plugin listed twice is refused with where it was listed. A plugin that
 * fails at boot is named in the message, and so is one that takes over another's upstream kind.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { loadConfig } from '../src/config/load.js';
import { defaultPlugins } from '../src/config/defaults.js';
import { startTestGateway } from './helpers.js';

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

/** The message a gateway start fails with when `source` is an extra plugin's module (undefined when it starts). */
async function bootError(source: string, upstream = '{ kind: simulator }'): Promise<string | undefined> {
  // .mjs: ES modules whatever package.json lies above the temporary folder (a .js there is
  // CommonJS or ESM by the nearest one, and a full CI run once read these as CommonJS).
  const module = join(dir, `plugin-${Math.random().toString(36).slice(2)}.mjs`);
  writeFileSync(module, source);
  return startTestGateway((dataDir) => `dataDir: ${dataDir}\nextraPlugins: [{ name: mine, module: ${JSON.stringify(module)} }]\nupstreams:\n  up: ${upstream}\nmodels:\n  - { id: m, upstream: up }\n`).then(
    async (gw) => void (await gw.stop()),
    (err: Error) => err.message.replace(module, 'MODULE'),
  );
}

t.test('a module without a factory as its default export is named, with what to export', async (t) => {
  for (const source of ['export const x = 1;\n', 'export default { name: "obj" };\n']) {
    t.equal(await bootError(source), 'plugins: "mine" (MODULE) must export default definePlugin(...)', source);
  }
});

t.test('a plugin whose factory throws is named', async (t) => {
  t.equal(await bootError('export default () => { throw new Error("boom from my plugin"); };\n'), 'plugins: "mine" failed at boot: boom from my plugin');
});

t.test('an upstream kind whose factory throws names the upstream and its kind', async (t) => {
  const kind = 'export default (ctx) => { ctx.addUpstreamKind("mine", () => { throw new Error("no token given"); }); return { name: "mine" }; };\n';
  t.equal(await bootError(kind, '{ kind: mine }'), 'upstreams.up (kind mine): no token given');
  t.equal(await bootError('export default () => ({ name: "mine" });\n', '{ kind: simulator, family: gemni }'), "upstreams.up.family: must be 'chat', 'responses', 'gemini' or 'messages'", 'a kind\'s own check keeps its words');
});

t.test('a plugin adding an upstream kind that exists is refused, as a family or dialect added twice is', async (t) => {
  const hijack = 'export default (ctx) => { ctx.addUpstreamKind("simulator", (name) => ({ name, family: "chat", send() { throw new Error("hijacked"); } })); return { name: "mine" }; };\n';
  t.equal(await bootError(hijack), 'plugins: the upstream kind simulator is added twice (by "mine")');
});
