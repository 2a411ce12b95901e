/**
 * Prompt-cache affinity pins shared through the Redis limiter's Redis: two gateway instances on one
 * Redis, a model with two channels. A conversation instance A pinned to its second channel after
 * its first failed is served by that channel on instance B too, straight away, while a
 * conversation never pinned goes to its first-ranked channel on B; serving a pinned conversation
 * asks Redis nothing.
 */
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Redis } from 'ioredis';
import t from 'tap';
import { eventually, fixedCompletion, startTestGateway, type TestGateway } from './helpers.js';
import { startRedis } from './servers.js';

t.setTimeout(120_000);

const redis = await startRedis();
const admin = new Redis(redis.url);
t.teardown(() => admin.disconnect());

/** An OpenAI-compatible upstream that answers, or, while `failing`, answers 500: the channel to fail over from. */
const flaky = { failing: false, calls: 0 };
const upstream = createServer((req, res) => {
  flaky.calls++;
  req.resume().on('end', () => {
    if (flaky.failing) return void res.writeHead(500, { 'content-type': 'application/json' }).end('{"error":{"message":"down for the test"}}');
    res.writeHead(200, { 'content-type': 'application/json' }).end(fixedCompletion('chatcmpl-flaky', 'sim-chat'));
  });
});
await new Promise<void>((resolve) => upstream.listen(0, '127.0.0.1', resolve));
t.teardown(() => upstream.close());
const upstreamUrl = `http://127.0.0.1:${(upstream.address() as AddressInfo).port}`;

const PREFIX = 'pins-test';
const PIN_TTL_SECONDS = 600;
// The same config on both instances but the data dir: each its own store, one Redis. The breaker
// needs many failures to open, so only a pin keeps a conversation away from `flaky`.
const config = (dataDir: string) => `dataDir: ${dataDir}
limiter: { kind: redis, url: "${redis.url}", prefix: ${PREFIX}, failMode: open }
affinity: { pinTtlSeconds: ${PIN_TTL_SECONDS} }
upstreams:
  flaky: { kind: openai-chat, baseUrl: "${upstreamUrl}/v1", retry: { attempts: 2, backoffMs: 1 }, breaker: { failures: 1000, minRequests: 1000 } }
  steady: { kind: simulator }
models:
  - id: m
    channels: [{ upstream: flaky, upstreamModel: sim-chat }, { upstream: steady, upstreamModel: sim-chat }]
`;
const a = await startTestGateway(config);
t.teardown(() => a.stop());
const b = await startTestGateway(config);
t.teardown(() => b.stop());

