/**
 * Configuration: a YAML file, `${ENV}` interpolation, then ajv validation with messages that name
 * the key and the problem. With no file, the embedded default runs the built-in simulator. What it
 * returns is typed in types.ts, what is left out comes from defaults.ts, and the schema that
 * validates the file is schema.ts.
 */
import { readFileSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { dirname, resolve as resolvePath } from 'node:path';
import type { ErrorObject } from 'ajv';
import { LineCounter, parseDocument } from 'yaml';
import { parseAddressRange } from '../trusted-proxies.js';
import { defaultRequestCaps } from '../request-caps.js';
import { defaultAffinity, defaultDroppedParameters, defaultPlugins, defaultResponseCache, embeddedDefault } from './defaults.js';
import { configSchema, validateConfig } from './schema.js';
import type { ChannelConfig, Config, McpConfig, McpServerConfig, ModelConfig, ParameterPolicy, PluginEntry, Prices, RawConfig, ResponseCacheConfig, UpstreamConfig } from './types.js';

export class ConfigError extends Error {}

export interface LoadOptions {
  /** Path of the YAML file; undefined for the embedded default. */
  path?: string;
  env?: NodeJS.ProcessEnv;
}

export function loadConfig({ path, env = process.env }: LoadOptions = {}): Config {
  let raw: unknown = {};
  const source = path ?? 'embedded default';
  if (path) {
    let text: string;
    try {
      text = readFileSync(path, 'utf8');
    } catch (err) {
      throw new ConfigError(`${path}: cannot read the file (${(err as Error).message})`);
    }
    raw = parseFile(text, path);
    // An empty file (or one of comments) would run the embedded default: the simulator, on 8080.
    if (raw === null || raw === undefined) throw new ConfigError(`the config file ${path} is empty: give it its settings (docs/configuration.md), or start without a config file for the built-in simulator`);
  }
  const placeholders = new Map<string, string>();
  if (path) raw = interpolate(raw, env, '', path, placeholders);
  if (!validateConfig(raw) && !(typePlaceholders(raw, validateConfig.errors ?? [], placeholders) && validateConfig(raw))) {
    throw new ConfigError(`${source}:\n${formatErrors(validateConfig.errors ?? [])}`);
  }
  return resolve(raw as RawConfig, env, source, path);
}

/**
 * The file's YAML, or a ConfigError naming where it breaks and why. The parser's own message
 * quotes the offending line (a code frame) or its token, which in a config is often a key's
 * value: the reason is cut where what it quotes begins (after a colon), and the position given
 * as line and column instead. The reload's answer and log line carry this too.
 */
function parseFile(text: string, path: string): unknown {
  const lines = new LineCounter();
  try {
    const doc = parseDocument(text, { lineCounter: lines, prettyErrors: false });
    const [error] = doc.errors;
    if (!error) return doc.toJS();
    const at = error.pos[0] >= 0 ? lines.linePos(error.pos[0]) : undefined;
    // `{ port: ${PORT} }`: in a flow collection the placeholder's braces are YAML's own.
    const hint = text.startsWith('${', error.pos[0] - 1) ? ' (inside { … } or [ … ], quote a placeholder: "${NAME}")' : '';
    throw new ConfigError(`${path}: not valid YAML${at ? ` at line ${at.line}, column ${at.col}` : ''}: ${reason(error.message)}${hint}`);
  } catch (err) {
    if (err instanceof ConfigError) throw err;
    // toJS: too many aliases (a resource exhaustion attack), or an alias to no anchor.
    throw new ConfigError(`${path}: not valid YAML: ${reason((err as Error).message)}`);
  }
}

/** The parser's reason without what it quotes; its advice to call another function of its own ("; please use …") is for programmers. */
const reason = (message: string) => message.split(/: |; /)[0];

function resolve(raw: RawConfig, env: NodeJS.ProcessEnv, source: string, path?: string): Config {
  const upstreams = raw.upstreams ?? embeddedDefault.upstreams;
  const rawModels = raw.models ?? (raw.upstreams ? [] : embeddedDefault.models);
  if (rawModels.length === 0) throw new ConfigError(`${source}: models: at least one model is required`);
  const seen = new Set<string>();
  const models = rawModels.map((m, i): ModelConfig => {
    if (seen.has(m.id)) throw new ConfigError(`${source}: models[${i}].id: "${m.id}" is listed twice`);
    seen.add(m.id);
    const channels = modelChannels(m, i, upstreams, source);
    const ceiling = m.maxOutputTokens ?? {};
    if (ceiling.default && ceiling.max && ceiling.default > ceiling.max) {
      throw new ConfigError(`${source}: models[${i}].maxOutputTokens: default is above max`);
    }
    return {
      id: m.id,
      upstream: channels[0]!.upstream,
      upstreamModel: channels[0]!.upstreamModel,
      channels,
      strategy: m.strategy ?? 'weighted',
      ...(m.responseCache && { responseCache: { ttlMs: m.responseCache !== true && m.responseCache.ttlSeconds ? m.responseCache.ttlSeconds * 1000 : cacheTtlMs(raw) } }),
      ...(m.prices && { prices: { cachedInput: m.prices.input!, cacheWrite: m.prices.input!, reasoning: m.prices.output!, ...m.prices } as Prices }),
      ...(m.limits && Object.keys(m.limits).length > 0 && { limits: m.limits }),
      maxOutputTokens: ceiling,
      features: {
        tools: true,
        jsonSchema: true,
        vision: true,
        temperature: true,
        reasoning: true,
        streamUsage: true,
        serverTools: [],
        unsupportedTools: 'reject',
        ...m.features,
        unsupportedParameters: parameterPolicy(m.features?.unsupportedParameters, m.ignoreParameters ?? []),
      },
      families: {},
      offeredFamilies: m.families,
      ignoreParameters: m.ignoreParameters ?? [],
      contextTokens: m.contextTokens ?? 131072,
      created: m.created ?? 1767225600,
      ownedBy: m.ownedBy ?? 'sluice',
    };
  });
  const maxConnections = raw.server?.maxConnections ?? defaultMaxConnections();
  const port = env.SLUICE_PORT !== undefined ? Number(env.SLUICE_PORT) : raw.server?.port ?? 8080;
  if (!Number.isInteger(port) || port < 0 || port > 65535) {
    throw new ConfigError(`SLUICE_PORT: "${env.SLUICE_PORT}" is not a port number`);
  }
  // MCP sessions and the stdio servers behind them live in one thread: with `mcp` one thread serves by default.
  const plugins = pluginList(raw, source, path);
  if (raw.mcp && !plugins.some((p) => p.name === 'mcp')) {
    throw new ConfigError(`${source}: mcp names servers, but the mcp plugin is not in plugins: add mcp to plugins (or to extraPlugins)`);
  }
  const workers = env.SLUICE_WORKERS !== undefined ? Number(env.SLUICE_WORKERS) : raw.server?.workers ?? (raw.mcp ? 1 : availableParallelism());
  if (!Number.isInteger(workers) || workers < 1 || workers > 256) throw new ConfigError(`SLUICE_WORKERS: "${env.SLUICE_WORKERS}" is not a number of workers (1 to 256)`);
  if (raw.mcp && workers > 1) {
    throw new ConfigError(`${source}: mcp needs server.workers: 1 (its sessions and stdio servers live in one thread); ${workers} workers are set`);
  }
  return {
    server: {
      host: env.SLUICE_HOST || raw.server?.host || '127.0.0.1',
      port,
      workers,
      maxBodyBytes: raw.server?.maxBodyBytes ?? 20 * 1024 * 1024,
      shutdownTimeoutMs: raw.server?.shutdownTimeoutMs ?? 30_000,
      trustedProxies: checkedProxies(raw.server?.trustedProxies ?? [], source),
      maxConnections,
      maxInFlightBodyBytes: raw.server?.maxInFlightBodyBytes ?? 256 * 1024 * 1024,
      maxUpstreamBodyBytes: raw.server?.maxUpstreamBodyBytes ?? 64 * 1024 * 1024,
      maxEventBytes: raw.server?.maxEventBytes ?? 16 * 1024 * 1024,
      writeStallMs: raw.server?.writeStallMs ?? 60_000,
      overheadHeader: raw.server?.overheadHeader ?? false,
      websocket: {
        enabled: raw.server?.websocket?.enabled ?? true,
        maxSockets: raw.server?.websocket?.maxSockets ?? Math.floor(maxConnections / 2),
        idleTimeoutSeconds: raw.server?.websocket?.idleTimeoutSeconds ?? 120,
        maxLifetimeMinutes: raw.server?.websocket?.maxLifetimeMinutes ?? 60,
      },
      requestCaps: { ...defaultRequestCaps, ...raw.server?.requestCaps },
    },
    dataDir: env.SLUICE_DATA_DIR || raw.dataDir || './data',
    adminToken: env.SLUICE_ADMIN_TOKEN || raw.adminToken,
    allowAnonymous: raw.allowAnonymous ?? false,
    ...(raw.tracing && {
      tracing: { endpoint: raw.tracing.endpoint, protocol: raw.tracing.protocol ?? 'http/protobuf', headers: raw.tracing.headers ?? {}, serviceName: raw.tracing.serviceName ?? 'sluice' },
    }),
    responseCache: responseCacheSettings(raw, source),
    affinity: {
      enabled: raw.affinity?.enabled ?? defaultAffinity.enabled,
      ...(raw.affinity?.header && { header: raw.affinity.header.toLowerCase() }),
      pinTtlMs: raw.affinity?.pinTtlSeconds !== undefined ? raw.affinity.pinTtlSeconds * 1000 : defaultAffinity.pinTtlMs,
      maxPins: raw.affinity?.maxPins ?? defaultAffinity.maxPins,
    },
    admin: { allowedOrigins: raw.admin?.allowedOrigins ?? [] },
    log: { level: logLevel(env.SLUICE_LOG_LEVEL) ?? raw.log?.level ?? 'info' },
    usage: { journalFsync: raw.usage?.journalFsync ?? false },
    store: raw.store?.kind === 'postgres' ? { kind: 'postgres', url: raw.store.url, poolSize: raw.store.poolSize ?? 10 } : { kind: 'sqlite' },
    limiter:
      raw.limiter?.kind === 'redis'
        ? { kind: 'redis', url: raw.limiter.url, failMode: raw.limiter.failMode, leaseMs: raw.limiter.leaseMs ?? 30_000, timeoutMs: raw.limiter.timeoutMs ?? 1000, prefix: raw.limiter.prefix ?? 'sluice' }
        : { kind: 'memory' },
    plugins,
    upstreams,
    models,
    ...(raw.mcp && { mcp: mcpConfig(raw.mcp) }),
  };
}

/** SLUICE_LOG_LEVEL, checked as the file's log.level is (pino's own refusal names none of the levels). */
function logLevel(level: string | undefined): string | undefined {
  const levels: readonly string[] = configSchema.properties.log.properties.level.enum;
  if (!level) return undefined;
  if (!levels.includes(level)) throw new ConfigError(`SLUICE_LOG_LEVEL: "${level}" is not a log level (${levels.join(', ')})`);
  return level;
}

/** The `mcp` section with its defaults: a minute per call, 1 MiB of arguments, 4 MiB of result, sessions idle ten minutes. */
function mcpConfig(raw: NonNullable<RawConfig['mcp']>): McpConfig {
  const servers: Record<string, McpServerConfig> = {};
  for (const [name, s] of Object.entries(raw.servers)) {
    const timeoutMs = Math.round((s.timeoutSeconds ?? 60) * 1000);
    servers[name] =
      s.transport === 'stdio'
        ? { transport: 'stdio', command: s.command, args: s.args ?? [], env: s.env ?? {}, ...(s.cwd && { cwd: s.cwd }), timeoutMs }
        : { transport: 'http', url: s.url, headers: s.headers ?? {}, timeoutMs };
  }
  return {
    servers,
    maxArgumentBytes: raw.maxArgumentBytes ?? 1024 * 1024,
    maxResultBytes: raw.maxResultBytes ?? 4 * 1024 * 1024,
    sessionIdleMs: Math.round((raw.sessionIdleSeconds ?? 600) * 1000),
  };
}

/** The response cache's settings, with their defaults; a Redis store needs the Redis limiter's server. */
function responseCacheSettings(raw: RawConfig, source: string): ResponseCacheConfig {
  const own = raw.responseCache ?? {};
  const store = own.store ?? 'memory';
  if (store === 'redis' && raw.limiter?.kind !== 'redis') {
    throw new ConfigError(`${source}: responseCache.store: redis keeps answers on the limiter's Redis; set limiter: { kind: redis, url: ... } too, or use store: memory`);
  }
  return { store, maxBytes: own.maxBytes ?? defaultResponseCache.maxBytes, maxEntryBytes: own.maxEntryBytes ?? defaultResponseCache.maxEntryBytes, ttlMs: cacheTtlMs(raw), groups: own.groups ?? [] };
}

const cacheTtlMs = (raw: RawConfig) => (raw.responseCache?.ttlSeconds !== undefined ? raw.responseCache.ttlSeconds * 1000 : defaultResponseCache.ttlMs);

/** `plugins` (or the default list) with `extraPlugins` after it; a name listed twice is refused. */
function pluginList(raw: RawConfig, source: string, path: string | undefined): PluginEntry[] {
  const entries = [...(raw.plugins ?? defaultPlugins), ...(raw.extraPlugins ?? [])].map((p) =>
    typeof p === 'string'
      ? { name: p, options: {} }
      : { name: p.name, options: p.options ?? {}, ...(p.module && { module: path ? resolvePath(dirname(path), p.module) : resolvePath(p.module) }) },
  );
  const base = raw.plugins ? 'plugins' : 'the default plugin list';
  const baseLength = (raw.plugins ?? defaultPlugins).length;
  const firstAt = new Map<string, number>();
  entries.forEach(({ name }, i) => {
    const first = firstAt.get(name);
    if (first === undefined) return void firstAt.set(name, i);
    const where = i < baseLength ? base : first < baseLength ? `${base} and extraPlugins (which adds to it)` : 'extraPlugins';
    throw new ConfigError(`${source}: plugin "${name}" is listed twice, in ${where}: list it once`);
  });
  return entries;
}

/** A model's channels, from its `channels` list or its single `upstream`, ordered by priority. */
function modelChannels(m: NonNullable<RawConfig['models']>[number], i: number, upstreams: Record<string, UpstreamConfig>, source: string): ChannelConfig[] {
  const at = `${source}: models[${i}]`;
  if (m.upstream && m.channels) throw new ConfigError(`${at}: give either "upstream" or "channels", not both`);
  if (m.upstreamModel && m.channels) throw new ConfigError(`${at}.upstreamModel: set it on each channel instead`);
  const raw = m.channels ?? (m.upstream ? [{ upstream: m.upstream, upstreamModel: m.upstreamModel }] : undefined);
  if (!raw) throw new ConfigError(`${source}:\n  /models/${i}: missing key "upstream" (or "channels")`);
  const channels = raw.map((c, j): ChannelConfig => {
    const where = m.channels ? `${at}.channels[${j}].upstream` : `${at}.upstream`;
    if (!Object.hasOwn(upstreams, c.upstream!)) throw new ConfigError(`${where}: no upstream named "${c.upstream}"`);
    return { name: c.upstream!, upstream: c.upstream!, upstreamModel: c.upstreamModel ?? m.id, priority: c.priority ?? 0, weight: c.weight ?? 1 };
  });
  for (const c of channels) if (channels.filter((o) => o.upstream === c.upstream).length > 1) c.name = `${c.upstream}/${c.upstreamModel}`;
  const names = new Set(channels.map((c) => c.name));
  if (names.size < channels.length) throw new ConfigError(`${at}.channels: the same upstream and upstreamModel are listed twice`);
  // Stable: equal priorities keep the order they were written in.
  return channels.sort((a, b) => a.priority - b.priority);
}

/** The defaults, then the model's own lists: a name it refuses is no longer dropped. */
function parameterPolicy(own: Partial<ParameterPolicy> = {}, ignored: string[]): ParameterPolicy {
  const reject = own.reject ?? [];
  const drop = [...new Set([...defaultDroppedParameters, ...(own.drop ?? []), ...ignored])].filter((n) => !reject.includes(n));
  return { policy: own.policy ?? 'reject', drop, reject };
}

/**
 * Each connection costs a file descriptor and, with its upstream call, often two: the default
 * leaves room under the process's descriptor limit (Linux: /proc/self/limits), at most 10,000.
 */
function defaultMaxConnections(): number {
  let limit = 65_536;
  try {
    const line = /Max open files\s+(\d+)/.exec(readFileSync('/proc/self/limits', 'utf8'));
    if (line) limit = Number(line[1]);
  } catch {
    // Not Linux: keep the fallback.
  }
  return Math.max(64, Math.min(10_000, Math.floor((limit - 256) / 2)));
}

function checkedProxies(entries: string[], source: string): string[] {
  entries.forEach((entry, i) => {
    try {
      parseAddressRange(entry);
    } catch (err) {
      throw new ConfigError(`${source}: server.trustedProxies[${i}]: ${(err as Error).message}`);
    }
  });
  return entries;
}

const PLACEHOLDER = /\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}/g;
const ONE_PLACEHOLDER = /^\$\{[A-Za-z_][A-Za-z0-9_]*(?::-[^}]*)?\}$/;

