/**
 * The shared store: one PostgreSQL database behind several gateways and their worker threads. It
 * keeps the SQLite store's semantics (sqlite.ts): keys as SHA-256 hashes of their secrets, usage in
 * batches that skip request ids already stored and move their keys' last-used times.
 *
 * The schema is versioned in `sluice_schema_migrations` and brought forward at open, in one
 * transaction under an advisory lock, so instances starting together migrate once. Every group and
 * key write sends NOTIFY `sluice_changes` in its own transaction (delivered on commit); watchers
 * LISTEN on a connection of their own, which reconnects with backoff and then reports a change,
 * since notifications sent meanwhile are lost. A database that cannot be reached rejects with
 * StoreUnavailableError, within CONNECT_TIMEOUT_MS (a query on a connection that stops answering,
 * within QUERY_TIMEOUT_MS) rather than hanging.
 */
import pg from 'pg';
import { pino, type Logger } from 'pino';
import { createLogger } from '../log.js';
import { jsonText, toGroup, toKey, toUsage, type GroupRow, type KeyRow, type UsageRow } from './rows.js';
import { hashSecret, mintKey } from './secrets.js';
import {
  StoreUnavailableError,
  type ApiKey,
  type AuditEntry,
  type AuditQuery,
  type Budget,
  type Group,
  type GroupInput,
  type KeyPatch,
  type Limits,
  type StoreBackend,
  type UpstreamActivity,
  type UsagePoint,
  type UsageQuery,
  type UsageRecord,
  type UsageTotals,
} from './store.js';

const CHANGES_CHANNEL = 'sluice_changes';
const CONNECT_TIMEOUT_MS = 2000;
const QUERY_TIMEOUT_MS = 30_000;
const LISTEN_RETRY_MIN_MS = 100;
const LISTEN_RETRY_MAX_MS = 5000;
const DEFAULT_POOL_SIZE = 10;

/** Each entry moves the schema one version forward; never edit a released one, append. */
const migrations: string[] = [
  `CREATE TABLE groups (
     name TEXT PRIMARY KEY,
     models JSONB NOT NULL,
     families JSONB NOT NULL,
     limits JSONB,
     budget JSONB,
     created_at BIGINT NOT NULL
   );
   CREATE TABLE keys (
     id TEXT PRIMARY KEY,
     hash TEXT NOT NULL UNIQUE,
     prefix TEXT NOT NULL,
     name TEXT,
     group_name TEXT NOT NULL REFERENCES groups(name) ON UPDATE CASCADE,
     disabled BOOLEAN NOT NULL DEFAULT FALSE,
     created_at BIGINT NOT NULL,
     last_used_at BIGINT,
     expires_at BIGINT,
     limits JSONB,
     budget JSONB
   );
   CREATE INDEX keys_group_name ON keys(group_name);
   CREATE TABLE usage (
     id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
     time BIGINT NOT NULL,
     request_id TEXT NOT NULL UNIQUE,
     key_id TEXT,
     group_name TEXT,
     model TEXT,
     upstream TEXT,
     family TEXT NOT NULL,
     status INTEGER NOT NULL,
     prompt_tokens BIGINT NOT NULL,
     completion_tokens BIGINT NOT NULL,
     cached_tokens BIGINT,
     cache_write_tokens BIGINT,
     reasoning_tokens BIGINT,
     cost DOUBLE PRECISION,
     channel TEXT,
     attempts INTEGER NOT NULL DEFAULT 1,
     estimated BOOLEAN NOT NULL,
     latency_ms DOUBLE PRECISION NOT NULL,
     ttfb_ms DOUBLE PRECISION,
     streamed BOOLEAN NOT NULL,
     outcome TEXT NOT NULL,
     error TEXT,
     notes TEXT
   );
   CREATE INDEX usage_time ON usage(time);
   CREATE INDEX usage_key_time ON usage(key_id, time);
   CREATE INDEX usage_group_time ON usage(group_name, time);
   CREATE TABLE audit (
     id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
     time BIGINT NOT NULL,
     actor TEXT NOT NULL,
     action TEXT NOT NULL,
     target TEXT,
     detail TEXT
   );
   CREATE INDEX audit_time ON audit(time);
   CREATE TABLE state (
     name TEXT PRIMARY KEY,
     value TEXT NOT NULL,
     expires_at BIGINT
   );
   CREATE INDEX state_expires_at ON state(expires_at) WHERE expires_at IS NOT NULL;`,
  // The MCP tools a group's keys may call (JSON list of `server/tool` or `server/*`).
  `ALTER TABLE groups ADD COLUMN mcp_tools JSONB;`,
];

