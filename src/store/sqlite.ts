/**
 * The embedded store: one SQLite file in the data directory. Keys are stored as SHA-256 hashes of
 * their secrets; usage arrives in batches from the journal in front of it (journal.ts), and each
 * batch also moves its keys' last-used times. SQLite (node:sqlite or better-sqlite3, see
 * sqlite-driver.ts) is synchronous and fast; the methods are async only to keep the Store's shape,
 * and caching lives in front of every store (cache.ts).
 * The gateway has usage batches written by a thread of their own (`usageWriter: 'thread'`), so
 * they never block the event loop.
 * Group and key writes are announced on a BroadcastChannel named after the file, which reaches the
 * stores of the other worker threads of the process (the CLI in another process is not told: the
 * caches' TTL covers it).
 */
import { resolve } from 'node:path';
import { BroadcastChannel } from 'node:worker_threads';
import type { Logger } from 'pino';
import { jsonText, toGroup, toKey, toUsage, type GroupRow, type KeyRow, type UsageRow } from './rows.js';
import { hashSecret, mintKey } from './secrets.js';
import { encodeRecord, recordLinePosition, recordLineValues } from './journal-lines.js';
import { openSqlite, type SqliteConnection } from './sqlite-driver.js';
import { UsageWriter } from './usage-writer.js';
import type { ApiKey, AuditEntry, AuditQuery, Budget, Group, GroupInput, KeyPatch, Limits, StoreBackend, UpstreamActivity, UsagePoint, UsageQuery, UsageRecord, UsageTotals } from './store.js';

/** Each entry moves the schema one version forward; never edit a released one, append. */
const migrations: string[] = [
  `CREATE TABLE groups (
     name TEXT PRIMARY KEY,
     models TEXT NOT NULL,
     families TEXT NOT NULL,
     created_at INTEGER NOT NULL
   );
   CREATE TABLE keys (
     id TEXT PRIMARY KEY,
     hash TEXT NOT NULL UNIQUE,
     prefix TEXT NOT NULL,
     name TEXT,
     group_name TEXT NOT NULL REFERENCES groups(name) ON UPDATE CASCADE,
     disabled INTEGER NOT NULL DEFAULT 0,
     created_at INTEGER NOT NULL,
     last_used_at INTEGER
   );
   CREATE TABLE usage (
     id INTEGER PRIMARY KEY,
     time INTEGER NOT NULL,
     request_id TEXT NOT NULL,
     key_id TEXT,
     group_name TEXT,
     model TEXT,
     upstream TEXT,
     family TEXT NOT NULL,
     status INTEGER NOT NULL,
     prompt_tokens INTEGER NOT NULL,
     completion_tokens INTEGER NOT NULL,
     estimated INTEGER NOT NULL,
     latency_ms REAL NOT NULL,
     ttfb_ms REAL,
     streamed INTEGER NOT NULL,
     outcome TEXT NOT NULL
   );
   CREATE INDEX usage_time ON usage(time);
   CREATE INDEX usage_key_time ON usage(key_id, time);`,
  `ALTER TABLE usage ADD COLUMN error TEXT;`,
  // Journal replay relies on this index to skip records already stored. Request ids are unique
  // per record; the rename only lets a database that somehow holds a repeat take the index.
  `UPDATE usage SET request_id = request_id || '#' || id
     WHERE id NOT IN (SELECT MIN(id) FROM usage GROUP BY request_id);
   CREATE UNIQUE INDEX usage_request_id ON usage(request_id);`,
  // What the model rules dropped from a request (`dropped tools: web_search`).
  `ALTER TABLE usage ADD COLUMN notes TEXT;`,
  // Key expiry, and the audit log of admin actions.
  `ALTER TABLE keys ADD COLUMN expires_at INTEGER;
   CREATE TABLE audit (
     id INTEGER PRIMARY KEY,
     time INTEGER NOT NULL,
     actor TEXT NOT NULL,
     action TEXT NOT NULL,
     target TEXT,
     detail TEXT
   );
   CREATE INDEX audit_time ON audit(time);`,
  // Limits and budgets (JSON), and what usage cost and which channel served it.
  `ALTER TABLE groups ADD COLUMN limits TEXT;
   ALTER TABLE groups ADD COLUMN budget TEXT;
   ALTER TABLE keys ADD COLUMN limits TEXT;
   ALTER TABLE keys ADD COLUMN budget TEXT;
   ALTER TABLE usage ADD COLUMN cached_tokens INTEGER;
   ALTER TABLE usage ADD COLUMN reasoning_tokens INTEGER;
   ALTER TABLE usage ADD COLUMN cost REAL;
   ALTER TABLE usage ADD COLUMN channel TEXT;
   ALTER TABLE usage ADD COLUMN attempts INTEGER NOT NULL DEFAULT 1;
   CREATE INDEX usage_group_time ON usage(group_name, time);`,
  `ALTER TABLE usage ADD COLUMN cache_write_tokens INTEGER;`,
  // Shared state (console sessions, sign-in lockouts, the admin token's hash); expired rows are swept on writes.
  `CREATE TABLE state (
     name TEXT PRIMARY KEY,
     value TEXT NOT NULL,
     expires_at INTEGER
   );
   CREATE INDEX state_expires_at ON state(expires_at) WHERE expires_at IS NOT NULL;`,
  // The MCP tools a group's keys may call (JSON list of `server/tool` or `server/*`).
  `ALTER TABLE groups ADD COLUMN mcp_tools TEXT;`,
];

