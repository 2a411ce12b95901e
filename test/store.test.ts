/**
 * The stores: the shared suite (store-suite.ts) on SQLite and on PostgreSQL, then what only one of
 * them does: SQLite's change notes across worker threads, and PostgreSQL's migrations under
 * concurrent starts, its failures while down (the journal holding usage until it is back) and its
 * LISTEN connection coming back after a restart.
 */
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { pathToFileURL } from 'node:url';
import { Worker } from 'node:worker_threads';
import { openSqlite } from '../src/store/sqlite-driver.js';
import pg from 'pg';
import t, { type Test } from 'tap';
import { createLogger } from '../src/log.js';
import { JournaledStore } from '../src/store/journal.js';
import { PostgresStore } from '../src/store/postgres.js';
import { SqliteStore } from '../src/store/sqlite.js';
import { StoreUnavailableError } from '../src/store/store.js';
import { childEnv, distRoot, eventually, READY_BOUND_MS } from './helpers.js';
import { postgresDatabase, startPostgres } from './servers.js';
import { storeSuite, untilListening, usage } from './store-suite.js';

// Private PostgreSQL servers (initdb, start, a halt and a restart) and node processes that must exit
// on their own: more than tap's default 60 s on two busy cores, and above the bound on those processes.
t.setTimeout(240_000);

const scratch = mkdtempSync(join(tmpdir(), 'sluice-store-'));
t.teardown(() => rmSync(scratch, { recursive: true, force: true }));
let files = 0;
const sqliteFile = () => join(scratch, `store-${++files}.db`);

storeSuite(t, 'SQLite', async () => {
  const file = sqliteFile();
  return { store: new SqliteStore(file), reopen: async () => new SqliteStore(file) };
});

// What the gateway runs: usage batches go to a thread of their own as journal lines, bound from their arrays.
storeSuite(t, 'SQLite, usage written by its thread', async () => {
  const file = sqliteFile();
  return { store: new SqliteStore(file, { usageWriter: 'thread' }), reopen: async () => new SqliteStore(file) };
});

storeSuite(t, 'PostgreSQL', async () => {
  const url = await postgresDatabase();
  return { store: await PostgresStore.open(url), reopen: () => PostgresStore.open(url) };
});

/** A logger whose lines the test reads. */
function capturedLog() {
  const lines: { msg?: string }[] = [];
  const sink = new Writable({
    write(chunk, _encoding, done) {
      for (const line of chunk.toString().split('\n')) if (line) lines.push(JSON.parse(line));
      done();
    },
  });
  return { log: createLogger('info', sink), lines };
}

async function sql<R extends pg.QueryResultRow>(url: string, text: string): Promise<R[]> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    return (await client.query<R>(text)).rows;
  } finally {
    await client.end();
  }
}

/** Settles like `promise`, or rejects once `ms` pass: a call that hangs fails the test instead of stalling it. */
function within<T>(promise: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout;
  const deadline = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`no answer within ${ms} ms`)), ms)));
  return Promise.race([promise, deadline]).finally(() => clearTimeout(timer));
}

/** Runs an ES module snippet in a fresh node process and resolves with its exit code (null when it had to be killed). */
async function exitCode(t: Test, script: string, env: Record<string, string>): Promise<number | null> {
  const child = spawn(process.execPath, ['--input-type=module', '-e', script], { env: childEnv(env), stdio: ['ignore', 'inherit', 'inherit'] });
  t.teardown(() => void (child.exitCode === null && child.kill('SIGKILL')));
  // Only a bound for a process that never exits: on two busy cores a node start with its imports
  // alone can take seconds, so this is far beyond any normal run.
  const killer = setTimeout(() => child.kill('SIGKILL'), READY_BOUND_MS);
  const [code] = await once(child, 'exit');
  clearTimeout(killer);
  return code;
}

const moduleUrl = (path: string) => pathToFileURL(join(distRoot, path)).href;

