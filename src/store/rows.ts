/**
 * Rows as both databases return them, and the records they become. Columns are named alike in
 * SQLite and PostgreSQL; what differs is the encoding: SQLite keeps JSON as text and booleans as
 * 0/1, PostgreSQL as JSONB and BOOLEAN. The mappers accept either.
 */
import type { ApiKey, Budget, Group, Limits, UsageRecord } from './store.js';

/** A JSON column: text in SQLite, already parsed in PostgreSQL. */
type Json<T> = T | string;
/** A boolean column: 0/1 in SQLite. */
type Flag = boolean | number;

export interface GroupRow {
  name: string;
  models: Json<string[]>;
  families: Json<string[]>;
  limits: Json<Limits> | null;
  budget: Json<Budget> | null;
  /** Null in rows written before MCP grants existed: none granted. */
  mcp_tools: Json<string[]> | null;
  created_at: number;
}

export interface KeyRow {
  id: string;
  prefix: string;
  name: string | null;
  group_name: string;
  disabled: Flag;
  created_at: number;
  last_used_at: number | null;
  expires_at: number | null;
  limits: Json<Limits> | null;
  budget: Json<Budget> | null;
}

export interface UsageRow {
  time: number;
  request_id: string;
  key_id: string | null;
  group_name: string | null;
  model: string | null;
  upstream: string | null;
  family: string;
  status: number;
  prompt_tokens: number;
  completion_tokens: number;
  cached_tokens: number | null;
  cache_write_tokens: number | null;
  reasoning_tokens: number | null;
  cost: number | null;
  channel: string | null;
  attempts: number;
  estimated: Flag;
  latency_ms: number;
  ttfb_ms: number | null;
  streamed: Flag;
  outcome: UsageRecord['outcome'];
  error: string | null;
  notes: string | null;
}

const json = <T>(value: Json<T> | null): T | null => (typeof value === 'string' ? JSON.parse(value) : value);

/** A value for a JSON column, as text (both databases take text for it). */
export const jsonText = (value: unknown): string | null => (value === null || value === undefined ? null : JSON.stringify(value));

export const toGroup = (r: GroupRow): Group => ({
  name: r.name,
  models: json(r.models)!,
  families: json(r.families)!,
  limits: json(r.limits),
  budget: json(r.budget),
  mcpTools: json(r.mcp_tools) ?? [],
  createdAt: r.created_at,
});

export const toKey = (r: KeyRow): ApiKey => ({
  id: r.id,
  name: r.name,
  group: r.group_name,
  disabled: Boolean(r.disabled),
  prefix: r.prefix,
  createdAt: r.created_at,
  lastUsedAt: r.last_used_at,
  expiresAt: r.expires_at,
  limits: json(r.limits),
  budget: json(r.budget),
});

export const toUsage = (r: UsageRow): UsageRecord => ({
  time: r.time,
  requestId: r.request_id,
  keyId: r.key_id,
  group: r.group_name,
  model: r.model,
  upstream: r.upstream,
  family: r.family,
  status: r.status,
  promptTokens: r.prompt_tokens,
  completionTokens: r.completion_tokens,
  cachedInputTokens: r.cached_tokens,
  cacheWriteTokens: r.cache_write_tokens,
  reasoningTokens: r.reasoning_tokens,
  cost: r.cost,
  channel: r.channel,
  attempts: r.attempts,
  estimated: Boolean(r.estimated),
  latencyMs: r.latency_ms,
  ttfbMs: r.ttfb_ms,
  streamed: Boolean(r.streamed),
  outcome: r.outcome,
  error: r.error,
  notes: r.notes,
});
