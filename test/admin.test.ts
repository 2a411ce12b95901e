/**
 * The admin surface: bearer tokens and console sessions (cookie + CSRF, expiry), models with
 * channel health, usage series and CSV, the request log, key expiry, the audit log (from the API,
 * a console session and the CLI), and the console's files. Throttling, Origin checks and trusted
 * proxies are in admin-security.test.ts.
 */
import { execFile } from 'node:child_process';
import { userInfo } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import t from 'tap';
import { Sessions } from '../src/admin/sessions.js';
import { tokenDigest } from '../src/admin/token.js';
import { distRoot, startTestGateway } from './helpers.js';

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
  const sessions = new Sessions(tokenDigest('a-long-admin-token-123'), gw.gateway.store, { ttlMs: 60_000 });
  const now = Date.now();
  const started = await sessions.start(now);
  t.ok(await sessions.get(started.id, now + 500));
  t.notOk(await sessions.get(started.id, now + 60_000), 'expired at its deadline');
  t.notOk(await sessions.get('made-up', now + 500), 'an unknown id is no session');
  t.notOk(await gw.gateway.store.getState(`session:${started.id}`), 'the store holds the id only hashed');
  const rotated = new Sessions(tokenDigest('a-new-admin-token-456'), gw.gateway.store, { ttlMs: 60_000 });
  t.notOk(await rotated.get(started.id, now + 500), 'a new admin token ends the sessions of the old one');
});

