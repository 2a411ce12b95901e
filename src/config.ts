/**
 * Configuration: a YAML file, `${ENV}` interpolation, then ajv validation with messages that name
 * the key and the problem. With no file, the embedded default runs the built-in simulator.
 */
import { readFileSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { dirname, resolve as resolvePath } from 'node:path';
import type { ErrorObject } from 'ajv';
import { schemaCompiler } from './schema-compiler.js';
import { parse as parseYaml } from 'yaml';
import { parseAddressRange } from './trusted-proxies.js';
import { defaultRequestCaps, type RequestCaps } from './request-caps.js';
import type { Limits } from './store/store.js';
import type { BreakerPolicy, RetryPolicy } from './channels/policy.js';
import { limitsSchema } from './limits/limiter.js';

export interface ModelFeatures {
  tools: boolean;
  jsonSchema: boolean;
  vision: boolean;
  temperature: boolean;
  /** Reasoning controls (`reasoning_effort`, Responses `reasoning`). */
  reasoning: boolean;
  /** The upstream reports usage in streams when asked (`stream_options.include_usage`). */
  streamUsage: boolean;
  /** Server-side tools the upstream runs itself (e.g. `web_search`); only a native upstream can. */
  serverTools: string[];
  /** A server-side tool the upstream cannot run: refuse the request, or drop the tool (noted in usage). */
  unsupportedTools: 'drop' | 'reject';
  /** Parameters a translated upstream cannot express, by family-neutral name (`topK`, `seed`, `stop`). */
  unsupportedParameters: ParameterPolicy;
}

/** Listed names follow their list; any other unexpressible parameter follows `policy`. */
export interface ParameterPolicy {
  policy: 'drop' | 'reject';
  drop: string[];
  reject: string[];
}

/**
 * Dropped by default: sampling hints that change nothing essential (Gemini CLI always sends
 * `topK`). What changes the meaning of an answer (`candidates`, `safetySettings`, `stop`) is refused.
 */
export const defaultDroppedParameters = ['topK', 'seed', 'presencePenalty', 'frequencyPenalty'];

/** How a model serves a family: in the upstream's own wire format, or translated by Sluice. */
export type FamilyMode = 'native' | 'bridge' | 'translated';

/** Prices per million tokens, in one currency of the operator's choosing. */
export interface Prices {
  input: number;
  /** Prompt tokens read from the upstream's cache; defaults to `input`. */
  cachedInput: number;
  /** Prompt tokens written to the upstream's cache (Anthropic prices them apart); defaults to `input`. */
  cacheWrite: number;
  output: number;
  /** Reasoning tokens (counted within the output); defaults to `output`. */
  reasoning: number;
}

/** One way to serve a model: an upstream and the name it knows the model by. */
export interface ChannelConfig {
  /** `upstream`, or `upstream/upstreamModel` when a model has two channels on one upstream. */
  name: string;
  upstream: string;
  upstreamModel: string;
  /** Lower numbers are tried first. */
  priority: number;
  /** Share of the traffic among healthy channels of the same priority. */
  weight: number;
}

export interface ModelConfig {
  id: string;
  /** The first channel's upstream (a key of `upstreams`); every channel speaks its family. */
  upstream: string;
  /** The model name the first channel's upstream knows; defaults to `id`. */
  upstreamModel: string;
  /** At least one; the single `upstream` form is one channel. Ordered by priority. */
  channels: ChannelConfig[];
  /** What the model's tokens cost; without prices usage has no cost and budgets do not apply. */
  prices?: Prices;
  /** Limits across every key, to protect the upstream's own quota. */
  limits?: Limits;
  /**
   * Output-token ceiling: `default` is sent when the client sets none; above `max` is refused, or
   * with `overMax: clamp` lowered to `max` (for clients that always ask for more than most models give).
   */
  maxOutputTokens: { default?: number; max?: number; overMax?: 'reject' | 'clamp' };
  features: ModelFeatures;
  /** Families the model is offered on, and how; filled in at boot from the upstream's family. */
  families: Record<string, FamilyMode>;
  /** Families the config restricts the model to; undefined offers every family Sluice speaks. */
  offeredFamilies?: string[];
  /** Older spelling of `features.unsupportedParameters.drop`; merged into it. */
  ignoreParameters: string[];
  /** Context window in tokens, shown in model lists that carry it. */
  contextTokens: number;
  /** Unix seconds, shown in model lists. */
  created: number;
  ownedBy: string;
}

export interface UpstreamConfig {
  /** Which upstream plugin serves this channel (e.g. `openai-chat`, `simulator`). */
  kind: string;
  /** Deadlines of one call (HTTP upstreams): connect, first byte, idle between chunks, total. */
  timeouts?: { connectMs?: number; firstByteMs?: number; idleMs?: number; totalMs?: number };
  /** Failover after a call to this upstream failed (src/channels/policy.ts has the defaults). */
  retry?: Partial<RetryPolicy>;
  /** Circuit breaking of each model channel on this upstream. */
  breaker?: Partial<BreakerPolicy>;
  [option: string]: unknown;
}

export interface PluginEntry {
  /** Path under plugins/, e.g. `auth` or `codecs/chat`; any name when `module` is given. */
  name: string;
  options: Record<string, unknown>;
  /** A plugin kept outside the tree: its module file, absolute or relative to the config file. */
  module?: string;
}

export interface WebSocketLimits {
  /** False switches the channel off: upgrades get 426, so clients such as Codex use HTTP at once. */
  enabled: boolean;
  /** Open sockets at once (they also count towards maxConnections). */
  maxSockets: number;
  /** Seconds without a frame (pings included) before a socket is closed; pings are sent automatically. */
  idleTimeoutSeconds: number;
  /** A socket is closed after this long with `websocket_connection_limit_reached`, as OpenAI does. */
  maxLifetimeMinutes: number;
}

/** Where groups, keys, usage and shared state live. */
export type StoreConfig = { kind: 'sqlite' } | { kind: 'postgres'; url: string; poolSize: number };

/** Where limit counters live: this process's memory, or a Redis shared by every instance. */
export type LimiterConfig =
  | { kind: 'memory' }
  | {
      kind: 'redis';
      url: string;
      /** Redis unreachable: `open` serves without limits, `closed` answers 503. */
      failMode: 'open' | 'closed';
      /** A concurrency slot's lease; the holder renews it while its exchange runs, a crashed holder's slot returns after it. */
      leaseMs: number;
      /** A decision Redis has not answered in this long counts as Redis unavailable. */
      timeoutMs: number;
      /** Prefix of every Redis key, so several gateways can share one Redis. */
      prefix: string;
    };

export interface Config {
  server: {
    host: string;
    port: number;
    /** uWebSockets.js apps on worker threads serving the port; 1 serves on the main thread. */
    workers: number;
    maxBodyBytes: number;
    shutdownTimeoutMs: number;
    /** Proxies (addresses or CIDRs) whose X-Forwarded-For/-Proto/-Host headers are believed. */
    trustedProxies: string[];
    /** In-flight HTTP exchanges plus open WebSockets; beyond it, 503 at once. */
    maxConnections: number;
    /** Request bodies being received at once, in bytes, across all connections. */
    maxInFlightBodyBytes: number;
    /** Largest complete (non-stream) upstream answer that is read. */
    maxUpstreamBodyBytes: number;
    /** Largest single upstream stream event. */
    maxEventBytes: number;
    /** A client that takes no bytes for this long is cut (`client_stalled`). */
    writeStallMs: number;
    websocket: WebSocketLimits;
    requestCaps: RequestCaps;
  };
  dataDir: string;
  adminToken?: string;
  /** Serve model routes with no authenticating plugin: anyone who reaches the port may call them. */
  allowAnonymous: boolean;
  /** Prompt-cache affinity for models with more than one channel (src/channels/affinity.ts). */
  affinity: AffinityConfig;
  /** OTLP trace export (plugins/tracing); absent: only the standard OTEL_* variables can turn it on. */
  tracing?: TracingConfig;
  admin: {
    /** Origins besides the gateway's own that may make state-changing admin calls. */
    allowedOrigins: string[];
  };
  log: { level: string };
  usage: {
    /** Sync each usage journal append to disk: records survive power loss, not only a crash. */
    journalFsync: boolean;
  };
  store: StoreConfig;
  limiter: LimiterConfig;
  plugins: PluginEntry[];
  upstreams: Record<string, UpstreamConfig>;
  models: ModelConfig[];
}

export interface AffinityConfig {
  enabled: boolean;
  /** A header (lowercase) that names the conversation, read before the agents' session headers. */
  header?: string;
  /** How long a pin to a channel other than the conversation's first-ranked one outlives its last turn. */
  pinTtlMs: number;
  /** Pins kept at most per thread; the least recently used go first. */
  maxPins: number;
}

export interface TracingConfig {
  /** The receiver's traces URL, e.g. http://127.0.0.1:4318/v1/traces. */
  endpoint: string;
  protocol: 'http/protobuf' | 'http/json';
  headers: Record<string, string>;
  serviceName: string;
}

export const defaultPlugins = [
  'auth',
  'grant',
  'limits',
  'codecs/chat',
  'codecs/responses',
  'codecs/gemini',
  'codecs/messages',
  'upstreams/openai-chat',
  'upstreams/openai-responses',
  'upstreams/gemini',
  'upstreams/anthropic',
  'upstreams/azure-openai',
  'upstreams/simulator',
  'usage',
  'access-log',
  'metrics',
  'tracing',
  'console',
];

/** The embedded default: the in-process simulator and its models. */
const embeddedDefault: { upstreams: Record<string, UpstreamConfig>; models: NonNullable<RawConfig['models']> } = {
  upstreams: {
    simulator: { kind: 'simulator' },
    'simulator-responses': { kind: 'simulator', family: 'responses' },
    'simulator-gemini': { kind: 'simulator', family: 'gemini' },
    'simulator-messages': { kind: 'simulator', family: 'messages' },
  },
  // Demo prices (per million tokens), so budgets and costs can be tried on the simulator.
  models: [
    // Bridged and translated models drop server-side tools (Codex always sends web_search).
    { id: 'sim-chat', upstream: 'simulator', prices: { input: 0.15, cachedInput: 0.075, output: 0.6 }, maxOutputTokens: { default: 1024, max: 8192, overMax: 'clamp' }, features: { unsupportedTools: 'drop' } },
    { id: 'sim-responses', upstream: 'simulator-responses', prices: { input: 1.25, cachedInput: 0.125, output: 10 }, maxOutputTokens: { default: 1024, max: 8192, overMax: 'clamp' }, features: { serverTools: ['web_search'] } },
    { id: 'sim-gemini', upstream: 'simulator-gemini', prices: { input: 0.3, cachedInput: 0.075, output: 2.5 }, maxOutputTokens: { default: 1024, max: 8192, overMax: 'clamp' }, features: { unsupportedTools: 'drop' } },
    { id: 'sim-messages', upstream: 'simulator-messages', prices: { input: 3, cachedInput: 0.3, cacheWrite: 3.75, output: 15 }, maxOutputTokens: { default: 1024, max: 8192, overMax: 'clamp' }, features: { unsupportedTools: 'drop' } },
    {
      id: 'sim-chat-basic',
      upstream: 'simulator',
      prices: { input: 0.05, output: 0.4 },
      maxOutputTokens: { default: 256, max: 1024, overMax: 'clamp' },
      features: { tools: false, jsonSchema: false, vision: false, temperature: false, reasoning: false, unsupportedTools: 'drop' },
    },
  ],
};

/** Request limits, as config and the admin API take them. */
/** One entry of `plugins` or `extraPlugins`: a name under plugins/, or a name with a module and options. */
const pluginEntrySchema = {
  anyOf: [
    { type: 'string', minLength: 1 },
    {
      type: 'object',
      required: ['name'],
      additionalProperties: false,
      properties: { name: { type: 'string', minLength: 1 }, options: { type: 'object' }, module: { type: 'string', minLength: 1 } },
    },
  ],
} as const;

const schema = {
  type: 'object',
  additionalProperties: false,
  properties: {
    server: {
      type: 'object',
      additionalProperties: false,
      properties: {
        host: { type: 'string', minLength: 1 },
        port: { type: 'integer', minimum: 0, maximum: 65535 },
        workers: { type: 'integer', minimum: 1, maximum: 256 },
        maxBodyBytes: { type: 'integer', minimum: 1024 },
        shutdownTimeoutMs: { type: 'integer', minimum: 0 },
        trustedProxies: { type: 'array', items: { type: 'string', minLength: 1 } },
        maxConnections: { type: 'integer', minimum: 1 },
        maxInFlightBodyBytes: { type: 'integer', minimum: 1024 },
        maxUpstreamBodyBytes: { type: 'integer', minimum: 1024 },
        maxEventBytes: { type: 'integer', minimum: 1024 },
        writeStallMs: { type: 'integer', minimum: 100 },
        websocket: {
          type: 'object',
          additionalProperties: false,
          properties: {
            enabled: { type: 'boolean' },
            maxSockets: { type: 'integer', minimum: 0 },
            idleTimeoutSeconds: { type: 'integer', minimum: 8, maximum: 960 },
            maxLifetimeMinutes: { type: 'number', exclusiveMinimum: 0, maximum: 10080 },
          },
        },
        requestCaps: {
          type: 'object',
          additionalProperties: false,
          properties: Object.fromEntries(Object.keys(defaultRequestCaps).map((name) => [name, { type: 'integer', minimum: 1 }])),
        },
      },
    },
    dataDir: { type: 'string', minLength: 1 },
    adminToken: { type: 'string', minLength: 16 },
    allowAnonymous: { type: 'boolean' },
    tracing: {
      type: 'object',
      additionalProperties: false,
      required: ['endpoint'],
      properties: {
        endpoint: { type: 'string', pattern: '^https?://' },
        protocol: { enum: ['http/protobuf', 'http/json'] },
        headers: { type: 'object', additionalProperties: { type: 'string' } },
        serviceName: { type: 'string', minLength: 1 },
      },
    },
    affinity: {
      type: 'object',
      additionalProperties: false,
      properties: {
        enabled: { type: 'boolean' },
        header: { type: 'string', pattern: '^[A-Za-z0-9!#$%&\'*+.^_`|~-]+$' },
        pinTtlSeconds: { type: 'integer', minimum: 1 },
        maxPins: { type: 'integer', minimum: 1 },
      },
    },
    admin: {
      type: 'object',
      additionalProperties: false,
      properties: {
        allowedOrigins: { type: 'array', items: { type: 'string', pattern: '^https?://[^/?#\\s]+$' }, uniqueItems: true },
      },
    },
    log: {
      type: 'object',
      additionalProperties: false,
      properties: { level: { enum: ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] } },
    },
    usage: { type: 'object', additionalProperties: false, properties: { journalFsync: { type: 'boolean' } } },
    // The discriminator picks the one branch `kind` names, so an error says what that kind lacks.
    store: {
      type: 'object',
      required: ['kind'],
      properties: { kind: { type: 'string' } },
      discriminator: { propertyName: 'kind' },
      oneOf: [
        { type: 'object', additionalProperties: false, required: ['kind'], properties: { kind: { const: 'sqlite' } } },
        {
          type: 'object',
          additionalProperties: false,
          required: ['kind', 'url'],
          properties: { kind: { const: 'postgres' }, url: { type: 'string', pattern: '^postgres(ql)?://' }, poolSize: { type: 'integer', minimum: 1, maximum: 1000 } },
        },
      ],
    },
    limiter: {
      type: 'object',
      required: ['kind'],
      properties: { kind: { type: 'string' } },
      discriminator: { propertyName: 'kind' },
      oneOf: [
        { type: 'object', additionalProperties: false, required: ['kind'], properties: { kind: { const: 'memory' } } },
        {
          type: 'object',
          additionalProperties: false,
          // No default fail mode: serving without limits and refusing everything are both costly, so the operator chooses.
          required: ['kind', 'url', 'failMode'],
          properties: {
            kind: { const: 'redis' },
            url: { type: 'string', pattern: '^rediss?://' },
            failMode: { enum: ['open', 'closed'] },
            leaseMs: { type: 'integer', minimum: 100 },
            timeoutMs: { type: 'integer', minimum: 1 },
            prefix: { type: 'string', minLength: 1, pattern: '^[A-Za-z0-9:._-]+$' },
          },
        },
      ],
    },
    plugins: { type: 'array', items: pluginEntrySchema },
    extraPlugins: { type: 'array', items: pluginEntrySchema },
    upstreams: {
      type: 'object',
      minProperties: 1,
      additionalProperties: {
        type: 'object',
        required: ['kind'],
        properties: {
          kind: { type: 'string', minLength: 1 },
          timeouts: {
            type: 'object',
            additionalProperties: false,
            properties: Object.fromEntries(['connectMs', 'firstByteMs', 'idleMs', 'totalMs'].map((k) => [k, { type: 'integer', minimum: 1 }])),
          },
          retry: {
            type: 'object',
            additionalProperties: false,
            properties: {
              attempts: { type: 'integer', minimum: 1, maximum: 10 },
              backoffMs: { type: 'integer', minimum: 0 },
              maxRetryAfterSeconds: { type: 'number', minimum: 0 },
              maxCoolDownSeconds: { type: 'number', minimum: 0 },
            },
          },
          breaker: {
            type: 'object',
            additionalProperties: false,
            properties: {
              failures: { type: 'integer', minimum: 1 },
              errorRate: { type: 'number', exclusiveMinimum: 0, maximum: 1 },
              windowSeconds: { type: 'integer', minimum: 1, maximum: 3600 },
              minRequests: { type: 'integer', minimum: 1 },
              coolDownSeconds: { type: 'number', exclusiveMinimum: 0 },
            },
          },
        },
      },
    },
    models: {
      type: 'array',
      minItems: 1,
      items: {
        type: 'object',
        required: ['id'],
        additionalProperties: false,
        properties: {
          id: { type: 'string', minLength: 1, pattern: '^[A-Za-z0-9._:/-]+$' },
          upstream: { type: 'string', minLength: 1 },
          upstreamModel: { type: 'string', minLength: 1 },
          channels: {
            type: 'array',
            minItems: 1,
            items: {
              type: 'object',
              required: ['upstream'],
              additionalProperties: false,
              properties: {
                upstream: { type: 'string', minLength: 1 },
                upstreamModel: { type: 'string', minLength: 1 },
                priority: { type: 'integer', minimum: 0 },
                weight: { type: 'number', exclusiveMinimum: 0 },
              },
            },
          },
          prices: {
            type: 'object',
            required: ['input', 'output'],
            additionalProperties: false,
            properties: Object.fromEntries(['input', 'cachedInput', 'cacheWrite', 'output', 'reasoning'].map((k) => [k, { type: 'number', minimum: 0 }])),
          },
          limits: limitsSchema,
          maxOutputTokens: {
            type: 'object',
            additionalProperties: false,
            properties: { default: { type: 'integer', minimum: 1 }, max: { type: 'integer', minimum: 1 }, overMax: { enum: ['reject', 'clamp'] } },
          },
          features: {
            type: 'object',
            additionalProperties: false,
            properties: {
              tools: { type: 'boolean' },
              jsonSchema: { type: 'boolean' },
              vision: { type: 'boolean' },
              temperature: { type: 'boolean' },
              reasoning: { type: 'boolean' },
              streamUsage: { type: 'boolean' },
              serverTools: { type: 'array', items: { type: 'string', minLength: 1 }, uniqueItems: true },
              unsupportedTools: { enum: ['drop', 'reject'] },
              unsupportedParameters: {
                type: 'object',
                additionalProperties: false,
                properties: {
                  policy: { enum: ['drop', 'reject'] },
                  drop: { type: 'array', items: { type: 'string', minLength: 1 }, uniqueItems: true },
                  reject: { type: 'array', items: { type: 'string', minLength: 1 }, uniqueItems: true },
                },
              },
            },
          },
          families: { type: 'array', minItems: 1, items: { type: 'string', minLength: 1 }, uniqueItems: true },
          ignoreParameters: { type: 'array', items: { type: 'string', minLength: 1 }, uniqueItems: true },
          contextTokens: { type: 'integer', minimum: 1 },
          created: { type: 'integer', minimum: 0 },
          ownedBy: { type: 'string' },
        },
      },
    },
  },
};

