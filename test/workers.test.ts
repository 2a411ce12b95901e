/**
 * `server.workers: 2`: two uWebSockets.js apps on worker threads serve one port, with the limits,
 * budgets, key caches and sessions exact across them (the primary thread's limiter, the store's
 * change notification, shared state), and a thread that dies is replaced with the exchanges it
 * held recorded as interrupted.
 */
import t from 'tap';
import { eventually, startStack } from './helpers.js';
import { call, exactnessTests, keyIn, PATIENCE_MS, type Cluster } from './scale.js';

t.setTimeout(120_000);

const routing = (simUrl: string) => `log: { level: warn }
upstreams:
  sim: { kind: openai-chat, baseUrl: "${simUrl}/v1" }
models:
  - { id: sim-chat, upstream: sim, maxOutputTokens: { default: 64, max: 4096 }, prices: { input: 1000000, output: 1000000 } }
`;
const { gw } = await startStack(routing, { workers: 2 });
const cluster: Cluster = { urls: [gw.url], admin: (method, path, body) => gw.admin(method, path, body) };

t.test('two threads serve the port', async (t) => {
  t.equal(gw.gateway.workers?.size, 2);
  const { key } = await keyIn(cluster);
  const all = await Promise.all(Array.from({ length: 20 }, () => call(gw.url, key, { messages: [{ role: 'user', content: 'hi [[sim tokens=2]]' }] })));
  t.ok(all.every((r) => r.status === 200));
});

t.test('a usage read on either thread shows every record made before it, whichever thread made it', async (t) => {
  const { key } = await keyIn(cluster);
  for (let round = 0; round < 3; round++) {
    // Fresh connections, so the kernel spreads them over both threads.
    const calls = await Promise.all(Array.from({ length: 12 }, () => call(gw.url, key, { messages: [{ role: 'user', content: 'hi [[sim tokens=2]]' }] })));
    const ids = calls.map((c) => c.id);
    // At once, not eventually: each thread batches its records for up to a second.
    const { body } = await gw.admin('GET', '/admin/usage?limit=1000');
    const seen = new Set((body.records as { requestId: string }[]).map((r) => r.requestId));
    t.same(ids.filter((id) => !seen.has(id!)), [], `round ${round}: all 12 records read at once`);
  }
});

exactnessTests(t, () => cluster);

t.test('a console session started on one thread is known to the other', async (t) => {
  const signIn = await fetch(`${gw.url}/admin/session`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ token: gw.adminToken }) });
  t.equal(signIn.status, 200);
  const cookie = signIn.headers.getSetCookie().map((c) => c.split(';')[0]).join('; ');
  const { Agent } = await import('undici');
  const statuses = await Promise.all(
    Array.from({ length: 12 }, async () => {
      const dispatcher = new Agent({ connections: 1 });
      // @ts-expect-error undici's fetch takes a dispatcher
      const res = await fetch(`${gw.url}/admin/keys`, { headers: { cookie }, dispatcher });
      await res.arrayBuffer();
      await dispatcher.close();
      return res.status;
    }),
  );
  t.same(new Set(statuses), new Set([200]), 'every connection, whichever thread took it');
});

t.test('a thread that fails is replaced; the exchanges it held end with a failure and a record, and their slots return', async (t) => {
  const { key, id } = await keyIn(cluster, { limits: { concurrency: 12 } });
  // Twelve long streams, spread over both threads by the kernel. `max_tokens` asks for all 400:
  // without it the model's default of 64 made them 1.6 s long, and on a busy machine the last one
  // could begin after the first had ended, so that none was left to cut.
  let begun = 0;
  const streams = Array.from({ length: 12 }, () =>
    call(gw.url, key, { messages: [{ role: 'user', content: 'Long [[sim tokens=400 tps=40]]' }], max_tokens: 400, stream: true }, () => begun++).catch((err: Error) => ({ status: -1, id: null, text: err.message })),
  );
  // The thread fails once all twelve answers have begun (each lasts ten seconds).
  await eventually(() => begun === 12, 'the twelve answers to begin');
  gw.gateway.workers!.crash(0);
  const ended = await Promise.all(streams);
  t.ok(
    ended.every((r) => r.status === 200),
    'all twelve were admitted',
  );
  const cut = ended.filter((r) => !r.text.includes('[DONE]'));
  t.ok(cut.length >= 1, `the failed thread's streams end early (${cut.length})`);
  t.ok(cut.length < 12, 'the other thread finishes its own');
  for (const r of cut) t.match(r, { status: 200, text: /"code":"shutting_down"/ }, "with the family's failure event");
  await eventually(async () => gw.gateway.workers!.replacements === 1, 'the replacement thread', PATIENCE_MS);
  // Every slot is free again: the failed thread's exchanges settled their leases as they ended.
  const after = await Promise.all(Array.from({ length: 12 }, () => call(gw.url, key, { messages: [{ role: 'user', content: 'After [[sim tokens=2]]' }], stream: true })));
  t.same(
    after.map((r) => r.status),
    Array(12).fill(200),
    'no slot leaked',
  );
  const records = await eventually(async () => {
    const got = (await gw.admin('GET', `/admin/requests?key=${id}&limit=1000`)).body.data as any[];
    return got.filter((r) => r.outcome === 'shutdown').length >= cut.length && got;
  }, 'the records of the cut exchanges', PATIENCE_MS);
  t.equal(records.filter((r: any) => r.outcome === 'shutdown').length, cut.length, 'one record per stream cut');
});

// Last: it makes this address wait out its wrong admin tokens.
t.test('wrong admin tokens count once across threads: the sixth try waits, whichever thread takes it', async (t) => {
  const { Agent } = await import('undici');
  const tryToken = async (token: string) => {
    const dispatcher = new Agent({ connections: 1 });
    // @ts-expect-error undici's fetch takes a dispatcher
    const res = await fetch(`${gw.url}/admin/groups`, { headers: { authorization: `Bearer ${token}` }, dispatcher });
    await res.arrayBuffer();
    await dispatcher.close();
    return res.status;
  };
  const wrong = [];
  for (let i = 0; i < 5; i++) wrong.push(await tryToken(`wrong-token-${i}`));
  t.same(wrong, [401, 401, 401, 401, 401]);
  const statuses = [];
  for (let i = 0; i < 4; i++) statuses.push(await tryToken(`wrong-token-again-${i}`));
  t.same(statuses, [429, 429, 429, 429], 'a sixth wrong token waits, on every connection');
  // A long (generated) token is past guessing: the guesser's wait never locks it out.
  const right = [];
  for (let i = 0; i < 4; i++) right.push(await tryToken(gw.adminToken));
  t.same(right, [200, 200, 200, 200], 'the right generated token is served on every connection');
});
