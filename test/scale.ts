/**
 * The exactness checks of scale-out, written once for any set of gateway addresses that share
 * their limits: the worker threads of one instance (workers.test.ts) and three instances on one
 * PostgreSQL and one Redis (scale-out.test.ts). Requests are spread round-robin over `urls`; with
 * one URL and worker threads, the kernel spreads the connections (each request below opens its own).
 */
import { Agent } from 'undici';
import type { Test } from 'tap';
import { eventually } from './helpers.js';

export interface Cluster {
  urls: string[];
  /** An admin API call on instance `at` (0 when absent). */
  admin(method: string, path: string, body?: unknown, at?: number): Promise<{ status: number; body: any }>;
}

/** Every request on a connection of its own, so that worker threads (kernel-spread connections) all take part. */
const fresh = () => new Agent({ pipelining: 0, connections: 1 });

/** A chat call on a fresh connection; `begun` is called once its answer has begun (status and headers). */
export async function call(url: string, key: string, body: Record<string, unknown>, begun?: () => void): Promise<{ status: number; id: string | null; text: string }> {
  const dispatcher = fresh();
  try {
    const res = await fetch(`${url}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', connection: 'close' },
      body: JSON.stringify({ model: 'sim-chat', ...body }),
      // @ts-expect-error undici's fetch takes a dispatcher
      dispatcher,
    });
    begun?.();
    return { status: res.status, id: res.headers.get('x-request-id'), text: await res.text() };
  } finally {
    await dispatcher.close();
  }
}

const say = (content: string, stream = true) => ({ messages: [{ role: 'user', content }], stream });

/** A new group with `fields` and a key in it, made through instance 0. */
export async function keyIn(cluster: Cluster, fields: Record<string, unknown> = {}): Promise<{ key: string; id: string; group: string }> {
  const group = `g${Math.random().toString(36).slice(2, 10)}`;
  const made = await cluster.admin('POST', '/admin/groups', { name: group, models: ['*'], families: ['chat', 'responses', 'gemini', 'messages'], ...fields });
  if (made.status !== 201) throw new Error(JSON.stringify(made.body));
  const key = await cluster.admin('POST', '/admin/keys', { group });
  return { key: key.body.key, id: key.body.id, group };
}

/** `n` requests at once, the i-th to `urls[i % urls.length]`. */
export const spread = (cluster: Cluster, n: number, send: (url: string, i: number) => ReturnType<typeof call>) =>
  Promise.all(Array.from({ length: n }, (_, i) => send(cluster.urls[i % cluster.urls.length]!, i)));

/**
 * The bound on waiting for what other threads and instances do (records, a replacement thread, a
 * recovery): each wait returns as soon as it holds; a thread or instance starting on two busy
 * cores can take tens of seconds, so this only stops a wait that never ends.
 */
export const PATIENCE_MS = 60_000;

/** Every request of `ids` has exactly one usage record, whichever instance served it. */
export async function oneRecordEach(t: Test, cluster: Cluster, keyId: string, ids: string[]): Promise<any[]> {
  const records = await eventually(async () => {
    const got = (await cluster.admin('GET', `/admin/requests?key=${keyId}&limit=1000`)).body.data as any[];
    return got.length >= ids.length && got;
  }, `${ids.length} usage records`, PATIENCE_MS);
  const byId = new Map<string, number>();
  for (const r of records) byId.set(r.requestId, (byId.get(r.requestId) ?? 0) + 1);
  t.equal(records.length, ids.length, 'as many records as requests');
  t.ok(
    ids.every((id) => byId.get(id) === 1),
    'each request exactly once',
  );
  return records;
}

export function exactnessTests(t: Test, cluster: () => Cluster): void {
  t.test('concurrency 4: of 15 simultaneous streams exactly 11 get a 429, and every request has one record', async (t) => {
    const c = cluster();
    const { key, id } = await keyIn(c, { limits: { concurrency: 4 } });
    // Three-second streams: all fifteen are decided long before the first one ends, even on a loaded machine.
    const all = await spread(c, 15, (url) => call(url, key, say('Hello [[sim tokens=60 tps=20]]')));
    t.equal(all.filter((r) => r.status === 429).length, 11, 'exactly N − M refused');
    t.equal(all.filter((r) => r.status === 200).length, 4);
    await oneRecordEach(t, c, id, all.map((r) => r.id!));
    const again = await spread(c, 4, (url) => call(url, key, say('Again [[sim tokens=3]]')));
    t.same(
      again.map((r) => r.status),
      [200, 200, 200, 200],
      'the slots are free once the streams end',
    );
  });

  t.test('rpm 6: of 20 simultaneous requests exactly 6 pass', async (t) => {
    const c = cluster();
    const { key, id } = await keyIn(c, { limits: { rpm: 6 } });
    const all = await spread(c, 20, (url) => call(url, key, say('Hi [[sim tokens=2]]', false)));
    t.equal(all.filter((r) => r.status === 200).length, 6);
    t.equal(all.filter((r) => r.status === 429).length, 14);
    await oneRecordEach(t, c, id, all.map((r) => r.id!));
  });

  t.test('a budget is never overshot: each request reserves its worst case at admission', async (t) => {
    const c = cluster();
    // sim-chat is priced one unit per token in these tests; each answer costs its prompt plus 20.
    const { key, id } = await keyIn(c, { budget: { amount: 100, period: 'total' } });
    const statuses: number[] = [];
    const ids: string[] = [];
    // Waves of 6 at once until one is refused whole: then nothing was in flight and what is left
    // is less than one request's worst case (its prompt bound plus max_tokens, at the prices).
    for (let wave = 0; wave < 20; wave++) {
      const all = await spread(c, 6, (url) => call(url, key, { ...say('Spend [[sim tokens=20]]', false), max_tokens: 20 }));
      for (const r of all) (statuses.push(r.status), ids.push(r.id!));
      if (all.every((r) => r.status === 429)) break;
    }
    t.ok(statuses.slice(-6).every((s) => s === 429), 'the budget refuses at last');
    const records = await oneRecordEach(t, c, id, ids);
    const spent = records.reduce((sum, r) => sum + (r.cost ?? 0), 0);
    t.ok(spent > 0, `some requests were served (${spent})`);
    t.ok(spent <= 100, `never over the budget, on any instance (${spent})`);
    const after = await spread(c, 3, (url) => call(url, key, say('More', false)));
    t.same(
      after.map((r) => r.status),
      [429, 429, 429],
      'every instance refuses once it is spent',
    );
  });

  t.test('a key disabled through one instance is refused by all within a second', async (t) => {
    const c = cluster();
    const { key, id } = await keyIn(c);
    // Every instance has the key in its cache.
    for (const url of c.urls) for (let i = 0; i < 3; i++) t.equal((await call(url, key, say('Warm [[sim tokens=1]]', false))).status, 200);
    t.equal((await c.admin('PATCH', `/admin/keys/${id}`, { disabled: true }, c.urls.length - 1)).status, 200);
    await eventually(
      async () => {
        const all = await spread(c, 3 * c.urls.length, (url) => call(url, key, say('Still?', false)));
        return all.every((r) => r.status === 401);
      },
      'every instance to refuse the disabled key',
      1000,
    );
    t.pass('refused everywhere within a second (the caches live for two)');
  });
}
