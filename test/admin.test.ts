/**
 * The admin surface: bearer tokens and console sessions (cookie + CSRF, expiry), models with
 * channel health, usage series and CSV, and the console's files. Throttling, Origin checks and
 * trusted proxies are in admin-security.test.ts.
 */
import t from 'tap';
import { Sessions } from '../src/admin/sessions.js';
import { startTestGateway } from './helpers.js';

const gw = await startTestGateway(
  (dataDir) => `
dataDir: ${dataDir}
upstreams:
  sim: { kind: simulator }
  broken: { kind: openai-chat, baseUrl: "http://127.0.0.1:9/v1" }
models:
  - { id: sim-chat, upstream: sim }
  - { id: sim-broken, upstream: broken, upstreamModel: sim-chat }
`,
);
t.teardown(() => gw.stop());

const call = (method: string, path: string, init: { headers?: Record<string, string>; body?: unknown } = {}) =>
  fetch(gw.url + path, {
    method,
    // As a browser on the console's page would: same origin.
    headers: { 'content-type': 'application/json', origin: gw.url, ...init.headers },
    body: init.body === undefined ? undefined : JSON.stringify(init.body),
  });
const chat = (model: string, content: string) =>
  call('POST', '/v1/chat/completions', { headers: { authorization: `Bearer ${gw.key}` }, body: { model, messages: [{ role: 'user', content }] } });

t.test('bearer token', async (t) => {
  t.equal((await call('GET', '/admin/groups')).status, 401);
  t.equal((await call('GET', '/admin/groups', { headers: { authorization: 'Bearer wrong' } })).status, 401);
  t.equal((await call('GET', '/admin/groups', { headers: { authorization: `Bearer ${gw.adminToken}` } })).status, 200);
});

t.test('console session: HttpOnly SameSite=Strict cookie, CSRF on every change, logout', async (t) => {
  t.equal((await call('POST', '/admin/session', { body: { token: 'nope' } })).status, 401);
  const login = await call('POST', '/admin/session', { body: { token: gw.adminToken } });
  t.equal(login.status, 200);
  const setCookie = login.headers.get('set-cookie')!;
  t.match(setCookie, /^sluice_session=[\w-]{20,}; HttpOnly; SameSite=Strict; Path=\/; Max-Age=\d+/);
  const cookie = setCookie.split(';')[0]!;
  const { csrfToken } = (await login.json()) as { csrfToken: string };

  const restored = await call('GET', '/admin/session', { headers: { cookie } });
  t.same(((await restored.json()) as any).csrfToken, csrfToken, 'a reload gets the same CSRF token back');
  t.equal((await call('GET', '/admin/keys', { headers: { cookie } })).status, 200, 'reads need only the cookie');
  const forged = await call('POST', '/admin/groups', { headers: { cookie }, body: { name: 'forged', models: ['*'], families: ['chat'] } });
  t.equal(forged.status, 403);
  t.match(await forged.json(), { error: { code: 'csrf' } });
  const wrongCsrf = await call('POST', '/admin/groups', { headers: { cookie, 'x-csrf-token': 'x' }, body: { name: 'forged', models: ['*'], families: ['chat'] } });
  t.equal(wrongCsrf.status, 403);
  const made = await call('POST', '/admin/groups', { headers: { cookie, 'x-csrf-token': csrfToken }, body: { name: 'console-made', models: ['*'], families: ['chat'] } });
  t.equal(made.status, 201);

  t.equal((await call('DELETE', '/admin/session', { headers: { cookie } })).status, 403, 'logout needs the CSRF token too');
  const out = await call('DELETE', '/admin/session', { headers: { cookie, 'x-csrf-token': csrfToken } });
  t.equal(out.status, 200);
  t.match(out.headers.get('set-cookie'), /Max-Age=0/);
  t.equal((await call('GET', '/admin/keys', { headers: { cookie } })).status, 401, 'the session is gone');
});

