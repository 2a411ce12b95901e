/**
 * Usage records are durable: a completed request's record survives `kill -9` of the gateway, a
 * failed store write keeps its records until the store takes them, and replaying the journal
 * never counts a record twice.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import fs, { appendFileSync, copyFileSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { syncBuiltinESMExports } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { openSqlite } from '../src/store/sqlite-driver.js';
import t from 'tap';
import { createLogger } from '../src/log.js';
import { JournaledStore } from '../src/store/journal.js';
import { decodeLine, encodeOpen, encodeRecord } from '../src/store/journal-lines.js';
import { SqliteStore } from '../src/store/sqlite.js';
import type { UsageRecord } from '../src/store/store.js';
import { childEnv, distRoot, eventually, runCommand, watchProcess } from './helpers.js';

// Four gateway processes, two CLI processes and 300 requests: more than tap's default 60 s on two
// busy cores. Waits follow readiness; this bounds only a hang.
t.setTimeout(300_000);

const run = runCommand;
const main = join(distRoot, 'src/main.js');

function scratchDir(): string {
  const dir = mkdtempSync(join(tmpdir(), 'sluice-durable-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** `sluice serve` as its own process on port 0; resolves once it listens (its listening log line). */
async function serve(dataDir: string, env: Record<string, string> = {}): Promise<{ child: ChildProcess; port: number; out: () => string; exited: Promise<unknown> }> {
  const child = spawn(process.execPath, [main, 'serve'], {
    env: childEnv({ SLUICE_DATA_DIR: dataDir, SLUICE_PORT: '0', SLUICE_LOG_LEVEL: 'info', ...env }),
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  t.teardown(() => void (child.exitCode === null && child.kill('SIGKILL')));
  const watched = watchProcess(child, { echoStderr: true });
  const port = Number((await watched.waitFor(/"url":"http:\/\/127\.0\.0\.1:(\d+)"/, 'the gateway\'s listening line'))[1]);
  return { child, port, out: watched.stdout, exited: watched.exited };
}

t.test('kill -9 right after the last response loses no usage record', async (t) => {
  const dataDir = scratchDir();
  const first = await serve(dataDir);
  const demoKey = /demo key[^:]*: (sk-\S+)/.exec(first.out())![1]!;

  const sent: string[] = [];
  const call = async (i: number) => {
    const stream = i % 2 === 0;
    const res = await fetch(`http://127.0.0.1:${first.port}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${demoKey}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'sim-chat', stream, messages: [{ role: 'user', content: `request ${i} [[sim tokens=8]]` }] }),
    });
    const body = await res.text();
    if (res.status !== 200 || (stream && !body.includes('data: [DONE]'))) throw new Error(`request ${i}: ${res.status} ${body}`);
    sent.push(res.headers.get('x-request-id')!);
  };
  // 300 requests, 10 at a time; the kill follows the last response without any pause.
  let next = 0;
  await Promise.all(Array.from({ length: 10 }, async () => {
    while (next < 300) await call(next++);
  }));
  first.child.kill('SIGKILL');
  await first.exited;
  t.equal(new Set(sent).size, 300, '300 distinct responses completed');

  const second = await serve(dataDir);
  const usage = JSON.parse((await run(process.execPath, [main, 'usage', '--limit', '1000'], { env: childEnv({ SLUICE_DATA_DIR: dataDir }) })).stdout);
  second.child.kill('SIGTERM');
  await second.exited;
  t.equal(usage.totals.requests, 300, 'exactly 300 records');
  const stored = usage.records.map((r: UsageRecord) => r.requestId).sort();
  t.same(stored, [...sent].sort(), 'each request id once');
});

t.test('kill -9 while two threads stream: each stream is recorded as interrupted at the next start, even with one thread', async (t) => {
  const dataDir = scratchDir();
  // Two worker threads, each with its own journal.
  const first = await serve(dataDir, { SLUICE_WORKERS: '2' });
  const demoKey = /demo key[^:]*: (sk-\S+)/.exec(first.out())![1]!;
  const ids: string[] = [];
  const streams = Array.from({ length: 8 }, async () => {
    const res = await fetch(`http://127.0.0.1:${first.port}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${demoKey}`, 'content-type': 'application/json', connection: 'close' },
      body: JSON.stringify({ model: 'sim-chat', stream: true, messages: [{ role: 'user', content: 'long [[sim tokens=2000 tps=50]]' }] }),
    });
    ids.push(res.headers.get('x-request-id')!);
    const reader = res.body!.getReader();
    await reader.read(); // the stream has begun
    return reader.read().catch(() => undefined);
  });
  await eventually(() => ids.length === 8, 'eight streams under way');
  first.child.kill('SIGKILL');
  await first.exited;
  await Promise.allSettled(streams);

  t.same(readdirSync(dataDir).filter((f) => f.endsWith('.journal')).sort(), ['usage-w0.journal', 'usage-w1.journal']);
  // One thread now: it takes over both threads' journals.
  const second = await serve(dataDir, { SLUICE_WORKERS: '1' });
  const usage = JSON.parse((await run(process.execPath, [main, 'usage', '--limit', '1000'], { env: childEnv({ SLUICE_DATA_DIR: dataDir }) })).stdout);
  second.child.kill('SIGTERM');
  await second.exited;
  t.equal(usage.totals.requests, 8, 'one record per stream');
  t.same(usage.records.map((r: UsageRecord) => r.requestId).sort(), [...ids].sort());
  t.ok(
    usage.records.every((r: UsageRecord) => r.outcome === 'interrupted' && r.status === 502 && r.estimated),
    'each interrupted',
  );
  t.match(second.out(), /recorded as interrupted/);
  t.same(readdirSync(dataDir).filter((f) => f.endsWith('.journal')), ['usage.journal'], 'the old journals are stored and removed');
});

