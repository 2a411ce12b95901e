/**
 * The Store: groups, keys and usage records. A database implements StoreBackend (SQLite is the
 * embedded one; a shared database can implement it when several gateways share one truth); the
 * gateway uses it as a Store, behind the usage journal (journal.ts), which makes usage durable.
 */

export interface Group {
  name: string;
  /** Model ids this group may use; `*` grants every model. */
  models: string[];
  /** Wire families this group may use. */
  families: string[];
  createdAt: number;
}

export interface ApiKey {
  id: string;
  name: string | null;
  group: string;
  disabled: boolean;
  /** The first characters of the secret, to tell keys apart without revealing them. */
  prefix: string;
  createdAt: number;
  lastUsedAt: number | null;
  /** Unix milliseconds after which the key is refused, or null for never. */
  expiresAt: number | null;
}

/** The fields of a key an operator sets. */
export interface KeyPatch {
  disabled?: boolean;
  name?: string | null;
  group?: string;
  expiresAt?: number | null;
}

/** One state-changing admin action, or a failed sign-in. */
export interface AuditEntry {
  time: number;
  /** `admin-token@ADDRESS`, `console:SESSION@ADDRESS` or `cli:USER`. */
  actor: string;
  /** `group.create`, `key.update`, `session.sign_in_failed`, ... */
  action: string;
  /** The group name or key id acted on, when there is one. */
  target: string | null;
  detail: string | null;
}

export interface AuditQuery {
  action?: string;
  since?: number;
  until?: number;
  limit?: number;
}

export interface UsageRecord {
  time: number;
  requestId: string;
  keyId: string | null;
  group: string | null;
  model: string | null;
  upstream: string | null;
  family: string;
  status: number;
  promptTokens: number;
  completionTokens: number;
  estimated: boolean;
  latencyMs: number;
  ttfbMs: number | null;
  streamed: boolean;
  outcome: 'finished' | 'aborted' | 'error' | 'client_stalled' | 'shutdown';
  /** `code: message` of the failure, when there was one. */
  error: string | null;
  /** What the model rules dropped from the request, when they dropped anything. */
  notes: string | null;
}

/** One time bucket of usage. */
export interface UsagePoint {
  /** Bucket start, unix milliseconds. */
  t: number;
  requests: number;
  promptTokens: number;
  completionTokens: number;
  errors: number;
  avgLatencyMs: number;
  maxLatencyMs: number;
}

/** How an upstream channel has fared recently, from the usage records. */
export interface UpstreamActivity {
  upstream: string;
  requests: number;
  /** Failures on the upstream's side: 5xx answers and streams that failed midway. */
  errors: number;
  lastError: string | null;
  lastSeen: number | null;
}

export interface UsageQuery {
  key?: string;
  group?: string;
  model?: string;
  /** HTTP statuses from `statusMin` (inclusive) to `statusMax` (exclusive). */
  statusMin?: number;
  statusMax?: number;
  /** Unix milliseconds, inclusive. */
  since?: number;
  /** Unix milliseconds, exclusive. */
  until?: number;
  limit?: number;
}

export interface UsageTotals {
  requests: number;
  promptTokens: number;
  completionTokens: number;
  errors: number;
}

export interface Store {
  createGroup(group: Omit<Group, 'createdAt'>): Group;
  getGroup(name: string): Group | undefined;
  listGroups(): Group[];
  /** Returns the updated group, or undefined when it does not exist. A rename moves its keys. */
  updateGroup(name: string, patch: Partial<Omit<Group, 'createdAt'>>): Group | undefined;
  /** Refuses (returns 'in_use') while keys still belong to the group. */
  deleteGroup(name: string): 'deleted' | 'not_found' | 'in_use';

  /** Creates a key and returns it with its secret; the secret is never stored or shown again. */
  createKey(input: { group: string; name?: string | null; expiresAt?: number | null }): { key: ApiKey; secret: string };
  /** Looks a key up by its secret. */
  findKeyBySecret(secret: string): ApiKey | undefined;
  getKey(id: string): ApiKey | undefined;
  listKeys(): ApiKey[];
  updateKey(id: string, patch: KeyPatch): ApiKey | undefined;
  deleteKey(id: string): boolean;

  /** Journals a usage record (it survives a crash once this returns) and queues it for the store. */
  recordUsage(record: UsageRecord): void;
  /** Writes queued records now. Never throws: a failed write keeps them for a later attempt. */
  flush(): void;
  queryUsage(query: UsageQuery): { records: UsageRecord[]; totals: UsageTotals };
  /** Usage in time buckets of `bucketMs`; only buckets with records. */
  usageSeries(query: UsageQuery, bucketMs: number): UsagePoint[];
  upstreamActivity(since: number): UpstreamActivity[];

  recordAudit(entry: AuditEntry): void;
  /** Newest first. */
  queryAudit(query: AuditQuery): AuditEntry[];

  close(): void;
}

/** What a database implements; usage arrives in batches from the journal in front of it. */
export interface StoreBackend extends Omit<Store, 'recordUsage' | 'flush'> {
  /**
   * Writes a batch in one transaction, or throws and writes none of it. A record whose requestId
   * is already stored is skipped, so replaying a journal never counts a request twice.
   */
  writeUsage(records: readonly UsageRecord[]): void;
}
