/**
 * Supported runtimes (issue 22): the uWebSockets.js build is chosen at load time, the newest whose
 * binary loads, and a runtime no build fits fails at start with one sentence naming what to install:
 * never a dlopen stack trace, never the packages' slow JS imitation.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { openSqlite, sqliteDriverName } from '../src/store/sqlite-driver.js';
import { loadUws, runtimeAdvice, uwsVersion } from '../src/uws.js';
import { spawnGateway } from './helpers.js';

t.test('the build that serves is native and fits this runtime', async (t) => {
  const major = Number(process.versions.node.split('.')[0]);
  t.match(uwsVersion(), major === 20 ? /^20\.(30|57)\.0$/ : /^20\.57\.0$/, `Node ${major} is served by uWebSockets.js ${uwsVersion()}`);
  t.match(String(loadUws().App), /\[native code\]/, 'the native binary, not the JS imitation');
});

t.test('the advice names what to install', async (t) => {
  t.match(runtimeAdvice('24.21.0', '2.36'), /Node 24 needs glibc 2\.38 or newer .*install Node 20, or run on a newer distribution/);
  t.match(runtimeAdvice('22.12.0', '2.31'), /Node 22 needs glibc 2\.38/);
  t.match(runtimeAdvice('18.20.0', '2.41'), /install Node 24 \(or 22, or 20 where glibc is older than 2\.38\)/);
  t.match(runtimeAdvice('23.1.0', '2.41'), /install Node 24/);
  t.notMatch(runtimeAdvice('20.20.2', '2.36'), /glibc 2\.38 or newer/, 'Node 20 on an old glibc is a supported pair');
});

t.test('the JS imitation is refused at start, in one sentence', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sluice-runtime-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const gateway = spawnGateway({ UWS_USE_FALLBACK: '1', SLUICE_WORKERS: '1' }, dir);
  t.equal(await gateway.exited, 1, 'exit 1');
  const stderr = gateway.stderr().trim();
  t.match(stderr, /^sluice: uWebSockets.js's JS imitation \(UWS_USE_FALLBACK\) is too slow to serve: unset UWS_USE_FALLBACK$/);
  t.notMatch(stderr, /\n\s+at /, 'no stack trace');
});

t.test('the SQLite driver fits the runtime: node:sqlite from Node 24, better-sqlite3 before', async (t) => {
  t.equal(sqliteDriverName({}, '24.21.0'), 'node:sqlite');
  t.equal(sqliteDriverName({}, '22.12.0'), 'better-sqlite3');
  t.equal(sqliteDriverName({}, '20.20.2'), 'better-sqlite3');
  t.equal(sqliteDriverName({ SLUICE_SQLITE_DRIVER: 'better-sqlite3' }, '24.21.0'), 'better-sqlite3', 'forced, to compare them');
  t.throws(() => sqliteDriverName({ SLUICE_SQLITE_DRIVER: 'sqlite3' }, '24.21.0'), /SLUICE_SQLITE_DRIVER is "sqlite3"; set it to "node:sqlite" or "better-sqlite3", or unset it/);

  const expected = sqliteDriverName();
  const dir = mkdtempSync(join(tmpdir(), 'sluice-runtime-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const db = openSqlite(join(dir, 'probe.db'));
  t.equal(db.driver, expected);
  t.equal(db.prepare<{ v: string }>('SELECT sqlite_version() AS v').get()?.v.split('.')[0], '3', 'a working connection');
  db.close();
  // A rolled-back transaction leaves nothing, on either driver.
  const again = openSqlite(join(dir, 'probe.db'));
  again.exec('CREATE TABLE t (a INTEGER NOT NULL)');
  t.throws(() => again.transaction(() => {
    again.prepare('INSERT INTO t VALUES (?)').run(1);
    again.prepare('INSERT INTO t VALUES (?)').run(null);
  }), /NOT NULL/);
  t.same(again.prepare('SELECT a FROM t').all(), [], 'the first insert went with the rollback');
  again.close();

  const gateway = spawnGateway({ SLUICE_WORKERS: '1' }, dir);
  t.teardown(() => gateway.child.kill('SIGKILL'));
  const [line] = await gateway.waitFor(/runtime: .*/, 'the runtime line');
  t.match(line, new RegExp(`runtime: +Node ${process.versions.node.replace(/\./g, '\\.')}, uWebSockets\\.js 20\\.\\d+\\.0, SQLite through ${expected}$`), 'the banner names the driver');
});
