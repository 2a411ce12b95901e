/** Shapes of the admin API's answers. */

export interface Session {
  csrfToken: string;
  expiresAt: number;
  /** What stands wrong with how the gateway runs (an open gateway); absent from older gateways. */
  warnings?: string[];
}

/** Request limits; an absent field is unlimited (on a key: the group's applies). */
export interface Limits {
  rpm?: number;
  tpm?: number;
  concurrency?: number;
}

export type BudgetPeriod = 'day' | 'month' | 'total';

/** A spending limit, in the currency of the models' prices. */
export interface Budget {
  amount: number;
  period: BudgetPeriod;
}

/** What the current budget period has spent so far. */
export interface Spend {
  period: BudgetPeriod;
  spent: number;
  remaining: number;
  /** Start of the period, ISO 8601. */
  since: string;
  /** When the period ends (ISO 8601), or null for `total`. */
  until: string | null;
}

export interface Group {
  name: string;
  /** Model ids, or `*` for every model. */
  models: string[];
  families: string[];
  limits: Limits | null;
  budget: Budget | null;
  /** MCP tools its keys may call through /mcp: `server/tool` or `server/*`. */
  mcpTools: string[];
  /** Null without a budget. */
  spend: Spend | null;
  createdAt: number;
}

export interface Key {
  id: string;
  name: string | null;
  group: string;
  disabled: boolean;
  prefix: string;
  createdAt: number;
  lastUsedAt: number | null;
  /** ISO 8601, or null for never. */
  expiresAt: string | null;
  /** Overrides of the group's limits, field by field. */
  limits: Limits | null;
  budget: Budget | null;
  spend: Spend | null;
}

/** The answer to creating a key: the only time `key` (the secret) is ever sent. */
export interface CreatedKey extends Key {
  key: string;
}

export type Serving = 'native' | 'bridge' | 'translated';

export interface Channel {
  name: string;
  upstream: string;
  upstreamModel: string;
  /** Lower is tried first. */
  priority: number;
  weight: number;
}

/** Per million tokens. */
export interface Prices {
  input: number;
  cachedInput: number;
  output: number;
  reasoning: number;
}

export interface Model {
  id: string;
  upstream: string;
  upstreamModel: string;
  upstreamKind: string;
  upstreamFamily: string;
  channels: Channel[];
  prices?: Prices;
  limits?: Limits;
  families: Partial<Record<string, Serving>>;
  features: {
    tools: boolean;
    jsonSchema: boolean;
    vision: boolean;
    temperature: boolean;
    reasoning: boolean;
    streamUsage: boolean;
    serverTools: string[];
  };
  maxOutputTokens: { default?: number; max?: number };
  contextTokens?: number | null;
}

export type Health = 'ok' | 'degraded' | 'down' | 'idle';

export interface Upstream {
  name: string;
  kind: string;
  family: string;
  health: { status: Health; requests: number; errors: number; lastError: string | null; lastSeen: number | null };
}

export type BreakerState = 'closed' | 'open' | 'half-open';

/** A channel's circuit breaker, live from the gateway. */
export interface ChannelState {
  model: string;
  channel: string;
  priority: number;
  weight: number;
  state: BreakerState;
  consecutiveFailures: number;
  recentRequests: number;
  recentErrors: number;
  lastError: string | null;
  /** ISO 8601, while open or half-open. */
  openedAt: string | null;
  nextProbeAt: string | null;
  /** Moving average of its calls' wait for an answer (ms), in the thread that answered; null before its first call. */
  latencyMs: number | null;
  /** Its calls under way now, in the thread that answered. */
  inFlight: number;
}

export interface UpstreamBreakers {
  name: string;
  kind: string;
  family: string;
  channels: ChannelState[];
}

export interface ModelsResponse {
  data: Model[];
  upstreams: Upstream[];
  families: string[];
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
  cachedInputTokens: number | null;
  reasoningTokens: number | null;
  /** Null when the model has no prices. */
  cost: number | null;
  /** The channel that served, after any failover. */
  channel: string | null;
  attempts: number;
  estimated: boolean;
  latencyMs: number;
  ttfbMs: number | null;
  streamed: boolean;
  outcome: 'finished' | 'aborted' | 'error' | 'client_stalled' | 'shutdown';
  /** What went wrong, when something did. */
  error?: string | null;
  /** What the model rules dropped from the request. */
  notes?: string | null;
}

export interface AuditEntry {
  time: number;
  actor: string;
  action: string;
  target: string | null;
  detail: string | null;
}

export interface UsageTotals {
  requests: number;
  promptTokens: number;
  completionTokens: number;
  cost: number;
  errors: number;
}

export interface UsageResponse {
  records: UsageRecord[];
  totals: UsageTotals;
}

export interface SeriesPoint {
  t: number;
  requests: number;
  promptTokens: number;
  completionTokens: number;
  cost: number;
  errors: number;
  avgLatencyMs: number | null;
  maxLatencyMs: number | null;
}

export interface SeriesResponse {
  bucketMs: number;
  points: SeriesPoint[];
}

/** Filters shared by the usage list, the series and the CSV export. */
export interface UsageFilter {
  key?: string;
  group?: string;
  model?: string;
  since?: number;
  until?: number;
}

/** Names each section of the config gained, lost or changed in a reload. */
export type ReloadChanges = Record<string, { added: string[]; removed: string[]; changed: string[] }>;

// --- MCP ---------------------------------------------------------------------------------------

/** One MCP server as GET /admin/mcp shows it. */
export interface McpServer {
  name: string;
  transport: 'stdio' | 'http';
  command?: string;
  url?: string;
  state: 'starting' | 'ready' | 'failed' | 'restarting' | 'stopped';
  error: string | null;
  restarts: number;
  readySince: string | null;
  timeoutSeconds: number;
  tools: { name: string; tool: string; description?: string }[];
  resources: number;
  prompts: number;
}

export interface McpReport {
  servers: McpServer[];
  groups: { name: string; mcpTools: string[]; tools: string[]; servers: string[] }[];
  sessions: number;
  callsInFlight: number;
}
