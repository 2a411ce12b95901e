/**
 * The admin API, same origin. The session lives in an HttpOnly cookie the page never sees; the
 * CSRF token it answers with is kept in memory only and sent on every call that changes state.
 */
import type {
  AuditEntry,
  Budget,
  CreatedKey,
  Group,
  Key,
  Limits,
  McpReport,
  ModelsResponse,
  ReloadChanges,
  SeriesResponse,
  Session,
  UsageFilter,
  UsageRecord,
  UpstreamBreakers,
  UsageResponse,
} from './types.js';

export class ApiError extends Error {
  constructor(
    message: string,
    readonly status: number,
    readonly code?: string,
    /** Seconds, from a `retry-after` header (429). */
    readonly retryAfter?: number,
    /** The answer's `error` object, for details beyond the message (a reload's reasons). */
    readonly detail?: Record<string, unknown>,
  ) {
    super(message);
    this.name = 'ApiError';
  }
}

let csrfToken: string | null = null;
/** When the current session ends (unix ms), from the gateway. */
let sessionEnd: number | null = null;
/** What the gateway says stands wrong with how it runs, from the session. */
let gatewayWarnings: readonly string[] = [];
let unauthorized: (() => void) | null = null;

/** Called when a call answers 401 because the session ended. */
export function onUnauthorized(handler: () => void): void {
  unauthorized = handler;
}

export function signedIn(): boolean {
  return csrfToken !== null;
}

/** When the session ends (unix ms), or null when signed out. */
export function sessionEndsAt(): number | null {
  return csrfToken === null ? null : sessionEnd;
}

/** The gateway's standing warnings (an open gateway), shown above every page. */
export function warnings(): readonly string[] {
  return gatewayWarnings;
}

interface Options {
  body?: unknown;
  signal?: AbortSignal;
  /** Session calls handle their own 401s (a wrong token is not an expired session). */
  sessionCall?: boolean;
}

export async function request<T>(method: string, path: string, opts: Options = {}): Promise<T> {
  const headers: Record<string, string> = { accept: 'application/json' };
  if (opts.body !== undefined) headers['content-type'] = 'application/json';
  if (method !== 'GET' && method !== 'HEAD' && csrfToken) headers['x-csrf-token'] = csrfToken;
  let res: Response;
  try {
    res = await fetch(path, {
      method,
      headers,
      credentials: 'same-origin',
      cache: 'no-store',
      body: opts.body === undefined ? undefined : JSON.stringify(opts.body),
      signal: opts.signal,
    });
  } catch (err) {
    if (err instanceof DOMException && err.name === 'AbortError') throw err;
    throw new ApiError('Could not reach the gateway. Check that it is running, then try again.', 0, 'network');
  }
  const text = await res.text();
  let body: unknown;
  if (text) {
    try {
      body = JSON.parse(text);
    } catch {
      body = undefined;
    }
  }
  if (res.ok) return body as T;

  const error = (body as { error?: { message?: unknown; code?: unknown } } | undefined)?.error;
  const message = typeof error?.message === 'string' && error.message ? error.message : `${res.status} ${res.statusText || 'error'}`.trim();
  const code = typeof error?.code === 'string' ? error.code : undefined;
  const retry = Number(res.headers.get('retry-after'));
  const detail = error && typeof error === 'object' ? (error as Record<string, unknown>) : undefined;
  const failure = new ApiError(message, res.status, code, Number.isFinite(retry) && retry > 0 ? retry : undefined, detail);
  if (res.status === 401 && !opts.sessionCall) {
    csrfToken = null;
    unauthorized?.();
  }
  throw failure;
}

function qs(params: Record<string, string | number | undefined>): string {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== '') q.set(k, String(v));
  const s = q.toString();
  return s ? `?${s}` : '';
}

const seg = encodeURIComponent;

// --- Session ---------------------------------------------------------------------------------

/** Restores the session from the cookie after a reload; false when there is none. */
export async function restoreSession(): Promise<boolean> {
  try {
    const s = await request<Session>('GET', '/admin/session', { sessionCall: true });
    csrfToken = s.csrfToken;
    sessionEnd = s.expiresAt;
    gatewayWarnings = s.warnings ?? [];
    return true;
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) return false;
    throw err;
  }
}

