/**
 * The config's contract: the shape every other module reads (`Config`, `ModelConfig`, …) once the
 * loader (load.ts) has validated the file and filled in every default, and the shape of the file as
 * written (`RawConfig`). Types only, so any module may import them without importing the loader.
 */
import type { RequestCaps } from '../request-caps.js';
import type { Limits } from '../store/store.js';
import type { BreakerPolicy, RetryPolicy } from '../channels/policy.js';

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
  /**
   * How a request picks among the channels of one priority: by `weight` (the default), the
   * lowest moving average of time to the upstream's answer, or the fewest calls under way.
   */
  strategy: 'weighted' | 'least-latency' | 'least-busy';
  /** Answers to identical requests are replayed from the response cache (plugins/response-cache); absent: not for every group. */
  responseCache?: { ttlMs: number };
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
    /** Every answer carries `x-sluice-overhead-ms`: the time spent in the gateway, the upstream's left out. */
    overheadHeader: boolean;
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
  /** Where the exact response cache keeps answers, how many, and the groups it serves on every model. */
  responseCache: ResponseCacheConfig;
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
  /** MCP servers behind `/mcp` (plugins/mcp); absent: none. Read at start only. */
  mcp?: McpConfig;
}

/** An MCP server the gateway starts itself and speaks to over its stdin and stdout. */
export interface McpStdioServerConfig {
  transport: 'stdio';
  command: string;
  args: string[];
  /** Added to a minimal environment (PATH, HOME and the like): the gateway's own is not passed on. */
  env: Record<string, string>;
  cwd?: string;
  /** How long one call to it may take. */
  timeoutMs: number;
}

/** An MCP server reached over the streamable HTTP transport. */
export interface McpHttpServerConfig {
  transport: 'http';
  url: string;
  headers: Record<string, string>;
  timeoutMs: number;
}

export type McpServerConfig = McpStdioServerConfig | McpHttpServerConfig;

export interface McpConfig {
  servers: Record<string, McpServerConfig>;
  /** Largest `tools/call` arguments, as JSON bytes. */
  maxArgumentBytes: number;
  /** Largest tool result passed back, as JSON bytes. */
  maxResultBytes: number;
  /** A client session unused this long is closed, with its upstream sessions. */
  sessionIdleMs: number;
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

export interface ResponseCacheConfig {
  /** `redis`: shared by every instance, on the Redis of `limiter` (which must be `kind: redis`). */
  store: 'memory' | 'redis';
  /** Bytes of stored answers at most (per thread in memory, in all in Redis); the least recently used go first. */
  maxBytes: number;
  /** A larger answer is not stored. */
  maxEntryBytes: number;
  /** How long an answer is replayed, unless its model sets its own. */
  ttlMs: number;
  /** Groups whose requests are cached on every model, as if each model had `responseCache: true`. */
  groups: string[];
}

export interface TracingConfig {
  /** The receiver's traces URL, e.g. http://127.0.0.1:4318/v1/traces. */
  endpoint: string;
  protocol: 'http/protobuf' | 'http/json';
  headers: Record<string, string>;
  serviceName: string;
}

/** A plugin as `plugins` and `extraPlugins` list it: a name under plugins/, or a name with a module and options. */
export type RawPluginEntry = string | { name: string; options?: Record<string, unknown>; module?: string };

/** The config file as written, after `${ENV}` interpolation and validation, before defaults. */
export interface RawConfig {
  server?: Partial<Config['server']>;
  dataDir?: string;
  adminToken?: string;
  allowAnonymous?: boolean;
  affinity?: { enabled?: boolean; header?: string; pinTtlSeconds?: number; maxPins?: number };
  tracing?: { endpoint: string; protocol?: TracingConfig['protocol']; headers?: Record<string, string>; serviceName?: string };
  responseCache?: { store?: ResponseCacheConfig['store']; maxBytes?: number; maxEntryBytes?: number; ttlSeconds?: number; groups?: string[] };
  admin?: { allowedOrigins?: string[] };
  log?: { level?: string };
  usage?: { journalFsync?: boolean };
  store?: { kind: 'sqlite' } | { kind: 'postgres'; url: string; poolSize?: number };
  limiter?: { kind: 'memory' } | { kind: 'redis'; url: string; failMode: 'open' | 'closed'; leaseMs?: number; timeoutMs?: number; prefix?: string };
  plugins?: RawPluginEntry[];
  /** Appended to `plugins` (or to the default list): a plugin of one's own without copying the defaults. */
  extraPlugins?: RawPluginEntry[];
  upstreams?: Record<string, UpstreamConfig>;
  mcp?: {
    servers: Record<
      string,
      | { transport: 'stdio'; command: string; args?: string[]; env?: Record<string, string>; cwd?: string; timeoutSeconds?: number }
      | { transport: 'http'; url: string; headers?: Record<string, string>; timeoutSeconds?: number }
    >;
    maxArgumentBytes?: number;
    maxResultBytes?: number;
    sessionIdleSeconds?: number;
  };
  models?: (Partial<Omit<ModelConfig, 'features' | 'families' | 'ignoreParameters' | 'channels' | 'prices' | 'responseCache'>> & {
      responseCache?: boolean | { ttlSeconds?: number }; ignoreParameters?: string[]; id: string; channels?: Partial<ChannelConfig>[]; prices?: Partial<Prices>; features?: Partial<Omit<ModelFeatures, 'unsupportedParameters'>> & { unsupportedParameters?: Partial<ParameterPolicy> }; families?: string[] })[];
}
