/**
 * Operations on groups, keys, usage and the audit log, with their validation. The admin HTTP API
 * (and the web console through it) and the CLI all call these, so each rule lives once, and every
 * change is written to the audit log with the actor the caller names.
 */
import type { ValidateFunction } from 'ajv';
import { schemaCompiler } from '../schema-compiler.js';
import type { UpstreamReport } from '../channels/table.js';
import { budgetPeriod } from '../budget.js';
import type { ModelConfig } from '../config/types.js';
import { limitsSchema } from '../limits/limiter.js';
import type { ApiKey, AuditQuery, Budget, KeyPatch, Limits, Store, UsageQuery, UsageRecord } from '../store/store.js';

export class AdminError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

/** Limits and a budget, on groups and keys alike; null clears them. */
const limitFields = {
  limits: { anyOf: [limitsSchema, { type: 'null' }] },
  budget: {
    anyOf: [
      {
        type: 'object',
        required: ['amount', 'period'],
        additionalProperties: false,
        // A trillion is beyond any real budget; far larger amounts (1e308) overflowed the spend shown to Infinity, printed as null.
        properties: { amount: { type: 'number', minimum: 0, maximum: 1e12 }, period: { enum: ['day', 'month', 'total'] } },
      },
      { type: 'null' },
    ],
  },
};

const GROUP_NAME = '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$';
/**
 * A key's name is shown in the console, the CLI and the audit log: not blank, and without control
 * characters (NUL, ESC) or bidi controls (U+202A–U+202E, U+2066–U+2069 and the marks), which
 * would drive a terminal or make one name read as another.
 */
const KEY_NAME = '^(?!\\s*$)[^\\u0000-\\u001f\\u007f-\\u009f\\u061c\\u200e\\u200f\\u202a-\\u202e\\u2066-\\u2069]*$';
/** What a pattern allows, said for a refusal instead of the pattern itself. */
const patternMessages: Record<string, string> = {
  [GROUP_NAME]: 'must start with a letter or digit and have only letters, digits, ".", "_" and "-" (64 at most)',
  [KEY_NAME]: 'must not be blank, nor hold control characters or bidi controls (U+202A–U+202E, U+2066–U+2069); null for none',
};
const keyName = { type: ['string', 'null'], maxLength: 128, pattern: KEY_NAME };

const groupFields = {
  name: { type: 'string', pattern: GROUP_NAME },
  models: { type: 'array', items: { type: 'string', minLength: 1 }, uniqueItems: true },
  families: { type: 'array', items: { type: 'string' }, uniqueItems: true },
  /** MCP grants: `server/tool` or `server/*`, checked against nothing (a server may be configured later). */
  mcpTools: { type: 'array', items: { type: 'string', pattern: '^[A-Za-z0-9][A-Za-z0-9_-]{0,31}/(\\*|[A-Za-z0-9_.-]{1,128})$' }, uniqueItems: true },
  ...limitFields,
};

/** An ISO 8601 date, or a time with its zone (a time without one would depend on the server's). */
const isoTime = /^\d{4}-\d{2}-\d{2}(T\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?(Z|[+-]\d{2}:\d{2}))?$/;
const expiresAtField = { type: ['string', 'null'] } as const;

const schemas = {
  createGroup: { type: 'object', required: ['name', 'models', 'families'], additionalProperties: false, properties: groupFields },
  updateGroup: { type: 'object', minProperties: 1, additionalProperties: false, properties: groupFields },
  createKey: {
    type: 'object',
    required: ['group'],
    additionalProperties: false,
    properties: { group: { type: 'string', minLength: 1 }, name: keyName, expiresAt: expiresAtField, ...limitFields },
  },
  updateKey: {
    type: 'object',
    additionalProperties: false,
    minProperties: 1,
    properties: {
      disabled: { type: 'boolean' },
      name: keyName,
      group: { type: 'string', minLength: 1 },
      expiresAt: expiresAtField,
      ...limitFields,
    },
  },
} as const;

const admin = schemaCompiler('admin', { allErrors: false });
const validators = Object.fromEntries(Object.entries(schemas).map(([k, s]) => [k, admin.compile(s)])) as Record<keyof typeof schemas, ValidateFunction>;