t.test('sessions expire', async (t) => {
  const sessions = new Sessions('a-long-admin-token-123', { ttlMs: 1000 });
  const started = sessions.start(10_000);
  t.ok(sessions.get(started.id, 10_500));
  t.notOk(sessions.get(started.id, 11_000), 'expired at its deadline');
  t.notOk(sessions.get(started.id, 10_500), 'and forgotten');
});

t.test('models with channel health', async (t) => {
  t.equal((await chat('sim-chat', 'hi [[sim tokens=2]]')).status, 200);
  t.equal((await chat('sim-broken', 'hi')).status, 503);
  const res = await call('GET', '/admin/models', { headers: { authorization: `Bearer ${gw.adminToken}` } });
  const body = (await res.json()) as any;
  t.same(body.families, ['chat', 'responses', 'gemini']);
  t.match(body.data.find((m: any) => m.id === 'sim-chat'), { upstream: 'sim', upstreamKind: 'simulator', upstreamFamily: 'chat', families: { chat: 'native', responses: 'bridge' } });
  const health = Object.fromEntries(body.upstreams.map((u: any) => [u.name, u.health]));
  t.match(health.sim, { status: 'ok', errors: 0 });
  t.ok(health.sim.requests >= 1);
  t.match(health.broken, { status: 'down', requests: 1, errors: 1, lastError: /upstream_unavailable: .*unreachable/ });
});

t.test('usage series and CSV', async (t) => {
  const auth = { authorization: `Bearer ${gw.adminToken}` };
  const series = (await (await call('GET', `/admin/usage/series?since=${Date.now() - 3_600_000}`, { headers: auth })).json()) as any;
  t.equal(series.bucketMs, 60_000, 'an hour is shown by the minute');
  const totals = series.points.reduce((a: any, p: any) => ({ requests: a.requests + p.requests, errors: a.errors + p.errors }), { requests: 0, errors: 0 });
  t.ok(totals.requests >= 2);
  t.ok(totals.errors >= 1);
  t.ok(series.points.every((p: any) => p.t % 60_000 === 0 && p.maxLatencyMs >= p.avgLatencyMs));
  t.equal((await call('GET', '/admin/usage/series?bucket=5', { headers: auth })).status, 400);

  const csv = await call('GET', '/admin/usage.csv?model=sim-broken', { headers: auth });
  t.match(csv.headers.get('content-type'), /text\/csv/);
  t.match(csv.headers.get('content-disposition'), /attachment/);
  const lines = (await csv.text()).trim().split('\r\n');
  t.equal(lines[0], 'time,requestId,keyId,group,model,upstream,family,status,promptTokens,completionTokens,estimated,latencyMs,ttfbMs,streamed,outcome,error,notes');
  t.equal(lines.length, 2);
  t.match(lines[1], /,sim-broken,broken,chat,503,.*,upstream_unavailable: Upstream `broken` is unreachable \(ECONNREFUSED\)\.,$/);
});

t.test('the console page: gzip, ETag, a strict CSP', async (t) => {
  const page = await fetch(`${gw.url}/console`, { headers: { 'accept-encoding': 'gzip' } });
  t.equal(page.status, 200);
  t.match(page.headers.get('content-type'), /text\/html/);
  t.equal(page.headers.get('content-encoding'), 'gzip');
  t.match(page.headers.get('content-security-policy'), /script-src 'self' 'sha256-/);
  t.match(await page.text(), /<script type="module" src="\/console\/app\/main.js">/);
  const etag = page.headers.get('etag')!;
  t.equal((await fetch(`${gw.url}/console`, { headers: { 'if-none-match': etag } })).status, 304);
  t.equal((await fetch(`${gw.url}/console/app/main.js`)).status, 200);
  t.equal((await fetch(`${gw.url}/console/vendor/uPlot.esm.js`)).status, 200);
  t.equal((await fetch(`${gw.url}/console/nope.js`)).status, 404);
});
