/**
 * No open gateway by accident: a plugin list without an authenticating plugin is refused at start,
 * unless the config says `allowAnonymous: true`, and then every start says so.
 */
import t from 'tap';
import { startTestGateway } from './helpers.js';

// The list the attack run used: everything but auth.
const withoutAuth = '[grant, limits, codecs/chat, upstreams/simulator, usage, access-log, metrics, console]';
const yaml = (extra: string) => (dataDir: string) => `dataDir: ${dataDir}
plugins: ${withoutAuth}
upstreams:
  sim: { kind: simulator }
models:
  - { id: m, upstream: sim }
  - { id: scarce, upstream: sim, limits: { rpm: 1 } }
${extra}`;

const chat = (url: string, model = 'm') =>
  fetch(`${url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model, messages: [{ role: 'user', content: 'hi' }] }) });

t.test('a plugin list without auth does not start', async (t) => {
  const err = await startTestGateway(yaml('')).then(
    async (gw) => {
      await gw.stop();
      return undefined;
    },
    (e: Error) => e,
  );
  t.ok(err, 'the start failed');
  t.match(err?.message, /no plugin authenticates callers .*Add auth to plugins, or set allowAnonymous: true/);
});

t.test('allowAnonymous: true serves without keys, and says so', async (t) => {
  const gw = await startTestGateway(yaml('allowAnonymous: true\n'));
  t.teardown(() => gw.stop());
  t.ok(
    gw.logs.some((l) => l.level === 40 && /anyone who reaches this port may call every model/.test(String(l.msg))),
    'a warning at start',
  );
  const res = await chat(gw.url);
  t.equal(res.status, 200, 'a keyless call is served, as asked');
  // No caller to count against, but the model's own limits still hold.
  t.equal((await chat(gw.url, 'scarce')).status, 200, 'the first call to a model limited to 1 rpm');
  const limited = await chat(gw.url, 'scarce');
  t.equal(limited.status, 429, "the second one is over the model's rpm");
  t.match(await limited.json(), { error: { code: 'rate_limit_exceeded', message: /model:scarce/ } });
  const session = await fetch(`${gw.url}/admin/session`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ token: gw.adminToken }) });
  t.equal(session.status, 200, 'a console sign-in');
  t.match(((await session.json()) as { warnings: string[] }).warnings, [/anyone who reaches this port may call every model/], 'carries the warning the console shows');
});

t.test('the default list authenticates: a keyless call is refused', async (t) => {
  const gw = await startTestGateway((dataDir) => `dataDir: ${dataDir}\nupstreams:\n  sim: { kind: simulator }\nmodels:\n  - { id: m, upstream: sim }\n`);
  t.teardown(() => gw.stop());
  t.equal((await chat(gw.url)).status, 401);
  t.notOk(gw.logs.some((l) => /allowAnonymous/.test(String(l.msg))), 'and no warning');
  const session = await fetch(`${gw.url}/admin/session`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ token: gw.adminToken }) });
  t.same(((await session.json()) as { warnings: string[] }).warnings, [], 'nor one for the console');
});