const record = (i: number): UsageRecord => ({
  time: 1_767_225_600_000 + i,
  requestId: `req-${i}`,
  keyId: 'key_1',
  group: 'default',
  model: 'sim-chat',
  upstream: 'simulator',
  family: 'chat',
  status: 200,
  promptTokens: 10,
  completionTokens: i,
  estimated: false,
  latencyMs: 1.5,
  ttfbMs: null,
  streamed: i % 2 === 0,
  outcome: 'finished',
  error: null,
  notes: null,
  cachedInputTokens: null,
  cacheWriteTokens: null,
  reasoningTokens: null,
  cost: null,
  channel: 'simulator',
  attempts: 1,
});

function captureLog() {
  const lines: Record<string, any>[] = [];
  const sink = new Writable({
    write(chunk, _enc, cb) {
      for (const line of chunk.toString().split('\n')) if (line) lines.push(JSON.parse(line));
      cb();
    },
  });
  return { log: createLogger('info', sink), lines };
}

/** Opens the data dir's store the way the gateway does, with a short busy timeout so a held lock fails fast. */
function openJournaled(dir: string, log = captureLog().log, maxHeldRecords?: number) {
  return JournaledStore.open(new SqliteStore(join(dir, 'sluice.db'), { busyTimeoutMs: 20 }), join(dir, 'usage.journal'), {
    owner: true,
    log,
    ...(maxHeldRecords && { maxHeldRecords }),
  });
}

const storedIds = (dir: string): string[] => {
  const db = openSqlite(join(dir, 'sluice.db'), { readonly: true });
  try {
    return db.prepare<{ request_id: string }>('SELECT request_id FROM usage ORDER BY request_id').all().map((r) => r.request_id);
  } finally {
    db.close();
  }
};
const ids = (n: number) => Array.from({ length: n }, (_, i) => `req-${i}`).sort();
const journalLines = (dir: string) => readFileSync(join(dir, 'usage.journal'), 'utf8').split('\n').filter(Boolean).length;

/** A second connection holding SQLite's write lock, as another process would. */
function holdWriteLock(dir: string): () => void {
  const blocker = openSqlite(join(dir, 'sluice.db'));
  blocker.exec('BEGIN EXCLUSIVE');
  return () => {
    blocker.exec('COMMIT');
    blocker.close();
  };
}

for (const [name, maxHeldRecords] of [
  ['held in memory', undefined],
  ['beyond the memory bound, read back from the journal', 50],
] as const) {
  t.test(`a failed store write keeps its records until the store takes them (${name})`, async (t) => {
    const dir = scratchDir();
    const { log, lines } = captureLog();
    const store = await openJournaled(dir, log, maxHeldRecords);
    t.teardown(() => store.close());
    const release = holdWriteLock(dir);
    for (let i = 0; i < 300; i++) store.recordUsage(record(i));
    await store.flush();
    t.same(storedIds(dir), [], 'nothing reached the locked store');
    t.equal(journalLines(dir), 300, 'every record is in the journal');
    t.match(lines.find((l) => l.msg?.includes('usage write failed')), { level: 50, err: { message: /database is locked/ } }, 'the failure is logged');

    release();
    // The retry comes by itself, after its backoff.
    await eventually(() => storedIds(dir).length === 300, 'the retry to write every record', 10_000);
    t.same(storedIds(dir), ids(300), 'every record landed exactly once');
    t.equal(journalLines(dir), 0, 'the journal is truncated once everything is stored');
  });
}