/**
 * Replaces `${NAME}` and `${NAME:-fallback}` in every string value of the file at `path`. The
 * values that were one placeholder and nothing else are noted in `placeholders` by their JSON
 * pointer (as ajv names them), for typePlaceholders.
 */
function interpolate(value: unknown, env: NodeJS.ProcessEnv, at: string, path: string, placeholders: Map<string, string>): unknown {
  if (typeof value === 'string') {
    const text = value.replace(PLACEHOLDER, (_, name: string, fallback?: string) => {
      const found = env[name];
      if (found !== undefined && found !== '') return found;
      if (fallback !== undefined) return fallback;
      throw new ConfigError(`${path}: ${at || '/'}: environment variable ${name} is not set: export ${name}=… before starting, or write \${${name}:-default} for a default`);
    });
    if (ONE_PLACEHOLDER.test(value)) placeholders.set(at, text);
    return text;
  }
  if (Array.isArray(value)) return value.map((v, i) => interpolate(v, env, `${at}/${i}`, path, placeholders));
  if (value && typeof value === 'object') {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, interpolate(v, env, `${at}/${k.replace(/~/g, '~0').replace(/\//g, '~1')}`, path, placeholders)]));
  }
  return value;
}

/**
 * A placeholder's value is text, and `port: ${PORT:-9900}` would be refused as not an integer.
 * Where the schema wants a number or a boolean and the value was one placeholder, its text is
 * read as YAML reads an unquoted scalar (9900, 0.5, true, 0x1F); only there, so an apiKey of
 * digits stays text, as do plugin options, which have no type here. Returns whether any changed.
 */
