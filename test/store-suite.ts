/**
 * What every StoreBackend does, the same on each database: test/store.test.ts runs this suite
 * against SQLite and PostgreSQL. Each subtest gets a fresh, empty database.
 */
import type { Test } from 'tap';
import type { AuditEntry, GroupInput, StoreBackend, UsageRecord } from '../src/store/store.js';
import { eventually } from './helpers.js';

export interface StoreFixture {
  store: StoreBackend;
  /** Another connection to the same database, as another worker thread or instance opens it. */
  reopen(): Promise<StoreBackend>;
}

let requests = 0;

/** A usage record with every field set; `fields` overrides. */
export function usage(fields: Partial<UsageRecord> = {}): UsageRecord {
  return {
    time: 1_700_000_000_000,
    requestId: `req_${process.pid}_${++requests}`,
    keyId: null,
    group: null,
    model: 'sim-chat',
    upstream: 'sim',
    family: 'openai-chat',
    status: 200,
    promptTokens: 10,
    completionTokens: 5,
    cachedInputTokens: null,
    cacheWriteTokens: null,
    reasoningTokens: null,
    cost: null,
    channel: null,
    attempts: 1,
    estimated: false,
    latencyMs: 100,
    ttfbMs: null,
    streamed: false,
    outcome: 'finished',
    error: null,
    notes: null,
    ...fields,
  };
}

const group = (name: string, fields: Partial<GroupInput> = {}): GroupInput => ({ name, models: ['*'], families: ['openai-chat'], ...fields });

/**
 * Waits until `watcher` is listening: a watch may take a moment to begin (PostgreSQL's LISTEN
 * connects first), so `write` runs now and then until a change is heard.
 */
export async function untilListening(write: () => Promise<unknown>, heard: () => number): Promise<void> {
  let lastWrite = 0;
  await eventually(async () => {
    if (heard() > 0) return true;
    if (Date.now() - lastWrite > 250) {
      lastWrite = Date.now();
      await write();
    }
    return false;
  }, 'a first change heard', 10_000);
}

