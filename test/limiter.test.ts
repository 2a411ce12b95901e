/**
 * The in-memory limiter against a model of what it promises: random interleavings of admissions,
 * settlements and the passing of time, each decision checked against concurrency and sliding
 * windows kept independently here; a refusal takes nothing, and every slot comes back.
 */
import fc from 'fast-check';
import t from 'tap';
import { WINDOW_MS, type LimitScope } from '../src/limits/limiter.js';
import { MemoryLimiter, type MemoryLease } from '../src/limits/memory.js';

const noSpend = async () => 0;

type Op = { kind: 'acquire'; scopes: number[]; tokens: number } | { kind: 'settle'; pick: number; used: number } | { kind: 'wait'; ms: number };

const op: fc.Arbitrary<Op> = fc.oneof(
  fc.record({ kind: fc.constant('acquire' as const), scopes: fc.uniqueArray(fc.integer({ min: 0, max: 2 }), { minLength: 1, maxLength: 3 }), tokens: fc.integer({ min: 0, max: 400 }) }),
  fc.record({ kind: fc.constant('settle' as const), pick: fc.nat(), used: fc.integer({ min: 0, max: 400 }) }),
  fc.record({ kind: fc.constant('wait' as const), ms: fc.integer({ min: 1, max: 30_000 }) }),
);

const limitsArb = fc.record({ rpm: fc.integer({ min: 1, max: 6 }), tpm: fc.integer({ min: 100, max: 1500 }), concurrency: fc.integer({ min: 1, max: 4 }) }, { requiredKeys: [] });

t.test('every decision is exactly what the limits allow, and a refusal takes nothing', async (t) => {
  fc.assert(
    fc.property(fc.array(limitsArb, { minLength: 3, maxLength: 3 }), fc.array(op, { maxLength: 120 }), (limits, ops) => {
      const limiter = new MemoryLimiter(noSpend);
      const scopes: LimitScope[] = limits.map((l, i) => ({ id: `key:${i}`, limits: l }));
      // The model: slots held and the window's entries (time, tokens) per scope.
      const active = [0, 0, 0];
      const windows: { t: number; tokens: number }[][] = [[], [], []];
      const held: { lease: MemoryLease; scopes: number[]; entries: { t: number; tokens: number }[] }[] = [];
      let now = 1_000_000;
      for (const o of ops) {
        if (o.kind === 'wait') now += o.ms;
        else if (o.kind === 'settle') {
          if (held.length === 0) continue;
          const h = held.splice(o.pick % held.length, 1)[0]!;
          limiter.settle(h.lease, { tokens: o.used, cost: 0 }, now);
          for (const i of h.scopes) active[i]!--;
          for (const e of h.entries) if (e.t > now - WINDOW_MS) e.tokens = o.used;
        } else {
          const fits = o.scopes.every((i) => {
            const l = limits[i]!;
            const recent = windows[i]!.filter((e) => e.t > now - WINDOW_MS);
            const tokens = recent.reduce((sum, e) => sum + e.tokens, 0);
            const rpmOk = l.rpm === undefined || recent.length < l.rpm;
            const tpmOk = l.tpm === undefined || tokens + o.tokens <= l.tpm;
            return (l.concurrency === undefined || active[i]! < l.concurrency) && rpmOk && tpmOk;
          });
          const decision = limiter.acquire(o.scopes.map((i) => scopes[i]!), { tokens: o.tokens, cost: 0 }, now);
          if (decision instanceof Promise) throw new Error('no budget: the decision is synchronous');
          if (decision.granted !== fits) return false;
          if (decision.granted) {
            const entries = o.scopes.map((i) => {
              active[i]!++;
              const e = { t: now, tokens: o.tokens };
              windows[i]!.push(e);
              return e;
            });
            held.push({ lease: decision.lease, scopes: o.scopes, entries });
          } else if (decision.retryAfterMs <= 0) return false;
        }
      }
      // Everything settled and a window later, every scope has all its room back.
      for (const h of held) limiter.settle(h.lease, { tokens: 0, cost: 0 }, now);
      now += WINDOW_MS + 1;
      return scopes.every((s) => {
        const slots = Array.from({ length: Math.min(s.limits!.concurrency ?? 4, s.limits!.rpm ?? 4) }, () => limiter.acquire([s], { tokens: 0, cost: 0 }, now));
        return slots.every((d) => !(d instanceof Promise) && d.granted);
      });
    }),
    { numRuns: 300 },
  );
  t.pass('300 random interleavings agree with the model');
});