function typePlaceholders(raw: unknown, errors: ErrorObject[], placeholders: Map<string, string>): boolean {
  let changed = false;
  for (const e of errors) {
    const text = placeholders.get(e.instancePath);
    if (e.keyword !== 'type' || text === undefined || !/^[\w.+-]+$/.test(text)) continue;
    const doc = parseDocument(text);
    const read: unknown = doc.errors.length === 0 ? doc.toJS() : undefined;
    const wants = String((e.params as { type: unknown }).type);
    const fits = typeof read === 'boolean' ? wants.includes('boolean') : typeof read === 'number' && Number.isFinite(read) && /number|integer/.test(wants);
    if (!fits) continue;
    const keys = e.instancePath.split('/').slice(1).map((k) => k.replace(/~1/g, '/').replace(/~0/g, '~'));
    const parent = keys.slice(0, -1).reduce((node, key) => node[key] as Record<string, unknown>, raw as Record<string, unknown>);
    parent[keys.at(-1)!] = read;
    changed = true;
  }
  return changed;
}

function formatErrors(errors: ErrorObject[]): string {
  return errors
    // A missing `kind` is said once, by `required`, not again by the discriminator.
    .filter((e) => e.keyword !== 'anyOf' && !(e.keyword === 'discriminator' && (e.params as { tagValue?: unknown }).tagValue === undefined))
    .map((e) => {
      const where = e.instancePath || '/';
      if (e.keyword === 'additionalProperties') {
        return `  ${where}: unknown key "${(e.params as { additionalProperty: string }).additionalProperty}"`;
      }
      if (e.keyword === 'required') {
        return `  ${where}: missing key "${(e.params as { missingProperty: string }).missingProperty}"`;
      }
      if (e.keyword === 'enum') {
        return `  ${where}: must be one of ${(e.params as { allowedValues: unknown[] }).allowedValues.map((v) => JSON.stringify(v)).join(', ')}`;
      }
      if (e.keyword === 'discriminator') {
        const { tag, tagValue } = e.params as { tag: string; tagValue: unknown };
        // Only top-level sections (store, limiter) have kinds.
        const section = (configSchema.properties as Record<string, { oneOf?: { properties: Record<string, { const?: string }> }[] }>)[where.slice(1)];
        const kinds = (section?.oneOf ?? []).map((b) => `"${b.properties[tag]?.const}"`);
        return `  ${where}/${tag}: ${JSON.stringify(tagValue)} is not one of ${kinds.join(', ')}`;
      }
      return `  ${where}: ${e.message}`;
    })
    .join('\n');
}