function usageFilter(query: UsageQuery): { filter: string; args: Record<string, unknown> } {
  const where: string[] = [];
  const args: Record<string, unknown> = {};
  const add = (clause: string, name: string, value: unknown) => {
    if (value === undefined) return;
    where.push(clause);
    args[name] = value;
  };
  add('key_id = @key', 'key', query.key);
  add('group_name = @group', 'group', query.group);
  add('model = @model', 'model', query.model);
  add('status >= @statusMin', 'statusMin', query.statusMin);
  add('status < @statusMax', 'statusMax', query.statusMax);
  add('time >= @since', 'since', query.since);
  add('time < @until', 'until', query.until);
  return { filter: where.length ? `WHERE ${where.join(' AND ')}` : '', args };
}

/** Each usage column and the record field it holds, in the INSERT's order. */
const usageColumns: ReadonlyArray<readonly [column: string, field: keyof UsageRecord]> = [
  ['time', 'time'], ['request_id', 'requestId'], ['key_id', 'keyId'], ['group_name', 'group'], ['model', 'model'],
  ['upstream', 'upstream'], ['family', 'family'], ['status', 'status'], ['prompt_tokens', 'promptTokens'],
  ['completion_tokens', 'completionTokens'], ['estimated', 'estimated'], ['latency_ms', 'latencyMs'], ['ttfb_ms', 'ttfbMs'],
  ['streamed', 'streamed'], ['outcome', 'outcome'], ['error', 'error'], ['notes', 'notes'], ['cached_tokens', 'cachedInputTokens'],
  ['cache_write_tokens', 'cacheWriteTokens'], ['reasoning_tokens', 'reasoningTokens'], ['cost', 'cost'], ['channel', 'channel'],
  ['attempts', 'attempts'],
];

/**
 * A record's values in column order. Bound by position: node:sqlite binds named parameters at
 * about twice the cost (24 µs against 10 µs a row, measured). A record replayed from an older
 * version's journal may lack fields added since: they bind as NULL (and a row missing a required
 * one is skipped by INSERT OR IGNORE rather than failing its batch).
 */
function usageValues(record: UsageRecord): unknown[] {
  const values = new Array<unknown>(usageColumns.length);
  for (let i = 0; i < usageColumns.length; i++) values[i] = bindable(record[usageColumns[i]![1]]);
  return values;
}

