/**
 * The SQLite usage writer thread runs at idle priority (SCHED_IDLE), so its bursts never take a
 * core from the serving thread or the processes it wakes; a writer starved at that priority (every
 * core busy) is replaced by one at normal priority, and its batch lands once. Real threads, real
 * scheduling: the starved case pins the thread to one core beside a busy process.
 */
import { execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import t, { type Test } from 'tap';
import { createLogger } from '../src/log.js';
import { openSqlite } from '../src/store/sqlite-driver.js';
import { SqliteStore } from '../src/store/sqlite.js';
import type { UsageRecord } from '../src/store/store.js';
import { eventually } from './helpers.js';

// Waits follow readiness; this bounds only a hang.
t.setTimeout(120_000);

const SCHED_OTHER = 0;
const SCHED_IDLE = 5;

/** Each thread of this process and its scheduling policy (`stat` field 41). */
function threadPolicies(): Map<number, number> {
  const policies = new Map<number, number>();
  for (const tid of readdirSync('/proc/self/task')) {
    try {
      const stat = readFileSync(`/proc/self/task/${tid}/stat`, 'latin1');
      // Fields after the command name, which is in parentheses and may hold spaces.
      const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      policies.set(Number(tid), Number(fields[41 - 3]));
    } catch {
      // The thread ended while being read.
    }
  }
  return policies;
}

const idleThreads = () => [...threadPolicies()].filter(([, policy]) => policy === SCHED_IDLE).map(([tid]) => tid);

function capturedLog() {
  const lines: { level: number; msg?: string; [field: string]: unknown }[] = [];
  const sink = new Writable({
    write(chunk, _encoding, done) {
      for (const line of chunk.toString().split('\n')) if (line) lines.push(JSON.parse(line));
      done();
    },
  });
  return { log: createLogger('info', sink), lines };
}

function scratchStore(t: Test, log = capturedLog().log) {
  const dir = mkdtempSync(join(tmpdir(), 'sluice-writer-'));
  const file = join(dir, 'sluice.db');
  const store = new SqliteStore(file, { usageWriter: 'thread', log });
  t.teardown(async () => {
    await store.close();
    rmSync(dir, { recursive: true, force: true });
  });
  return { store, file };
}

let n = 0;
const record = (): UsageRecord => ({
  time: Date.now(), requestId: `req-${++n}`, keyId: null, group: null, model: 'm', upstream: 'up', family: 'chat', status: 200,
  promptTokens: 10, completionTokens: 20, cachedInputTokens: null, cacheWriteTokens: null, reasoningTokens: null, cost: null,
  channel: 'up', attempts: 1, estimated: false, latencyMs: 1.5, ttfbMs: 1, streamed: false, outcome: 'finished', error: null, notes: null,
});
const records = (count: number) => Array.from({ length: count }, record);

const storedRows = (file: string) => {
  const db = openSqlite(file, { readonly: true });
  try {
    return db.prepare<{ rows: number; ids: number }>('SELECT COUNT(*) AS rows, COUNT(DISTINCT request_id) AS ids FROM usage').get()!;
  } finally {
    db.close();
  }
};

t.test('the usage writer thread runs at idle priority (SCHED_IDLE)', async (t) => {
  t.same(idleThreads(), [], 'no idle thread before the store starts one');
  const { store } = scratchStore(t);
  await store.writeUsage(records(10));
  const [tid] = await eventually(() => idleThreads().length === 1 && idleThreads(), 'the writer thread at SCHED_IDLE', 10_000);
  t.ok(tid! > 0, `thread ${tid} is idle, the only one`);
  t.equal(threadPolicies().get(process.pid), SCHED_OTHER, 'the serving thread keeps its priority');
  await store.writeUsage(records(10));
  t.same(idleThreads(), [tid], 'and it stays so from batch to batch');
});

t.test('without chrt the writer stays at normal priority, and says so', async (t) => {
  const path = process.env.PATH;
  process.env.PATH = '/nonexistent';
  t.teardown(() => (process.env.PATH = path));
  const { log, lines } = capturedLog();
  const { store, file } = scratchStore(t, log);
  await store.writeUsage(records(10));
  const notice = await eventually(() => lines.find((l) => l.msg?.includes('normal priority')), 'the notice');
  process.env.PATH = path;
  t.match(notice, { level: 30, reason: /chrt failed: not installed/ }, 'the notice names the cause');
  t.same(idleThreads(), [], 'no thread is idle');
  t.same(storedRows(file), { rows: 10, ids: 10 }, 'and usage is written all the same');
});

t.test('a writer starved at idle priority is replaced by one at normal priority, and its batch lands once', async (t) => {
  const { log, lines } = capturedLog();
  const { store, file } = scratchStore(t, log);
  await store.writeUsage(records(10));
  const [starved] = await eventually(() => idleThreads().length === 1 && idleThreads(), 'the writer thread at SCHED_IDLE', 10_000);
  // The writer shares core 0 with a process that never sleeps: at weight 3 against 1,024 it gets
  // about 0.3% of that core, and 20,000 records (about 120 ms of work) would take some 40 s.
  const hog = spawn(process.execPath, ['-e', 'process.stdout.write("spinning\\n"); for (;;);'], { stdio: ['ignore', 'pipe', 'inherit'] });
  t.teardown(() => void hog.kill('SIGKILL'));
  await new Promise((resolve) => hog.stdout.once('data', resolve));
  execFileSync('taskset', ['--pid', '--cpu-list', '0', String(hog.pid)]);
  execFileSync('taskset', ['--pid', '--cpu-list', '0', String(starved)]);

  await store.writeUsage(records(20_000));
  const warning = lines.find((l) => l.msg?.includes('starved'));
  t.match(warning, { level: 40, batches: 1 }, 'the starved thread is reported');
  t.ok((warning?.waitedMs as number) >= 1000, `after it waited ${warning?.waitedMs} ms ready to run`);
  t.same(storedRows(file), { rows: 20_010, ids: 20_010 }, 'every record stored, once');
  // The starved thread was told to end, which takes it CPU time too: once the core is free.
  hog.kill('SIGKILL');
  await eventually(() => !threadPolicies().has(starved!), 'the starved thread to end');
  t.same(idleThreads(), [], 'its replacement runs at normal priority');
  await store.writeUsage(records(10));
  t.same(storedRows(file), { rows: 20_020, ids: 20_020 }, 'and takes the batches after it');
});