t.test('SQLite: a change made in another worker thread is heard', async (t) => {
  const file = sqliteFile();
  const store = new SqliteStore(file);
  t.teardown(() => store.close());
  await store.createGroup({ name: 'g', models: ['*'], families: ['openai-chat'] });
  const { key } = await store.createKey({ group: 'g' });
  let heard = 0;
  store.watch(() => heard++);
  const worker = new Worker(
    `const { workerData } = require('node:worker_threads');
     import(workerData.module).then(async ({ SqliteStore }) => {
       const store = new SqliteStore(workerData.file);
       await store.updateKey(workerData.id, { disabled: true });
       await store.close();
     });`,
    { eval: true, workerData: { module: moduleUrl('src/store/sqlite.js'), file, id: key.id } },
  );
  await once(worker, 'exit');
  await eventually(() => heard > 0, 'the worker\'s change heard', 1000);
  t.equal((await store.getKey(key.id))?.disabled, true);
});

t.test('SQLite: expired state is swept on writes', async (t) => {
  const file = sqliteFile();
  const store = new SqliteStore(file);
  t.teardown(() => store.close());
  await store.setState('stale', 'v', Date.now() - 1);
  await store.setState('kept', 'v', Date.now() + 60_000);
  const db = openSqlite(file, { readonly: true });
  t.teardown(() => db.close());
  t.same(db.prepare('SELECT name FROM state ORDER BY name').all(), [{ name: 'kept' }]);
});

t.test('SQLite: an open store with watchers does not keep the process alive', async (t) => {
  const script = `
    const { SqliteStore } = await import(${JSON.stringify(moduleUrl('src/store/sqlite.js'))});
    const store = new SqliteStore(process.env.SLUICE_TEST_DB);
    store.watch(() => {});
    await store.createGroup({ name: 'g', models: ['*'], families: ['openai-chat'] });`;
  t.equal(await exitCode(t, script, { SLUICE_TEST_DB: sqliteFile() }), 0, 'the process exits on its own');
});

t.test('PostgreSQL: three instances opening a fresh database at once migrate it once', async (t) => {
  const url = await postgresDatabase();
  const stores = await Promise.all([1, 2, 3].map(() => PostgresStore.open(url)));
  t.teardown(() => Promise.all(stores.map((s) => s.close())));
  const versions = async () => (await sql<{ version: number }>(url, 'SELECT version FROM sluice_schema_migrations ORDER BY version')).map((r) => r.version);
  const applied = await versions();
  t.ok(applied.length > 0);
  t.strictSame(applied, applied.map((_, i) => i + 1), 'each version applied once, in order');

  const [a, b, c] = stores as [PostgresStore, PostgresStore, PostgresStore];
  await a.createGroup({ name: 'g', models: ['*'], families: ['openai-chat'] });
  const { key, secret } = await b.createKey({ group: 'g' });
  t.strictSame(await c.findKeyBySecret(secret), key, 'all three work on the one schema');

  await (await PostgresStore.open(url)).close();
  t.strictSame(await versions(), applied, 'opening a migrated database applies nothing');

  await sql(url, `INSERT INTO sluice_schema_migrations (version, applied_at) VALUES (${applied.length + 1}, 0)`);
  await t.rejects(PostgresStore.open(url), /newer than this Sluice/, 'a schema from a newer version is refused');
});

t.test('PostgreSQL: expired state is swept on writes', async (t) => {
  const url = await postgresDatabase();
  const store = await PostgresStore.open(url);
  t.teardown(() => store.close());
  await store.setState('stale', 'v', Date.now() - 1);
  await store.setState('kept', 'v', Date.now() + 60_000);
  t.strictSame(await sql(url, 'SELECT name FROM state ORDER BY name'), [{ name: 'kept' }]);
});

t.test('PostgreSQL: close lets the process exit, with a watcher listening', async (t) => {
  const script = `
    const { PostgresStore } = await import(${JSON.stringify(moduleUrl('src/store/postgres.js'))});
    const store = await PostgresStore.open(process.env.SLUICE_TEST_DB);
    let heard = 0;
    store.watch(() => heard++);
    for (let i = 0; heard === 0; i++) {
      await store.createGroup({ name: 'g' + i, models: ['*'], families: ['openai-chat'] });
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    await store.close();`;
  t.equal(await exitCode(t, script, { SLUICE_TEST_DB: await postgresDatabase() }), 0, 'the process exits on its own');
});