t.test('models with channel health', async (t) => {
  t.equal((await chat('sim-chat', 'hi [[sim tokens=2]]')).status, 200);
  t.equal((await chat('sim-broken', 'hi')).status, 503);
  const res = await call('GET', '/admin/models', { headers: { authorization: `Bearer ${gw.adminToken}` } });
  const body = (await res.json()) as any;
  t.same(body.families, ['chat', 'responses', 'gemini', 'messages']);
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
  t.equal(lines[0], 'time,requestId,keyId,group,model,upstream,channel,attempts,family,status,promptTokens,cachedInputTokens,cacheWriteTokens,completionTokens,reasoningTokens,cost,estimated,latencyMs,ttfbMs,streamed,outcome,error,notes');
  t.equal(lines.length, 2);
  t.match(lines[1], /,"sim-broken","broken","broken",\d+,"chat",503,.*,"upstream_unavailable: Upstream `broken` is unreachable \(ECONNREFUSED\)\.",$/, 'text quoted, numbers and empty cells as they are');
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

const bearer = { authorization: `Bearer ${gw.adminToken}` };
const get = async (path: string) => (await (await call('GET', path, { headers: bearer })).json()) as any;

t.test('the request log: newest first, with errors, filtered like usage', async (t) => {
  t.equal((await chat('sim-chat', 'logged [[sim tokens=3]]')).status, 200);
  t.equal((await chat('sim-broken', 'logged')).status, 503);
  const all = await get('/admin/requests');
  t.ok(all.data.length >= 2);
  t.ok(all.data.every((r: any, i: number) => i === 0 || all.data[i - 1].time >= r.time), 'newest first');
  t.match(all.data[0], { model: 'sim-broken', status: 503, outcome: 'error', error: /upstream_unavailable/, family: 'chat', group: 'default' });
  t.match(all.data[1], { model: 'sim-chat', status: 200, completionTokens: 3, error: null, notes: null });
  t.type(all.data[1].ttfbMs, 'number');

  const failed = await get('/admin/requests?status=5xx');
  t.ok(failed.data.length >= 1 && failed.data.every((r: any) => r.status >= 500 && r.status < 600), 'status class');
  t.ok((await get('/admin/requests?status=503')).data.every((r: any) => r.status === 503), 'exact status');
  t.ok((await get('/admin/requests?status=2xx&model=sim-chat')).data.every((r: any) => r.status === 200 && r.model === 'sim-chat'));
  t.equal((await get('/admin/requests?limit=1')).data.length, 1);
  t.equal((await get(`/admin/requests?since=${Date.now() + 60_000}`)).data.length, 0, 'since');
  t.equal((await get(`/admin/requests?key=key_nobody`)).data.length, 0, 'key');
  t.equal((await call('GET', '/admin/requests?limit=1001', { headers: bearer })).status, 400, 'limit has a maximum');
  t.equal((await call('GET', '/admin/requests?status=6xx', { headers: bearer })).status, 400);
});

t.test('key expiry: set, shown, changed, and refused in every family once past', async (t) => {
  const bad = await call('POST', '/admin/keys', { headers: bearer, body: { group: 'default', expiresAt: 'next tuesday' } });
  t.equal(bad.status, 400);
  t.match(await bad.json(), { error: { message: /expiresAt must be an ISO 8601/ } });

  const past = await call('POST', '/admin/keys', { headers: bearer, body: { group: 'default', name: 'old', expiresAt: '2020-01-01T00:00:00Z' } });
  t.equal(past.status, 201);
  const expired = (await past.json()) as any;
  t.equal(expired.expiresAt, '2020-01-01T00:00:00.000Z');
  const post = (path: string, headers: Record<string, string>, body: unknown) =>
    fetch(gw.url + path, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) });

  const chatRes = await post('/v1/chat/completions', { authorization: `Bearer ${expired.key}` }, { model: 'sim-chat', messages: [{ role: 'user', content: 'hi' }] });
  t.equal(chatRes.status, 401);
  t.match(await chatRes.json(), { error: { code: 'key_expired', message: /expired at 2020-01-01T00:00:00.000Z/ } });
  const responsesRes = await post('/v1/responses', { authorization: `Bearer ${expired.key}` }, { model: 'sim-chat', input: 'hi' });
  t.equal(responsesRes.status, 401);
  t.match(await responsesRes.json(), { error: { code: 'key_expired' } });
  const geminiRes = await post('/v1beta/models/sim-chat:generateContent', { 'x-goog-api-key': expired.key }, { contents: [{ role: 'user', parts: [{ text: 'hi' }] }] });
  t.equal(geminiRes.status, 401);
  t.match(await geminiRes.json(), { error: { code: 401, status: 'UNAUTHENTICATED', message: /expired/ } });

  const revived = await call('PATCH', `/admin/keys/${expired.id}`, { headers: bearer, body: { expiresAt: null } });
  t.match(await revived.json(), { expiresAt: null });
  t.equal((await post('/v1/chat/completions', { authorization: `Bearer ${expired.key}` }, { model: 'sim-chat', messages: [{ role: 'user', content: 'hi' }] })).status, 200, 'no expiry: works again');

  // A key that expires while its lookup is cached (2 s) is refused all the same.
  const soon = Date.now() + 1000;
  const patched = await call('PATCH', `/admin/keys/${expired.id}`, { headers: bearer, body: { expiresAt: new Date(soon).toISOString() } });
  t.equal(((await patched.json()) as any).expiresAt, new Date(soon).toISOString());
  t.equal((await post('/v1/chat/completions', { authorization: `Bearer ${expired.key}` }, { model: 'sim-chat', messages: [{ role: 'user', content: 'hi' }] })).status, 200, 'before its expiry');
  await new Promise((r) => setTimeout(r, Math.max(0, soon - Date.now()) + 50));
  const late = await post('/v1/chat/completions', { authorization: `Bearer ${expired.key}` }, { model: 'sim-chat', messages: [{ role: 'user', content: 'hi' }] });
  t.equal(late.status, 401, 'after it, even from the cache');
  t.match(await late.json(), { error: { code: 'key_expired' } });

  const listed = (await get('/admin/keys')).data.find((k: any) => k.id === expired.id);
  t.equal(listed.expiresAt, new Date(soon).toISOString(), 'listed with its expiry');
});

