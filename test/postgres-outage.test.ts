/**
 * PostgreSQL stopped under a running gateway: keys it has seen keep serving, usage waits in the
 * journal and lands once PostgreSQL is back, admin calls that need the store answer 503
 * `store_unavailable`, and the gateway recovers without a restart.
 */
import t from 'tap';
import { eventually, startSimulatorProcess, startTestGateway } from './helpers.js';
import { call } from './scale.js';
import { startPostgres } from './servers.js';

t.setTimeout(120_000);

const [sim, pg] = await Promise.all([startSimulatorProcess(), startPostgres()]);
const gw = await startTestGateway(
  (dataDir) => `dataDir: ${dataDir}
log: { level: warn }
server: { workers: 1, shutdownTimeoutMs: 2000 }
store: { kind: postgres, url: "${pg.url}/postgres" }
upstreams:
  sim: { kind: openai-chat, baseUrl: "${sim.url}/v1" }
models:
  - { id: sim-chat, upstream: sim }
`,
);
t.teardown(async () => {
  await gw.stop();
  await sim.stop();
  pg.stop();
});

const hello = (key: string) => call(gw.url, key, { messages: [{ role: 'user', content: 'hi [[sim tokens=2]]' }] });

t.test('a shared store beside the in-memory limiter is warned about at start: each instance would let the whole limit through', async (t) => {
  const warned = gw.logs.find((l) => l.level === 40 && /limiter: memory/.test(String(l.msg)));
  t.match(warned?.msg, /while the store is shared \(postgres\).*Set limiter: \{ kind: redis/);
});

t.test('PostgreSQL away: seen keys serve, usage waits, admin writes get 503; then everything lands', async (t) => {
  const seen = await hello(gw.key);
  t.equal(seen.status, 200);
  const { body: created } = await gw.admin('POST', '/admin/keys', { group: 'default' });
  const unseen: string = created.key;

  pg.halt();
  // Past the cache's freshness (2 s): the key must come from the stale entry, not a fresh read.
  await new Promise((r) => setTimeout(r, 2500));
  const during = await Promise.all([0, 1, 2, 3, 4].map(() => hello(gw.key)));
  t.same(
    during.map((r) => r.status),
    [200, 200, 200, 200, 200],
    'a key seen before keeps serving',
  );
  const never = await hello(unseen);
  t.equal(never.status, 503, 'a key never seen cannot be checked');
  t.match(JSON.parse(never.text), { error: { code: 'store_unavailable' } });

  const write = await gw.admin('POST', '/admin/groups', { name: 'during-outage', models: ['*'], families: ['chat'] });
  t.equal(write.status, 503);
  t.match(write.body, { error: { code: 'store_unavailable', message: /store cannot be reached/ } });

  pg.start();
  const ids = [seen.id, ...during.map((r) => r.id)];
  const records = await eventually(async () => {
    const res = await gw.admin('GET', '/admin/requests?limit=1000');
    return res.status === 200 && ids.every((id) => (res.body.data as any[]).some((r) => r.requestId === id)) && res.body.data;
  }, 'the usage recorded during the outage to land', 30_000);
  t.equal(records.filter((r: any) => ids.includes(r.requestId)).length, ids.length, 'each request once');
  t.equal((await hello(unseen)).status, 200, 'and the unseen key is served once the store answers');
  t.equal((await gw.admin('POST', '/admin/groups', { name: 'after-outage', models: ['*'], families: ['chat'] })).status, 201);
});
