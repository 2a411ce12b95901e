/**
 * The cache layer in front of any Store: the request path's lookup (a key by its secret, with its
 * group) answers from memory without a wait while fresh, and every write through this layer
 * clears it, and so does the store's change notification (writes by other workers and instances).
 * Changes no notification reaches (the CLI on SQLite) are seen within `ttlMs`. While the store is
 * unreachable, keys seen before keep serving as they were last read.
 */
import { JournaledStore } from './journal.js';
import { StoreUnavailableError, type ApiKey, type AuditEntry, type AuditQuery, type Group, type GroupInput, type KeyPatch, type OpenExchange, type OpenTicket, type Store, type UsageQuery, type UsageRecord } from './store.js';

/** A key found by its secret, with the group it belongs to (undefined when that group is gone). */
export interface KeyLookup {
  key: ApiKey;
  group: Group | undefined;
}

const DEFAULT_TTL_MS = 2000;
const MAX_ENTRIES = 10_000;

export class CachedStore implements Store {
  private readonly keys = new Map<string, { found: KeyLookup; expires: number }>();
  /** Lookups under way, shared by the requests that need the same secret at once. */
  private readonly loading = new Map<string, Promise<KeyLookup | undefined>>();
  /** Moves on every forget: a lookup that began before a write must not cache what it read. */
  private generation = 0;

  private readonly unwatch: () => void;

  constructor(
    private readonly store: Store,
    private readonly ttlMs = DEFAULT_TTL_MS,
  ) {
    // Writes through other connections (workers, instances) reach this cache as notifications.
    this.unwatch = store.watch(() => this.forget());
  }

  /** The key for a secret: at once from the cache, otherwise a promise. Misses are not cached, so random secrets cannot fill memory. */
  keyBySecret(secret: string): KeyLookup | undefined | Promise<KeyLookup | undefined> {
    const hit = this.keys.get(secret);
    if (hit && hit.expires > Date.now()) return hit.found;
    let loading = this.loading.get(secret);
    if (!loading) {
      const started: Promise<KeyLookup | undefined> = this.load(secret).finally(() => {
        if (this.loading.get(secret) === started) this.loading.delete(secret);
      });
      this.loading.set(secret, (loading = started));
    }
    return loading;
  }

  private async load(secret: string): Promise<KeyLookup | undefined> {
    const generation = this.generation;
    let found: KeyLookup | undefined;
    try {
      const key = await this.store.findKeyBySecret(secret);
      if (!key) {
        this.keys.delete(secret);
        return undefined;
      }
      found = { key, group: await this.store.getGroup(key.group) };
    } catch (err) {
      // The database is down: a key seen before keeps serving as it was until the store is back.
      const stale = this.keys.get(secret);
      if (err instanceof StoreUnavailableError && stale) return stale.found;
      throw err;
    }
    if (this.keys.size >= MAX_ENTRIES) this.keys.clear();
    // Expired entries stay (up to MAX_ENTRIES) for when the store is unreachable. A read that
    // began before a write is kept only as such a fallback: it may predate the write.
    this.keys.set(secret, { found, expires: generation === this.generation ? Date.now() + this.ttlMs : 0 });
    return found;
  }

  /**
   * Every cached lookup goes stale: the next request of each key reads the store, and falls back
   * on what it last read only while the store is unreachable.
   */
  forget(): void {
    this.generation++;
    for (const entry of this.keys.values()) entry.expires = 0;
    // A lookup that began before a write must not be joined by requests that came after it.
    this.loading.clear();
  }

  private async changing<T>(write: Promise<T>): Promise<T> {
    this.forget();
    try {
      return await write;
    } finally {
      this.forget();
    }
  }

  createGroup(group: GroupInput) {
    return this.changing(this.store.createGroup(group));
  }
  updateGroup(name: string, patch: Partial<GroupInput>) {
    return this.changing(this.store.updateGroup(name, patch));
  }
  deleteGroup(name: string) {
    return this.changing(this.store.deleteGroup(name));
  }
  createKey(input: Parameters<Store['createKey']>[0]) {
    return this.changing(this.store.createKey(input));
  }
  updateKey(id: string, patch: KeyPatch) {
    return this.changing(this.store.updateKey(id, patch));
  }
  deleteKey(id: string) {
    return this.changing(this.store.deleteKey(id));
  }

  getGroup(name: string) {
    return this.store.getGroup(name);
  }
  listGroups() {
    return this.store.listGroups();
  }
  findKeyBySecret(secret: string) {
    return this.store.findKeyBySecret(secret);
  }
  getKey(id: string) {
    return this.store.getKey(id);
  }
  listKeys() {
    return this.store.listKeys();
  }
  beginExchange(exchange: OpenExchange) {
    return this.store.beginExchange(exchange);
  }
  recordUsage(record: UsageRecord, opened?: OpenTicket) {
    this.store.recordUsage(record, opened);
  }
  flush() {
    return this.store.flush();
  }

  settle() {
    return this.store.settle();
  }

  /** Usage records journaled and not yet in the store (none without a journal). */
  usageQueued(): number {
    return this.store instanceof JournaledStore ? this.store.queued : 0;
  }
  queryUsage(query: UsageQuery) {
    return this.store.queryUsage(query);
  }
  usageSeries(query: UsageQuery, bucketMs: number) {
    return this.store.usageSeries(query, bucketMs);
  }
  upstreamActivity(since: number) {
    return this.store.upstreamActivity(since);
  }
  recordAudit(entry: AuditEntry) {
    return this.store.recordAudit(entry);
  }
  queryAudit(query: AuditQuery) {
    return this.store.queryAudit(query);
  }
  getState(name: string) {
    return this.store.getState(name);
  }
  setState(name: string, value: string, expiresAt: number | null, options?: { onlyIfAbsent?: boolean }) {
    return this.store.setState(name, value, expiresAt, options);
  }
  deleteState(name: string) {
    return this.store.deleteState(name);
  }
  watch(onChange: () => void) {
    return this.store.watch(onChange);
  }
  close() {
    this.unwatch();
    return this.store.close();
  }
}
