/**
 * The admin surface against guessing and cross-site requests: wrong admin tokens throttled per
 * client and globally (a right token from a clean client always served), console sign-in not
 * locked out by other people's failures (other addresses, or a known device behind the same
 * address), Origin checked on state-changing calls, trusted proxies for the client address and
 * the Secure cookie, and a 400 for bad %-encoding.
 */
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { GuessThrottle, addressKey } from '../src/admin/throttle.js';
import { loadConfig } from '../src/config/load.js';
import { canonicalAddress } from '../src/trusted-proxies.js';
import { startTestGateway, type TestGateway } from './helpers.js';

// A short operator-chosen token, which the throttle must shield from guessing; a long (generated)
// one is never refused when right (the last tests).
const SHORT_TOKEN = 'operator-chosen-pw';
const yaml = (server: string, adminToken = `adminToken: ${SHORT_TOKEN}`) => (dataDir: string) => `
dataDir: ${dataDir}
${adminToken}
server: ${server}
admin: { allowedOrigins: ["https://console.example.com"] }
upstreams: { sim: { kind: simulator } }
models: [{ id: sim-chat, upstream: sim }]
`;
// Test traffic comes from 127.0.0.1, here a trusted proxy, so X-Forwarded-For names the client.
const gw = await startTestGateway(yaml('{ trustedProxies: ["127.0.0.1", "10.0.0.0/8"] }'));
const direct = await startTestGateway(yaml('{}'));
t.teardown(async () => {
  await gw.stop();
  await direct.stop();
});

