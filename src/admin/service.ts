/**
 * Operations on groups, keys and usage, with their validation. The admin HTTP API, the CLI and
 * (later) the web console all call these, so each rule lives once.
 */
import { Ajv } from 'ajv';
import type { Store, UsageQuery } from '../store/store.js';

export class AdminError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

const groupFields = {
  name: { type: 'string', pattern: '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$' },
  models: { type: 'array', items: { type: 'string', minLength: 1 }, uniqueItems: true },
  families: { type: 'array', items: { type: 'string' }, uniqueItems: true },
};

const schemas = {
  createGroup: { type: 'object', required: ['name', 'models', 'families'], additionalProperties: false, properties: groupFields },
  updateGroup: { type: 'object', minProperties: 1, additionalProperties: false, properties: groupFields },
  createKey: {
    type: 'object',
    required: ['group'],
    additionalProperties: false,
    properties: { group: { type: 'string', minLength: 1 }, name: { type: ['string', 'null'], maxLength: 128 } },
  },
  updateKey: {
    type: 'object',
    additionalProperties: false,
    minProperties: 1,
    properties: {
      disabled: { type: 'boolean' },
      name: { type: ['string', 'null'], maxLength: 128 },
      group: { type: 'string', minLength: 1 },
    },
  },
} as const;

const ajv = new Ajv({ allErrors: false });
const validators = Object.fromEntries(Object.entries(schemas).map(([k, s]) => [k, ajv.compile(s)])) as Record<
  keyof typeof schemas,
  ReturnType<typeof ajv.compile>
>;

function check<T>(schema: keyof typeof schemas, input: unknown): T {
  const validate = validators[schema];
  if (!validate(input)) {
    const e = validate.errors![0]!;
    const field = e.instancePath ? e.instancePath.slice(1).replace(/\//g, '.') : 'body';
    const detail =
      e.keyword === 'additionalProperties'
        ? `unknown field "${(e.params as { additionalProperty: string }).additionalProperty}"`
        : e.keyword === 'required'
          ? `missing field "${(e.params as { missingProperty: string }).missingProperty}"`
          : `${field} ${e.message}`;
    throw new AdminError(400, 'invalid_request', detail);
  }
  return input as T;
}

export class AdminService {
  constructor(
    private readonly store: Store,
    /** Model ids the gateway serves. */
    private readonly modelIds: string[],
    /** Families the gateway speaks. */
    private readonly families: string[],
  ) {}

  listGroups() {
    return this.store.listGroups();
  }

  createGroup(input: unknown) {
    const g = check<{ name: string; models: string[]; families: string[] }>('createGroup', input);
    this.checkGrants(g);
    if (this.store.getGroup(g.name)) throw new AdminError(409, 'conflict', `group "${g.name}" already exists`);
    return this.store.createGroup(g);
  }

  updateGroup(name: string, input: unknown) {
    const patch = check<{ name?: string; models?: string[]; families?: string[] }>('updateGroup', input);
    this.checkGrants(patch);
    if (patch.name && patch.name !== name && this.store.getGroup(patch.name)) {
      throw new AdminError(409, 'conflict', `group "${patch.name}" already exists`);
    }
    const updated = this.store.updateGroup(name, patch);
    if (!updated) throw new AdminError(404, 'not_found', `no group named "${name}"`);
    return updated;
  }

  deleteGroup(name: string) {
    const result = this.store.deleteGroup(name);
    if (result === 'not_found') throw new AdminError(404, 'not_found', `no group named "${name}"`);
    if (result === 'in_use') {
      throw new AdminError(409, 'conflict', `group "${name}" still has keys; move or delete them first`);
    }
  }

  listKeys() {
    return this.store.listKeys();
  }

  getKey(id: string) {
    const key = this.store.getKey(id);
    if (!key) throw new AdminError(404, 'not_found', `no key with id "${id}"`);
    return key;
  }

  /** The only place a secret is ever returned. */
  createKey(input: unknown) {
    const k = check<{ group: string; name?: string | null }>('createKey', input);
    this.requireGroup(k.group);
    const { key, secret } = this.store.createKey(k);
    return { ...key, key: secret };
  }

  updateKey(id: string, input: unknown) {
    const patch = check<{ disabled?: boolean; name?: string | null; group?: string }>('updateKey', input);
    if (patch.group) this.requireGroup(patch.group);
    const key = this.store.updateKey(id, patch);
    if (!key) throw new AdminError(404, 'not_found', `no key with id "${id}"`);
    return key;
  }

  deleteKey(id: string) {
    if (!this.store.deleteKey(id)) throw new AdminError(404, 'not_found', `no key with id "${id}"`);
  }

  usage(query: Record<string, string | undefined>) {
    const q: UsageQuery = { key: query.key || undefined, group: query.group || undefined, model: query.model || undefined };
    q.since = parseTime('since', query.since);
    q.until = parseTime('until', query.until);
    if (query.limit) {
      const limit = Number(query.limit);
      if (!Number.isInteger(limit) || limit < 1 || limit > 100_000) {
        throw new AdminError(400, 'invalid_request', 'limit must be an integer from 1 to 100000');
      }
      q.limit = limit;
    }
    return this.store.queryUsage(q);
  }

  private requireGroup(name: string): void {
    if (!this.store.getGroup(name)) throw new AdminError(400, 'invalid_request', `no group named "${name}"`);
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
}

/** Accepts unix milliseconds or an ISO 8601 date. */
function parseTime(name: string, value: string | undefined): number | undefined {
  if (!value) return undefined;
  const ms = /^\d+$/.test(value) ? Number(value) : Date.parse(value);
  if (!Number.isFinite(ms)) throw new AdminError(400, 'invalid_request', `${name} must be unix milliseconds or an ISO date`);
  return ms;
}
