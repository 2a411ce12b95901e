/**
 * The Store: groups, keys and usage records, asynchronous so that any database can hold them. A
 * database implements StoreBackend (SQLite is the embedded one; a shared database can implement it
 * when several gateways share one truth); the gateway uses it as a Store behind the usage journal
 * (journal.ts), which makes usage durable, and the cache layer (cache.ts), which answers the
 * request path's lookups without a wait.
 */

/** Request limits of a group, key or model; an absent field is unlimited. */
export interface Limits {
  /** Requests per minute (a sliding window). */
  rpm?: number;
  /** Tokens per minute: prompt and output, reserved at admission and reconciled at the end. */
  tpm?: number;
  /** Exchanges generating at once. */
  concurrency?: number;
}

/** A spending limit, in the currency of the models' prices. */
export interface Budget {
  amount: number;
  /** `day` and `month` start at midnight UTC and on the 1st; `total` never resets. */
  period: 'day' | 'month' | 'total';
}

export interface Group {
  name: string;
  /** Model ids this group may use; `*` grants every model. */
  models: string[];
  /** Wire families this group may use. */
  families: string[];
  /** Defaults for the group's keys; each key may override them. */
  limits: Limits | null;
  budget: Budget | null;
  /** MCP tools its keys may call through `/mcp`: `server/tool` or `server/*`; none when empty. */
  mcpTools: string[];
  createdAt: number;
}

/** Whether a group's grant names the model (or every model, `*`). */
export function groupAllowsModel(group: Pick<Group, 'models'>, modelId: string): boolean {
  return group.models.includes('*') || group.models.includes(modelId);
}

/** The fields of a group an operator sets. */
export type GroupInput = Omit<Group, 'createdAt' | 'limits' | 'budget' | 'mcpTools'> & Partial<Pick<Group, 'limits' | 'budget' | 'mcpTools'>>;

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
  /** Overrides of the group's limits, field by field. */
  limits: Limits | null;
  /** The key's own budget, checked besides the group's. */
  budget: Budget | null;
}

/** The fields of a key an operator sets. */
export interface KeyPatch {
  disabled?: boolean;
  name?: string | null;
  group?: string;
  expiresAt?: number | null;
  limits?: Limits | null;
  budget?: Budget | null;
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
  /** Input tokens, cached ones included. */
  promptTokens: number;
  /** Output tokens, reasoning ones included. */
  completionTokens: number;
  /** Of the prompt tokens, those read from the upstream's prompt cache, when it reports them. */
  cachedInputTokens: number | null;
  /** Of the prompt tokens, those written to the upstream's prompt cache, when it reports them. */
  cacheWriteTokens: number | null;
  /** Of the completion tokens, those spent reasoning, when the upstream reports them. */
  reasoningTokens: number | null;
  /** What the exchange cost at the model's prices, or null when the model has none. */
  cost: number | null;
  /** The channel that served (after any failover), when one did. */
  channel: string | null;
  /** Upstream calls made: 1, more after failovers, 0 when none was made. */
  attempts: number;
  estimated: boolean;
  latencyMs: number;
  ttfbMs: number | null;
  streamed: boolean;
  /** `interrupted`: the thread or process serving it died; its record was written at the next start. */
  outcome: 'finished' | 'aborted' | 'error' | 'client_stalled' | 'shutdown' | 'interrupted';
  /** `code: message` of the failure, when there was one. */
  error: string | null;
  /** What the model rules dropped from the request, when they dropped anything. */
  notes: string | null;
}

/** What is known of an exchange when it calls its upstream: enough for a record if it never ends. */
export type OpenExchange = Pick<UsageRecord, 'time' | 'requestId' | 'keyId' | 'group' | 'model' | 'upstream' | 'family' | 'streamed'>;

/** What beginExchange returns, for recordUsage to end that open exchange without a search. */
export interface OpenTicket {
  readonly exchange: OpenExchange;
}

/** The token and cost fields of a record for something that used no tokens (an interrupted start, an MCP call). */
export const NO_TOKENS: Pick<UsageRecord, 'promptTokens' | 'completionTokens' | 'cachedInputTokens' | 'cacheWriteTokens' | 'reasoningTokens' | 'cost'> = {
  promptTokens: 0,
  completionTokens: 0,
  cachedInputTokens: null,
  cacheWriteTokens: null,
  reasoningTokens: null,
  cost: null,
};