/** Where each column's value sits in a record's journal line. */
const columnLinePositions = usageColumns.map(([, field]) => recordLinePosition(field));

/** The same values, from a record's journal line read as its array (recordLineValues). */
function usageValuesFromLine(line: readonly unknown[]): unknown[] {
  const values = new Array<unknown>(usageColumns.length);
  for (let i = 0; i < usageColumns.length; i++) values[i] = bindable(line[columnLinePositions[i]!]);
  return values;
}

const bindable = (value: unknown) => (typeof value === 'boolean' ? (value ? 1 : 0) : (value ?? null));
const TIME_COLUMN = usageColumns.findIndex(([column]) => column === 'time');
const KEY_COLUMN = usageColumns.findIndex(([column]) => column === 'key_id');

/** node:sqlite's rows have no prototype; what the store hands out are ordinary objects. */
const plain = <T extends object>(row: T): T => ({ ...row });

export interface SqliteOptions {
  /** How long a write waits for another connection's lock before it fails (SQLITE_BUSY). */
  busyTimeoutMs?: number;
  /**
   * `thread`: usage batches are written by a thread of their own (sqlite-writer.ts), off the event
   * loop that serves requests: what the gateway uses. `inline` (the default) writes them here.
   */
  usageWriter?: 'inline' | 'thread';
  /** Where the writer thread's notices go (it could not run at idle priority, it starved); unsaid without. */
  log?: Logger;
}

export class SqliteStore implements StoreBackend {
  private readonly db: SqliteConnection;
  private readonly stmt;
  /** Carries "a group or key changed" between the stores of one file; a channel never hears its own posts. */
  private readonly changes: BroadcastChannel;
  private readonly writer: UsageWriter | undefined;

  constructor(file: string, options: SqliteOptions = {}) {
    this.db = openSqlite(file);
    this.db.exec('PRAGMA journal_mode = WAL');
    // FULL: a committed batch survives power loss too, before the journal that held it is cut.
    // Writes come in batches, so the fsync per commit is rare.
    this.db.exec('PRAGMA synchronous = FULL');
    this.db.exec(`PRAGMA busy_timeout = ${Math.max(0, Math.floor(options.busyTimeoutMs ?? 5000))}`);
    this.db.exec('PRAGMA foreign_keys = ON');
    this.migrate();
    this.stmt = {
      keyByHash: this.db.prepare<KeyRow>('SELECT * FROM keys WHERE hash = ?'),
      keyById: this.db.prepare<KeyRow>('SELECT * FROM keys WHERE id = ?'),
      group: this.db.prepare<GroupRow>('SELECT * FROM groups WHERE name = ?'),
      insertUsage: this.db.prepare(
        `INSERT OR IGNORE INTO usage (${usageColumns.map(([column]) => column).join(', ')})
         VALUES (${usageColumns.map(([column]) => (column === 'attempts' ? 'COALESCE(?, 1)' : '?')).join(', ')})`,
      ),
      touchKey: this.db.prepare('UPDATE keys SET last_used_at = MAX(COALESCE(last_used_at, 0), ?) WHERE id = ?'),
      getState: this.db.prepare<{ value: string }>('SELECT value FROM state WHERE name = ? AND (expires_at IS NULL OR expires_at > ?)'),
      setState: this.db.prepare(
        `INSERT INTO state (name, value, expires_at) VALUES (?, ?, ?)
         ON CONFLICT (name) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at`,
      ),
      setStateIfAbsent: this.db.prepare(
        `INSERT INTO state (name, value, expires_at) VALUES (?, ?, ?)
         ON CONFLICT (name) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at
           WHERE state.expires_at IS NOT NULL AND state.expires_at <= ?`,
      ),
      sweepState: this.db.prepare('DELETE FROM state WHERE expires_at <= ?'),
    };
    this.changes = new BroadcastChannel(`sluice-store:${resolve(file)}`);
    // Watching is no reason to stay alive: the gateway's server keeps the process up.
    this.changes.unref();
    // Its thread starts with the first batch, once the schema is in place.
    if (options.usageWriter === 'thread') this.writer = new UsageWriter(file, { busyTimeoutMs: options.busyTimeoutMs, log: options.log });
  }