interface Call {
  headers?: Record<string, string>;
  body?: unknown;
  /** The client address the trusted proxy reports. */
  from?: string;
}
const call = (target: TestGateway, method: string, path: string, { headers = {}, body, from }: Call = {}) =>
  fetch(target.url + path, {
    method,
    headers: { 'content-type': 'application/json', ...(from ? { 'x-forwarded-for': from } : {}), ...headers },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
const bearer = (target: TestGateway, token: string, from?: string) =>
  call(target, 'GET', '/admin/groups', { headers: { authorization: `Bearer ${token}` }, from });
const signIn = (target: TestGateway, token: string, init: Call = {}) =>
  call(target, 'POST', '/admin/session', { ...init, body: { token }, headers: { origin: target.url, ...init.headers } });
const code = async (res: Response) => ((await res.json()) as { error: { code: string } }).error.code;

async function statuses(requests: (() => Promise<Response>)[]): Promise<number[]> {
  const out: number[] = [];
  for (const request of requests) out.push((await request()).status);
  return out;
}
const times = (n: number, request: () => Promise<Response>) => Array.from({ length: n }, () => request);

t.test('bearer guesses: five per address, then 429 with Retry-After even for the right short token', async (t) => {
  t.same(await statuses(times(5, () => bearer(gw, 'wrong-token', '203.0.113.1'))), [401, 401, 401, 401, 401]);
  const locked = await bearer(gw, gw.adminToken, '203.0.113.1');
  t.equal(locked.status, 429, 'not even checked while the address waits');
  t.equal(await code(locked), 'too_many_attempts');
  t.equal(locked.headers.get('retry-after'), '30');
  t.equal((await bearer(gw, gw.adminToken, '203.0.113.2')).status, 200, 'another address is served');
  t.equal((await bearer(gw, gw.adminToken)).status, 200, 'and so is the proxy itself');
});

t.test('the client is the rightmost untrusted X-Forwarded-For hop; IPv6 clients count per /64', async (t) => {
  await statuses(times(5, () => bearer(gw, 'wrong-token', '198.51.100.7, 10.1.2.3')));
  t.equal((await bearer(gw, gw.adminToken, '198.51.100.7')).status, 429, 'the trusted hop 10.1.2.3 is skipped');
  t.equal((await bearer(gw, gw.adminToken, '6.6.6.6, 198.51.100.7, 10.9.9.9')).status, 429, 'a made-up leftmost hop changes nothing');
  t.equal((await bearer(gw, gw.adminToken, '198.51.100.8, 10.1.2.3')).status, 200);

  await statuses(times(5, () => bearer(gw, 'wrong-token', '2001:db8:1:2::1')));
  t.equal((await bearer(gw, gw.adminToken, '2001:db8:1:2:ffff::9')).status, 429, 'same /64');
  t.equal((await bearer(gw, gw.adminToken, '2001:db8:1:3::1')).status, 200, 'another /64');
});

t.test('Secure cookies when a trusted proxy says the client used TLS', async (t) => {
  const tls = { 'x-forwarded-proto': 'https', 'x-forwarded-host': 'sluice.example.com', origin: 'https://sluice.example.com' };
  const login = await signIn(gw, gw.adminToken, { headers: tls });
  const cookies = login.headers.getSetCookie();
  t.equal(cookies.length, 2);
  t.ok(cookies.every((c) => c.endsWith('; Secure')), 'session and device cookies');
  const { csrfToken } = (await login.json()) as { csrfToken: string };
  const out = await call(gw, 'DELETE', '/admin/session', { headers: { ...tls, cookie: cookies[0]!.split(';')[0]!, 'x-csrf-token': csrfToken } });
  t.equal(out.status, 200);
  t.match(out.headers.get('set-cookie'), /Max-Age=0; Secure$/);

  const plain = await signIn(gw, gw.adminToken);
  t.equal(plain.headers.getSetCookie().length, 2);
  t.ok(plain.headers.getSetCookie().every((c) => !c.includes('Secure')), 'plain HTTP: no Secure');
  const untrusted = await signIn(direct, direct.adminToken, { headers: { 'x-forwarded-proto': 'https' } });
  t.equal(untrusted.status, 200);
  t.ok(untrusted.headers.getSetCookie().every((c) => !c.includes('Secure')), 'a peer that is not a trusted proxy cannot claim TLS');
});

t.test('without a trusted proxy, X-Forwarded-For is ignored', async (t) => {
  let i = 0;
  t.same(await statuses(times(5, () => bearer(direct, 'wrong-token', `192.0.2.${++i}`))), [401, 401, 401, 401, 401]);
  t.equal((await bearer(direct, direct.adminToken, '192.0.2.99')).status, 429, 'every forged address is the same peer');
});

t.test('console sign-in: one address waiting does not lock out the right token from another', async (t) => {
  t.same(await statuses(times(5, () => signIn(gw, 'wrong-token', { from: '203.0.113.10' }))), [401, 401, 401, 401, 401]);
  const locked = await signIn(gw, gw.adminToken, { from: '203.0.113.10' });
  t.equal(locked.status, 429);
  t.equal(locked.headers.get('retry-after'), '30');
  const other = await signIn(gw, gw.adminToken, { from: '203.0.113.11' });
  t.equal(other.status, 200);
  t.match(await other.json(), { csrfToken: String });
});

t.test('console sign-in: a browser that signed in before is not locked out by its address (shared NAT)', async (t) => {
  const nat = '203.0.113.20';
  const first = await signIn(gw, gw.adminToken, { from: nat });
  const device = first.headers.getSetCookie().find((c) => c.startsWith('sluice_device='))!;
  t.match(device, /^sluice_device=[\w-]+\.[\w-]+; HttpOnly; SameSite=Strict; Path=\/admin\/session; Max-Age=\d+$/);
  const cookie = device.split(';')[0]!;

  await statuses(times(5, () => signIn(gw, 'wrong-token', { from: nat })));
  t.equal((await signIn(gw, gw.adminToken, { from: nat })).status, 429, 'the address waits');
  const known = await signIn(gw, gw.adminToken, { from: nat, headers: { cookie } });
  t.equal(known.status, 200, 'the known browser signs in');
  t.notOk(known.headers.getSetCookie().some((c) => c.startsWith('sluice_device=')), 'and keeps its device cookie');

  await statuses(times(5, () => signIn(gw, 'wrong-token', { from: '203.0.113.21', headers: { cookie } })));
  t.equal((await signIn(gw, gw.adminToken, { from: '203.0.113.21', headers: { cookie } })).status, 429, 'a device waits out its own wrong tokens');
  const forged = `${cookie.split('.')[0]}.AAAA`;
  t.equal((await signIn(gw, gw.adminToken, { from: nat, headers: { cookie: forged } })).status, 429, 'a forged device cookie counts as the address');
});

t.test('many addresses guessing together: one wrong token each, the right token still served', async (t) => {
  const botnet = await startTestGateway(yaml('{ trustedProxies: ["127.0.0.1"] }'));
  t.teardown(() => botnet.stop());
  t.same(await statuses(times(4, () => bearer(botnet, 'wrong-token', '100.64.0.1'))), [401, 401, 401, 401], 'a fresh address may try a few');
  for (let bot = 1; bot <= 20; bot++) await statuses(times(5, () => bearer(botnet, 'wrong-token', `100.64.1.${bot}`)));
  // The 100th wrong token reached the global budget.
  t.equal((await bearer(botnet, 'wrong-token', '100.64.2.1')).status, 401);
  t.equal((await bearer(botnet, botnet.adminToken, '100.64.2.1')).status, 429, 'under pressure one wrong token starts the wait');
  t.equal((await bearer(botnet, 'wrong-token', '100.64.0.1')).status, 401);
  t.equal((await bearer(botnet, 'wrong-token', '100.64.0.1')).status, 429, 'and an address that had tries left has one');
  t.equal((await bearer(botnet, botnet.adminToken, '100.64.2.2')).status, 200, 'a clean address with the right token is served');
  t.equal((await signIn(botnet, botnet.adminToken, { from: '100.64.2.3' })).status, 200, 'in the console too');
});

t.test('Origin on state-changing calls', async (t) => {
  const auth = { authorization: `Bearer ${gw.adminToken}` };
  const group = (name: string, headers: Record<string, string>) =>
    call(gw, 'POST', '/admin/groups', { headers, body: { name, models: ['*'], families: ['chat'] } });

  const evil = await group('evil', { ...auth, origin: 'https://evil.example' });
  t.equal(evil.status, 403, 'a foreign origin is refused even with the token');
  t.equal(await code(evil), 'origin_not_allowed');
  t.equal((await group('nullorigin', { ...auth, origin: 'null' })).status, 403);
  t.equal((await call(gw, 'DELETE', '/admin/groups/default', { headers: { ...auth, origin: 'https://evil.example' } })).status, 403);
  t.equal((await group('script', auth)).status, 201, 'a script without Origin');
  t.equal((await group('same-origin', { ...auth, origin: gw.url })).status, 201);
  t.equal((await group('allowed', { ...auth, origin: 'https://console.example.com' })).status, 201, 'admin.allowedOrigins');
  t.equal((await call(gw, 'GET', '/admin/groups', { headers: { ...auth, origin: 'https://evil.example' } })).status, 200, 'reads are not checked');

  const behindProxy = { ...auth, 'x-forwarded-proto': 'https', 'x-forwarded-host': 'sluice.example.com' };
  t.equal((await group('proxied', { ...behindProxy, origin: 'https://sluice.example.com' })).status, 201, 'the origin the proxy serves');
  t.equal((await group('downgraded', { ...behindProxy, origin: 'http://sluice.example.com' })).status, 403);

  const loginEvil = await signIn(gw, gw.adminToken, { headers: { origin: 'https://evil.example' } });
  t.equal(loginEvil.status, 403, 'no sign-in from another site');
  t.equal((await call(gw, 'POST', '/admin/session', { body: { token: gw.adminToken } })).status, 200, 'a script may sign in without Origin');

  const login = await signIn(gw, gw.adminToken);
  const cookie = login.headers.getSetCookie()[0]!.split(';')[0]!;
  const { csrfToken } = (await login.json()) as { csrfToken: string };
  const session = { cookie, 'x-csrf-token': csrfToken };
  const noOrigin = await group('cookie-no-origin', session);
  t.equal(noOrigin.status, 403, 'a cookie call without Origin is refused');
  t.equal(await code(noOrigin), 'origin_required');
  t.equal((await group('cookie-evil', { ...session, origin: 'https://evil.example' })).status, 403);
  t.equal((await group('cookie-same', { ...session, origin: gw.url })).status, 201);
  t.equal((await call(gw, 'DELETE', '/admin/session', { headers: session })).status, 403, 'sign-out too');
});

t.test('bad %-encoding in an admin path is a 400', async (t) => {
  for (const path of ['/admin/groups/%E0%A4%A', '/admin/%ZZ', '/admin/keys/%']) {
    const res = await call(gw, 'GET', path, { headers: { authorization: `Bearer ${gw.adminToken}` } });
    t.equal(res.status, 400, path);
    t.equal(await code(res), 'invalid_path');
  }
});

t.test('the throttle: waits double up to the cap, quiet clients start afresh, memory is bounded', async (t) => {
  const throttle = new GuessThrottle({ perClient: 2, firstWaitMs: 1000, maxWaitMs: 8000, forgetMs: 60_000, maxClients: 3 });
  let now = 1_000_000;
  const waits: number[] = [];
  t.equal(await throttle.failed('a', now), 0);
  for (let i = 0; i < 6; i++) {
    const wait = await throttle.failed('a', now);
    waits.push(wait);
    t.equal(await throttle.waitFor('a', now), wait);
    now += wait * 1000;
    t.equal(await throttle.waitFor('a', now), 0, 'free again when the wait is over');
  }
  t.same(waits, [1, 2, 4, 8, 8, 8]);
  t.equal(await throttle.failed('a', now + 60_000), 0, 'after an hour of quiet, a few tries again');

  const small = new GuessThrottle({ perClient: 1, maxClients: 2 });
  await small.failed('x', now);
  t.ok((await small.waitFor('x', now)) > 0);
  await small.failed('y', now);
  await small.failed('z', now);
  t.equal(await small.waitFor('x', now), 0, 'the oldest client is forgotten past maxClients');
  t.ok((await small.waitFor('z', now)) > 0);
});

t.test('addresses: uWebSockets.js IPv6 text, IPv4-mapped, /64 keys', async (t) => {
  t.equal(canonicalAddress('0000:0000:0000:0000:0000:0000:0000:0001'), '::1');
  t.equal(canonicalAddress('::ffff:127.0.0.1'), '127.0.0.1');
  t.equal(canonicalAddress('0000:0000:0000:0000:0000:ffff:7f00:0001'), '127.0.0.1');
  t.equal(canonicalAddress('not-an-ip'), undefined);
  t.equal(canonicalAddress('fe80::1%eth0'), undefined);
  t.equal(addressKey('2001:db8::1'), '2001:db8:0:0::/64');
  t.equal(addressKey('2001:0db8:0000:0000:ffff:0000:0000:0001'), '2001:db8:0:0::/64');
  t.equal(addressKey('203.0.113.5'), '203.0.113.5');
});

t.test('config: trusted proxies and allowed origins are checked at start', async (t) => {
  const load = (server: string, admin = '{}') => {
    const file = join(gw.dataDir, 'check.yaml');
    writeFileSync(file, `server: ${server}\nadmin: ${admin}\n`);
    return loadConfig({ path: file, env: {} });
  };
  t.same(load('{ trustedProxies: ["10.0.0.0/8", "::1", "fd00::/8"] }').server.trustedProxies, ['10.0.0.0/8', '::1', 'fd00::/8']);
  t.same(load('{}').server.trustedProxies, []);
  t.same(load('{}').admin.allowedOrigins, []);
  t.throws(() => load('{ trustedProxies: ["10.0.0.0/33"] }'), /check\.yaml: server\.trustedProxies\[0\]: "10\.0\.0\.0\/33": the prefix length must be 0–32/);
  t.throws(() => load('{ trustedProxies: ["proxy.local"] }'), /server\.trustedProxies\[0\]: "proxy.local" is not an IP address or CIDR range/);
  t.throws(() => load('{}', '{ allowedOrigins: ["https://console.example.com/path"] }'), /\/admin\/allowedOrigins\/0: must match pattern/);
});

t.test('a long (generated) token is never locked out by wrong guesses from its address', async (t) => {
  const generated = await startTestGateway(yaml('{ trustedProxies: ["127.0.0.1"] }', ''));
  t.teardown(() => generated.stop());
  t.ok(generated.adminToken.length >= 32, `generated: ${generated.adminToken.length} characters`);
  const nat = '203.0.113.50';
  t.same(await statuses(times(6, () => bearer(generated, 'wrong-token', nat))), [401, 401, 401, 401, 401, 429], 'the guesser waits');
  t.equal((await bearer(generated, 'wrong-token', nat)).status, 429, 'and keeps waiting');
  t.equal((await bearer(generated, generated.adminToken, nat)).status, 200, 'the operator behind the same address is served');
  t.equal((await signIn(generated, generated.adminToken, { from: nat })).status, 200, 'and signs in to the console');
  const almost = generated.adminToken.slice(0, -1) + (generated.adminToken.endsWith('A') ? 'B' : 'A');
  t.equal((await bearer(generated, almost, nat)).status, 429, 'a long wrong token still waits');
});
