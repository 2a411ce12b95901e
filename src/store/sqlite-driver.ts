/**
 * One SQLite connection, from whichever driver suits the runtime. On Node 24 and later the store
 * uses the runtime's own `node:sqlite` (nothing native to install; measured as fast as
 * better-sqlite3 for what the store does, see docs/runtimes.md). Earlier runtimes
 * use better-sqlite3, which on Node 24 can abort the process when a thread that used it exits
 * (`(env) != nullptr` in its statement destructor), so it is loaded only where it is chosen.
 * `SLUICE_SQLITE_DRIVER` forces one (benchmarks compare them).
 *
 * Both see the same SQL and the same file format; this module evens out the few differences:
 * pragmas go through `exec`/`prepare`, a transaction is BEGIN IMMEDIATE … COMMIT, and unknown
 * named parameters are ignored as better-sqlite3 does (a usage record may carry fields the
 * INSERT does not name).
 */
import { createRequire } from 'node:module';

export type SqliteDriverName = 'node:sqlite' | 'better-sqlite3';

export interface SqliteStatement<Row> {
  run(...params: unknown[]): { changes: number | bigint };
  get(...params: unknown[]): Row | undefined;
  all(...params: unknown[]): Row[];
}

export interface SqliteConnection {
  readonly driver: SqliteDriverName;
  prepare<Row = unknown>(sql: string): SqliteStatement<Row>;
  exec(sql: string): void;
  /** Runs `work` in one transaction: committed when it returns, rolled back when it throws. */
  transaction<T>(work: () => T): T;
  /** An integer pragma's value (`user_version`). */
  pragmaNumber(name: string): number;
  close(): void;
}

export interface OpenOptions {
  readonly?: boolean;
}

/** The driver this runtime uses, unless `SLUICE_SQLITE_DRIVER` names one. */
export function sqliteDriverName(env: NodeJS.ProcessEnv = process.env, nodeVersion = process.versions.node): SqliteDriverName {
  const forced = env.SLUICE_SQLITE_DRIVER;
  if (forced === 'node:sqlite' || forced === 'better-sqlite3') return forced;
  if (forced) throw new Error(`SLUICE_SQLITE_DRIVER is "${forced}"; set it to "node:sqlite" or "better-sqlite3", or unset it`);
  return Number(nodeVersion.split('.')[0]) >= 24 ? 'node:sqlite' : 'better-sqlite3';
}

export function openSqlite(file: string, options: OpenOptions = {}, driver = sqliteDriverName()): SqliteConnection {
  return driver === 'node:sqlite' ? openNodeSqlite(file, options) : openBetterSqlite(file, options);
}

function runInTransaction<T>(exec: (sql: string) => void, work: () => T): T {
  // IMMEDIATE takes the write lock up front, so a busy file waits (busy_timeout) at BEGIN rather
  // than failing half-way through the work.
  exec('BEGIN IMMEDIATE');
  let result: T;
  try {
    result = work();
  } catch (err) {
    exec('ROLLBACK');
    throw err;
  }
  exec('COMMIT');
  return result;
}

// ---- node:sqlite (Node 24+) ----

interface NodeStatement {
  run(...params: unknown[]): { changes: number | bigint };
  get(...params: unknown[]): unknown;
  all(...params: unknown[]): unknown[];
  setAllowUnknownNamedParameters?(enabled: boolean): void;
}
interface NodeDatabase {
  prepare(sql: string): NodeStatement;
  exec(sql: string): void;
  close(): void;
}
type NodeSqliteModule = { DatabaseSync: new (file: string, options?: { readOnly?: boolean }) => NodeDatabase };

function openNodeSqlite(file: string, options: OpenOptions): SqliteConnection {
  const sqlite = process.getBuiltinModule?.('node:sqlite') as NodeSqliteModule | undefined;
  if (!sqlite) throw new Error(`node:sqlite is not available in Node ${process.versions.node}; unset SLUICE_SQLITE_DRIVER to use better-sqlite3`);
  const db = new sqlite.DatabaseSync(file, { readOnly: options.readonly === true });
  const exec = (sql: string) => db.exec(sql);
  return {
    driver: 'node:sqlite',
    prepare<Row>(sql: string): SqliteStatement<Row> {
      const statement = db.prepare(sql);
      statement.setAllowUnknownNamedParameters?.(true);
      return statement as SqliteStatement<Row>;
    },
    exec,
    transaction: (work) => runInTransaction(exec, work),
    pragmaNumber: (name) => Number(Object.values(db.prepare(`PRAGMA ${name}`).get() as object)[0]),
    close: () => db.close(),
  };
}

// ---- better-sqlite3 (Node 20 and 22) ----

interface BetterDatabase {
  prepare(sql: string): SqliteStatement<unknown>;
  exec(sql: string): void;
  pragma(source: string, options: { simple: true }): unknown;
  close(): void;
}
type BetterSqliteConstructor = new (file: string, options?: { readonly?: boolean }) => BetterDatabase;

function openBetterSqlite(file: string, options: OpenOptions): SqliteConnection {
  const Database = createRequire(import.meta.url)('better-sqlite3') as BetterSqliteConstructor;
  const db = new Database(file, { readonly: options.readonly === true });
  const exec = (sql: string) => void db.exec(sql);
  return {
    driver: 'better-sqlite3',
    prepare: <Row>(sql: string) => db.prepare(sql) as SqliteStatement<Row>,
    exec,
    transaction: (work) => runInTransaction(exec, work),
    pragmaNumber: (name) => Number(db.pragma(name, { simple: true })),
    close: () => db.close(),
  };
}