export function storeSuite(t: Test, name: string, open: () => Promise<StoreFixture>): Promise<unknown> {
  return t.test(name, async (t) => {
    /** A fresh database for one subtest; every connection to it is closed when the subtest ends. */
    const fresh = async (t: Test): Promise<StoreFixture> => {
      const fixture = await open();
      const opened = [fixture.store];
      t.teardown(async () => {
        for (const store of opened) await store.close();
      });
      const reopen = async () => {
        const store = await fixture.reopen();
        opened.push(store);
        return store;
      };
      return { store: fixture.store, reopen };
    };

    t.test('groups: create, read, list and update', async (t) => {
      const { store } = await fresh(t);
      const before = Date.now();
      const alpha = await store.createGroup(group('alpha', { models: ['sim-chat', 'gpt-*'] }));
      t.strictSame(alpha, { name: 'alpha', models: ['sim-chat', 'gpt-*'], families: ['openai-chat'], limits: null, budget: null, mcpTools: [], createdAt: alpha.createdAt });
      t.ok(alpha.createdAt >= before && alpha.createdAt <= Date.now(), 'createdAt is unix milliseconds, as a number');
      t.strictSame(await store.getGroup('alpha'), alpha);

      const limits = { rpm: 60, tpm: 100_000, concurrency: 2 };
      const budget = { amount: 12.5, period: 'month' as const };
      const beta = await store.createGroup(group('Beta', { models: [], families: ['openai-chat', 'gemini'], limits, budget }));
      t.strictSame(beta.limits, limits);
      t.strictSame(await store.getGroup('Beta'), beta, 'limits and budget round-trip');
      await store.createGroup(group('beta'));
      t.strictSame((await store.listGroups()).map((g) => g.name), ['Beta', 'alpha', 'beta'], 'listed by name, in byte order');
      t.equal(await store.getGroup('missing'), undefined);
      await t.rejects(store.createGroup(group('alpha')), 'a name is taken once');

      const updated = await store.updateGroup('alpha', { models: ['other'], limits: { rpm: 5 } });
      t.strictSame(updated, { ...alpha, models: ['other'], limits: { rpm: 5 } }, 'update changes what the patch names');
      t.strictSame(await store.getGroup('alpha'), updated);
      t.strictSame(await store.updateGroup('Beta', { limits: null, budget: null }), { ...beta, limits: null, budget: null }, 'limits and budget cleared');
      t.strictSame(await store.updateGroup('Beta', { budget: { amount: 1, period: 'total' } }), { ...beta, limits: null, budget: { amount: 1, period: 'total' } });
      t.equal(await store.updateGroup('missing', { models: [] }), undefined);

      const tools = ['everything/*', 'files/read_text_file'];
      const gamma = await store.createGroup(group('gamma', { mcpTools: tools }));
      t.strictSame(gamma.mcpTools, tools, 'MCP grants are stored');
      t.strictSame((await store.getGroup('gamma'))?.mcpTools, tools, 'and read back');
      t.strictSame((await store.updateGroup('gamma', { models: ['x'] }))?.mcpTools, tools, 'an update that does not name them keeps them');
      t.strictSame((await store.updateGroup('gamma', { mcpTools: [] }))?.mcpTools, [], 'and one that does replaces them');
    });

    t.test('a rename moves the group, its keys and its usage', async (t) => {
      const { store } = await fresh(t);
      await store.createGroup(group('old'));
      const { key, secret } = await store.createKey({ group: 'old' });
      await store.writeUsage([usage({ keyId: key.id, group: 'old' }), usage({ keyId: key.id, group: 'old' })]);
      t.equal((await store.updateGroup('old', { name: 'new' }))?.name, 'new');
      // A group's budget is spent from its records by name: left behind, they would refill it.
      t.equal((await store.queryUsage({ group: 'new' })).totals.requests, 2, 'its records are under the new name');
      t.equal((await store.queryUsage({ group: 'old' })).totals.requests, 0, 'and none under the old');
      t.equal(await store.getGroup('old'), undefined);
      t.equal((await store.getKey(key.id))?.group, 'new');
      t.equal((await store.findKeyBySecret(secret))?.group, 'new');
      await store.createGroup(group('taken'));
      await t.rejects(store.updateGroup('new', { name: 'taken' }), 'renaming onto another group fails');
      t.equal((await store.getKey(key.id))?.group, 'new', 'and moves nothing');
      t.ok(await store.getGroup('new'));
    });

    t.test('deleteGroup refuses while keys belong to the group', async (t) => {
      const { store } = await fresh(t);
      t.equal(await store.deleteGroup('missing'), 'not_found');
      await store.createGroup(group('g'));
      const { key } = await store.createKey({ group: 'g' });
      t.equal(await store.deleteGroup('g'), 'in_use');
      t.ok(await store.getGroup('g'), 'the group is still there');
      t.equal(await store.deleteKey(key.id), true);
      t.equal(await store.deleteGroup('g'), 'deleted');
      t.equal(await store.getGroup('g'), undefined);
      t.equal(await store.deleteGroup('g'), 'not_found');
      t.strictSame(await store.listGroups(), []);
    });

    t.test('keys: the secret is shown once and finds its key, nothing else does', async (t) => {
      const { store } = await fresh(t);
      await store.createGroup(group('g'));
      const before = Date.now();
      const { key, secret } = await store.createKey({ group: 'g', name: 'ci' });
      t.match(secret, /^sk-[A-Za-z0-9_-]{32}$/);
      t.match(key.id, /^key_[0-9a-f]{16}$/);
      t.strictSame(key, {
        id: key.id, name: 'ci', group: 'g', disabled: false, prefix: secret.slice(0, 7), createdAt: key.createdAt,
        lastUsedAt: null, expiresAt: null, limits: null, budget: null,
      });
      t.ok(key.createdAt >= before && key.createdAt <= Date.now(), 'createdAt is unix milliseconds, as a number');
      t.strictSame(await store.findKeyBySecret(secret), key);
      t.strictSame(await store.getKey(key.id), key);
      t.equal(await store.findKeyBySecret(`${secret}x`), undefined, 'a longer secret misses');
      t.equal(await store.findKeyBySecret(secret.slice(0, -1)), undefined, 'a shorter secret misses');
      t.equal(await store.findKeyBySecret(key.prefix), undefined, 'the prefix misses');
      t.equal(await store.getKey('key_0000000000000000'), undefined);

      const second = await store.createKey({ group: 'g' });
      t.not(second.secret, secret);
      t.not(second.key.id, key.id);
      t.equal(second.key.name, null);
      const listed = await store.listKeys();
      const expected = [key, second.key].sort((a, b) => a.createdAt - b.createdAt || (a.id < b.id ? -1 : 1));
      t.strictSame(listed, expected, 'listed by creation time, then id');
      t.notOk(JSON.stringify(listed).includes(secret.slice(7)), 'the secret is never shown again');
      await t.rejects(store.createKey({ group: 'missing' }), 'a key needs an existing group');
      t.equal((await store.listKeys()).length, 2);
    });

    t.test('keys: expiry, limits and budgets round-trip, set and cleared', async (t) => {
      const { store } = await fresh(t);
      await store.createGroup(group('g'));
      const expiresAt = Date.now() + 86_400_000;
      const { key } = await store.createKey({ group: 'g', expiresAt, limits: { rpm: 10, concurrency: 1 }, budget: { amount: 0.25, period: 'day' } });
      t.equal(key.expiresAt, expiresAt);
      t.strictSame(key.limits, { rpm: 10, concurrency: 1 });
      t.strictSame(key.budget, { amount: 0.25, period: 'day' });
      t.strictSame(await store.getKey(key.id), key);
      const cleared = await store.updateKey(key.id, { expiresAt: null, limits: null, budget: null });
      t.strictSame(cleared, { ...key, expiresAt: null, limits: null, budget: null });
      t.strictSame(await store.getKey(key.id), cleared);
      const set = await store.updateKey(key.id, { expiresAt: 1, limits: { tpm: 100 }, budget: { amount: 3, period: 'total' } });
      t.strictSame(set, { ...key, expiresAt: 1, limits: { tpm: 100 }, budget: { amount: 3, period: 'total' } });
      t.strictSame(await store.getKey(key.id), set);
    });

    t.test('updateKey changes what the patch names; deleteKey', async (t) => {
      const { store } = await fresh(t);
      await store.createGroup(group('g'));
      await store.createGroup(group('h'));
      const { key, secret } = await store.createKey({ group: 'g', name: 'n' });
      const disabled = await store.updateKey(key.id, { disabled: true });
      t.strictSame(disabled, { ...key, disabled: true });
      t.equal((await store.findKeyBySecret(secret))?.disabled, true, 'a disabled key is still found, marked disabled');
      t.strictSame(await store.updateKey(key.id, { name: null, disabled: undefined }), { ...key, disabled: true, name: null }, 'undefined fields are left alone');
      t.strictSame(await store.updateKey(key.id, { group: 'h', disabled: false }), { ...key, name: null, group: 'h' });
      await t.rejects(store.updateKey(key.id, { group: 'missing' }), 'a key cannot move to a missing group');
      t.equal((await store.getKey(key.id))?.group, 'h');
      t.equal(await store.updateKey('key_0000000000000000', { disabled: true }), undefined);
      t.equal(await store.deleteKey(key.id), true);
      t.equal(await store.deleteKey(key.id), false);
      t.equal(await store.getKey(key.id), undefined);
      t.equal(await store.findKeyBySecret(secret), undefined);
    });

    t.test('usage: batches round-trip every field, replays count nothing twice, a failed batch writes nothing', async (t) => {
      const { store } = await fresh(t);
      const T = 1_700_000_000_000;
      const full = usage({
        time: T + 3, keyId: 'key_1', group: 'g', model: 'gpt-x', upstream: 'openai', channel: 'openai-eu', status: 200,
        promptTokens: 1200, completionTokens: 340, cachedInputTokens: 1000, cacheWriteTokens: 150, reasoningTokens: 200,
        cost: 0.012345, attempts: 2, estimated: true, latencyMs: 1234.5, ttfbMs: 210.25, streamed: true, notes: 'dropped tools: web_search',
      });
      const failed = usage({ time: T + 2, keyId: 'key_1', group: 'g', status: 502, outcome: 'error', error: 'upstream_error: bad gateway', attempts: 0 });
      const bare = usage({ time: T + 1, model: null, upstream: null, outcome: 'aborted' });
      await store.writeUsage([bare, failed, full]);
      const first = await store.queryUsage({});
      t.strictSame(first.records, [full, failed, bare], 'newest first, every field as written');
      t.strictSame(first.totals, { requests: 3, promptTokens: 20 + 1200, completionTokens: 10 + 340, cost: 0.012345, errors: 1 });

      await store.writeUsage([bare, failed, full]);
      const extra = usage({ time: T + 4 });
      await store.writeUsage([full, extra]);
      t.equal((await store.queryUsage({})).totals.requests, 4, 'records already stored are skipped, new ones in the batch stored');

      const twice = usage({ time: T + 5 });
      await store.writeUsage([twice, { ...twice, promptTokens: 999 }]);
      const repeated = (await store.queryUsage({})).records.filter((r) => r.requestId === twice.requestId);
      t.strictSame(repeated, [twice], 'a request id repeated within a batch is stored once, as first written');

      const good = usage({ time: T + 6 });
      await t.rejects(store.writeUsage([good, usage({ time: T + 7, promptTokens: {} as unknown as number })]), 'a batch with an unwritable record fails');
      const after = await store.queryUsage({});
      t.equal(after.totals.requests, 5, 'and writes none of it');
      t.notOk(after.records.some((r) => r.requestId === good.requestId));
      await store.writeUsage([good]);
      t.equal((await store.queryUsage({})).totals.requests, 6, 'the good record goes in with the next batch');

      // A record journaled by an older version lacks the fields added since.
      const old: Partial<UsageRecord> = usage({ time: T + 8 });
      for (const field of ['cachedInputTokens', 'cacheWriteTokens', 'reasoningTokens', 'cost', 'channel', 'attempts', 'notes'] as const) delete old[field];
      const { family: _, ...withoutFamily } = usage({ time: T + 9 });
      await store.writeUsage([old as UsageRecord, withoutFamily as UsageRecord]);
      const stored = (await store.queryUsage({ since: T + 8 })).records;
      t.strictSame(stored, [{ ...old, cachedInputTokens: null, cacheWriteTokens: null, reasoningTokens: null, cost: null, channel: null, attempts: 1, notes: null }],
        'missing optional fields read as null (attempts as 1); a record missing a required field is skipped, not failing its batch');
    });

    t.test('usage batches move their keys\' last-used times forward only', async (t) => {
      const { store } = await fresh(t);
      await store.createGroup(group('g'));
      const a = (await store.createKey({ group: 'g' })).key;
      const b = (await store.createKey({ group: 'g' })).key;
      await store.writeUsage([usage({ keyId: a.id, time: 5000 }), usage({ keyId: a.id, time: 7000 }), usage({ keyId: b.id, time: 6000 }), usage({ keyId: 'key_gone', time: 9000 })]);
      t.equal((await store.getKey(a.id))?.lastUsedAt, 7000);
      t.equal((await store.getKey(b.id))?.lastUsedAt, 6000);
      await store.writeUsage([usage({ keyId: a.id, time: 4000 }), usage({ keyId: b.id, time: 8000 })]);
      t.strictSame((await store.listKeys()).map((k) => [k.id, k.lastUsedAt]).sort(), [[a.id, 7000], [b.id, 8000]].sort(), 'an older record does not move it back');
      t.equal((await store.queryUsage({ key: 'key_gone' })).totals.requests, 1, 'usage of a deleted key is still stored');
    });

    t.test('queryUsage: filters, order, limit and totals', async (t) => {
      const { store } = await fresh(t);
      const r1 = usage({ time: 1000, keyId: 'k1', group: 'g1', model: 'a', status: 200, promptTokens: 10, completionTokens: 1, cost: 0.5 });
      const r2 = usage({ time: 2000, keyId: 'k1', group: 'g1', model: 'b', status: 429, promptTokens: 20, completionTokens: 2 });
      const r3 = usage({ time: 3000, keyId: 'k2', group: 'g2', model: 'a', status: 500, outcome: 'error', promptTokens: 30, completionTokens: 3, cost: 1.25 });
      const r4 = usage({ time: 4000, keyId: 'k2', group: 'g2', model: 'a', status: 200, outcome: 'error', promptTokens: 40, completionTokens: 4, cost: 0.25 });
      const r5 = usage({ time: 5000, model: null, status: 401, promptTokens: 0, completionTokens: 0 });
      const r6 = usage({ time: 6000 });
      const r7 = usage({ time: 6000 });
      await store.writeUsage([r3, r1, r5]);
      await store.writeUsage([r2, r4, r6, r7]);
      const ids = async (query: Parameters<StoreBackend['queryUsage']>[0]) => (await store.queryUsage(query)).records.map((r) => r.requestId);
      const names = (...records: UsageRecord[]) => records.map((r) => r.requestId);

      t.strictSame(await ids({}), names(r7, r6, r5, r4, r3, r2, r1), 'newest first; the same time in reverse order of writing');
      t.strictSame(await store.queryUsage({ key: 'k1' }), { records: [r2, r1], totals: { requests: 2, promptTokens: 30, completionTokens: 3, cost: 0.5, errors: 1 } });
      t.strictSame(await store.queryUsage({ group: 'g2' }), { records: [r4, r3], totals: { requests: 2, promptTokens: 70, completionTokens: 7, cost: 1.5, errors: 2 } }, 'a failed stream counts as an error');
      t.strictSame(await ids({ model: 'a' }), names(r4, r3, r1));
      t.strictSame(await ids({ statusMin: 400, statusMax: 500 }), names(r5, r2), 'statusMin inclusive, statusMax exclusive');
      t.strictSame(await ids({ statusMin: 500 }), names(r3));
      t.strictSame(await ids({ since: 2000, until: 4000 }), names(r3, r2), 'since inclusive, until exclusive');
      t.strictSame(await ids({ model: 'a', statusMin: 200, statusMax: 300, since: 1000 }), names(r4, r1), 'filters combine');
      const limited = await store.queryUsage({ limit: 2 });
      t.strictSame(limited.records.map((r) => r.requestId), names(r7, r6));
      t.strictSame(limited.totals, { requests: 7, promptTokens: 120, completionTokens: 20, cost: 2, errors: 4 }, 'totals cover every match, not only the limit');
      t.strictSame(await store.queryUsage({ key: 'nobody' }), { records: [], totals: { requests: 0, promptTokens: 0, completionTokens: 0, cost: 0, errors: 0 } });
    });

    t.test('usageSeries: time buckets with only the buckets that have records', async (t) => {
      const { store } = await fresh(t);
      await store.writeUsage([
        usage({ time: 1000, keyId: 'k1', latencyMs: 100, promptTokens: 10, completionTokens: 1, cost: 0.5 }),
        usage({ time: 1500, keyId: 'k1', latencyMs: 200.5, promptTokens: 20, completionTokens: 2, status: 500, outcome: 'error' }),
        usage({ time: 2999, keyId: 'k2', latencyMs: 1, promptTokens: 1, completionTokens: 1, status: 200, outcome: 'error' }),
        usage({ time: 2000, keyId: 'k2', latencyMs: 1, promptTokens: 1, completionTokens: 1 }),
        usage({ time: 2500, keyId: 'k2', latencyMs: 2, promptTokens: 1, completionTokens: 1, cost: 0.125 }),
        usage({ time: 5000, keyId: 'k1', latencyMs: 10, promptTokens: 5, completionTokens: 5 }),
      ]);
      t.strictSame(await store.usageSeries({}, 1000), [
        { t: 1000, requests: 2, promptTokens: 30, completionTokens: 3, cost: 0.5, errors: 1, avgLatencyMs: 150.25, maxLatencyMs: 200.5 },
        { t: 2000, requests: 3, promptTokens: 3, completionTokens: 3, cost: 0.125, errors: 1, avgLatencyMs: 1.33, maxLatencyMs: 2 },
        { t: 5000, requests: 1, promptTokens: 5, completionTokens: 5, cost: 0, errors: 0, avgLatencyMs: 10, maxLatencyMs: 10 },
      ]);
      t.strictSame(await store.usageSeries({ key: 'k1', until: 5000 }, 60_000), [
        { t: 0, requests: 2, promptTokens: 30, completionTokens: 3, cost: 0.5, errors: 1, avgLatencyMs: 150.25, maxLatencyMs: 200.5 },
      ], 'filtered like queryUsage');
      t.strictSame(await store.usageSeries({ since: 6000 }, 1000), []);
    });

    t.test('upstreamActivity: requests, the upstream\'s own failures and the last one', async (t) => {
      const { store } = await fresh(t);
      await store.writeUsage([
        usage({ time: 500, upstream: 'a', status: 500, outcome: 'error', error: 'before the window' }),
        usage({ time: 1000, upstream: 'a' }),
        usage({ time: 2000, upstream: 'a', status: 502, outcome: 'error', error: 'upstream_error: bad gateway' }),
        usage({ time: 3000, upstream: 'a', status: 200, outcome: 'error', error: 'stream_failed: reset' }),
        usage({ time: 4000, upstream: 'a', status: 429, outcome: 'error', error: 'rate_limited: not the upstream failing' }),
        usage({ time: 1500, upstream: 'b' }),
        usage({ time: 1600, upstream: null, status: 401, outcome: 'error', error: 'unauthorized' }),
      ]);
      const activity = (await store.upstreamActivity(1000)).sort((x, y) => (x.upstream < y.upstream ? -1 : 1));
      t.strictSame(activity, [
        { upstream: 'a', requests: 4, errors: 2, lastError: 'stream_failed: reset', lastSeen: 4000 },
        { upstream: 'b', requests: 1, errors: 0, lastError: null, lastSeen: 1500 },
      ]);
      t.strictSame(await store.upstreamActivity(10_000), []);
    });

    t.test('audit: newest first, filtered by action and time', async (t) => {
      const { store } = await fresh(t);
      const entries: AuditEntry[] = [
        { time: 1000, actor: 'cli:root', action: 'group.create', target: 'g', detail: 'models *' },
        { time: 2000, actor: 'admin-token@127.0.0.1', action: 'key.create', target: 'key_1', detail: null },
        { time: 2000, actor: 'admin-token@127.0.0.1', action: 'key.update', target: 'key_1', detail: 'disabled' },
        { time: 3000, actor: 'console:abc@::1', action: 'session.sign_in_failed', target: null, detail: null },
      ];
      for (const entry of entries) await store.recordAudit(entry);
      const [created, keyCreated, keyUpdated, signIn] = entries;
      t.strictSame(await store.queryAudit({}), [signIn, keyUpdated, keyCreated, created], 'the same time in reverse order of recording');
      t.strictSame(await store.queryAudit({ action: 'key.create' }), [keyCreated]);
      t.strictSame(await store.queryAudit({ since: 2000, until: 3000 }), [keyUpdated, keyCreated], 'since inclusive, until exclusive');
      t.strictSame(await store.queryAudit({ limit: 1 }), [signIn]);
      t.strictSame(await store.queryAudit({ action: 'nothing' }), []);
    });

    t.test('shared state: set, read, expiry, onlyIfAbsent and delete', async (t) => {
      const { store, reopen } = await fresh(t);
      t.equal(await store.getState('s'), undefined);
      t.equal(await store.setState('s', 'one', null), true);
      t.equal(await store.getState('s'), 'one');
      t.equal(await store.setState('s', 'two', null), true, 'a plain set overwrites');
      t.equal(await store.getState('s'), 'two');
      t.equal(await store.setState('s', 'three', null, { onlyIfAbsent: true }), false, 'onlyIfAbsent keeps an entry that is there');
      t.equal(await store.getState('s'), 'two');
      t.equal(await store.setState('fresh', 'v', null, { onlyIfAbsent: true }), true, 'onlyIfAbsent stores when nothing is there');

      t.equal(await store.setState('e', 'gone', Date.now() - 1), true);
      t.equal(await store.getState('e'), undefined, 'an expired entry reads as absent');
      t.equal(await store.setState('e', 'again', Date.now() + 60_000, { onlyIfAbsent: true }), true, 'onlyIfAbsent replaces an expired entry');
      t.equal(await store.getState('e'), 'again', 'an entry that has not expired reads');
      t.equal(await store.setState('e', 'other', null, { onlyIfAbsent: true }), false);

      const value = JSON.stringify({ session: 'é✓'.repeat(500), at: Date.now() });
      await store.setState('big', value, null);
      t.equal(await store.getState('big'), value, 'values are stored as they are');

      await store.deleteState('s');
      t.equal(await store.getState('s'), undefined);
      await store.deleteState('s');
      t.pass('deleting an absent entry is fine');

      const other = await reopen();
      t.equal(await other.getState('e'), 'again', 'another connection reads the same state');
      const raced = await Promise.all([store, other].map((s, i) => s.setState('race', `winner ${i}`, null, { onlyIfAbsent: true })));
      t.equal(raced.filter(Boolean).length, 1, 'of two connections setting the same entry onlyIfAbsent, one stores');
      t.equal(await store.getState('race'), `winner ${raced.indexOf(true)}`);
    });

    t.test('watch: group and key writes through another connection are heard within a second', async (t) => {
      const { store, reopen } = await fresh(t);
      const other = await reopen();
      await store.createGroup(group('g'));
      const { key } = await store.createKey({ group: 'g' });
      let heard = 0;
      const unwatch = other.watch(() => heard++);
      t.teardown(unwatch);
      let unsubscribedHeard = 0;
      other.watch(() => unsubscribedHeard++)();
      let n = 0;
      await untilListening(() => store.updateKey(key.id, { name: `n${++n}` }), () => heard);

      const doomed = (await store.createKey({ group: 'g' })).key;
      await untilHeard(t, 'updateKey', () => store.updateKey(key.id, { disabled: true }));
      await untilHeard(t, 'createKey', () => store.createKey({ group: 'g' }));
      await untilHeard(t, 'deleteKey', () => store.deleteKey(doomed.id));
      await untilHeard(t, 'createGroup', () => store.createGroup(group('h')));
      await untilHeard(t, 'updateGroup', () => store.updateGroup('h', { models: ['x'] }));
      await untilHeard(t, 'a group rename', () => store.updateGroup('h', { name: 'i' }));
      await untilHeard(t, 'deleteGroup', () => store.deleteGroup('i'));
      t.equal((await other.getKey(key.id))?.disabled, true, 'the other connection reads the change');
      t.equal(unsubscribedHeard, 0, 'an unsubscribed watcher hears nothing');

      async function untilHeard(t: Test, what: string, write: () => Promise<unknown>): Promise<void> {
        const before = heard;
        await write();
        await eventually(() => heard > before, `${what} heard`, 1000);
        t.pass(`${what} is heard by the other connection`);
      }
    });
  });
}