function check<T>(schema: keyof typeof schemas, input: unknown): T {
  const validate = validators[schema];
  if (!validate(input)) {
    // The first error that is not an anyOf's summary names the field best.
    const e = validate.errors!.find((err) => err.keyword !== 'anyOf' && !(err.keyword === 'type' && err.params.type === 'null')) ?? validate.errors![0]!;
    const field = e.instancePath ? e.instancePath.slice(1).replace(/\//g, '.') : 'body';
    const detail =
      e.keyword === 'additionalProperties'
        ? `unknown field "${(e.params as { additionalProperty: string }).additionalProperty}"`
        : e.keyword === 'required'
          ? `missing field "${(e.params as { missingProperty: string }).missingProperty}"`
          : `${field} ${(e.keyword === 'pattern' && patternMessages[(e.params as { pattern: string }).pattern]) || e.message}`;
    throw new AdminError(400, 'invalid_request', detail);
  }
  return input as T;
}

/** An upstream channel as the admin surface shows it. */
export interface ChannelInfo {
  name: string;
  kind: string;
  family: string;
}

/** The window behind channel health. */
const HEALTH_WINDOW_MS = 15 * 60 * 1000;

const niceBuckets = [60_000, 300_000, 900_000, 3_600_000, 6 * 3_600_000, 86_400_000];

const csvColumns: (keyof UsageRecord)[] = [
  'time', 'requestId', 'keyId', 'group', 'model', 'upstream', 'channel', 'attempts', 'family', 'status', 'promptTokens',
  'cachedInputTokens', 'cacheWriteTokens', 'completionTokens', 'reasoningTokens', 'cost', 'estimated', 'latencyMs', 'ttfbMs', 'streamed', 'outcome', 'error', 'notes',
];

/**
 * Characters a terminal or a text layout acts on instead of showing: C0 and C1 controls with DEL
 * (ESC starts a terminal escape, BEL rings) and the bidi controls, which reorder what is shown
 * around them. Stored strings such as a model id come from key holders.
 */
export const UNSAFE_TEXT = /[\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;

/**
 * Where a spreadsheet could start a formula: at the start of a cell (after spaces too, which some
 * spreadsheets trim), and after a `,` or `;` inside it, where a reader that splits on that
 * separator starts a cell of its own. The formula characters are OWASP's `= + - @` and the
 * fullwidth `＝ ＋ － ＠` some spreadsheets take for them; tab, CR and LF are gone by then.
 */
const FORMULA_START = /^(?=[\s=+\-@\uFF1D\uFF0B\uFF0D\uFF20])|(?<=[,;])(?=\s*[=+\-@\uFF1D\uFF0B\uFF0D\uFF20])/g;

/**
 * One CSV field, as OWASP's CSV injection advice has it: text is always quoted (its `"` doubled),
 * so no separator inside it splits it, and gets a `'` wherever a formula could start; controls
 * are dropped (line breaks and tabs become spaces) so the CSV printed to a terminal cannot drive
 * it. Numbers and booleans are Sluice's own and stay as they are.
 */
export function csvCell(value: unknown): string {
  if (typeof value !== 'string') return value === null || value === undefined ? '' : String(value);
  const text = value.replace(/[\t\n\v\f\r]/g, ' ').replace(UNSAFE_TEXT, '').replace(FORMULA_START, "'");
  return `"${text.replace(/"/g, '""')}"`;
}

export class AdminService {
  private modelIds: string[];

  constructor(
    private readonly store: Store,
    private models: ModelConfig[],
    private channels: ChannelInfo[],
    /** Families the gateway speaks. */
    private readonly families: string[],
  ) {
    this.modelIds = models.map((m) => m.id);
  }

  /** After a config reload: the models and channels shown, and the model ids grants may name. */
  reconfigure(models: ModelConfig[], channels: ChannelInfo[]): void {
    this.models = models;
    this.channels = channels;
    this.modelIds = models.map((m) => m.id);
  }

  /** Every configured model, how it is served, and how its upstream channel has fared recently. */
  async listModels(now = Date.now()) {
    const activity = new Map((await this.store.upstreamActivity(now - HEALTH_WINDOW_MS)).map((a) => [a.upstream, a]));
    const upstreams = this.channels.map((c) => {
      const a = activity.get(c.name);
      const requests = a?.requests ?? 0;
      const errors = a?.errors ?? 0;
      const status = requests === 0 ? 'idle' : errors === 0 ? 'ok' : errors * 2 >= requests ? 'down' : 'degraded';
      return { ...c, health: { status, requests, errors, lastError: a?.lastError ?? null, lastSeen: a?.lastSeen ?? null } };
    });
    const channel = new Map(this.channels.map((c) => [c.name, c]));
    const data = this.models.map((m) => ({
      id: m.id,
      upstream: m.upstream,
      upstreamModel: m.upstreamModel,
      upstreamKind: channel.get(m.upstream)?.kind,
      upstreamFamily: channel.get(m.upstream)?.family,
      families: m.families,
      features: m.features,
      maxOutputTokens: m.maxOutputTokens,
      channels: m.channels,
      ...(m.prices && { prices: m.prices }),
      ...(m.limits && { limits: m.limits }),
      contextTokens: m.contextTokens,
      ignoreParameters: m.ignoreParameters,
    }));
    return { data, upstreams, families: this.families };
  }

  async listGroups(now = Date.now()) {
    return Promise.all((await this.store.listGroups()).map((g) => this.withSpend(g, { group: g.name }, now)));
  }

  async createGroup(input: unknown, actor: string) {
    const g = check<{ name: string; models: string[]; families: string[]; mcpTools?: string[]; limits?: Limits | null; budget?: Budget | null }>('createGroup', input);
    this.checkGrants(g);
    // Model calls need a model and a family; /mcp needs only MCP grants. With neither, its keys could use nothing.
    if ((!g.models.length || !g.families.length) && !g.mcpTools?.length) {
      throw new AdminError(400, 'invalid_request', 'a new group needs at least one model and one family, or MCP grants (mcpTools): without them its keys could use nothing');
    }
    if (await this.store.getGroup(g.name)) throw new AdminError(409, 'conflict', `group "${g.name}" already exists`);
    const group = await this.store.createGroup({ ...g, limits: cleared(g.limits), budget: g.budget ?? null });
    await this.audit(actor, 'group.create', g.name, `models ${g.models.join(',')}; families ${g.families.join(',')}${g.mcpTools?.length ? `; mcpTools ${g.mcpTools.join(',')}` : ''}${limitsNote(g)}`);
    return this.withSpend(group, { group: group.name });
  }

  async updateGroup(name: string, input: unknown, actor: string) {
    const patch = check<{ name?: string; models?: string[]; families?: string[]; mcpTools?: string[]; limits?: Limits | null; budget?: Budget | null }>('updateGroup', input);
    if (patch.limits !== undefined) patch.limits = cleared(patch.limits);
    this.checkGrants(patch);
    if (patch.name && patch.name !== name && (await this.store.getGroup(patch.name))) {
      throw new AdminError(409, 'conflict', `group "${patch.name}" already exists`);
    }
    const updated = await this.store.updateGroup(name, patch);
    if (!updated) throw new AdminError(404, 'not_found', `no group named "${name}"`);
    await this.audit(actor, 'group.update', name, JSON.stringify(patch));
    return this.withSpend(updated, { group: updated.name });
  }

  async deleteGroup(name: string, actor: string) {
    const result = await this.store.deleteGroup(name);
    if (result === 'not_found') throw new AdminError(404, 'not_found', `no group named "${name}"`);
    if (result === 'in_use') {
      throw new AdminError(409, 'conflict', `group "${name}" still has keys; move or delete them first`);
    }
    await this.audit(actor, 'group.delete', name, null);
  }

  async listKeys(now = Date.now()) {
    return Promise.all((await this.store.listKeys()).map((k) => this.presentKey(k, now)));
  }

  async getKey(id: string) {
    const key = await this.store.getKey(id);
    if (!key) throw new AdminError(404, 'not_found', `no key with id "${id}"`);
    return this.presentKey(key);
  }

  /** The only place a secret is ever returned. */
  async createKey(input: unknown, actor: string) {
    const k = check<{ group: string; name?: string | null; expiresAt?: string | null; limits?: Limits | null; budget?: Budget | null }>('createKey', input);
    await this.requireGroup(k.group);
    const { key, secret } = await this.store.createKey({ ...k, limits: cleared(k.limits), expiresAt: parseExpiry(k.expiresAt) });
    await this.audit(actor, 'key.create', key.id, `group ${key.group}${key.name ? `; name ${key.name}` : ''}${k.expiresAt ? `; expires ${k.expiresAt}` : ''}${limitsNote(k)}`);
    return { ...(await this.presentKey(key)), key: secret };
  }

  async updateKey(id: string, input: unknown, actor: string) {
    const patch = check<Omit<KeyPatch, 'expiresAt'> & { expiresAt?: string | null }>('updateKey', input);
    if (patch.group) await this.requireGroup(patch.group);
    if (patch.limits !== undefined) patch.limits = cleared(patch.limits);
    const key = await this.store.updateKey(id, { ...patch, expiresAt: parseExpiry(patch.expiresAt) });
    if (!key) throw new AdminError(404, 'not_found', `no key with id "${id}"`);
    await this.audit(actor, 'key.update', id, JSON.stringify(patch));
    return this.presentKey(key);
  }

  async deleteKey(id: string, actor: string) {
    if (!(await this.store.deleteKey(id))) throw new AdminError(404, 'not_found', `no key with id "${id}"`);
    await this.audit(actor, 'key.delete', id, null);
  }

  /** Writes one audit entry; also used for sign-ins, which the HTTP layer handles. */
  audit(actor: string, action: string, target: string | null, detail: string | null): Promise<void> {
    return this.store.recordAudit({ time: Date.now(), actor, action, target, detail: detail && detail.slice(0, 500) });
  }

  /** The audit log, newest first. */
  async auditLog(query: Record<string, string | undefined>) {
    const q: AuditQuery = { action: query.action || undefined, since: parseTime('since', query.since), until: parseTime('until', query.until) };
    q.limit = parseLimit(query.limit, 1000) ?? 100;
    return { data: await this.store.queryAudit(q) };
  }

  /** The latest exchanges, newest first, each with its error and notes. */
  async requests(query: Record<string, string | undefined>) {
    const q = usageQuery(query);
    q.limit = parseLimit(query.limit, 1000) ?? 100;
    await this.settleUsage();
    return { data: (await this.store.queryUsage(q)).records };
  }

  async usage(query: Record<string, string | undefined>) {
    await this.settleUsage();
    return this.store.queryUsage(usageQuery(query));
  }

  /** Usage over time; the bucket defaults to about 60 points across the range. */
  async usageSeries(query: Record<string, string | undefined>, now = Date.now()) {
    const q = usageQuery(query);
    let bucketMs = query.bucket ? Number(query.bucket) : undefined;
    if (bucketMs !== undefined && (!Number.isInteger(bucketMs) || bucketMs < 1000)) {
      throw new AdminError(400, 'invalid_request', 'bucket must be a whole number of milliseconds, at least 1000');
    }
    if (bucketMs === undefined) {
      const span = (q.until ?? now) - (q.since ?? now - 86_400_000);
      bucketMs = niceBuckets.find((b) => span / b <= 90) ?? niceBuckets.at(-1)!;
    }
    await this.settleUsage();
    return { bucketMs, points: await this.store.usageSeries(q, bucketMs) };
  }

  async usageCsv(query: Record<string, string | undefined>): Promise<string> {
    await this.settleUsage();
    const { records } = await this.store.queryUsage({ ...usageQuery(query), limit: usageQuery(query).limit ?? 100_000 });
    const lines = records.map((r) => csvColumns.map((c) => csvCell(c === 'time' ? new Date(r.time).toISOString() : r[c])).join(','));
    return [csvColumns.join(','), ...lines].join('\r\n') + '\r\n';
  }

  private presentKey(key: ApiKey, now = Date.now()) {
    return this.withSpend(present(key), { key: key.id }, now);
  }

  /** An item with a budget gains its spend in the current period, from the usage records. */
  private async withSpend<T extends { budget: Budget | null; createdAt: number }>(item: T, scope: UsageQuery, now = Date.now()) {
    if (!item.budget) return { ...item, spend: null };
    const period = budgetPeriod(item.budget, now, item.createdAt);
    const spent = (await this.store.queryUsage({ ...scope, since: period.since, limit: 1 })).totals.cost;
    return {
      ...item,
      spend: {
        period: item.budget.period,
        since: new Date(period.since).toISOString(),
        until: period.until === undefined ? null : new Date(period.until).toISOString(),
        spent,
        remaining: Math.max(0, Math.round((item.budget.amount - spent) * 1e9) / 1e9),
      },
    };
  }

  private async requireGroup(name: string): Promise<void> {
    if (!(await this.store.getGroup(name))) throw new AdminError(400, 'invalid_request', `no group named "${name}"`);
  }

  private checkGrants(g: { models?: string[]; families?: string[] }): void {
    const unknownModel = g.models?.find((m) => m !== '*' && !this.modelIds.includes(m));
    if (unknownModel) {
      throw new AdminError(400, 'invalid_request', `unknown model "${unknownModel}"; configured: ${this.modelIds.join(', ')} (or "*")`);
    }
    const unknownFamily = g.families?.find((f) => !this.families.includes(f));
    if (unknownFamily) {
      throw new AdminError(400, 'invalid_request', `unknown family "${unknownFamily}"; known: ${this.families.join(', ')}`);
    }
  }

  /** The live channel table's report; the gateway points it at the pipeline's current routing. */
  upstreamReport: () => UpstreamReport[] = () => [];
  /**
   * Waits until every record made so far can be read. With worker threads each thread batches its
   * own records, so the gateway sets this to have them all write what they queued.
   */
  settleUsage: () => Promise<unknown> = async () => {};

  /** Every upstream with the circuit-breaker state of each model channel on it. */
  listUpstreams() {
    return { data: this.upstreamReport() };
  }
}

function usageQuery(query: Record<string, string | undefined>): UsageQuery {
  const q: UsageQuery = { key: query.key || undefined, group: query.group || undefined, model: query.model || undefined };
  q.since = parseTime('since', query.since);
  q.until = parseTime('until', query.until);
  q.limit = parseLimit(query.limit, 100_000);
  if (query.status) {
    const m = /^([1-5])xx$|^([1-5]\d\d)$/.exec(query.status);
    if (!m) throw new AdminError(400, 'invalid_request', 'status must be a class such as 4xx or a status such as 503');
    q.statusMin = m[1] ? Number(m[1]) * 100 : Number(m[2]);
    q.statusMax = m[1] ? q.statusMin + 100 : q.statusMin + 1;
  }
  return q;
}

function parseLimit(value: string | undefined, max: number): number | undefined {
  if (!value) return undefined;
  const limit = Number(value);
  if (!Number.isInteger(limit) || limit < 1 || limit > max) {
    throw new AdminError(400, 'invalid_request', `limit must be an integer from 1 to ${max}`);
  }
  return limit;
}

/** `expiresAt` as the API takes it (ISO 8601 or null) to unix milliseconds; undefined stays unset. */
export function parseExpiry(value: string | null | undefined): number | null | undefined {
  if (value === undefined || value === null) return value;
  const ms = isoTime.test(value) ? Date.parse(value) : NaN;
  if (!Number.isFinite(ms)) {
    throw new AdminError(400, 'invalid_request', 'expiresAt must be an ISO 8601 date or time with a zone (2026-12-31T00:00:00Z), or null');
  }
  // Date.parse rolls a day past the month's end over (2026-02-31 is 3 March): the day must read back.
  const day = value.slice(0, 10);
  if (new Date(day).toISOString().slice(0, 10) !== day) throw new AdminError(400, 'invalid_request', `expiresAt: ${day} is not a day of the calendar`);
  return ms;
}

/** A key as the admin surface shows it: its expiry as an ISO time, like the API takes it. */
function present(key: ApiKey) {
  return { ...key, expiresAt: key.expiresAt === null ? null : new Date(key.expiresAt).toISOString() };
}

/** Accepts unix milliseconds or an ISO 8601 date. */
function parseTime(name: string, value: string | undefined): number | undefined {
  if (!value) return undefined;
  const ms = /^\d+$/.test(value) ? Number(value) : Date.parse(value);
  if (!Number.isFinite(ms)) throw new AdminError(400, 'invalid_request', `${name} must be unix milliseconds or an ISO date`);
  return ms;
}

/** Limits with no field set are no limits. */
function cleared(limits: Limits | null | undefined): Limits | null {
  return limits && Object.keys(limits).length > 0 ? limits : null;
}

function limitsNote(item: { limits?: Limits | null; budget?: Budget | null }): string {
  return `${item.limits ? `; limits ${JSON.stringify(item.limits)}` : ''}${item.budget ? `; budget ${item.budget.amount}/${item.budget.period}` : ''}`;
}