/**
 * A batch arrives as one JSON parameter. Numbers are read as doubles and rounded into integer
 * columns, and a record lacking a required field (replayed from an older version's journal) is
 * skipped, as SQLite's INSERT OR IGNORE does: neither may fail every later batch.
 */
const insertUsage = `
  INSERT INTO usage (time, request_id, key_id, group_name, model, upstream, family, status, prompt_tokens, completion_tokens,
    cached_tokens, cache_write_tokens, reasoning_tokens, cost, channel, attempts, estimated, latency_ms, ttfb_ms, streamed,
    outcome, error, notes)
  SELECT "time", "requestId", "keyId", "group", model, upstream, family, status, "promptTokens", "completionTokens",
    "cachedInputTokens", "cacheWriteTokens", "reasoningTokens", cost, channel, COALESCE(attempts, 1), estimated, "latencyMs",
    "ttfbMs", streamed, outcome, error, notes
  FROM jsonb_to_recordset($1::jsonb) AS r("time" float8, "requestId" text, "keyId" text, "group" text, model text,
    upstream text, family text, status float8, "promptTokens" float8, "completionTokens" float8, "cachedInputTokens" float8,
    "cacheWriteTokens" float8, "reasoningTokens" float8, cost float8, channel text, attempts float8, estimated boolean,
    "latencyMs" float8, "ttfbMs" float8, streamed boolean, outcome text, error text, notes text)
  WHERE "time" IS NOT NULL AND "requestId" IS NOT NULL AND family IS NOT NULL AND status IS NOT NULL
    AND "promptTokens" IS NOT NULL AND "completionTokens" IS NOT NULL AND estimated IS NOT NULL
    AND "latencyMs" IS NOT NULL AND streamed IS NOT NULL AND outcome IS NOT NULL
  ON CONFLICT (request_id) DO NOTHING`;

/** PostgreSQL text cannot hold NUL: one in an upstream's error message must not fail the batch. */
const withoutNul = (_key: string, value: unknown) => (typeof value === 'string' ? value.replaceAll('\0', '') : value);

/** Unix milliseconds and counts come back as BIGINT, sums as NUMERIC: all well within a double. */
const types = new pg.TypeOverrides();
types.setTypeParser(pg.types.builtins.INT8, Number);
types.setTypeParser(pg.types.builtins.NUMERIC, Number);

/** Errors that mean the database cannot be reached, rather than that it refused the statement. */
const unreachableCodes = new Set([
  'ECONNREFUSED', 'ECONNRESET', 'ETIMEDOUT', 'EPIPE', 'ENOTFOUND', 'EHOSTUNREACH', 'ENETUNREACH', 'EAI_AGAIN',
  // admin_shutdown, crash_shutdown, cannot_connect_now (starting up), too_many_connections
  '57P01', '57P02', '57P03', '53300',
]);

function isUnreachable(err: unknown): boolean {
  if (!(err instanceof Error)) return false;
  const code = (err as { code?: unknown }).code;
  // Class 08 is "connection exception".
  if (typeof code === 'string' && (unreachableCodes.has(code) || code.startsWith('08'))) return true;
  // pg's own words for a connection that timed out or died under a query.
  return /timeout exceeded when trying to connect|timeout expired|Connection terminated|not queryable|Query read timeout/i.test(err.message);
}

function storeError(err: unknown): unknown {
  return isUnreachable(err) && !(err instanceof StoreUnavailableError) ? new StoreUnavailableError(`PostgreSQL cannot be reached: ${(err as Error).message}`, { cause: err }) : err;
}


/** A WHERE clause of the conditions whose value is set, the values appended to `values` as $1, $2, ... */
function whereClause(conditions: [condition: string, value: unknown][], values: unknown[]): string {
  const where: string[] = [];
  for (const [condition, value] of conditions) {
    if (value === undefined) continue;
    values.push(value);
    where.push(`${condition} $${values.length}`);
  }
  return where.length ? `WHERE ${where.join(' AND ')}` : '';
}