t.test('PostgreSQL down and back: failures are quick and clear, usage waits in the journal, LISTEN recovers', async (t) => {
  const server = await startPostgres();
  t.teardown(() => server.stop());
  await sql(`${server.url}/postgres`, 'CREATE DATABASE sluice');
  const url = `${server.url}/sluice`;
  const { log, lines } = capturedLog();
  const store = await PostgresStore.open(url, { log });
  const watching = await PostgresStore.open(url, { log });
  t.teardown(() => Promise.all([store.close(), watching.close()]));
  await store.createGroup({ name: 'g', models: ['*'], families: ['openai-chat'] });
  const { key, secret } = await store.createKey({ group: 'g' });
  let heard = 0;
  watching.watch(() => heard++);
  let n = 0;
  await untilListening(() => store.updateKey(key.id, { name: `n${++n}` }), () => heard);

  const journalPath = join(scratch, 'usage.journal');
  const journal = await JournaledStore.open(store, journalPath, { owner: true, log });
  t.teardown(() => journal.close());
  const before = usage({ keyId: key.id });
  journal.recordUsage(before);
  await journal.flush();
  t.equal((await store.queryUsage({})).totals.requests, 1);

  server.halt();
  const heardBeforeRestart = heard;
  const calls: Record<string, () => Promise<unknown>> = {
    getKey: () => store.getKey(key.id),
    findKeyBySecret: () => store.findKeyBySecret(secret),
    listGroups: () => store.listGroups(),
    queryUsage: () => store.queryUsage({}),
    getState: () => store.getState('s'),
    createGroup: () => store.createGroup({ name: 'h', models: ['*'], families: ['openai-chat'] }),
    updateKey: () => store.updateKey(key.id, { disabled: true }),
    deleteKey: () => store.deleteKey(key.id),
    setState: () => store.setState('s', 'v', null),
    recordAudit: () => store.recordAudit({ time: Date.now(), actor: 'cli:test', action: 'key.update', target: key.id, detail: null }),
    writeUsage: () => store.writeUsage([usage()]),
    open: () => PostgresStore.open(url, { log }),
  };
  for (const [name, call] of Object.entries(calls)) {
    await t.rejects(within(call(), 10_000), StoreUnavailableError, `${name} rejects with StoreUnavailableError, without hanging`);
  }

  const whileDown = [usage({ keyId: key.id }), usage({ keyId: key.id }), usage()];
  for (const record of whileDown) journal.recordUsage(record);
  await journal.flush();
  const journaled = readFileSync(journalPath, 'utf8');
  t.ok(whileDown.every((r) => journaled.includes(r.requestId)), 'usage written while PostgreSQL is down waits in the journal');

  server.start();
  const expected = [before, ...whileDown].map((r) => r.requestId).sort();
  const stored = async () => (await store.queryUsage({})).records.map((r) => r.requestId).sort();
  await eventually(async () => {
    await journal.flush();
    return (await store.queryUsage({}).catch(() => undefined))?.totals.requests === expected.length;
  }, 'the journaled usage stored', 20_000);
  t.strictSame(await stored(), expected, 'every record landed exactly once');
  await eventually(() => readFileSync(journalPath).length === 0, 'the journal emptied');
  t.equal((await store.getKey(key.id))?.lastUsedAt, Math.max(before.time, whileDown[0]!.time), 'and moved the key\'s last use');

  await eventually(() => lines.some((l) => l.msg === 'PostgreSQL change notifications resumed'), 'the LISTEN connection back', 20_000);
  t.ok(heard > heardBeforeRestart, 'watchers are told once the LISTEN connection is back: changes meanwhile went unheard');
  const heardAfterRestart = heard;
  await store.updateKey(key.id, { disabled: true });
  await eventually(() => heard > heardAfterRestart, 'a change after the restart heard', 1000);
  t.equal((await watching.getKey(key.id))?.disabled, true);
});