t.test('a budget: the spend so far is read once, reservations stop a burst, settled costs replace them', async (t) => {
  let reads = 0;
  const limiter = new MemoryLimiter(async () => (reads++, 2));
  const scope: LimitScope = { id: 'group:g', budget: { amount: 10, since: 0, until: undefined } };
  const first = await limiter.acquire([scope], { tokens: 0, cost: 4 }, 1);
  t.ok(first.granted, 'spent 2 + reserved 0 < 10');
  const second = limiter.acquire([scope], { tokens: 0, cost: 4 }, 2) as Awaited<typeof first>;
  t.ok(second.granted, 'spent 2 + reserved 4 < 10, decided at once');
  const third = limiter.acquire([scope], { tokens: 0, cost: 4 }, 3) as Awaited<typeof first>;
  t.notOk(third.granted, 'spent 2 + reserved 8 ≥ 10: refused while the others run');
  t.equal(reads, 1, 'the spend is read once per period');
  if (!first.granted || !second.granted || third.granted) return;
  t.equal(third.reason, 'budget');
  limiter.settle(first.lease, { tokens: 0, cost: 1 });
  limiter.settle(second.lease, { tokens: 0, cost: 1 });
  t.same(limiter.spend('group:g', 0), { spent: 4, reserved: 0 });
  t.ok((limiter.acquire([scope], { tokens: 0, cost: 4 }, 4) as Awaited<typeof first>).granted, 'the real cost was small: room again');
  const nextPeriod = limiter.acquire([{ ...scope, budget: { amount: 10, since: 100, until: undefined } }], { tokens: 0, cost: 1 }, 5);
  t.ok(nextPeriod instanceof Promise, 'a new period reads its spend first');
  await nextPeriod;
  t.equal(reads, 2);
});

t.test('a settled lease is settled once', async (t) => {
  const limiter = new MemoryLimiter(noSpend);
  const scope: LimitScope = { id: 'key:k', limits: { concurrency: 1 } };
  const d = limiter.acquire([scope], { tokens: 0, cost: 0 }, 1);
  if (d instanceof Promise || !d.granted) return t.fail('granted');
  limiter.settle(d.lease, { tokens: 0, cost: 0 });
  limiter.settle(d.lease, { tokens: 0, cost: 0 });
  const a = limiter.acquire([scope], { tokens: 0, cost: 0 }, 2);
  const b = limiter.acquire([scope], { tokens: 0, cost: 0 }, 3);
  t.ok(!(a instanceof Promise) && a.granted, 'one slot');
  t.ok(!(b instanceof Promise) && !b.granted, 'and only one: a second settle did not free another');
});

t.test("a budget admits a request only when its own reservation fits in what is left", async (t) => {
  const limiter = new MemoryLimiter(async () => 0.3);
  const period = { amount: 1, since: 0, until: 10_000 };
  const scope: LimitScope = { id: 'key:own', budget: period };
  const ask = (cost: number, now: number) => limiter.acquire([scope], { tokens: 0, cost }, now);
  // The period's spend is read once, then decisions are synchronous and at the given time.
  const primed = await ask(0, 0);
  if (primed.granted) limiter.settle(primed.lease, { tokens: 0, cost: 0 }, 0);
  const tooDear = ask(0.8, 1);
  t.match(tooDear, { granted: false, reason: 'budget', limit: 1, budget: { spent: 0.3, reserved: 0 }, retryAfterMs: 9_999 }, 'spent 0.3 + 0.8 > 1: refused although nothing is reserved, until the period ends');
  // 0.1 + 0.2 is 0.30000000000000004 in binary: costs compare in billionths.
  const a = ask(0.1, 2);
  const b = ask(0.2, 3);
  const c = ask(0.4, 4);
  t.ok(!(a instanceof Promise) && a.granted && !(b instanceof Promise) && b.granted && !(c instanceof Promise) && c.granted, '0.3 + 0.1 + 0.2 + 0.4 = 1: all fit exactly');
  const more = ask(0.000_000_001, 5);
  t.match(more, { granted: false, reason: 'budget', budget: { reserved: 0.7000000000000001 }, retryAfterMs: 1000 }, 'a billionth more does not; it would fit once those in flight settle: a second');
  if (a instanceof Promise || !a.granted || b instanceof Promise || !b.granted || c instanceof Promise || !c.granted) return;
  limiter.settle(a.lease, { tokens: 0, cost: 0.05 });
  t.match(ask(0.06, 6), { granted: false, reason: 'budget' }, 'settled at 0.05, what is left is 0.05');
  const fits = ask(0.05, 7);
  t.ok(!(fits instanceof Promise) && fits.granted, '0.05 fits');
  const unpriced = ask(0, 8);
  t.match(unpriced, { granted: false, reason: 'budget' }, 'used up (spent and reserved reach the amount): even a request that costs nothing is refused');
});