/** A WHERE clause for a usage query, its values appended to `values`. */
const usageFilter = (query: UsageQuery, values: unknown[]) =>
  whereClause(
    [
      ['key_id =', query.key],
      ['group_name =', query.group],
      ['model =', query.model],
      ['status >=', query.statusMin],
      ['status <', query.statusMax],
      ['time >=', query.since],
      ['time <', query.until],
    ],
    values,
  );

/** Tells every watcher, once the transaction commits, that a group or key changed. */
const notifyChange = (client: pg.PoolClient) => client.query(`SELECT pg_notify('${CHANGES_CHANNEL}', '')`);

/** LISTENs for changes on a connection of its own; reconnects with backoff when it drops. */
class ChangeListener {
  private client: pg.Client | undefined;
  private retry: NodeJS.Timeout | undefined;
  private retryMs = LISTEN_RETRY_MIN_MS;
  /** The connection dropped: changes may have gone unheard until it is back. */
  private missed = false;
  private closed = false;

  constructor(
    private readonly url: string,
    private readonly onChange: () => void,
    private readonly log: Logger,
  ) {
    void this.connect();
  }

  private async connect(): Promise<void> {
    const client = new pg.Client({ connectionString: this.url, connectionTimeoutMillis: CONNECT_TIMEOUT_MS, keepAlive: true });
    this.client = client;
    let dropped = false;
    const drop = (err: unknown) => {
      if (dropped) return;
      dropped = true;
      client.end().catch(() => {});
      if (this.closed) return;
      if (!this.missed) this.log.warn({ err }, 'PostgreSQL change notifications lost: reconnecting');
      this.missed = true;
      this.retry = setTimeout(() => void this.connect(), this.retryMs).unref();
      this.retryMs = Math.min(this.retryMs * 2, LISTEN_RETRY_MAX_MS);
    };
    client.on('error', drop);
    client.on('end', () => drop(new Error('connection ended')));
    client.on('notification', () => this.onChange());
    try {
      await client.connect();
      await client.query(`LISTEN ${CHANGES_CHANNEL}`);
    } catch (err) {
      drop(err);
      return;
    }
    if (dropped) return;
    this.retryMs = LISTEN_RETRY_MIN_MS;
    if (this.missed) {
      this.missed = false;
      this.log.info('PostgreSQL change notifications resumed');
      this.onChange();
    }
  }

  async close(): Promise<void> {
    this.closed = true;
    clearTimeout(this.retry);
    await this.client?.end().catch(() => {});
  }
}

export interface PostgresOptions {
  /** Connections in the pool (the LISTEN connection is extra). */
  poolSize?: number;
  log?: Logger;
}

export class PostgresStore implements StoreBackend {
  private readonly pool: pg.Pool;
  private readonly log: Logger;
  private readonly watchers = new Set<() => void>();
  /** Started by the first watch. */
  private listener: ChangeListener | undefined;
  private closed = false;

  private constructor(
    private readonly url: string,
    options: PostgresOptions,
  ) {
    this.log = options.log ?? createLogger('warn', pino.destination({ dest: 2, sync: true }));
    this.pool = new pg.Pool({
      connectionString: url,
      max: options.poolSize ?? DEFAULT_POOL_SIZE,
      connectionTimeoutMillis: CONNECT_TIMEOUT_MS,
      // A server that vanishes without closing its sockets (a network partition) must not hang a
      // query, a journal flush or a shutdown: the statement fails and counts as unreachable.
      query_timeout: QUERY_TIMEOUT_MS,
      keepAlive: true,
      keepAliveInitialDelayMillis: 10_000,
      types,
    });
    // An idle connection that drops (a server restart) is discarded by the pool; unhandled, it would crash the process.
    this.pool.on('error', (err) => this.log.warn({ err }, 'PostgreSQL connection lost while idle'));
  }

  /** Connects and brings the schema up to date; rejects with StoreUnavailableError when the database cannot be reached. */
  static async open(url: string, options: PostgresOptions = {}): Promise<PostgresStore> {
    const store = new PostgresStore(url, options);
    try {
      await store.transaction((client) => migrate(client));
    } catch (err) {
      await store.close();
      throw err;
    }
    return store;
  }

  private async query<R extends pg.QueryResultRow>(text: string, values?: unknown[]): Promise<R[]> {
    try {
      return (await this.pool.query<R>(text, values)).rows;
    } catch (err) {
      throw storeError(err);
    }
  }