export async function login(token: string): Promise<void> {
  const s = await request<Session>('POST', '/admin/session', { body: { token }, sessionCall: true });
  csrfToken = s.csrfToken;
  sessionEnd = s.expiresAt;
  gatewayWarnings = s.warnings ?? [];
}

export async function logout(): Promise<void> {
  try {
    await request('DELETE', '/admin/session', { sessionCall: true });
  } finally {
    csrfToken = null;
  }
}

// --- Resources -------------------------------------------------------------------------------

/** What an operator sets on a group; `null` limits or budget clears them. */
export type GroupInput = Pick<Group, 'name' | 'models' | 'families'> & { mcpTools?: string[]; limits?: Limits | null; budget?: Budget | null };

export const listGroups = (signal?: AbortSignal) => request<{ data: Group[] }>('GET', '/admin/groups', { signal }).then((r) => r.data);
export const createGroup = (g: GroupInput) => request<Group>('POST', '/admin/groups', { body: g });
export const updateGroup = (name: string, patch: Partial<GroupInput>) => request<Group>('PATCH', `/admin/groups/${seg(name)}`, { body: patch });
export const deleteGroup = (name: string) => request<unknown>('DELETE', `/admin/groups/${seg(name)}`);

export const listKeys = (signal?: AbortSignal) => request<{ data: Key[] }>('GET', '/admin/keys', { signal }).then((r) => r.data);
export const createKey = (k: { group: string; name?: string; expiresAt?: string | null; limits?: Limits | null; budget?: Budget | null }) =>
  request<CreatedKey>('POST', '/admin/keys', { body: k });
export const updateKey = (
  id: string,
  patch: { name?: string | null; group?: string; disabled?: boolean; expiresAt?: string | null; limits?: Limits | null; budget?: Budget | null },
) =>
  request<Key>('PATCH', `/admin/keys/${seg(id)}`, { body: patch });
export const deleteKey = (id: string) => request<unknown>('DELETE', `/admin/keys/${seg(id)}`);

export const listModels = (signal?: AbortSignal) => request<ModelsResponse>('GET', '/admin/models', { signal });

/** Every upstream with its channels' circuit breakers, live. */
export const upstreams = (signal?: AbortSignal) => request<{ data: UpstreamBreakers[] }>('GET', '/admin/upstreams', { signal }).then((r) => r.data);

/** Re-reads the config file; a bad one is refused (400) and the running config stays. */
export const reloadConfig = () => request<{ applied: true; changes: ReloadChanges }>('POST', '/admin/reload');

function filterParams(f: UsageFilter) {
  return { key: f.key, group: f.group, model: f.model, since: f.since, until: f.until };
}

export const usage = (f: UsageFilter, limit: number, signal?: AbortSignal) =>
  request<UsageResponse>('GET', `/admin/usage${qs({ ...filterParams(f), limit })}`, { signal });

export const usageSeries = (f: UsageFilter, bucket: number | undefined, signal?: AbortSignal) =>
  request<SeriesResponse>('GET', `/admin/usage/series${qs({ ...filterParams(f), bucket })}`, { signal });

/** The CSV export's address for a download link (the cookie goes with it). */
export const usageCsvUrl = (f: UsageFilter) => `/admin/usage.csv${qs(filterParams(f))}`;

/** The latest exchanges; `status` is a class such as `4xx`. */
export const requests = (f: UsageFilter & { status?: string }, limit: number, signal?: AbortSignal) =>
  request<{ data: UsageRecord[] }>('GET', `/admin/requests${qs({ ...filterParams(f), status: f.status, limit })}`, { signal }).then((r) => r.data);

export const auditLog = (limit: number, signal?: AbortSignal) =>
  request<{ data: AuditEntry[] }>('GET', `/admin/audit${qs({ limit })}`, { signal }).then((r) => r.data);

/** The MCP servers, their tools and the grants (404 when the gateway runs no MCP servers). */
export const mcpReport = (signal?: AbortSignal) => request<McpReport>('GET', '/admin/mcp', { signal });