  private migrate(): void {
    const version = this.db.pragmaNumber('user_version');
    if (version > migrations.length) {
      throw new Error(`the database schema (v${version}) is newer than this Sluice (v${migrations.length})`);
    }
    for (let v = version; v < migrations.length; v++) {
      this.db.transaction(() => {
        this.db.exec(migrations[v]!);
        this.db.exec(`PRAGMA user_version = ${v + 1}`);
      });
    }
  }

  async createGroup(group: GroupInput): Promise<Group> {
    const row: GroupRow = {
      name: group.name,
      models: JSON.stringify(group.models),
      families: JSON.stringify(group.families),
      limits: jsonText(group.limits),
      budget: jsonText(group.budget),
      mcp_tools: JSON.stringify(group.mcpTools ?? []),
      created_at: Date.now(),
    };
    this.db
      .prepare('INSERT INTO groups (name, models, families, limits, budget, mcp_tools, created_at) VALUES (@name, @models, @families, @limits, @budget, @mcp_tools, @created_at)')
      .run(row);
    this.announce();
    return toGroup(row);
  }

  async getGroup(name: string): Promise<Group | undefined> {
    const row = this.stmt.group.get(name);
    return row && toGroup(row);
  }

  async listGroups(): Promise<Group[]> {
    return this.db.prepare<GroupRow>('SELECT * FROM groups ORDER BY name').all().map(toGroup);
  }

  async updateGroup(name: string, patch: Partial<GroupInput>): Promise<Group | undefined> {
    const current = await this.getGroup(name);
    if (!current) return undefined;
    const next = { ...current, ...patch };
    this.db.transaction(() => {
      this.db
        .prepare('UPDATE groups SET name = ?, models = ?, families = ?, limits = ?, budget = ?, mcp_tools = ? WHERE name = ?')
        .run(next.name, JSON.stringify(next.models), JSON.stringify(next.families), jsonText(next.limits), jsonText(next.budget), JSON.stringify(next.mcpTools), name);
      // A rename moves the group's usage with its keys: its spend (budgets) is summed from its
      // records by name, and a renamed group would otherwise start its budget afresh.
      if (next.name !== name) this.db.prepare('UPDATE usage SET group_name = ? WHERE group_name = ?').run(next.name, name);
    });
    this.announce();
    return this.getGroup(next.name);
  }

  async deleteGroup(name: string): Promise<'deleted' | 'not_found' | 'in_use'> {
    if (!(await this.getGroup(name))) return 'not_found';
    const inUse = this.db.prepare('SELECT 1 FROM keys WHERE group_name = ? LIMIT 1').get(name);
    if (inUse) return 'in_use';
    this.db.prepare('DELETE FROM groups WHERE name = ?').run(name);
    this.announce();
    return 'deleted';
  }

  async createKey(input: { group: string; name?: string | null; expiresAt?: number | null; limits?: Limits | null; budget?: Budget | null }): Promise<{ key: ApiKey; secret: string }> {
    const { secret, ...minted } = mintKey();
    const row: KeyRow & { hash: string } = {
      ...minted,
      name: input.name ?? null,
      group_name: input.group,
      disabled: 0,
      created_at: Date.now(),
      last_used_at: null,
      expires_at: input.expiresAt ?? null,
      limits: jsonText(input.limits),
      budget: jsonText(input.budget),
    };
    this.db
      .prepare(
        `INSERT INTO keys (id, hash, prefix, name, group_name, disabled, created_at, last_used_at, expires_at, limits, budget)
         VALUES (@id, @hash, @prefix, @name, @group_name, @disabled, @created_at, @last_used_at, @expires_at, @limits, @budget)`,
      )
      .run(row);
    this.announce();
    return { key: toKey(row), secret };
  }