t.test('bodies the admin API refuses, with a message that says what is allowed', async (t) => {
  const bearer = { authorization: `Bearer ${gw.adminToken}` };
  const refused = async (path: string, body: unknown, message: RegExp, what: string) => {
    const res = await call(path.startsWith('/admin/keys/') ? 'PATCH' : 'POST', path, { headers: bearer, body });
    t.equal(res.status, 400, what);
    t.match(((await res.json()) as { error: { message: string } }).error.message, message, what);
  };
  const useless = /^a new group needs at least one model and one family, or MCP grants \(mcpTools\)/;
  await refused('/admin/groups', { name: 'useless', models: [], families: ['chat'] }, useless, 'a new group without a model');
  await refused('/admin/groups', { name: 'useless', models: ['*'], families: [], mcpTools: [] }, useless, 'a new group without a family');
  const tools = await call('POST', '/admin/groups', { headers: bearer, body: { name: 'tools-only', models: [], families: [], mcpTools: ['files/*'] } });
  t.equal(tools.status, 201, 'a group of MCP tools alone needs no model: /mcp checks only its grants');
  await call('DELETE', '/admin/groups/tools-only', { headers: bearer });

  const { id } = (await (await call('POST', '/admin/keys', { headers: bearer, body: { group: 'default', name: 'CI bot – Zürich 🚀' } })).json()) as { id: string };
  t.ok(id, 'a name in any script, with spaces and punctuation, is a name');
  const nameRule = /^name must not be blank, nor hold control characters or bidi controls/;
  for (const [name, what] of [
    ['ci\u0000bot', 'NUL'],
    ['\u001b[2Jci', 'ESC'],
    ['ci\u0085bot', 'a C1 control'],
    ['\u202egpj.exe', 'a right-to-left override'],
    ['ci\u2066bot', 'a bidi isolate'],
    ['', 'empty'],
    [' \t ', 'whitespace only'],
  ]) {
    await refused('/admin/keys', { group: 'default', name }, nameRule, `a new key's name: ${what}`);
    await refused(`/admin/keys/${id}`, { name }, nameRule, `a rename: ${what}`);
  }
  const impossible = /^expiresAt: 2026-02-31 is not a day of the calendar$/;
  await refused('/admin/keys', { group: 'default', expiresAt: '2026-02-31' }, impossible, 'a new key expiring on 31 February');
  await refused(`/admin/keys/${id}`, { expiresAt: '2026-02-31T00:00:00Z' }, impossible, 'an expiry moved to 31 February');
  const tooMuch = /^budget\.amount must be <= 1000000000000$/;
  await refused('/admin/keys', { group: 'default', budget: { amount: 1e308, period: 'day' } }, tooMuch, 'a key budget of 1e308');
  await refused('/admin/groups', { name: 'rich', models: ['*'], families: ['chat'], budget: { amount: 1e308, period: 'month' } }, tooMuch, 'a group budget of 1e308');
  const most = await call('PATCH', `/admin/keys/${id}`, { headers: bearer, body: { budget: { amount: 1e12, period: 'total' }, expiresAt: '2028-02-29' } });
  t.match(await most.json(), { expiresAt: '2028-02-29T00:00:00.000Z', spend: { remaining: 1e12 } }, 'a trillion and a leap day are taken; remaining is a number');
  await call('DELETE', `/admin/keys/${id}`, { headers: bearer });
});