t.test('a crash between the store commit and the journal truncate does not count twice', async (t) => {
  const dir = scratchDir();
  const store = await openJournaled(dir);
  for (let i = 0; i < 100; i++) store.recordUsage(record(i));
  // The records are appended at the end of the turn that made them.
  await new Promise((resolve) => setImmediate(resolve));
  // The journal as it was when the batch committed, before its truncate.
  copyFileSync(join(dir, 'usage.journal'), join(dir, 'journal.copy'));
  await store.close();
  t.same(storedIds(dir), ids(100), 'stored at close');
  copyFileSync(join(dir, 'journal.copy'), join(dir, 'usage.journal'));
  // A crash also leaves a torn last line: it is skipped, and the next record is not glued to it.
  appendFileSync(join(dir, 'usage.journal'), JSON.stringify(record(100)).slice(0, 40));

  // With the store locked at start the journal stays as it is, torn line included.
  const release = holdWriteLock(dir);
  const reopened = await openJournaled(dir);
  reopened.recordUsage(record(101));
  await new Promise((resolve) => setImmediate(resolve));
  release();
  // What a restart would replay now, from the file alone.
  const { log: readerLog, lines } = captureLog();
  await (await JournaledStore.open(new SqliteStore(join(dir, 'sluice.db')), join(dir, 'usage.journal'), { owner: false, log: readerLog })).close();
  t.same(storedIds(dir), [...ids(100), 'req-101'].sort(), 'each record once, and the one appended after the torn line is kept');
  t.match(lines.find((l) => l.msg?.includes('unreadable')), { level: 40, lines: 1 }, 'the torn line is reported');
  await reopened.close();
});

t.test('an open exchange ends at its record, with the ticket or found by id; one never recorded is interrupted at the next start', async (t) => {
  const dir = scratchDir();
  const store = await openJournaled(dir);
  const open = (i: number) => {
    const { time, requestId, keyId, group, model, upstream, family, streamed } = record(i);
    return store.beginExchange({ time, requestId, keyId, group, model, upstream, family, streamed });
  };
  const ticket = open(0);
  open(1);
  // The open lines are appended at the end of the turn.
  await new Promise((resolve) => setImmediate(resolve));
  store.recordUsage(record(0), ticket);
  store.recordUsage(record(1));
  await store.flush();
  t.ok(store.drained, 'both exchanges ended: nothing is open or queued');
  t.equal(journalLines(dir), 0, 'and the journal is empty');
  open(2);
  await new Promise((resolve) => setImmediate(resolve));
  // The process dies here: exchange 2 never got its record. A new owner opens the same files.
  const { log, lines } = captureLog();
  const next = await openJournaled(dir, log);
  t.same(storedIds(dir), ids(3), 'each exchange once');
  const db = openSqlite(join(dir, 'sluice.db'), { readonly: true });
  const outcomes = db.prepare<{ request_id: string; outcome: string }>('SELECT request_id, outcome FROM usage ORDER BY request_id').all();
  db.close();
  t.same(outcomes.map((r) => r.outcome), ['finished', 'finished', 'interrupted'], 'only the unrecorded one is interrupted');
  t.match(lines.find((l) => l.msg?.includes('interrupted')), { exchanges: 1 });
  await next.close();
});

