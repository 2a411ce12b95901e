/**
 * The out-of-tree example (`examples/plugins/`) against the package as it ships: `npm pack` makes
 * the tarball, it is unpacked into a scratch project's node_modules the way `npm install` places
 * it, the example compiles against the packed types, and the packed gateway serves with the
 * example's upstream kind and policy plugin loaded from its own config.
 *
 * One shortcut: npm would fetch the package's dependencies; the scratch project borrows the
 * checkout's (already installed, natively built) instead, so the test needs no registry and no
 * compiler. Everything of Sluice's own comes from the tarball.
 */
import { execFile, spawn } from 'node:child_process';
import { cpSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { createServer, type IncomingHttpHeaders } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import t from 'tap';
import { childEnv, distRoot, eventually, watchProcess } from './helpers.js';

const root = join(distRoot, '..');
const run = promisify(execFile);

interface UpstreamCall {
  path: string;
  headers: IncomingHttpHeaders;
  body: { model?: string; stream?: boolean };
}

/** The provider the example's upstream kind calls: records each request, answers like OpenAI. */
async function recordingProvider(): Promise<{ url: string; calls: UpstreamCall[]; close(): void }> {
  const calls: UpstreamCall[] = [];
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c)).on('end', () => {
      const body = JSON.parse(Buffer.concat(chunks).toString() || '{}') as UpstreamCall['body'];
      calls.push({ path: req.url ?? '', headers: req.headers, body });
      if (req.url !== '/accounts/acme/ai/v1/chat/completions') {
        res.writeHead(404, { 'content-type': 'application/json' }).end('{"error":{"message":"no such route"}}');
        return;
      }
      const usage = { prompt_tokens: 5, completion_tokens: 2, total_tokens: 7 };
      if (body.stream) {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        const chunk = (delta: object, finish: string | null) =>
          `data: ${JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', created: 1, model: body.model, choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;
        res.end(chunk({ role: 'assistant', content: 'Hello' }, null) + chunk({ content: ' there' }, 'stop') +
          `data: ${JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', created: 1, model: body.model, choices: [], usage })}\n\ndata: [DONE]\n\n`);
        return;
      }
      res.writeHead(200, { 'content-type': 'application/json' }).end(
        JSON.stringify({
          id: 'c1', object: 'chat.completion', created: 1, model: body.model,
          choices: [{ index: 0, message: { role: 'assistant', content: 'Hello there' }, finish_reason: 'stop' }],
          usage,
        }),
      );
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, calls, close: () => server.close() };
}

t.test('the example plugins, built against the packed package, serve through the packed gateway', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sluice-pack-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));

  // The tarball, as `npm publish` would upload it (the build already ran: the suite tests dist/).
  const packed = await run('npm', ['pack', '--ignore-scripts', '--json', '--pack-destination', dir], { cwd: root });
  const [info] = JSON.parse(packed.stdout) as { filename: string; files: { path: string }[] }[];
  const files = info!.files.map((f) => f.path);
  t.ok(files.includes('dist/src/plugin-api.d.ts'), 'the plugin API ships with its types');
  t.ok(files.includes('dist/plugins/codecs/chat/index.js') && files.includes('plugins/console/static/index.html'), 'the in-tree plugins and the console ship');
  t.notOk(files.some((f) => f.startsWith('dist/test/') || f.startsWith('dist/bench/') || f.endsWith('.map') || f.startsWith('src/')), 'no tests, benches, maps or sources');

  // The author's project: the example, with the package placed where `npm install sluice-….tgz` puts it.
  const app = join(dir, 'app');
  cpSync(join(root, 'examples', 'plugins'), app, { recursive: true, filter: (src) => !/[/\\](node_modules|dist|data)$/.test(src) });
  const installed = join(app, 'node_modules', 'sluice');
  mkdirSync(installed, { recursive: true });
  await run('tar', ['-xzf', join(dir, info!.filename), '-C', installed, '--strip-components=1']);
  symlinkSync(join(root, 'node_modules'), join(installed, 'node_modules'), 'dir');
  symlinkSync(join(root, 'node_modules', '@types'), join(app, 'node_modules', '@types'), 'dir');

  // `npm run build` in the example: its own tsconfig, the TypeScript the project pins.
  const tsc = join(root, 'node_modules', 'typescript', 'bin', 'tsc');
  const compiled = await run(process.execPath, [tsc, '-p', join(app, 'tsconfig.json')]).then(
    () => '',
    (err: { stdout?: string; message: string }) => err.stdout || err.message,
  );
  t.equal(compiled, '', 'the example compiles against the packed types');
  const imports = ['account-openai.ts', 'team-policy.ts'].flatMap((f) =>
    [...readFileSync(join(app, 'src', f), 'utf8').matchAll(/from\s+'([^']+)'/g)].map((m) => m[1]),
  );
  t.same([...new Set(imports)], ['sluice/plugin-api'], 'the example imports nothing but sluice/plugin-api');

  const provider = await recordingProvider();
  t.teardown(() => provider.close());
  // The example's own config, pointed at the recording provider, with one more model to refuse.
  const config = readFileSync(join(app, 'sluice.yaml'), 'utf8').replace('https://api.example.com', provider.url) +
    '  - { id: other, upstream: provider }\n';
  writeFileSync(join(app, 'sluice.yaml'), config);

  // `npx sluice serve --config sluice.yaml`, from the packed copy.
  const child = spawn(process.execPath, [join(installed, 'dist', 'src', 'main.js'), 'serve', '--config', 'sluice.yaml'], {
    cwd: app,
    env: { ...childEnv(), SLUICE_PORT: '0', SLUICE_ADMIN_TOKEN: 'example-admin-token', PROVIDER_API_KEY: 'sk-provider' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const gateway = watchProcess(child);
  t.teardown(async () => {
    child.kill('SIGTERM');
    await gateway.exited;
  });
  const [, url] = await gateway.waitFor(/Sluice listening on (http:\/\/\S+)/, 'the banner');
  const admin = (path: string, body: object) =>
    fetch(`${url}${path}`, {
      method: 'POST',
      headers: { authorization: 'Bearer example-admin-token', 'content-type': 'application/json' },
      body: JSON.stringify(body),
    }).then((r) => r.json() as Promise<{ key?: string }>);
  const group = await admin('/admin/groups', { name: 'teams', models: ['*'], families: ['chat', 'messages'] });
  t.match(group, { name: 'teams' }, 'a group from the admin API');
  const { key } = await admin('/admin/keys', { group: 'teams', name: 'example' });
  t.ok(key, 'a key from the admin API');

  const post = (path: string, body: object, headers: Record<string, string>) =>
    fetch(`${url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) });
  const hi = [{ role: 'user', content: 'hi' }];

  const chat = await post('/v1/chat/completions', { model: 'm', messages: hi }, { authorization: `Bearer ${key}`, 'x-team': 'red' });
  t.equal(chat.status, 200);
  t.equal(chat.headers.get('x-team'), 'red', "the policy's response header");
  t.match(await chat.json(), { object: 'chat.completion', choices: [{ message: { content: 'Hello there' } }] });
  const call = provider.calls.at(-1)!;
  t.equal(call.path, '/accounts/acme/ai/v1/chat/completions', "the upstream kind's account path");
  t.equal(call.headers.authorization, 'Bearer sk-provider', 'its key, as a Bearer token');
  t.equal(call.headers['x-account'], 'acme', 'its account header');
  t.equal(call.body.model, 'provider-model-1', "the model's upstream name");

  // Another client family, translated to the chat dialect the kind speaks, streamed.
  const messages = await post(
    '/v1/messages',
    { model: 'm', max_tokens: 50, stream: true, messages: hi },
    { 'x-api-key': key!, 'anthropic-version': '2023-06-01', 'x-team': 'blue' },
  );
  t.equal(messages.status, 200);
  const events = await messages.text();
  t.match(events, /event: content_block_delta[\s\S]*"text":" there"[\s\S]*event: message_stop/, 'a Messages stream, translated from the chat upstream');

  const unknownTeam = await post('/v1/chat/completions', { model: 'm', messages: hi }, { authorization: `Bearer ${key}`, 'x-team': 'green' });
  t.equal(unknownTeam.status, 403);
  t.match(await unknownTeam.json(), { error: { code: 'model_not_permitted', message: /Name your team in the x-team header \(one of: red, blue\)/ } });
  const ungranted = await post('/v1/chat/completions', { model: 'other', messages: hi }, { authorization: `Bearer ${key}`, 'x-team': 'red' });
  t.equal(ungranted.status, 403);
  t.match(await ungranted.json(), { error: { message: /Team red may not use model other; it may use: m\./ } });
  const keyless = await post('/v1/chat/completions', { model: 'm', messages: hi }, { 'x-team': 'red' });
  t.equal(keyless.status, 401, "Sluice's own auth still runs first");

  // Both served exchanges and the refused one were logged; the refused team (green) was never known.
  const usageLines = await eventually(() => {
    const lines = gateway.stdout().split('\n').filter((l) => l.includes('"team usage"'));
    return lines.length >= 3 && lines.map((l) => JSON.parse(l) as Record<string, unknown>);
  }, 'the policy plugin logging in its done phase');
  t.match(usageLines.find((l) => l.team === 'red' && l.model === 'm'), { outcome: 'finished', input: 5, output: 2 }, 'the done phase read the finished exchange');
  t.match(usageLines.find((l) => l.team === 'blue'), { model: 'm', outcome: 'finished' });
  t.match(usageLines.find((l) => l.model === 'other'), { team: 'red', outcome: 'error' });
});