  private async transaction<T>(work: (client: pg.PoolClient) => Promise<T>): Promise<T> {
    let client: pg.PoolClient;
    try {
      client = await this.pool.connect();
    } catch (err) {
      throw storeError(err);
    }
    // A checked-out connection that drops emits 'error' besides failing its statement; unhandled, it would crash the process.
    const ignore = () => {};
    client.on('error', ignore);
    try {
      await client.query('BEGIN');
      const result = await work(client);
      await client.query('COMMIT');
      client.off('error', ignore);
      client.release();
      return result;
    } catch (err) {
      const rolledBack = await client.query('ROLLBACK').then(() => true, () => false);
      client.off('error', ignore);
      // A connection that cannot roll back is not given to the next caller.
      client.release(!rolledBack);
      throw storeError(err);
    }
  }

  async createGroup(group: GroupInput): Promise<Group> {
    return this.transaction(async (client) => {
      const { rows } = await client.query<GroupRow>(
        'INSERT INTO groups (name, models, families, limits, budget, mcp_tools, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING *',
        [group.name, JSON.stringify(group.models), JSON.stringify(group.families), jsonText(group.limits), jsonText(group.budget), JSON.stringify(group.mcpTools ?? []), Date.now()],
      );
      await notifyChange(client);
      return toGroup(rows[0]!);
    });
  }

  async getGroup(name: string): Promise<Group | undefined> {
    const [row] = await this.query<GroupRow>('SELECT * FROM groups WHERE name = $1', [name]);
    return row && toGroup(row);
  }

  async listGroups(): Promise<Group[]> {
    // Byte order, as SQLite sorts, whatever the database's collation.
    return (await this.query<GroupRow>('SELECT * FROM groups ORDER BY name COLLATE "C"')).map(toGroup);
  }

  async updateGroup(name: string, patch: Partial<GroupInput>): Promise<Group | undefined> {
    return this.transaction(async (client) => {
      const [current] = (await client.query<GroupRow>('SELECT * FROM groups WHERE name = $1 FOR UPDATE', [name])).rows;
      if (!current) return undefined;
      const next = { ...toGroup(current), ...patch };
      // A rename moves the group's keys (ON UPDATE CASCADE).
      const { rows } = await client.query<GroupRow>(
        'UPDATE groups SET name = $1, models = $2, families = $3, limits = $4, budget = $5, mcp_tools = $6 WHERE name = $7 RETURNING *',
        [next.name, JSON.stringify(next.models), JSON.stringify(next.families), jsonText(next.limits), jsonText(next.budget), JSON.stringify(next.mcpTools), name],
      );
      // And its usage: a group's spend (budgets) is summed from its records by name.
      if (next.name !== name) await client.query('UPDATE usage SET group_name = $1 WHERE group_name = $2', [next.name, name]);
      await notifyChange(client);
      return toGroup(rows[0]!);
    });
  }

  async deleteGroup(name: string): Promise<'deleted' | 'not_found' | 'in_use'> {
    return this.transaction(async (client): Promise<'deleted' | 'not_found' | 'in_use'> => {
      // The row lock makes a key being added to the group wait, and then fail its foreign key.
      if (!(await client.query('SELECT 1 FROM groups WHERE name = $1 FOR UPDATE', [name])).rowCount) return 'not_found';
      if ((await client.query('SELECT 1 FROM keys WHERE group_name = $1 LIMIT 1', [name])).rowCount) return 'in_use';
      await client.query('DELETE FROM groups WHERE name = $1', [name]);
      await notifyChange(client);
      return 'deleted';
    });
  }

  async createKey(input: { group: string; name?: string | null; expiresAt?: number | null; limits?: Limits | null; budget?: Budget | null }): Promise<{ key: ApiKey; secret: string }> {
    const { secret, id, hash, prefix } = mintKey();
    return this.transaction(async (client) => {
      const { rows } = await client.query<KeyRow>(
        `INSERT INTO keys (id, hash, prefix, name, group_name, created_at, expires_at, limits, budget)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING *`,
        [id, hash, prefix, input.name ?? null, input.group, Date.now(), input.expiresAt ?? null, jsonText(input.limits), jsonText(input.budget)],
      );
      await notifyChange(client);
      return { key: toKey(rows[0]!), secret };
    });
  }

  async findKeyBySecret(secret: string): Promise<ApiKey | undefined> {
    const [row] = await this.query<KeyRow>('SELECT * FROM keys WHERE hash = $1', [hashSecret(secret)]);
    return row && toKey(row);
  }