t.test('the audit log: every change, by the admin token, a console session and the CLI', async (t) => {
  const made = await call('POST', '/admin/groups', { headers: bearer, body: { name: 'audited', models: ['*'], families: ['chat'] } });
  t.equal(made.status, 201);
  await call('PATCH', '/admin/groups/audited', { headers: bearer, body: { families: ['chat', 'gemini'] } });
  const key = (await (await call('POST', '/admin/keys', { headers: bearer, body: { group: 'audited', expiresAt: '2030-01-01' } })).json()) as any;
  await call('PATCH', `/admin/keys/${key.id}`, { headers: bearer, body: { disabled: true } });
  await call('DELETE', `/admin/keys/${key.id}`, { headers: bearer });
  await call('DELETE', '/admin/groups/audited', { headers: bearer });
  t.equal((await call('POST', '/admin/groups', { headers: bearer, body: { name: 'audited', models: ['nope'], families: [] } })).status, 400);

  t.equal((await call('POST', '/admin/session', { body: { token: 'wrong-token' } })).status, 401);
  const login = await call('POST', '/admin/session', { body: { token: gw.adminToken } });
  const cookie = login.headers.get('set-cookie')!.split(';')[0]!;
  const { csrfToken } = (await login.json()) as { csrfToken: string };
  await call('POST', '/admin/groups', { headers: { cookie, 'x-csrf-token': csrfToken }, body: { name: 'from-console', models: ['*'], families: ['chat'] } });
  await call('DELETE', '/admin/session', { headers: { cookie, 'x-csrf-token': csrfToken } });

  const run = promisify(execFile);
  const cli = (...args: string[]) => run(process.execPath, [join(distRoot, 'src/main.js'), ...args, '--config', join(gw.dataDir, 'sluice.yaml')]);
  const cliKey = JSON.parse((await cli('keys', 'create', '--group', 'default', '--expires', '2031-06-01T00:00:00Z')).stdout);
  t.equal(cliKey.expiresAt, '2031-06-01T00:00:00.000Z', 'the CLI sets an expiry');
  t.match(JSON.parse((await cli('keys', 'update', cliKey.id, '--expires', 'none')).stdout), { expiresAt: null }, 'and clears it');

  const { data } = await get('/admin/audit?limit=1000');
  const entries = data.map((e: any) => `${e.action} ${e.target ?? '-'} ${e.actor}`);
  const client = '127.0.0.1';
  const session = data.find((e: any) => e.action === 'session.sign_in').actor as string;
  t.match(session, new RegExp(`^console:[\\w-]{8}@${client}$`), 'a console actor names its session');
  const expected = [
    `group.create audited admin-token@${client}`,
    `group.update audited admin-token@${client}`,
    `key.create ${key.id} admin-token@${client}`,
    `key.update ${key.id} admin-token@${client}`,
    `key.delete ${key.id} admin-token@${client}`,
    `group.delete audited admin-token@${client}`,
    `session.sign_in_failed - console@${client}`,
    `session.sign_in - ${session}`,
    `group.create from-console ${session}`,
    `session.sign_out - ${session}`,
    `key.create ${cliKey.id} cli:${userInfo().username}`,
    `key.update ${cliKey.id} cli:${userInfo().username}`,
  ];
  const chronological = entries.slice().reverse();
  const at = expected.map((e) => chronological.lastIndexOf(e));
  t.same(at.filter((i) => i < 0), [], `every action is there: ${JSON.stringify(expected.filter((_, i) => at[i]! < 0))}`);
  t.same(at, at.slice().sort((a, b) => a - b), 'in the order they happened');
  t.notOk(entries.some((e: string) => e.startsWith('group.create audited') && entries.filter((x: string) => x === e).length > 1), 'a refused change is not logged');
  t.match(data.find((e: any) => e.action === 'key.create' && e.target === key.id).detail, /group audited; expires 2030-01-01/);
  t.match(data.find((e: any) => e.action === 'key.update' && e.target === key.id).detail, '{"disabled":true}');

  const onlyFailed = await get('/admin/audit?action=session.sign_in_failed');
  t.ok(onlyFailed.data.length >= 1 && onlyFailed.data.every((e: any) => e.action === 'session.sign_in_failed'), 'filtered by action');
  t.equal((await call('GET', '/admin/audit?limit=0', { headers: bearer })).status, 400);
});
