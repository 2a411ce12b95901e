/**
 * The Redis limiter against a real redis-server: the same decisions as the memory limiter, exact
 * limits across several instances deciding at once, leases that come back after a holder is
 * killed and stay while a live holder renews them, Redis's clock, and the fail modes while Redis
 * is paused or stopped, with recovery when it returns.
 */
import { spawn } from 'node:child_process';
import { Writable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import fc from 'fast-check';
import { Redis } from 'ioredis';
import t from 'tap';
import { createLogger } from '../src/log.js';
import { MemoryLimiter, type MemoryLease } from '../src/limits/memory.js';
import { RedisLimiter, type RedisLease, type RedisLimiterOptions } from '../src/limits/redis.js';
import { WINDOW_MS, type Decision, type LimitScope, type Limiter, type SpendSource } from '../src/limits/limiter.js';
import { simulatorUpstreams, startStack } from './helpers.js';
import { startRedis } from './servers.js';

t.setTimeout(60_000);

const holderScript = fileURLToPath(new URL('fixtures/limiter-redis-holder.js', import.meta.url));

const redis = await startRedis();
const admin = new Redis(redis.url);
const open: RedisLimiter[] = [];
let prefixes = 0;

/** A limiter on the test's Redis, under a fresh prefix unless one is given (to share counters). */
function redisLimiter(options: Partial<RedisLimiterOptions> = {}, spend: SpendSource = async () => 0): RedisLimiter {
  const limiter = new RedisLimiter({ url: redis.url, failMode: 'closed', leaseMs: 30_000, timeoutMs: 1000, prefix: `test${++prefixes}`, ...options }, spend);
  open.push(limiter);
  return limiter;
}

t.teardown(async () => {
  for (const limiter of open) await limiter.close();
  await admin.quit();
  redis.stop();
});

const nothing = { tokens: 0, cost: 0 };
const granted = (decisions: Decision<RedisLease>[]) => decisions.filter((d) => d.granted).length;

/** What must agree between the two limiters: the decision and what the headers would say. */
function comparable(d: Decision<unknown>) {
  const windows = d.windows.map((w) => ({ scope: w.scope, requests: w.requests && [w.requests.limit, w.requests.remaining], tokens: w.tokens && [w.tokens.limit, w.tokens.remaining] }));
  return d.granted ? { granted: true, windows } : { granted: false, scope: d.scope, reason: d.reason, limit: d.limit, windows };
}

t.test('random acquires and settles decide exactly as the memory limiter does', async (t) => {
  const today = new Date();
  const since = Date.UTC(today.getUTCFullYear(), today.getUTCMonth(), today.getUTCDate());
  const cents = fc.integer({ min: 0, max: 300 }).map((c) => c / 100);
  const scopeArb = fc.record({
    limits: fc.record({ rpm: fc.integer({ min: 1, max: 6 }), tpm: fc.integer({ min: 100, max: 1500 }), concurrency: fc.integer({ min: 1, max: 4 }) }, { requiredKeys: [] }),
    budget: fc.option(fc.record({ amount: fc.integer({ min: 1, max: 8 }), ends: fc.boolean() }), { nil: undefined }),
    spent: cents,
  });
  const op = fc.oneof(
    fc.record({ kind: fc.constant('acquire' as const), scopes: fc.uniqueArray(fc.integer({ min: 0, max: 2 }), { minLength: 1, maxLength: 3 }), tokens: fc.integer({ min: 0, max: 400 }), cost: cents }),
    fc.record({ kind: fc.constant('settle' as const), pick: fc.nat(), tokens: fc.integer({ min: 0, max: 400 }), cost: cents }),
  );
  let runs = 0;
  await fc.assert(
    fc.asyncProperty(fc.array(scopeArb, { minLength: 3, maxLength: 3 }), fc.array(op, { maxLength: 50 }), async (defs, ops) => {
      runs++;
      const spentSoFar: SpendSource = async (scope) => defs[Number(scope.slice('key:'.length))]!.spent;
      const memory = new MemoryLimiter(spentSoFar);
      const prefix = `diff${runs}`;
      const shared = redisLimiter({ prefix }, spentSoFar);
      const scopes: LimitScope[] = defs.map((d, i) => ({
        id: `key:${i}`,
        limits: d.limits,
        ...(d.budget && { budget: { amount: d.budget.amount, since, until: d.budget.ends ? since + 86_400_000 : undefined } }),
      }));
      const held: [MemoryLease, RedisLease][] = [];
      const now = Date.now();
      try {
        for (const [step, o] of ops.entries()) {
          if (o.kind === 'settle') {
            if (held.length === 0) continue;
            const [m, r] = held.splice(o.pick % held.length, 1)[0]!;
            memory.settle(m, o, now);
            await shared.settle(r, o);
            continue;
          }
          const chosen = o.scopes.map((i) => scopes[i]!);
          const m = await memory.acquire(chosen, o, now);
          const r = await shared.acquire(chosen, o);
          const [expected, actual] = [JSON.stringify(comparable(m)), JSON.stringify(comparable(r))];
          if (expected !== actual) throw new Error(`step ${step}: memory ${expected}, redis ${actual}`);
          // Waits count from Redis's clock, which has moved on since `now` by at most the time elapsed.
          const drift = Date.now() - now + 1000;
          if (!m.granted && !r.granted && !(r.retryAfterMs > 0 && Math.abs(m.retryAfterMs - r.retryAfterMs) <= drift)) {
            throw new Error(`step ${step}: retryAfterMs memory ${m.retryAfterMs}, redis ${r.retryAfterMs}`);
          }
          if (m.granted && r.granted) held.push([m.lease, r.lease]);
        }
        // Spent and reserved of every budget, to the last bit: the same arithmetic in the same order.
        for (const scope of scopes.filter((s) => s.budget)) {
          const stored = await admin.hmget(`${prefix}:${scope.id}:spend:${since}`, 'spent', 'reserved');
          const actual = stored[0] === null ? undefined : { spent: Number(stored[0]), reserved: Number(stored[1]) };
          const expected = memory.spend(scope.id, since);
          if (JSON.stringify(actual) !== JSON.stringify(expected)) throw new Error(`${scope.id}: memory ${JSON.stringify(expected)}, redis ${JSON.stringify(actual)}`);
        }
      } finally {
        await shared.close();
      }
    }),
    { numRuns: 100 },
  );
  t.equal(runs, 100, '100 random sequences agree with the memory limiter');
});

t.test('three instances deciding at once: limits are exact across them', async (t) => {
  const reads = { count: 0 };
  const spend: SpendSource = async () => (reads.count++, 0);
  const instances = [0, 1, 2].map(() => redisLimiter({ prefix: 'exact' }, spend));
  const burst = (n: number, scope: LimitScope, ask = nothing) => Promise.all(Array.from({ length: n }, (_, i) => instances[i % 3]!.acquire([scope], ask)));

  const slots = await burst(30, { id: 'key:slots', limits: { concurrency: 7 } });
  t.equal(granted(slots), 7, 'concurrency 7, 30 at once: exactly 7 granted');
  t.ok(
    slots.every((d) => d.granted || d.reason === 'concurrency'),
    'the 23 others are refused for concurrency',
  );

  const window = await burst(25, { id: 'key:window', limits: { rpm: 10 } });
  t.equal(granted(window), 10, 'rpm 10, 25 at once: exactly 10 granted');
  const refusal = window.find((d) => !d.granted);
  t.ok(refusal && !refusal.granted && refusal.reason === 'requests' && refusal.retryAfterMs > 0 && refusal.retryAfterMs <= WINDOW_MS, 'refused for requests, with a wait within the minute');

  const budget: LimitScope = { id: 'group:spenders', budget: { amount: 1, since: 0, until: undefined } };
  const spending = await burst(20, budget, { tokens: 0, cost: 0.25 });
  t.equal(granted(spending), 4, 'a budget of 1 at 0.25 a request: 4 in flight (0, 0.25, 0.5, 0.75 spent or reserved at their admission), no more');
  t.ok(reads.count >= 1 && reads.count <= 3, `the period's spend was read at most once per instance (${reads.count})`);
  for (const [i, d] of spending.entries()) if (d.granted) await instances[i % 3]!.settle(d.lease, { tokens: 0, cost: 0.25 });
  const after = await instances[1]!.acquire([budget], { tokens: 0, cost: 0.25 });
  t.ok(!after.granted && after.reason === 'budget' && after.limit === 1, 'settled at their real cost the budget is used up, for every instance');

  const single: LimitScope = { id: 'key:single', limits: { concurrency: 1 } };
  const first = await instances[0]!.acquire([single], nothing);
  if (!first.granted) return t.fail('the first is granted');
  t.notOk((await instances[1]!.acquire([single], nothing)).granted, 'the slot is held');
  await instances[0]!.settle(first.lease, nothing);
  await instances[0]!.settle(first.lease, nothing);
  const [b, c] = await Promise.all([instances[1]!.acquire([single], nothing), instances[2]!.acquire([single], nothing)]);
  t.equal(granted([b, c]), 1, 'settled (twice) the slot is free, and only one slot');
});

t.test('an instance killed while holding slots: they come back within the lease time', async (t) => {
  const leaseMs = 1200;
  const scope: LimitScope = { id: 'key:crash', limits: { concurrency: 3 } };
  const holder = spawn(process.execPath, [holderScript, redis.url, 'crash', String(leaseMs), scope.id, '3'], { stdio: ['ignore', 'pipe', 'inherit'] });
  const exited = new Promise((resolve) => holder.once('exit', resolve));
  t.teardown(() => void holder.kill('SIGKILL'));
  await new Promise<void>((resolve, reject) => {
    holder.stdout!.on('data', (d: Buffer) => d.toString().includes('held') && resolve());
    void exited.then(() => reject(new Error('the holder exited before holding its slots')));
  });
  const limiter = redisLimiter({ prefix: 'crash', leaseMs });
  t.notOk((await limiter.acquire([scope], nothing)).granted, 'the holder has every slot');
  await sleep(3 * leaseMs);
  t.notOk((await limiter.acquire([scope], nothing)).granted, 'three lease times later the live holder still has them (it renews)');

  holder.kill('SIGKILL');
  await exited;
  const rightAfter = await limiter.acquire([scope], nothing);
  t.ok(!rightAfter.granted && rightAfter.reason === 'concurrency', 'refused right after the kill: the leases have not expired yet');
  let back: Decision<RedisLease> | undefined;
  for (const deadline = Date.now() + leaseMs + 3000; Date.now() < deadline; await sleep(50)) {
    back = await limiter.acquire([scope], nothing);
    if (back.granted) break;
  }
  t.ok(back?.granted, 'a slot came back within the lease time (and a margin)');
  const rest = await Promise.all([limiter.acquire([scope], nothing), limiter.acquire([scope], nothing), limiter.acquire([scope], nothing)]);
  t.equal(granted(rest), 2, 'all three came back, and no more');
});

t.test('a live holder keeps its lease far beyond the lease time', async (t) => {
  const limiter = redisLimiter({ prefix: 'renewal', leaseMs: 600 });
  const other = redisLimiter({ prefix: 'renewal', leaseMs: 600 });
  const scope: LimitScope = { id: 'key:long', limits: { concurrency: 1 } };
  const lease = await limiter.acquire([scope], nothing);
  if (!lease.granted) return t.fail('granted');
  await sleep(2000);
  t.notOk((await other.acquire([scope], nothing)).granted, 'held for more than three lease times: still held');
  t.equal(limiter.stats.leasesLost, 0, 'no lease lost');
  await limiter.settle(lease.lease, nothing);
  t.ok((await other.acquire([scope], nothing)).granted, 'settled, the slot is free');
});

t.test('a holder gone without settling: its reservation returns with its lease, a late settle still counts', async (t) => {
  const gone = redisLimiter({ prefix: 'reserve', leaseMs: 500 });
  const other = redisLimiter({ prefix: 'reserve', leaseMs: 500 });
  const budget: LimitScope = { id: 'group:reserve', budget: { amount: 1, since: 0, until: undefined } };
  const first = await gone.acquire([budget], { tokens: 0, cost: 1 });
  if (!first.granted) return t.fail('granted');
  await gone.close(); // no renewal, no settle: a crashed instance
  t.match(await other.acquire([budget], nothing), { granted: false, reason: 'budget' }, 'refused while the reservation stands');
  let back: Decision<RedisLease> | undefined;
  for (const deadline = Date.now() + 500 + 3000; Date.now() < deadline; await sleep(50)) {
    back = await other.acquire([budget], nothing);
    if (back.granted) break;
  }
  if (!back?.granted) return t.fail('the reservation came back within the lease time');
  await other.settle(back.lease, nothing);
  await other.settle(first.lease, { tokens: 0, cost: 0.5 });
  t.same(await admin.hmget('reserve:group:reserve:spend:0', 'spent', 'reserved'), ['0.5', '0'], 'the late settle counted its spend, and nothing stays reserved');
});

t.test("a request whose own reservation does not fit is refused, as by the memory limiter", async (t) => {
  const limiter = redisLimiter({}, async () => 0.3);
  const scope: LimitScope = { id: 'key:own', budget: { amount: 1, since: 0, until: undefined } };
  const ask = (cost: number) => limiter.acquire([scope], { tokens: 0, cost });
  t.match(await ask(0.8), { granted: false, reason: 'budget', limit: 1, budget: { spent: 0.3, reserved: 0 } }, 'spent 0.3 + 0.8 > 1: refused although nothing is reserved');
  const held = await Promise.all([ask(0.1), ask(0.2), ask(0.4)]);
  t.equal(granted(held), 3, '0.3 + 0.1 + 0.2 + 0.4 = 1: all fit exactly');
  t.match(await ask(0.000_000_001), { granted: false, reason: 'budget', retryAfterMs: 1000 }, 'a billionth more does not; it would fit once those in flight settle: a second');
  for (const d of held) if (d.granted) await limiter.settle(d.lease, { tokens: 0, cost: 0.1 });
  t.match(await ask(0.5), { granted: false, reason: 'budget' }, 'settled at 0.1 each: 0.4 left');
  t.ok((await ask(0.4)).granted, '0.4 fits');
});

t.test('a refusal waits for the entries that must leave the window', async (t) => {
  const limiter = redisLimiter();
  const scope = (limits: { rpm?: number; tpm?: number }): LimitScope => ({ id: 'key:waits', limits });
  const wait = async (limits: { rpm?: number; tpm?: number }, tokens: number) => {
    const d = await limiter.acquire([scope(limits)], { tokens, cost: 0 });
    if (d.granted) throw new Error(`granted past ${JSON.stringify(limits)}`);
    return d.retryAfterMs;
  };
  t.ok((await limiter.acquire([scope({ rpm: 3, tpm: 100 })], { tokens: 60, cost: 0 })).granted);
  await sleep(1000);
  t.ok((await limiter.acquire([scope({ rpm: 3, tpm: 100 })], { tokens: 30, cost: 0 })).granted, 'a second entry, a second later');
  const [oneMustLeave, twoMustLeave] = [await wait({ rpm: 2 }, 0), await wait({ rpm: 1 }, 0)];
  t.ok(oneMustLeave <= WINDOW_MS - 500 && twoMustLeave - oneMustLeave >= 500, `rpm: the first entry's wait (${oneMustLeave}), then the second's (${twoMustLeave})`);
  const [firstFrees, bothFree] = [await wait({ tpm: 100 }, 40), await wait({ tpm: 100 }, 80)];
  t.ok(firstFrees <= WINDOW_MS - 500 && bothFree - firstFrees >= 500, `tpm: 60 tokens free with the first (${firstFrees}), 70 need the second (${bothFree})`);
});

t.test("a refusal's wait reads a bounded part of a crowded window: one key cannot hold Redis for every tenant", async (t) => {
  const limiter = redisLimiter();
  const scope: LimitScope = { id: 'key:crowded', limits: { tpm: 1_000_000 } };
  for (let i = 0; i < 5000; i += 100) {
    await Promise.all(Array.from({ length: 100 }, () => limiter.acquire([scope], { tokens: 1, cost: 0 })));
  }
  const hgets = async () => Number(/cmdstat_hget:calls=(\d+)/.exec(await admin.info('commandstats'))?.[1] ?? 0);
  const before = await hgets();
  // It fits only once all 5,000 entries have left: finding that would read every one of them.
  const refused = await limiter.acquire([scope], { tokens: 1_000_000 - 1, cost: 0 });
  const read = (await hgets()) - before;
  t.match(refused, { granted: false, reason: 'tokens' });
  t.ok(read <= 1100, `${read} entries read for the wait (before, all 5,000)`);
  t.equal(refused.granted ? 0 : refused.retryAfterMs, WINDOW_MS, 'past the bound, the wait is the whole window');
});

t.test("windows and budgets run on Redis's clock, not the caller's", async (t) => {
  const limiter = redisLimiter();
  const scope: LimitScope = { id: 'key:clock', limits: { rpm: 1 } };
  t.ok((await limiter.acquire([scope], nothing)).granted, 'the first request');
  const asLimiter: Limiter<RedisLease> = limiter;
  const later = await asLimiter.acquire([scope], nothing, Date.now() + 10 * WINDOW_MS);
  t.ok(!later.granted && later.reason === 'requests', 'a caller claiming ten minutes later is still in the same window');

  const until = Date.now() + 3_600_000;
  const budget: LimitScope = { id: 'group:clock', budget: { amount: 1, since: 0, until } };
  const before = await redisNow();
  const spent = redisLimiter({}, async () => 5);
  const refused = await spent.acquire([budget], nothing);
  const after = await redisNow();
  if (refused.granted) return t.fail('the budget is spent');
  t.ok(until - refused.retryAfterMs >= before && until - refused.retryAfterMs <= after, 'the wait until the period ends is measured from Redis TIME during the decision');
});

async function redisNow(): Promise<number> {
  const [seconds, micros] = await admin.time();
  return Number(seconds) * 1000 + Math.floor(Number(micros) / 1000);
}

t.test('Redis paused or stopped: the fail mode, logged and counted, then recovery', async (t) => {
  const flaky = await startRedis();
  t.teardown(() => flaky.stop());
  const logs = { open: [] as { level: number; msg: string }[], closed: [] as { level: number; msg: string }[] };
  const sink = (into: { level: number; msg: string }[]) =>
    createLogger(
      'info',
      new Writable({
        write(chunk, _enc, cb) {
          for (const line of chunk.toString().split('\n')) if (line) into.push(JSON.parse(line));
          cb();
        },
      }),
    );
  const timeoutMs = 300;
  const limiters = {
    open: redisLimiter({ url: flaky.url, failMode: 'open', timeoutMs, log: sink(logs.open) }),
    closed: redisLimiter({ url: flaky.url, failMode: 'closed', timeoutMs, log: sink(logs.closed) }),
  };
  const scope: LimitScope = { id: 'key:flaky', limits: { concurrency: 1, rpm: 1000 } };
  /** A decision, which must come within the timeout and a margin. */
  const decide = async (limiter: RedisLimiter, scopes = [scope]) => {
    const bound = sleep(timeoutMs + 2000).then(() => 'late' as const);
    const decision = await Promise.race([limiter.acquire(scopes, nothing), bound]);
    if (decision === 'late') throw new Error('no decision within the timeout');
    return decision;
  };
  const warnings = (lines: { level: number; msg: string }[]) => lines.filter((l) => l.level === 40 && l.msg.includes('unavailable')).length;
  const recoveries = (lines: { level: number; msg: string }[]) => lines.filter((l) => l.level === 30 && l.msg.includes('available again')).length;

  const held = await decide(limiters.open);
  t.ok(held.granted && held.lease.counted, 'with Redis up, a counted lease');
  t.ok((await decide(limiters.closed, [{ id: 'key:other', limits: { concurrency: 1 } }])).granted, 'and for the closed limiter too');

  // Redis not answering: a paused server holds the scripts past timeoutMs.
  const paused = new Redis(flaky.url);
  await paused.call('CLIENT', 'PAUSE', '1500', 'ALL');
  const pausedScope: LimitScope = { id: 'key:paused', limits: { concurrency: 100 } };
  const openPaused = await decide(limiters.open, [pausedScope]);
  t.ok(openPaused.granted && !openPaused.lease.counted && openPaused.windows.length === 0, 'open: granted uncounted, without windows');
  const closedPaused = await decide(limiters.closed, [pausedScope]);
  t.match(closedPaused, { granted: false, reason: 'unavailable', scope: 'key:paused', retryAfterMs: 1000, windows: [] }, 'closed: refused as unavailable');
  await paused.ping(); // answered when the pause is over
  paused.disconnect();
  const recovered = async (limiter: RedisLimiter) => {
    for (const deadline = Date.now() + 10_000; Date.now() < deadline; await sleep(100)) {
      const d = await decide(limiter, [{ id: `key:probe${Math.random()}`, limits: { concurrency: 1 } }]);
      if (d.granted && d.lease.counted) return true;
    }
    return false;
  };
  t.ok((await recovered(limiters.open)) && (await recovered(limiters.closed)), 'answering again, both decide with Redis again');

  // Redis stopped: connections refused, every decision fails at once.
  flaky.stop();
  for (let i = 0; i < 5; i++) {
    const d = await decide(limiters.open);
    t.ok(d.granted && !d.lease.counted, `open, stopped, decision ${i + 1}: granted uncounted`);
    if (d.granted) await limiters.open.settle(d.lease, { tokens: 10, cost: 1 });
    t.match(await decide(limiters.closed), { granted: false, reason: 'unavailable' }, `closed, stopped, decision ${i + 1}: refused`);
  }
  if (held.granted) await limiters.open.settle(held.lease, nothing);
  t.equal(limiters.open.stats.settlesFailed, 1, 'the counted lease could not be settled, and that was counted (not thrown)');
  t.equal(limiters.open.stats.failedOpen, 6, 'open: 6 decisions without Redis');
  t.equal(limiters.closed.stats.failedClosed, 6, 'closed: 6 refusals without Redis');
  t.equal(limiters.open.available, false);
  t.equal(warnings(logs.open), 2, 'open: one warning per outage, not one per decision');
  t.equal(warnings(logs.closed), 2, 'closed: one warning per outage');
  t.ok(logs.closed.some((l) => l.level === 40 && (l as { failMode?: string }).failMode === 'closed'), 'the warning names the fail mode');

  flaky.start();
  t.ok((await recovered(limiters.open)) && (await recovered(limiters.closed)), 'Redis back (empty): both decide with it again');
  const again = await decide(limiters.closed);
  t.ok(again.granted && again.lease.counted, 'the scope is counted again');
  t.notOk((await decide(limiters.closed)).granted, 'and limited again');
  t.equal(limiters.closed.available, true);
  t.equal(recoveries(logs.open), 2, 'open: recovery logged once per outage');
  t.equal(recoveries(logs.closed), 2, 'closed: recovery logged once per outage');
});

t.test('through a gateway failing closed: limited requests get a 503 in their family shape while Redis is down', async (t) => {
  const down = await startRedis();
  t.teardown(() => down.stop());
  const { gw } = await startStack(
    (sim) => `${simulatorUpstreams(sim)}limiter: { kind: redis, url: "${down.url}", failMode: closed, timeoutMs: 300 }
models:
  - { id: sim-chat, upstream: chat, maxOutputTokens: { default: 64 } }
  - { id: sim-gemini, upstream: gemini, maxOutputTokens: { default: 64 } }
  - { id: sim-messages, upstream: messages, maxOutputTokens: { default: 64 } }
`,
  );
  const group = await gw.admin('POST', '/admin/groups', { name: 'limited', models: ['*'], families: ['chat', 'responses', 'gemini', 'messages'], limits: { rpm: 1000 } });
  t.equal(group.status, 201);
  const key = (await gw.admin('POST', '/admin/keys', { group: 'limited' })).body.key as string;
  const headers = { authorization: `Bearer ${key}`, 'x-goog-api-key': key, 'content-type': 'application/json', 'anthropic-version': '2023-06-01' };
  const post = async (path: string, body: unknown) => {
    const res = await fetch(gw.url + path, { method: 'POST', headers, body: JSON.stringify(body) });
    return { status: res.status, headers: res.headers, body: JSON.parse(await res.text()) };
  };
  const calls = {
    chat: () => post('/v1/chat/completions', { model: 'sim-chat', messages: [{ role: 'user', content: 'Hi' }] }),
    responses: () => post('/v1/responses', { model: 'sim-chat', input: 'Hi' }),
    messages: () => post('/v1/messages', { model: 'sim-messages', max_tokens: 16, messages: [{ role: 'user', content: 'Hi' }] }),
    gemini: () => post('/v1beta/models/sim-gemini:generateContent', { contents: [{ role: 'user', parts: [{ text: 'Hi' }] }] }),
  };

  const up = await calls.chat();
  t.equal(up.status, 200);
  t.equal(up.headers.get('x-ratelimit-limit-requests'), '1000', 'counted in Redis, with its headers');

  down.stop();
  const shapes = {
    chat: { error: { type: 'service_unavailable', code: 'overloaded' } },
    responses: { error: { type: 'service_unavailable', code: 'overloaded' } },
    messages: { type: 'error', error: { type: 'overloaded_error' } },
    gemini: { error: { code: 503, status: 'UNAVAILABLE' } },
  };
  for (const [family, call] of Object.entries(calls)) {
    const res = await call();
    t.equal(res.status, 503, `${family}: 503`);
    t.equal(res.headers.get('retry-after'), '1', `${family}: Retry-After`);
    t.notOk([...res.headers.keys()].some((h) => h.startsWith('x-ratelimit')), `${family}: no x-ratelimit headers`);
    t.match(res.body, shapes[family as keyof typeof shapes], `${family}: its own error shape`);
  }
  t.ok(gw.logs.some((l) => l.level === 40 && String(l.msg).includes('Redis limiter unavailable') && l.failMode === 'closed'), 'logged, with the fail mode');

  down.start();
  let back = 0;
  for (const deadline = Date.now() + 10_000; Date.now() < deadline && back !== 200; await sleep(100)) back = (await calls.chat()).status;
  t.equal(back, 200, 'Redis back: served again');
});