t.test('journal lines carry every field of a record and of an open exchange, and lines of the earlier object format still replay', async (t) => {
  // Every field distinct, so that two fields swapped between the encoder and the decoder show.
  const full: UsageRecord = {
    time: 1_700_000_000_123, requestId: 'req-full', keyId: 'key_9', group: 'team "a"', model: 'm\nx', upstream: 'up', family: 'messages',
    status: 429, promptTokens: 11, completionTokens: 22, cachedInputTokens: 3, cacheWriteTokens: 4, reasoningTokens: 5, cost: 0.0625,
    channel: 'ch', attempts: 2, estimated: true, latencyMs: 12.5, ttfbMs: 7.25, streamed: true, outcome: 'aborted',
    error: 'rate_limited: slow down', notes: 'dropped tools: web_search',
  };
  t.strictSame(decodeLine(encodeRecord(full)), { record: full }, 'a record survives its line');
  const { time, requestId, keyId, group, model, upstream, family, streamed } = full;
  const opened = { time, requestId, keyId, group, model, upstream, family, streamed };
  t.strictSame(decodeLine(encodeOpen(opened)), { open: opened }, 'so does an open exchange');
  t.ok(encodeRecord(record(1)).length < JSON.stringify(record(1)).length / 2, 'a line is under half the object it replaces');
  for (const bad of ['', '[', '[1]', '[2,1,"x"]', '[1,1,2]', 'null', '{"open":{}}', '"text"']) t.equal(decodeLine(bad), undefined, `not a line: ${bad}`);

  // A journal an earlier version left: object lines, one exchange still open.
  const dir = scratchDir();
  const old = [record(0), record(1)].map((r) => JSON.stringify(r)).join('\n') + `\n{"open":${JSON.stringify({ ...opened, requestId: 'req-2' })}}\n`;
  fs.writeFileSync(join(dir, 'usage.journal'), old);
  const store = await openJournaled(dir);
  t.same(storedIds(dir), ['req-0', 'req-1', 'req-2'], 'its records and its open exchange are stored');
  const db = openSqlite(join(dir, 'sluice.db'), { readonly: true });
  const rows = db.prepare<{ request_id: string; outcome: string; completion_tokens: number }>('SELECT request_id, outcome, completion_tokens FROM usage ORDER BY request_id').all();
  db.close();
  t.same(rows.map((r) => [r.outcome, r.completion_tokens]), [['finished', 0], ['finished', 1], ['interrupted', 0]], 'with their fields, the open one as interrupted');
  await store.close();
});

t.test("a turn's open lines and records are appended together at its end, open lines first, in one write", async (t) => {
  const dir = scratchDir();
  const store = await openJournaled(dir);
  const journal = join(dir, 'usage.journal');
  // Every write of this process, seen through the binding the journal imported.
  const writes: number[] = [];
  const writeSync = fs.writeSync;
  fs.writeSync = ((fd: number, ...rest: unknown[]) => (writes.push(fd), (writeSync as (...args: unknown[]) => number)(fd, ...rest))) as typeof fs.writeSync;
  syncBuiltinESMExports();
  t.teardown(() => {
    fs.writeSync = writeSync;
    syncBuiltinESMExports();
  });
  const { time, keyId, group, model, upstream, family, streamed } = record(0);
  const tickets = Array.from({ length: 20 }, (_, i) => store.beginExchange({ time, requestId: `open-${i}`, keyId, group, model, upstream, family, streamed }));
  for (let i = 0; i < 50; i++) store.recordUsage(record(i));
  // One of the open exchanges ends in the turn it began: it needs no open line.
  store.recordUsage({ ...record(0), requestId: 'open-0' }, tickets[0]);
  t.equal(readFileSync(journal, 'utf8'), '', 'nothing is appended during the turn');
  await new Promise((resolve) => setImmediate(resolve));
  const lines = readFileSync(journal, 'utf8').split('\n').filter(Boolean).map((line) => decodeLine(line));
  t.equal(writes.length, 1, 'one write for the turn');
  t.same(lines.slice(0, 19).map((l) => l && 'open' in l && l.open.requestId), Array.from({ length: 19 }, (_, i) => `open-${i + 1}`), 'the open lines first');
  t.same(lines.slice(19).map((l) => l && 'record' in l && l.record.requestId), [...Array.from({ length: 50 }, (_, i) => `req-${i}`), 'open-0'], 'then the records, in order');
  await store.close();
});