/** One turn of the conversation `session` (Claude Code's session header keys it) on `gw`: the channel that served it and its attempts. */
async function turn(gw: TestGateway, session: string, n: number, directive = ''): Promise<{ channel: string; attempts: number }> {
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${gw.key}`, 'content-type': 'application/json', 'x-claude-code-session-id': session },
    body: JSON.stringify({ model: 'm', max_tokens: 8, messages: [{ role: 'user', content: `Turn ${n} of ${session} ${directive}` }] }),
  });
  if (res.status !== 200) throw new Error(`${res.status}: ${await res.text()}`);
  const id = res.headers.get('x-request-id');
  return eventually(async () => {
    const records = (await gw.admin('GET', '/admin/requests?model=m&limit=1000')).body.data as { requestId: string; channel: string; attempts: number }[];
    return records.find((r) => r.requestId === id);
  }, `the usage record of ${id}`);
}

let pinned = '';
let unpinned = '';

const commandsProcessed = async () => Number(/total_commands_processed:(\d+)/.exec(await admin.info('stats'))![1]);

t.test("a conversation pinned by one instance after a failover is served by the same channel on another", async (t) => {
  // Conversations whose first-ranked channel is `flaky` (rendezvous hashing ranks alike everywhere): two of them.
  const onFlaky: string[] = [];
  for (let i = 0; onFlaky.length < 2; i++) {
    if (i === 64) throw new Error('no conversation ranked flaky first in 64: the ranking is not spread');
    const session = `conversation-${i}`;
    if ((await turn(a, session, 1)).channel === 'flaky') onFlaky.push(session);
  }
  [pinned, unpinned] = onFlaky as [string, string];
  t.same(await admin.keys(`${PREFIX}:pin:*`), [], 'nothing pinned while the first-ranked channel serves');

  flaky.failing = true;
  t.match(await turn(a, pinned, 2), { channel: 'steady', attempts: 2 }, 'instance A fails over from flaky and pins the conversation to steady');
  flaky.failing = false;

  // The pin is written with its TTL, and published in the same step: by the time it can be read
  // here, B's subscriber has the message too.
  const keys = await eventually(async () => {
    const found = await admin.keys(`${PREFIX}:pin:*`);
    return found.length > 0 && found;
  }, 'the pin in Redis');
  t.equal(keys.length, 1, 'one pin');
  t.equal(await admin.get(keys[0]!), 'steady/sim-chat', "the pin names the channel's upstream and model");
  const ttl = await admin.pttl(keys[0]!);
  t.ok(ttl > 0 && ttl <= PIN_TTL_SECONDS * 1000, `it expires with the pin's TTL (${ttl} ms left)`);

  const callsBefore = flaky.calls;
  const commandsBefore = await commandsProcessed();
  t.match(await turn(b, pinned, 3), { channel: 'steady', attempts: 1 }, 'instance B serves the next turn on the pinned channel, straight away');
  t.equal(flaky.calls, callsBefore, 'without trying flaky, which is healthy again');
  // The usage record read above and INFO itself are the only commands; finding the pin asked Redis nothing.
  t.equal((await commandsProcessed()) - commandsBefore, 1, 'serving the pinned turn sent Redis no command');

  t.match(await turn(b, unpinned, 2), { channel: 'flaky', attempts: 1 }, 'a conversation never pinned goes to its first-ranked channel on B');
});

t.test('a conversation back on its first-ranked channel is unpinned on every instance', async (t) => {
  t.ok(pinned, 'the conversation pinned by the test before');
  // Its pinned channel fails on B (the simulator's error directive): B fails over to flaky, the
  // conversation's first-ranked channel, and drops the pin.
  t.match(await turn(b, pinned, 4, '[[sim error=500]]'), { channel: 'flaky', attempts: 2 }, 'B fails over to the first-ranked channel');
  await eventually(async () => (await admin.keys(`${PREFIX}:pin:*`)).length === 0, 'the pin gone from Redis');
  t.match(await turn(a, pinned, 5), { channel: 'flaky', attempts: 1 }, 'A heard it: the next turn goes to the first-ranked channel');
});

t.test('the pin bus: a limiter that connects later reads every live pin', async (t) => {
  const { RedisLimiter } = await import('../src/limits/redis.js');
  const limiter = (prefix: string) => new RedisLimiter({ url: redis.url, failMode: 'open', leaseMs: 30_000, timeoutMs: 1000, prefix }, async () => 0);
  const first = limiter('bus-test');
  t.teardown(() => first.close());
  const heardByFirst: string[] = [];
  first.pins.subscribe((key) => heardByFirst.push(key));
  first.pins.publish('m\0one', 'east/sim-chat', 60_000);
  first.pins.publish('m\0two', 'west/sim-chat', 60_000);
  first.pins.publish('m\0two', undefined, 60_000);
  await eventually(async () => (await admin.keys('bus-test:pin:*')).length === 1, 'one pin left in Redis');

  const later = limiter('bus-test');
  t.teardown(() => later.close());
  const heard = new Map<string, { channel: string | undefined; ttlMs: number }>();
  later.pins.subscribe((key, channel, ttlMs) => heard.set(key, { channel, ttlMs }));
  const pin = await eventually(() => heard.get('m\0one'), 'the later limiter to read the live pin');
  t.equal(pin.channel, 'east/sim-chat');
  t.ok(pin.ttlMs > 0 && pin.ttlMs <= 60_000, 'with what is left of its TTL');
  t.notOk(heard.has('m\0two'), 'a dropped pin is not read');

  later.pins.publish('m\0three', 'west/sim-chat', 60_000);
  await eventually(() => heardByFirst.includes('m\0three'), 'the first limiter to hear the later one');
  t.pass('published pins reach the other limiters');
});