  async getKey(id: string): Promise<ApiKey | undefined> {
    const [row] = await this.query<KeyRow>('SELECT * FROM keys WHERE id = $1', [id]);
    return row && toKey(row);
  }

  async listKeys(): Promise<ApiKey[]> {
    return (await this.query<KeyRow>('SELECT * FROM keys ORDER BY created_at, id COLLATE "C"')).map(toKey);
  }

  async updateKey(id: string, patch: KeyPatch): Promise<ApiKey | undefined> {
    return this.transaction(async (client) => {
      const [current] = (await client.query<KeyRow>('SELECT * FROM keys WHERE id = $1 FOR UPDATE', [id])).rows;
      if (!current) return undefined;
      const next = { ...toKey(current), ...Object.fromEntries(Object.entries(patch).filter(([, v]) => v !== undefined)) };
      const { rows } = await client.query<KeyRow>(
        'UPDATE keys SET disabled = $1, name = $2, group_name = $3, expires_at = $4, limits = $5, budget = $6 WHERE id = $7 RETURNING *',
        [next.disabled, next.name, next.group, next.expiresAt, jsonText(next.limits), jsonText(next.budget), id],
      );
      await notifyChange(client);
      return toKey(rows[0]!);
    });
  }

  async deleteKey(id: string): Promise<boolean> {
    return this.transaction(async (client) => {
      const deleted = ((await client.query('DELETE FROM keys WHERE id = $1', [id])).rowCount ?? 0) > 0;
      if (deleted) await notifyChange(client);
      return deleted;
    });
  }

  async writeUsage(records: readonly UsageRecord[]): Promise<void> {
    const lastUsed = new Map<string, number>();
    for (const r of records) if (r.keyId) lastUsed.set(r.keyId, Math.max(r.time, lastUsed.get(r.keyId) ?? 0));
    await this.transaction(async (client) => {
      await client.query(insertUsage, [JSON.stringify(records, withoutNul)]);
      if (lastUsed.size === 0) return;
      const ids = [...lastUsed.keys()];
      // Locked in one order, so instances writing batches for the same keys at once cannot deadlock.
      await client.query('SELECT 1 FROM keys WHERE id = ANY($1) ORDER BY id FOR UPDATE', [ids]);
      await client.query(
        `UPDATE keys SET last_used_at = GREATEST(last_used_at, t.time)
         FROM unnest($1::text[], $2::float8[]) AS t(id, time) WHERE keys.id = t.id`,
        [ids, [...lastUsed.values()]],
      );
    });
  }

  async queryUsage(query: UsageQuery): Promise<{ records: UsageRecord[]; totals: UsageTotals }> {
    const values: unknown[] = [];
    const filter = usageFilter(query, values);
    const [rows, [totals]] = await Promise.all([
      this.query<UsageRow>(`SELECT * FROM usage ${filter} ORDER BY time DESC, id DESC LIMIT $${values.length + 1}`, [...values, query.limit ?? 1000]),
      this.query<UsageTotals>(
        `SELECT COUNT(*) AS requests, COALESCE(SUM(prompt_tokens), 0) AS "promptTokens",
           COALESCE(SUM(completion_tokens), 0) AS "completionTokens", COALESCE(SUM(cost), 0) AS cost,
           COUNT(*) FILTER (WHERE status >= 400 OR outcome = 'error') AS errors
         FROM usage ${filter}`,
        values,
      ),
    ]);
    return { records: rows.map(toUsage), totals: totals! };
  }

  async usageSeries(query: UsageQuery, bucketMs: number): Promise<UsagePoint[]> {
    const values: unknown[] = [Math.max(1, Math.floor(bucketMs))];
    const filter = usageFilter(query, values);
    return this.query<UsagePoint>(
      `SELECT time / $1::bigint * $1::bigint AS t, COUNT(*) AS requests,
         SUM(prompt_tokens) AS "promptTokens", SUM(completion_tokens) AS "completionTokens", COALESCE(SUM(cost), 0) AS cost,
         COUNT(*) FILTER (WHERE status >= 400 OR outcome = 'error') AS errors,
         ROUND(AVG(latency_ms)::numeric, 2) AS "avgLatencyMs", ROUND(MAX(latency_ms)::numeric, 2) AS "maxLatencyMs"
       FROM usage ${filter} GROUP BY t ORDER BY t`,
      values,
    );
  }

