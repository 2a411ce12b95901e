/**
 * Overload: excess is shed at once with 503 and Retry-After in the family's shape, never queued
 * until it times out; health and admin calls keep answering; the gateway recovers as soon as the
 * load stops. Also the WebSocket caps: how many may be open, and how long one may live.
 */
import t from 'tap';
import WebSocket from 'ws';
import { eventually, startStack } from './helpers.js';

const { gw } = await startStack(
  (url) => `
upstreams:
  sim: { kind: openai-chat, baseUrl: ${url}/v1 }
  narrow: { kind: openai-chat, baseUrl: ${url}/v1, connections: 2, maxQueue: 2, queueTimeoutMs: 300 }
models:
  - { id: sim-chat, upstream: sim }
  - { id: sim-narrow, upstream: narrow, upstreamModel: sim-chat }
  - { id: sim-responses, upstream: sim, upstreamModel: sim-chat }
`,
  { maxConnections: 20, websocket: { maxSockets: 3, maxLifetimeMinutes: 0.02 } },
);

const call = (model: string, content: string, stream = false) =>
  fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${gw.key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model, stream, messages: [{ role: 'user', content }] }),
  });

t.test('an upstream whose connections are all busy: a bounded queue, a bounded wait, then 503 with Retry-After', async (t) => {
  const answers = await Promise.all(
    Array.from({ length: 8 }, async () => {
      const res = await call('sim-narrow', 'slow [[sim ttft_ms=1500]]');
      return { status: res.status, retryAfter: res.headers.get('retry-after'), body: (await res.json()) as { error?: { code: string; type: string } } };
    }),
  );
  const served = answers.filter((a) => a.status === 200);
  const refused = answers.filter((a) => a.status === 503);
  t.equal(served.length, 2, 'two connections: two served');
  t.equal(refused.length, 6, 'two waited past the queue timeout, four found the queue full');
  for (const a of refused) {
    t.equal(a.body.error?.code, 'upstream_busy');
    t.equal(a.body.error?.type, 'service_unavailable');
    t.equal(a.retryAfter, '1');
  }
  t.equal((await call('sim-narrow', 'after')).status, 200, 'served again once the connections are free');
});

t.test('10x overload: the excess is shed at once, health and admin keep answering, and the gateway recovers', async (t) => {
  const load = Array.from({ length: 200 }, () =>
    call('sim-chat', 'slow [[sim tokens=5 ttft_ms=1500]]', true).then(async (res) => {
      const text = await res.text();
      return { status: res.status, retryAfter: res.headers.get('retry-after'), text };
    }),
  );
  // While the load is on: health and admin calls are not shed.
  await new Promise((r) => setTimeout(r, 300));
  const health = await fetch(`${gw.url}/healthz`);
  t.equal(health.status, 200, '/healthz answers under load');
  t.equal((await gw.admin('GET', '/admin/keys')).status, 200, 'the admin API answers under load');
  const answers = await Promise.all(load);
  const served = answers.filter((a) => a.status === 200);
  const shed = answers.filter((a) => a.status === 503);
  t.equal(served.length + shed.length, 200, 'every request got an answer: served or shed');
  t.ok(served.length >= 15 && served.length <= 20, `at most maxConnections (20) served at once (${served.length})`);
  t.ok(shed.every((a) => a.retryAfter === '1' && a.text.includes('"code":"overloaded"')), 'shed with Retry-After in the chat error shape');
  for (const a of served) t.match(a.text, /data: \[DONE\]/);
  const after = await call('sim-chat', 'after the storm');
  t.equal(after.status, 200, 'recovers as soon as the load stops');
});

const socket = (key = gw.key) => new WebSocket(`${gw.url.replace('http', 'ws')}/v1/responses`, { headers: { authorization: `Bearer ${key}` } });
const opened = (ws: WebSocket) =>
  new Promise<{ ok: boolean; status?: number }>((resolve) => {
    ws.once('open', () => resolve({ ok: true }));
    ws.once('unexpected-response', (_req, res) => resolve({ ok: false, status: res.statusCode }));
    ws.once('error', () => resolve({ ok: false }));
  });

t.test('WebSockets: a cap on open sockets, and a lifetime that ends with websocket_connection_limit_reached', async (t) => {
  const sockets = [socket(), socket(), socket()];
  const results = await Promise.all(sockets.map(opened));
  t.ok(results.every((r) => r.ok), 'three open');
  const fourth = socket();
  t.same(await opened(fourth), { ok: false, status: 503 }, 'the fourth is refused at the upgrade');

  // maxLifetimeMinutes 0.02 = 1.2 s: each socket is told why, then closed.
  const messages: string[] = [];
  sockets[0]!.on('message', (m) => messages.push(m.toString()));
  const closed = await new Promise<number>((resolve) => sockets[0]!.once('close', (code) => resolve(code)));
  t.equal(closed, 1000);
  const last = JSON.parse(messages.at(-1)!);
  t.equal(last.type, 'error');
  t.equal(last.error.code, 'websocket_connection_limit_reached');
  await eventually(() => sockets.every((s) => s.readyState === WebSocket.CLOSED), 'all expired');
  const fresh = socket();
  t.ok((await opened(fresh)).ok, 'room again once they closed');
  fresh.close();
});