const validate = schemaCompiler('config', { allErrors: true, strict: true, discriminator: true }).compile(schema);

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
    try {
      raw = parseYaml(text) ?? {};
    } catch (err) {
      throw new ConfigError(`${path}: not valid YAML: ${(err as Error).message}`);
    }
    raw = interpolate(raw, env, '');
  }
  if (!validate(raw)) throw new ConfigError(`${source}:\n${formatErrors(validate.errors ?? [])}`);
  return resolve(raw as RawConfig, env, source, path);
}

type RawPluginEntry = string | { name: string; options?: Record<string, unknown>; module?: string };

interface RawConfig {
  server?: Partial<Config['server']>;
  dataDir?: string;
  adminToken?: string;
  allowAnonymous?: boolean;
  affinity?: { enabled?: boolean; header?: string; pinTtlSeconds?: number; maxPins?: number };
  tracing?: { endpoint: string; protocol?: TracingConfig['protocol']; headers?: Record<string, string>; serviceName?: string };
  admin?: { allowedOrigins?: string[] };
  log?: { level?: string };
  usage?: { journalFsync?: boolean };
  store?: { kind: 'sqlite' } | { kind: 'postgres'; url: string; poolSize?: number };
  limiter?: { kind: 'memory' } | { kind: 'redis'; url: string; failMode: 'open' | 'closed'; leaseMs?: number; timeoutMs?: number; prefix?: string };
  plugins?: RawPluginEntry[];
  /** Appended to `plugins` (or to the default list): a plugin of one's own without copying the defaults. */
  extraPlugins?: RawPluginEntry[];
  upstreams?: Record<string, UpstreamConfig>;
  models?: (Partial<Omit<ModelConfig, 'features' | 'families' | 'ignoreParameters' | 'channels' | 'prices'>> & { ignoreParameters?: string[]; id: string; channels?: Partial<ChannelConfig>[]; prices?: Partial<Prices>; features?: Partial<Omit<ModelFeatures, 'unsupportedParameters'>> & { unsupportedParameters?: Partial<ParameterPolicy> }; families?: string[] })[];
}

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
  const workers = env.SLUICE_WORKERS !== undefined ? Number(env.SLUICE_WORKERS) : raw.server?.workers ?? availableParallelism();
  if (!Number.isInteger(workers) || workers < 1 || workers > 256) throw new ConfigError(`SLUICE_WORKERS: "${env.SLUICE_WORKERS}" is not a number of workers (1 to 256)`);
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
    affinity: {
      enabled: raw.affinity?.enabled ?? true,
      ...(raw.affinity?.header && { header: raw.affinity.header.toLowerCase() }),
      pinTtlMs: (raw.affinity?.pinTtlSeconds ?? 3600) * 1000,
      maxPins: raw.affinity?.maxPins ?? 100_000,
    },
    admin: { allowedOrigins: raw.admin?.allowedOrigins ?? [] },
    log: { level: env.SLUICE_LOG_LEVEL || raw.log?.level || 'info' },
    usage: { journalFsync: raw.usage?.journalFsync ?? false },
    store: raw.store?.kind === 'postgres' ? { kind: 'postgres', url: raw.store.url, poolSize: raw.store.poolSize ?? 10 } : { kind: 'sqlite' },
    limiter:
      raw.limiter?.kind === 'redis'
        ? { kind: 'redis', url: raw.limiter.url, failMode: raw.limiter.failMode, leaseMs: raw.limiter.leaseMs ?? 30_000, timeoutMs: raw.limiter.timeoutMs ?? 1000, prefix: raw.limiter.prefix ?? 'sluice' }
        : { kind: 'memory' },
    plugins: pluginList(raw, source, path),
    upstreams,
    models,
  };
}

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