  async upstreamActivity(since: number): Promise<UpstreamActivity[]> {
    // The upstream's own failures: 5xx answers, and streams that failed after a 200.
    const failure = `(status >= 500 OR (outcome = 'error' AND status < 400))`;
    return this.query<UpstreamActivity>(
      `SELECT upstream, COUNT(*) AS requests, COUNT(*) FILTER (WHERE ${failure}) AS errors, MAX(time) AS "lastSeen",
         (SELECT error FROM usage f WHERE f.upstream = u.upstream AND f.time >= $1 AND ${failure}
          ORDER BY f.time DESC, f.id DESC LIMIT 1) AS "lastError"
       FROM usage u WHERE upstream IS NOT NULL AND time >= $1 GROUP BY upstream ORDER BY upstream COLLATE "C"`,
      [since],
    );
  }

  async recordAudit(entry: AuditEntry): Promise<void> {
    await this.query('INSERT INTO audit (time, actor, action, target, detail) VALUES ($1, $2, $3, $4, $5)', [
      entry.time, entry.actor, entry.action, entry.target, entry.detail,
    ]);
  }

  async queryAudit(query: AuditQuery): Promise<AuditEntry[]> {
    const values: unknown[] = [];
    const filter = whereClause(
      [
        ['action =', query.action],
        ['time >=', query.since],
        ['time <', query.until],
      ],
      values,
    );
    values.push(query.limit ?? 100);
    return this.query<AuditEntry>(
      `SELECT time, actor, action, target, detail FROM audit ${filter}
       ORDER BY time DESC, id DESC LIMIT $${values.length}`,
      values,
    );
  }

  async getState(name: string): Promise<string | undefined> {
    const [row] = await this.query<{ value: string }>('SELECT value FROM state WHERE name = $1 AND (expires_at IS NULL OR expires_at > $2)', [name, Date.now()]);
    return row?.value;
  }

  async setState(name: string, value: string, expiresAt: number | null, options: { onlyIfAbsent?: boolean } = {}): Promise<boolean> {
    const now = Date.now();
    // Entries are small and written rarely (sign-ins, lockouts), so every write sweeps: the table stays bounded.
    await this.query('DELETE FROM state WHERE expires_at <= $1', [now]);
    const upsert = `INSERT INTO state (name, value, expires_at) VALUES ($1, $2, $3)
      ON CONFLICT (name) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at`;
    if (!options.onlyIfAbsent) {
      await this.query(upsert, [name, value, expiresAt]);
      return true;
    }
    // Another instance's entry wins unless it has expired; RETURNING shows whether this one was stored.
    const stored = await this.query(`${upsert} WHERE state.expires_at IS NOT NULL AND state.expires_at <= $4 RETURNING 1`, [name, value, expiresAt, now]);
    return stored.length > 0;
  }

  async deleteState(name: string): Promise<void> {
    await this.query('DELETE FROM state WHERE name = $1', [name]);
  }

  watch(onChange: () => void): () => void {
    const watcher = () => onChange();
    this.watchers.add(watcher);
    if (!this.closed) this.listener ??= new ChangeListener(this.url, () => this.watchers.forEach((w) => w()), this.log);
    return () => this.watchers.delete(watcher);
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await Promise.all([this.listener?.close(), this.pool.end()]);
  }
}

/** Brings the schema forward; the advisory lock makes instances starting together take turns. */
async function migrate(client: pg.PoolClient): Promise<void> {
  await client.query(`SELECT pg_advisory_xact_lock(hashtext('sluice_schema_migrations'))`);
  await client.query('CREATE TABLE IF NOT EXISTS sluice_schema_migrations (version INTEGER PRIMARY KEY, applied_at BIGINT NOT NULL)');
  const { rows } = await client.query<{ version: number | null }>('SELECT MAX(version) AS version FROM sluice_schema_migrations');
  const version = rows[0]!.version ?? 0;
  if (version > migrations.length) {
    throw new Error(`the database schema (v${version}) is newer than this Sluice (v${migrations.length})`);
  }
  for (let v = version; v < migrations.length; v++) {
    await client.query(migrations[v]!);
    await client.query('INSERT INTO sluice_schema_migrations (version, applied_at) VALUES ($1, $2)', [v + 1, Date.now()]);
  }
}