/** One time bucket of usage. */
export interface UsagePoint {
  /** Bucket start, unix milliseconds. */
  t: number;
  requests: number;
  promptTokens: number;
  completionTokens: number;
  cost: number;
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
  cost: number;
  errors: number;
}

/**
 * Small state every instance sharing the store sees: console sessions, sign-in lockouts, the admin
 * token's hash. Values are opaque strings; an expired entry reads as absent.
 */
export interface SharedState {
  getState(name: string): Promise<string | undefined>;
  /**
   * Stores `value` under `name` until `expiresAt` (unix milliseconds; null keeps it). With
   * `onlyIfAbsent` it stores only when nothing unexpired is there. Returns whether it stored.
   */
  setState(name: string, value: string, expiresAt: number | null, options?: { onlyIfAbsent?: boolean }): Promise<boolean>;
  deleteState(name: string): Promise<void>;
}

/** The store cannot be reached (a database that is down): the admin API answers 503. */
export class StoreUnavailableError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'StoreUnavailableError';
  }
}

export interface Store extends SharedState {
  createGroup(group: GroupInput): Promise<Group>;
  getGroup(name: string): Promise<Group | undefined>;
  listGroups(): Promise<Group[]>;
  /** Returns the updated group, or undefined when it does not exist. A rename moves its keys. */
  updateGroup(name: string, patch: Partial<GroupInput>): Promise<Group | undefined>;
  /** Refuses (returns 'in_use') while keys still belong to the group. */
  deleteGroup(name: string): Promise<'deleted' | 'not_found' | 'in_use'>;

  /** Creates a key and returns it with its secret; the secret is never stored or shown again. */
  createKey(input: { group: string; name?: string | null; expiresAt?: number | null; limits?: Limits | null; budget?: Budget | null }): Promise<{ key: ApiKey; secret: string }>;
  /** Looks a key up by its secret. */
  findKeyBySecret(secret: string): Promise<ApiKey | undefined>;
  getKey(id: string): Promise<ApiKey | undefined>;
  listKeys(): Promise<ApiKey[]>;
  updateKey(id: string, patch: KeyPatch): Promise<ApiKey | undefined>;
  deleteKey(id: string): Promise<boolean>;

  /**
   * Journals that an exchange is about to call its upstream, so that if the process dies before its
   * record is written, the next start records it as interrupted rather than losing it.
   */
  beginExchange(exchange: OpenExchange): OpenTicket;
  /**
   * Journals a usage record (appended with the rest of its turn's at the end of the turn, before the
   * exchange's answer leaves: see src/turn-end.ts) and queues it for the store. `opened` is what beginExchange returned for this exchange, if it
   * began: it ends the open exchange at once (without it, the open exchanges are searched by id).
   */
  recordUsage(record: UsageRecord, opened?: OpenTicket): void;
  /** Writes queued records now. Never rejects: a failed write keeps them for a later attempt. */
  flush(): Promise<void>;
  /** Writes what is queued, unless the store is refusing writes (then its retries go on at their pace): what reads of usage wait for. */
  settle(): Promise<void>;
  queryUsage(query: UsageQuery): Promise<{ records: UsageRecord[]; totals: UsageTotals }>;
  /** Usage in time buckets of `bucketMs`; only buckets with records. */
  usageSeries(query: UsageQuery, bucketMs: number): Promise<UsagePoint[]>;
  upstreamActivity(since: number): Promise<UpstreamActivity[]>;

  recordAudit(entry: AuditEntry): Promise<void>;
  /** Newest first. */
  queryAudit(query: AuditQuery): Promise<AuditEntry[]>;

  /**
   * Calls `onChange` soon after a group or key changes through any other connection to the same
   * database (another worker, another instance); returns the unsubscribe. Caches in front of the
   * store forget on it, so a key disabled anywhere is refused everywhere within a second.
   */
  watch(onChange: () => void): () => void;

  close(): Promise<void>;
}

/** What a database implements; usage arrives in batches from the journal in front of it. */
export interface StoreBackend extends Omit<Store, 'recordUsage' | 'beginExchange' | 'flush' | 'settle'> {
  /**
   * Writes a batch in one transaction, or rejects and writes none of it. A record whose requestId
   * is already stored is skipped, so replaying a journal never counts a request twice. `lines`, when
   * the caller has them, are the same records' JSON texts (the journal's lines): a backend that
   * hands the batch to another thread sends those strings instead of cloning the objects.
   */
  writeUsage(records: readonly UsageRecord[], lines?: readonly string[]): Promise<void>;
}
