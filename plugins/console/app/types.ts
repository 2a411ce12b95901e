/** Shapes of the admin API's answers. */

export interface Session {
  csrfToken: string;
  expiresAt: number;
}

export interface Group {
  name: string;
  /** Model ids, or `*` for every model. */
  models: string[];
  families: string[];
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
}

/** The answer to creating a key: the only time `key` (the secret) is ever sent. */
export interface CreatedKey extends Key {
  key: string;
}

export type Serving = 'native' | 'bridge' | 'translated';

export interface Model {
  id: string;
  upstream: string;
  upstreamModel: string;
  upstreamKind: string;
  upstreamFamily: string;
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
  estimated: boolean;
  latencyMs: number;
  ttfbMs: number | null;
  streamed: boolean;
  outcome: 'finished' | 'aborted' | 'error';
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