  async findKeyBySecret(secret: string): Promise<ApiKey | undefined> {
    const row = this.stmt.keyByHash.get(hashSecret(secret));
    return row && toKey(row);
  }

  async getKey(id: string): Promise<ApiKey | undefined> {
    const row = this.stmt.keyById.get(id);
    return row && toKey(row);
  }

  async listKeys(): Promise<ApiKey[]> {
    return this.db.prepare<KeyRow>('SELECT * FROM keys ORDER BY created_at, id').all().map(toKey);
  }

  async updateKey(id: string, patch: KeyPatch): Promise<ApiKey | undefined> {
    const current = await this.getKey(id);
    if (!current) return undefined;
    const next = { ...current, ...Object.fromEntries(Object.entries(patch).filter(([, v]) => v !== undefined)) };
    this.db
      .prepare('UPDATE keys SET disabled = ?, name = ?, group_name = ?, expires_at = ?, limits = ?, budget = ? WHERE id = ?')
      .run(next.disabled ? 1 : 0, next.name, next.group, next.expiresAt, jsonText(next.limits), jsonText(next.budget), id);
    this.announce();
    return this.getKey(id);
  }

  async deleteKey(id: string): Promise<boolean> {
    const deleted = this.db.prepare('DELETE FROM keys WHERE id = ?').run(id).changes > 0;
    if (deleted) this.announce();
    return deleted;
  }

  async writeUsage(records: readonly UsageRecord[], lines?: readonly string[]): Promise<void> {
    if (this.writer) return this.writer.write(lines ?? records.map(encodeRecord));
    this.insertUsage(records.map(usageValues));
  }

  /** The writer thread's side of `writeUsage`: a batch as the records' journal lines, bound from their arrays. */
  writeUsageLines(lines: readonly string[]): void {
    this.insertUsage(lines.map((line) => usageValuesFromLine(recordLineValues(line))));
  }

  /** One transaction: the rows (usageValues), then each key's last-used time. */
  private insertUsage(rows: readonly unknown[][]): void {
    const lastUsed = new Map<string, number>();
    for (const row of rows) {
      const key = row[KEY_COLUMN], time = row[TIME_COLUMN] as number;
      if (typeof key === 'string' && key) lastUsed.set(key, Math.max(time, lastUsed.get(key) ?? 0));
    }
    this.db.transaction(() => {
      for (const row of rows) this.stmt.insertUsage.run(...row);
      for (const [id, time] of lastUsed) this.stmt.touchKey.run(time, id);
    });
  }

  async queryUsage(query: UsageQuery): Promise<{ records: UsageRecord[]; totals: UsageTotals }> {
    const { filter, args } = usageFilter(query);
    const records = this.db
      .prepare<UsageRow>(`SELECT * FROM usage ${filter} ORDER BY time DESC, id DESC LIMIT @limit`)
      .all({ ...args, limit: query.limit ?? 1000 })
      .map(toUsage);
    const totals = this.db
      .prepare<UsageTotals>(
        `SELECT COUNT(*) AS requests, COALESCE(SUM(prompt_tokens), 0) AS promptTokens,
           COALESCE(SUM(completion_tokens), 0) AS completionTokens, COALESCE(SUM(cost), 0) AS cost,
           COALESCE(SUM(CASE WHEN status >= 400 OR outcome = 'error' THEN 1 ELSE 0 END), 0) AS errors
         FROM usage ${filter}`,
      )
      .get(args)!;
    return { records, totals: plain(totals) };
  }