/** Replaces `${NAME}` and `${NAME:-fallback}` in every string value. */
function interpolate(value: unknown, env: NodeJS.ProcessEnv, at: string): unknown {
  if (typeof value === 'string') {
    return value.replace(/\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}/g, (_, name: string, fallback?: string) => {
      const found = env[name];
      if (found !== undefined && found !== '') return found;
      if (fallback !== undefined) return fallback;
      throw new ConfigError(`${at || '/'}: environment variable ${name} is not set`);
    });
  }
  if (Array.isArray(value)) return value.map((v, i) => interpolate(v, env, `${at}/${i}`));
  if (value && typeof value === 'object') {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, interpolate(v, env, `${at}/${k}`)]));
  }
  return value;
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
      if (e.keyword === 'discriminator') {
        const { tag, tagValue } = e.params as { tag: string; tagValue: unknown };
        // Only top-level sections (store, limiter) have kinds.
        const section = (schema.properties as Record<string, { oneOf?: { properties: Record<string, { const?: string }> }[] }>)[where.slice(1)];
        const kinds = (section?.oneOf ?? []).map((b) => `"${b.properties[tag]?.const}"`);
        return `  ${where}/${tag}: ${JSON.stringify(tagValue)} is not one of ${kinds.join(', ')}`;
      }
      return `  ${where}: ${e.message}`;
    })
    .join('\n');
}
