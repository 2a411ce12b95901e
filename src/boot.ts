/**
 * What a start does before it serves, whichever thread does it: the data directory, the usage
 * journals an earlier run left, the store behind its journal and cache, the first start's demo
 * key, the warning about budgets that unpriced models slip past; and the Gateway a start returns.
 * Apart from gateway.ts because the primary of worker threads (workers/primary.ts) does the same
 * before it starts them: both import this, and neither imports the other's half.
 */
import { accessSync, constants, existsSync, mkdirSync, readdirSync, unlinkSync } from 'node:fs';
import { join } from 'node:path';
import type { Logger } from 'pino';
import type { AdminCredential } from './admin/token.js';
import { unpricedBudgetWarnings } from './budget.js';
import type { Config, ModelConfig } from './config/types.js';
import type { ReloadOutcome } from './reload.js';
import { CachedStore } from './store/cache.js';
import { JournaledStore, type JournalOptions } from './store/journal.js';
import { SqliteStore } from './store/sqlite.js';
import type { StoreBackend } from './store/store.js';
import type { WorkerPool } from './workers/protocol.js';

/** A running gateway: one that serves (gateway.ts), or the primary of worker threads (workers/primary.ts). */
export interface Gateway {
  port: number;
  store: CachedStore;
  /** The admin token, unless this instance knows only its digest (another instance made it). */
  adminToken: string | undefined;
  admin: AdminCredential;
  /** Set only on the first start: shown once, never stored. */
  firstStart?: { demoKey: string };
  /** The client families served. */
  families: string[];
  /** With `server.workers` above 1: the worker threads serving the port. */
  workers?: WorkerPool;
  /** Reads the config file again and applies it (SIGHUP, POST /admin/reload); `via` names who asked. */
  reload(via: string): Promise<ReloadOutcome>;
  /** Drains for `drainMs` (default `server.shutdownTimeoutMs`), then ends what is left with its family's failure. */
  shutdown(drainMs?: number): Promise<void>;
  /** A worker thread's part of a `GatewayView.gather(topic)`: what its plugins registered, if any. */
  answer?(topic: string): Promise<unknown>;
}


/**
 * The configured store behind the data dir's usage journal and the cache layer. Only the gateway
 * owns a journal (each worker thread its own `file`); the CLI reads them.
 */
export async function openStore(config: Pick<Config, 'dataDir' | 'store'>, journal: JournalOptions & { file?: string } = { owner: false }): Promise<CachedStore> {
  const { dataDir } = config;
  ensureDataDir(dataDir);
  // Only the journal's owner writes usage all the time; the CLI and the primary thread replay once.
  const backend = await openBackend(config, journal.log, journal.owner);
  try {
    if (journal.owner) return new CachedStore(await JournaledStore.open(backend, join(dataDir, journal.file ?? 'usage.journal'), journal));
    // The CLI first replays every thread's journal, so it shows what the running gateway has recorded.
    const [first = 'usage.journal', ...others] = journalFiles(dataDir);
    for (const file of others) await JournaledStore.open(backend, join(dataDir, file), journal);
    return new CachedStore(await JournaledStore.open(backend, join(dataDir, first), journal));
  } catch (err) {
    await backend.close();
    throw err;
  }
}

/** Where a SQLite store keeps its database. */
const sqliteFile = (dataDir: string) => join(dataDir, 'sluice.db');

/**
 * For the CLI, before it opens the store: a SQLite database must already be there, since opening
 * one creates it. An empty one in a mistyped data dir is a database the gateway never reads, and
 * one made before the first start keeps that start from making the default group and demo key.
 * A PostgreSQL store keeps nothing in the data dir, so there is nothing to look for.
 */
export function requireStoreData(config: Pick<Config, 'dataDir' | 'store'>): void {
  if (config.store.kind !== 'sqlite' || existsSync(sqliteFile(config.dataDir))) return;
  throw new Error(`no Sluice data in ${config.dataDir}: start the gateway once (\`npm start\`) or set SLUICE_DATA_DIR / --config to the gateway's`);
}

async function openBackend(config: Pick<Config, 'dataDir' | 'store'>, log?: Logger, serving = false): Promise<StoreBackend> {
  if (config.store.kind === 'sqlite') return new SqliteStore(sqliteFile(config.dataDir), { usageWriter: serving ? 'thread' : 'inline', ...(log && { log }) });
  // Loaded only when configured: the embedded default starts without pg's modules.
  const { PostgresStore } = await import('./store/postgres.js');
  return PostgresStore.open(config.store.url, { poolSize: config.store.poolSize, ...(log && { log }) });
}

/**
 * Makes the data dir (and its parents) when missing, as a fresh clone starts. One that cannot be
 * made or written is refused in one sentence that says what to do, before anything reads it.
 */
export function ensureDataDir(dataDir: string): void {
  try {
    mkdirSync(dataDir, { recursive: true, mode: 0o700 });
    accessSync(dataDir, constants.W_OK);
  } catch (err) {
    const reason = (err as NodeJS.ErrnoException).code ?? (err as Error).message;
    throw new Error(`cannot use the data directory "${dataDir}" (${reason}): make it writable, or set SLUICE_DATA_DIR (or dataDir in the config file) to a directory Sluice may create and write`);
  }
}

/** The usage journals in a data dir: `usage.journal` of one thread, `usage-wN.journal` of worker thread N. */
const journalFiles = (dataDir: string) => readdirSync(dataDir).filter((f) => /^usage(-w\d+)?\.journal$/.test(f));

/**
 * Journals no thread of this start will own (`server.workers` changed since they were written):
 * each is taken over once, so its records are stored and its open exchanges recorded as
 * interrupted, and removed when that worked (otherwise the next start tries again).
 */
export async function adoptJournals(config: Pick<Config, 'dataDir' | 'store'>, owned: string[], log: Logger): Promise<void> {
  ensureDataDir(config.dataDir);
  for (const file of journalFiles(config.dataDir).filter((f) => !owned.includes(f))) {
    const path = join(config.dataDir, file);
    const journal = await JournaledStore.open(await openBackend(config, log), path, { owner: true, log });
    const stored = journal.drained;
    await journal.close();
    if (stored) unlinkSync(path);
    log.info({ journal: file, stored }, stored ? 'usage journal of an earlier thread count stored and removed' : 'usage journal of an earlier thread count not stored yet: kept for the next start');
  }
}

/** Said at every start (by one thread): budgets that models without prices slip past. */
export async function warnUnpricedBudgets(store: CachedStore, models: ModelConfig[], log: Logger): Promise<void> {
  for (const warning of unpricedBudgetWarnings(await store.listGroups(), await store.listKeys(), models)) log.warn(warning);
}

/** On the first start (no groups yet): the default group and its demo key, whose secret is shown once. */
export async function createDemoKey(store: CachedStore, families: { name: string }[] | string[]): Promise<Gateway['firstStart']> {
  if ((await store.listGroups()).length > 0) return undefined;
  try {
    await store.createGroup({ name: 'default', models: ['*'], families: families.map((f) => (typeof f === 'string' ? f : f.name)) });
  } catch (err) {
    // Instances starting together on one shared store: another made it first.
    if ((await store.listGroups()).some((g) => g.name === 'default')) return undefined;
    throw err;
  }
  const { secret } = await store.createKey({ group: 'default', name: 'demo' });
  return { demoKey: secret };
}