t.test("the journal is emptied by a rename, and the old file's last close runs on libuv's pool, never the serving thread", async (t) => {
  // Freeing a file's blocks is the kernel's work at a truncate or at the last close of a replaced
  // file; on a filesystem mounted with `discard` it waits for the disk. The serving thread compacts
  // after every batch, and measured asleep in that wait 185 times in 4 s while it did so in place.
  const dir = scratchDir();
  const store = await openJournaled(dir);
  const journal = join(dir, 'usage.journal');
  const journalFds = () =>
    readdirSync('/proc/self/fd').filter((fd) => {
      try {
        return fs.readlinkSync(`/proc/self/fd/${fd}`).startsWith(journal);
      } catch {
        return false; // the descriptor readdir itself used, closed since
      }
    });
  // Each call, with the file its descriptor pointed at.
  const calls: string[] = [];
  const target = (fd: number) => fs.readlinkSync(`/proc/self/fd/${fd}`).replace(dir, '');
  const { closeSync, close, ftruncateSync } = fs;
  fs.closeSync = ((fd: number) => (calls.push(`closeSync ${target(fd)}`), closeSync(fd))) as typeof fs.closeSync;
  fs.ftruncateSync = ((fd: number, len?: number) => (calls.push(`ftruncateSync ${target(fd)}`), ftruncateSync(fd, len))) as typeof fs.ftruncateSync;
  fs.close = ((fd: number, done: (err: NodeJS.ErrnoException | null) => void) => (calls.push(`close ${target(fd)}`), close(fd, done))) as typeof fs.close;
  syncBuiltinESMExports();
  t.teardown(() => {
    Object.assign(fs, { closeSync, close, ftruncateSync });
    syncBuiltinESMExports();
  });
  for (let i = 0; i < 300; i++) store.recordUsage(record(i));
  await store.flush();
  t.same(storedIds(dir), ids(300), 'every record stored');
  t.equal(journalLines(dir), 0, 'and the journal emptied');
  t.notOk(calls.some((c) => c.startsWith('ftruncateSync')), 'not by a truncate in place');
  const closedHere = calls.filter((c) => c.startsWith('closeSync '));
  t.ok(closedHere.length > 0 && closedHere.every((c) => c === 'closeSync /usage.journal.next'), 'the serving thread closes only the new file it wrote, before the rename');
  t.ok(calls.includes('close /usage.journal (deleted)'), "the replaced file's last close is on libuv's pool");
  await eventually(() => journalFds().length === 1 && !journalFds().some((n) => fs.readlinkSync(`/proc/self/fd/${n}`).endsWith('(deleted)')), 'the old file closed: one descriptor, on the new file');
  store.recordUsage(record(300));
  await new Promise((resolve) => setImmediate(resolve));
  t.equal(journalLines(dir), 1, 'appends go to the new file');
  await store.close();
});

t.test('under load the store gets full batches: what arrives during a write waits for a full batch or the timer', async (t) => {
  const dir = scratchDir();
  const backend = new SqliteStore(join(dir, 'sluice.db'));
  // Each batch's write is held until the test lets it finish, as a busy writer thread would.
  const batches: number[] = [];
  const held: (() => void)[] = [];
  const writeUsage = backend.writeUsage.bind(backend);
  backend.writeUsage = async (records, lines) => {
    batches.push(records.length);
    await new Promise<void>((resolve) => held.push(resolve));
    return writeUsage(records, lines);
  };
  const store = await JournaledStore.open(backend, join(dir, 'usage.journal'), { owner: true, log: captureLog().log });
  for (let i = 0; i < 256; i++) store.recordUsage(record(i));
  t.same(batches, [256], 'a full batch is written at once');
  for (let i = 256; i < 556; i++) store.recordUsage(record(i));
  held.shift()!();
  await eventually(() => batches.length === 2, 'the second batch');
  held.shift()!();
  // 44 are left: not a batch of their own straight away.
  await eventually(() => store.queued === 44, 'the second batch written');
  await new Promise((resolve) => setTimeout(resolve, 50));
  t.same(batches, [256, 256], 'the 44 left over wait');
  const flushed = store.flush();
  await eventually(() => held.length === 1, 'the flush');
  held.shift()!();
  await flushed;
  t.same(batches, [256, 256, 44], 'a flush (the timer, a read, the close) writes them');
  t.same(storedIds(dir).length, 556);
  await store.close();
});

t.test('the CLI sees journaled records while the journal stays with its owner', async (t) => {
  const dir = scratchDir();
  const store = await openJournaled(dir);
  const release = holdWriteLock(dir);
  for (let i = 0; i < 5; i++) store.recordUsage(record(i));
  await store.flush();
  release();
  // As after a kill -9: records only in the journal. A reader replays them without truncating.
  const reader = await JournaledStore.open(new SqliteStore(join(dir, 'sluice.db')), join(dir, 'usage.journal'), { owner: false });
  t.equal((await reader.queryUsage({})).totals.requests, 5);
  await reader.close();
  t.equal(journalLines(dir), 5, 'only the owner truncates the journal');
  await store.close();
  t.same(storedIds(dir), ids(5), 'the owner\'s own write of the same records adds nothing');
});