  async usageSeries(query: UsageQuery, bucketMs: number): Promise<UsagePoint[]> {
    const { filter, args } = usageFilter(query);
    return this.db
      .prepare<UsagePoint>(
        `SELECT CAST(time / @bucket AS INTEGER) * @bucket AS t, COUNT(*) AS requests,
           SUM(prompt_tokens) AS promptTokens, SUM(completion_tokens) AS completionTokens, COALESCE(SUM(cost), 0) AS cost,
           SUM(CASE WHEN status >= 400 OR outcome = 'error' THEN 1 ELSE 0 END) AS errors,
           ROUND(AVG(latency_ms), 2) AS avgLatencyMs, ROUND(MAX(latency_ms), 2) AS maxLatencyMs
         FROM usage ${filter} GROUP BY t ORDER BY t`,
      )
      .all({ ...args, bucket: Math.max(1, Math.floor(bucketMs)) })
      .map(plain);
  }

  async upstreamActivity(since: number): Promise<UpstreamActivity[]> {
    // The upstream's own failures: 5xx answers, and streams that failed after a 200.
    const failure = `(status >= 500 OR (outcome = 'error' AND status < 400))`;
    const activity = this.db
      .prepare<Omit<UpstreamActivity, 'lastError'>>(
        `SELECT upstream, COUNT(*) AS requests, SUM(CASE WHEN ${failure} THEN 1 ELSE 0 END) AS errors, MAX(time) AS lastSeen
         FROM usage WHERE upstream IS NOT NULL AND time >= ? GROUP BY upstream`,
      )
      .all(since);
    const lastError = this.db.prepare<{ error: string | null }>(
      `SELECT error FROM usage WHERE upstream = ? AND time >= ? AND ${failure} ORDER BY time DESC, id DESC LIMIT 1`,
    );
    return activity.map((a) => ({ ...a, lastError: a.errors ? (lastError.get(a.upstream, since)?.error ?? null) : null }));
  }

  async recordAudit(entry: AuditEntry): Promise<void> {
    this.db.prepare('INSERT INTO audit (time, actor, action, target, detail) VALUES (@time, @actor, @action, @target, @detail)').run(entry);
  }

  async queryAudit(query: AuditQuery): Promise<AuditEntry[]> {
    const where: string[] = [];
    const args: Record<string, unknown> = { limit: query.limit ?? 100 };
    const add = (clause: string, name: 'action' | 'since' | 'until') => {
      if (query[name] === undefined) return;
      where.push(clause);
      args[name] = query[name];
    };
    add('action = @action', 'action');
    add('time >= @since', 'since');
    add('time < @until', 'until');
    return this.db
      .prepare<AuditEntry>(
        `SELECT time, actor, action, target, detail FROM audit ${where.length ? `WHERE ${where.join(' AND ')}` : ''}
         ORDER BY time DESC, id DESC LIMIT @limit`,
      )
      .all(args)
      .map(plain);
  }

  async getState(name: string): Promise<string | undefined> {
    return this.stmt.getState.get(name, Date.now())?.value;
  }

  async setState(name: string, value: string, expiresAt: number | null, options: { onlyIfAbsent?: boolean } = {}): Promise<boolean> {
    const now = Date.now();
    // Entries are small and written rarely (sign-ins, lockouts), so every write sweeps: the table stays bounded.
    this.stmt.sweepState.run(now);
    if (options.onlyIfAbsent) return this.stmt.setStateIfAbsent.run(name, value, expiresAt, now).changes > 0;
    this.stmt.setState.run(name, value, expiresAt);
    return true;
  }

  async deleteState(name: string): Promise<void> {
    this.db.prepare('DELETE FROM state WHERE name = ?').run(name);
  }

  watch(onChange: () => void): () => void {
    const listener = () => onChange();
    this.changes.addEventListener('message', listener);
    return () => this.changes.removeEventListener('message', listener);
  }

  /** Tells the other stores of this file that a group or key changed. */
  private announce(): void {
    this.changes.postMessage('changed');
  }

  async close(): Promise<void> {
    await this.writer?.close();
    this.changes.close();
    this.db.close();
  }
}
