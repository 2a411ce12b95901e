/**
 * The public plugin API (`src/plugin-api.ts`, exported as `sluice/plugin-api`): the plugins in the
 * tree import nothing else from the core, a plugin written outside the tree, in TypeScript,
 * against the package as an author installs it, compiles and serves, and one that writes the
 * exchange's lifecycle does not compile.
 */
import { execFile } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { promisify } from 'node:util';
import t from 'tap';
import { distRoot, startTestGateway } from './helpers.js';

const root = join(distRoot, '..');

function sources(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const path = join(dir, e.name);
    if (e.isDirectory()) return e.name === 'app' || e.name === 'static' ? [] : sources(path);
    return e.name.endsWith('.ts') ? [path] : [];
  });
}

t.test('plugins in the tree import from the core only through the plugin API', async (t) => {
  const files = sources(join(root, 'plugins'));
  t.ok(files.length > 40, `${files.length} plugin sources read`);
  const reaching: string[] = [];
  for (const file of files) {
    const text = readFileSync(file, 'utf8');
    // Static and dynamic imports, on one line or several.
    for (const m of text.matchAll(/(?:from\s+|import\s*\(\s*)'([^']+)'/g)) {
      const target = m[1]!;
      if (/(^|\/)src\//.test(target) && !target.endsWith('/src/plugin-api.js')) reaching.push(`${relative(root, file)} imports ${target}`);
    }
  }
  t.same(reaching, [], 'no plugin reaches past the plugin API');
});

t.test('a plugin outside the tree, in TypeScript, imports sluice/plugin-api and serves', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sluice-author-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  // What `npm install ../sluice` leaves in an author's project: a link to the package.
  mkdirSync(join(dir, 'node_modules'));
  symlinkSync(root, join(dir, 'node_modules', 'sluice'), 'dir');
  writeFileSync(join(dir, 'package.json'), JSON.stringify({ name: 'tenant-plugin', type: 'module', private: true }));
  writeFileSync(
    join(dir, 'tsconfig.json'),
    JSON.stringify({
      compilerOptions: { module: 'NodeNext', moduleResolution: 'NodeNext', target: 'ES2022', strict: true, skipLibCheck: true, typeRoots: [join(root, 'node_modules', '@types')], types: ['node'] },
      files: ['tenant.ts'],
    }),
  );
  writeFileSync(
    join(dir, 'tenant.ts'),
    `import { definePlugin, GatewayError, type Exchange, type Plugin } from 'sluice/plugin-api';

export default definePlugin(({ options, log }) => {
  const header = String(options.header ?? 'x-tenant');
  const plugin: Plugin = {
    name: 'tenant',
    request(ex: Exchange) {
      const tenant = ex.headers[header];
      if (tenant === 'blocked') return new GatewayError('model_not_permitted', \`Tenant \${tenant} may not call models here.\`);
      ex.responseHeaders = { ...ex.responseHeaders, 'x-served-tenant': tenant ?? 'none' };
    },
    done(ex) {
      log.info({ req: ex.id, tenant: ex.headers[header] ?? null }, 'tenant served');
    },
  };
  return plugin;
});
`,
  );
  // The author's own compile, with the TypeScript the project pins: the API's types must resolve.
  const tsc = join(root, 'node_modules', 'typescript', 'bin', 'tsc');
  const compiled = await promisify(execFile)(process.execPath, [tsc, '-p', join(dir, 'tsconfig.json')]).then(
    () => '',
    (err: { stdout?: string; message: string }) => err.stdout || err.message,
  );
  t.equal(compiled, '', 'the plugin compiles against the package');

  // An HTTP upstream kind names what createHttpUpstream takes by the API's own types.
  writeFileSync(
    join(dir, 'http-kind.ts'),
    `import { createHttpUpstream, definePlugin, type HttpUpstreamKind, type HttpUpstreamOptions, type Timeouts } from 'sluice/plugin-api';
const kind: HttpUpstreamKind = { family: 'chat', authHeaders: (apiKey) => ({ authorization: \`Bearer \${apiKey}\` }) };
const timeouts: Partial<Timeouts> = { firstByteMs: 30_000 };
export default definePlugin((ctx) => {
  ctx.addUpstreamKind('typed', (name, raw) => {
    const options: HttpUpstreamOptions = { baseUrl: String(raw.baseUrl), timeouts };
    return createHttpUpstream(kind, name, { ...options });
  });
  return { name: 'typed' };
});
`,
  );
  writeFileSync(join(dir, 'tsconfig.http-kind.json'), JSON.stringify({ extends: './tsconfig.json', files: ['http-kind.ts'] }));
  const typed = await promisify(execFile)(process.execPath, [tsc, '-p', join(dir, 'tsconfig.http-kind.json'), '--noEmit']).then(
    () => '',
    (err: { stdout?: string; message: string }) => err.stdout || err.message,
  );
  t.equal(typed, '', 'HttpUpstreamKind, HttpUpstreamOptions and Timeouts are exported');

  // The lifecycle is the pipeline's: a plugin that writes how an exchange ended, or ends it, does not compile.
  writeFileSync(
    join(dir, 'meddling.ts'),
    `import { definePlugin } from 'sluice/plugin-api';
export default definePlugin(() => ({
  name: 'meddling',
  request(ex) {
    ex.outcome = 'error';
    ex.status = 200;
    ex.cancel();
  },
}));
`,
  );
  writeFileSync(join(dir, 'tsconfig.meddling.json'), JSON.stringify({ extends: './tsconfig.json', files: ['meddling.ts'] }));
  const meddling = await promisify(execFile)(process.execPath, [tsc, '-p', join(dir, 'tsconfig.meddling.json'), '--noEmit']).then(
    () => '',
    (err: { stdout?: string }) => err.stdout ?? '',
  );
  t.match(meddling, /Cannot assign to 'outcome' because it is a read-only property/, 'outcome is read-only to plugins');
  t.match(meddling, /Cannot assign to 'status' because it is a read-only property/, 'status is read-only to plugins');
  t.match(meddling, /Property 'cancel' does not exist/, 'a plugin cannot end an exchange');

  const gw = await startTestGateway(
    (dataDir) => `dataDir: ${dataDir}
extraPlugins: [{ name: tenant, module: ${join(dir, 'tenant.js')}, options: { header: x-team } }]
upstreams:
  sim: { kind: simulator }
models:
  - { id: m, upstream: sim }
`,
  );
  t.teardown(() => gw.stop());
  const chat = (team: string) =>
    fetch(`${gw.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${gw.key}`, 'content-type': 'application/json', 'x-team': team },
      body: JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'hi' }] }),
    });
  const served = await chat('blue');
  t.equal(served.status, 200);
  t.equal(served.headers.get('x-served-tenant'), 'blue', "the plugin's response header, from its own option");
  t.match(await served.json(), { object: 'chat.completion' });
  t.ok(gw.logs.some((l) => l.msg === 'tenant served' && l.tenant === 'blue'), 'its done phase logged through the gateway logger');
  const refused = await chat('blocked');
  t.equal(refused.status, 403, "the plugin's GatewayError, in the family's shape");
  t.match(await refused.json(), { error: { code: 'model_not_permitted', message: /Tenant blocked may not call models here/ } });
});
