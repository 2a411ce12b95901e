/**
 * Boot: config → store → plugins → upstreams → pipeline → server, and the way back down.
 * Plugins are loaded by the names listed in config; the core imports none of them. What every
 * start does before it serves (the data dir, the journals, the store) is in boot.ts, which the
 * primary of worker threads (workers/primary.ts) shares.
 */
import { existsSync, readdirSync } from 'node:fs';
import { pathToFileURL } from 'node:url';
import type { Logger } from 'pino';
import { TooManyGuesses, adminAuthorizer, adminRoutes } from './admin/http.js';
import { AdminError, AdminService } from './admin/service.js';
import { Sessions } from './admin/sessions.js';
import { resolveAdminToken, type AdminCredential } from './admin/token.js';
import { GuessThrottle, SharedThrottleStorage } from './admin/throttle.js';
import { adoptJournals, createDemoKey, openStore, warnUnpricedBudgets, type Gateway } from './boot.js';
import { startWorkers } from './workers/primary.js';
import { ConfigError, loadConfig, type LoadOptions } from './config/load.js';
import type { Config, ModelConfig } from './config/types.js';
import type { BootContext, ClientFamily, Figure, GatewayView, JsonHandler, Plugin, PluginFactory, Upstream, UpstreamDialect, UpstreamFactory, UpstreamStatus } from './contracts.js';
import { CoolDowns } from './channels/cooldown.js';
import { ChannelTable } from './channels/table.js';
import { Pipeline, type Routing } from './pipeline.js';
import { Reloader, Retirements } from './reload.js';
import { startServer } from './server.js';
import { MemoryLimiter } from './limits/memory.js';
import { spendInUsage, type Limiter } from './limits/limiter.js';
import type { CachedStore } from './store/cache.js';
import { TrustedProxies } from './trusted-proxies.js';
import { warmTokenizer } from './tokens.js';

/** What the plugins listed in config contribute. */
export interface Loaded {
  plugins: Plugin[];
  /** Client families, in plugin order (their endpoints are routed in that order). */
  families: ClientFamily[];
  /** Upstream dialects by the family they speak. */
  dialects: Map<string, UpstreamDialect>;
  upstreams: Map<string, Upstream>;
  /** Extra HTTP routes by path prefix (the console). */
  routes: Record<string, JsonHandler>;
  /** Builds upstream `name` of `config` with the kinds the plugins provided: at start and on every reload. */
  makeUpstream(config: Config, name: string): Upstream;
  /** What stands wrong with how it runs (an open gateway): logged at start, shown in the console. */
  warnings: string[];
}

const pluginName = /^[a-z0-9-]+(\/[a-z0-9-]+)*$/;
const pluginsDir = new URL('../plugins/', import.meta.url);

/** The names `plugins:` can list: the folders under plugins/ with an index.js, one level of grouping deep (codecs/chat). */
function inTreePlugins(): string[] {
  const folders = (dir: URL) => readdirSync(dir, { withFileTypes: true }).filter((d) => d.isDirectory()).map((d) => d.name);
  return folders(pluginsDir)
    .flatMap((name) => (existsSync(new URL(`${name}/index.js`, pluginsDir)) ? [name] : folders(new URL(`${name}/`, pluginsDir)).map((inner) => `${name}/${inner}`)))
    .filter((name) => existsSync(new URL(`${name}/index.js`, pluginsDir)))
    .sort();
}

/**
 * Loads the plugins in config order, builds the upstream channels from their kinds, and records
 * on each model which families it serves and how. `gateway` is what plugins see of the running
 * gateway; the CLI, which serves nothing, gives none.
 */
export async function loadPlugins(
  config: Config,
  store: CachedStore,
  log: Logger,
  limiter: Limiter = new MemoryLimiter(spendInUsage(store)),
  gateway?: GatewayView,
): Promise<Loaded> {
  const plugins: Plugin[] = [];
  const families: ClientFamily[] = [];
  const dialects = new Map<string, UpstreamDialect>();
  const kinds = new Map<string, UpstreamFactory>();
  const routes: Record<string, JsonHandler> = {};
  const context = (name: string, options: Record<string, unknown>, current = config): BootContext => ({
    config: current,
    store,
    limiter,
    log: log.child({ plugin: name }),
    options,
    addFamily: (family) => {
      if (families.some((f) => f.name === family.name)) throw new ConfigError(`plugins: the ${family.name} family is added twice (by "${name}")`);
      families.push(family);
    },
    addDialect: (dialect) => {
      if (dialects.has(dialect.family)) throw new ConfigError(`plugins: a dialect of the ${dialect.family} family is added twice (by "${name}")`);
      dialects.set(dialect.family, dialect);
    },
    // A later plugin would otherwise take over every upstream of that kind without a word.
    addUpstreamKind: (kind, make) => {
      if (kinds.has(kind)) throw new ConfigError(`plugins: the upstream kind ${kind} is added twice (by "${name}")`);
      kinds.set(kind, make);
    },
    addRoute: (prefix, handler) => (routes[prefix] = handler),
    ...(gateway && { gateway }),
  });
  // Every name is checked before any plugin boots (and logs).
  for (const entry of config.plugins) {
    if (entry.module) continue;
    if (!pluginName.test(entry.name)) throw new Error(`plugins: "${entry.name}" is not a plugin name`);
    if (!existsSync(new URL(`${entry.name}/index.js`, pluginsDir))) {
      throw new ConfigError(`plugins: there is no plugin "${entry.name}" (there are: ${inTreePlugins().join(', ')}); one of your own is { name: ${entry.name}, module: ./its-file.js }`);
    }
  }
  for (const entry of config.plugins) {
    const url = entry.module ? pathToFileURL(entry.module) : new URL(`${entry.name}/index.js`, pluginsDir);
    let factory: unknown;
    try {
      factory = (await import(url.href)).default;
    } catch (err) {
      throw new Error(`plugins: cannot load "${entry.name}": ${(err as Error).message}`);
    }
    if (typeof factory !== 'function') throw new ConfigError(`plugins: "${entry.name}" (${entry.module ?? `plugins/${entry.name}`}) must export default definePlugin(...)`);
    try {
      plugins.push(await (factory as PluginFactory)(context(entry.name, entry.options)));
    } catch (err) {
      // What the boot context refused (a family added twice) names the plugin already.
      if (err instanceof ConfigError) throw err;
      throw new Error(`plugins: "${entry.name}" failed at boot: ${(err as Error).message}`);
    }
  }

  const warnings = checkAuthentication(config, plugins, families);
  for (const warning of warnings) log.warn(warning);

  const makeUpstream = (current: Config, name: string): Upstream => {
    const { kind, ...options } = current.upstreams[name]!;
    const make = kinds.get(kind);
    if (!make) throw new Error(`upstreams.${name}.kind: no loaded plugin provides "${kind}" (available: ${[...kinds.keys()].join(', ') || 'none'})`);
    try {
      return make(name, options, context(`upstream ${name}`, options, current));
    } catch (err) {
      const message = (err as Error).message;
      // The kinds' own option checks name the upstream and the option already (upstreams.NAME.baseUrl: …).
      throw new Error(message.startsWith(`upstreams.${name}.`) ? message : `upstreams.${name} (kind ${kind}): ${message}`);
    }
  };
  const upstreams = new Map(Object.keys(config.upstreams).map((name) => [name, makeUpstream(config, name)]));
  resolveModels(config.models, upstreams, families, dialects);
  return { plugins, families, dialects, upstreams, routes, makeUpstream, warnings };
}

/**
 * A plugin list without an authenticating plugin would serve every model to anyone who reaches the
 * port: refused, unless the config asks for exactly that (`allowAnonymous: true`). Returns the
 * warnings that then stand for as long as it runs: logged at every start, shown in the console.
 */
function checkAuthentication(config: Config, plugins: Plugin[], families: ClientFamily[]): string[] {
  if (families.length === 0 || plugins.some((p) => p.authenticates)) return [];
  if (!config.allowAnonymous) {
    throw new ConfigError(
      'plugins: no plugin authenticates callers (the list has no "auth"), so every model route would be open to anyone. Add auth to plugins, or set allowAnonymous: true to serve without keys on purpose',
    );
  }
  return ['allowAnonymous: true and no authenticating plugin: anyone who reaches this port may call every model, with no key, limits or budgets per key'];
}

/**
 * Records on each model which families it serves and how. Throws on what would start and then
 * fail every call, or leave a model off endpoints without a word: an upstream whose answers no
 * loaded dialect reads, a model whose channels speak different families, a family name in a
 * model's `families` that no plugin loaded (a typo).
 */
export function resolveModels(models: ModelConfig[], upstreams: Map<string, Upstream>, families: ClientFamily[], dialects: Map<string, UpstreamDialect>): void {
  for (const upstream of upstreams.values()) {
    if (dialects.has(upstream.family)) continue;
    const codec = `codecs/${upstream.family}`;
    const add = existsSync(new URL(`${codec}/index.js`, pluginsDir)) ? `add ${codec} to plugins` : `add the plugin that reads the ${upstream.family} family to plugins`;
    throw new ConfigError(`upstreams.${upstream.name} speaks the ${upstream.family} family, but no loaded plugin reads its answers: ${add}`);
  }
  const loaded = families.map((f) => f.name);
  for (const model of models) {
    const unknown = model.offeredFamilies?.find((f) => !loaded.includes(f));
    if (unknown !== undefined) throw new ConfigError(`models.${model.id}.families: "${unknown}" is not a loaded family (loaded: ${loaded.join(', ') || 'none'})`);
    const family = upstreams.get(model.upstream)!.family;
    const other = model.channels.find((c) => upstreams.get(c.upstream)!.family !== family);
    if (other) throw new Error(`models.${model.id}.channels: every channel must speak one family (${model.upstream} speaks ${family}, ${other.upstream} ${upstreams.get(other.upstream)!.family})`);
    resolveFamilies(model, family, families);
  }
}

function resolveFamilies(model: ModelConfig, upstreamFamily: string, families: ClientFamily[]): void {
  for (const family of families) {
    if (model.offeredFamilies && !model.offeredFamilies.includes(family.name)) continue;
    model.families[family.name] = family.name === upstreamFamily ? 'native' : (family.translationMode?.(upstreamFamily) ?? 'translated');
  }
}

/** The configured limiter: this process's memory, or Redis shared by every instance. */
export async function createLimiter(config: Config, store: CachedStore, log: Logger): Promise<Limiter> {
  const spend = spendInUsage(store);
  if (config.limiter.kind === 'memory') {
    // A shared store is how several instances run; each would then hold limits of its own.
    if (config.store.kind === 'postgres') {
      log.warn(
        'limits, budgets and concurrency are counted in this process alone (limiter: memory) while the store is shared (postgres): with several instances each lets through the whole limit. Set limiter: { kind: redis, url: … } to count them across instances',
      );
    }
    return new MemoryLimiter(spend);
  }
  const { kind: _, ...options } = config.limiter;
  // Loaded only when configured, like the PostgreSQL store.
  const { RedisLimiter } = await import('./limits/redis.js');
  return new RedisLimiter({ ...options, log: log.child({ component: 'limiter' }) }, spend);
}

export function adminService(store: CachedStore, config: Config, loaded: Loaded): AdminService {
  return new AdminService(store, config.models, channelInfo(config, loaded.upstreams), loaded.families.map((f) => f.name));
}

const channelInfo = (config: Config, upstreams: Map<string, Upstream>) =>
  [...upstreams.values()].map((u) => ({ name: u.name, kind: config.upstreams[u.name]!.kind, family: u.family }));

/** The gather topic on which every worker thread writes the usage records it has queued (Store.settle). */
const USAGE_FLUSH = 'usage:flush';
/**
 * How long a usage read waits for the other threads' writes. It promises every record made before
 * it, and the store's commit behind a thread's answer (an fsync, a lock held elsewhere) can take
 * seconds; a gather's default 3 s suits a metrics scrape. (A loaded CI run once read two records
 * short; the primary now logs a gather that goes on without a thread.)
 */
const USAGE_FLUSH_TIMEOUT_MS = 15_000;
/** How long after start the tokenizer loads if no estimate has loaded it (see tokens.ts). */
const TOKENIZER_WARM_DELAY_MS = 1000;

/** What a worker thread's gateway gets from the primary thread (src/workers/). */
export interface ThreadSetup {
  /** Names the thread's usage journal, `usage-wN.journal`, which a replacement thread takes over. */
  index: number;
  admin: AdminCredential;
  /** The primary's in-memory limiter, shared by every thread; absent with Redis (each thread connects). */
  limiter?: Limiter;
  /** Listen on a port the other threads listen on too. */
  port: number;
  /** This thread reloaded its config through the admin API: the others must too. */
  reloaded(via: string): void;
  /** Every thread's answer to `topic`, through the primary (`GatewayView.gather`); a silent thread is waited for `timeoutMs` (3 s by default). */
  gather(topic: string, timeoutMs?: number): Promise<unknown[]>;
}

/**
 * `source` is how `config` was loaded: a reload loads it the same way again. With
 * `server.workers` above 1 this thread starts the worker threads (src/workers/) and serves none
 * itself; each of them calls this again with its `thread` setup.
 */
export async function startGateway(config: Config, log: Logger, source: LoadOptions = {}, thread?: ThreadSetup): Promise<Gateway> {
  if (config.server.workers > 1 && !thread) return startWorkers(config, log, source);
  if (!thread) await adoptJournals(config, ['usage.journal'], log);
  const store = await openStore(config, { owner: true, fsync: config.usage.journalFsync, log, ...(thread && { file: `usage-w${thread.index}.journal` }) });
  let loaded: Loaded;
  let admin: AdminCredential;
  let limiter: Limiter;
  // Plugins see the pipeline through the view once it exists (they are loaded before it).
  let running: Pipeline | undefined;
  const answers = new Map<string, () => unknown>();
  const answer = async (topic: string) => answers.get(topic)?.();
  const figures: Figure[] = [];
  try {
    admin = thread?.admin ?? (await resolveAdminToken(config.dataDir, config.adminToken, store, config.store.kind !== 'sqlite'));
    limiter = thread?.limiter ?? (await createLimiter(config, store, log));
    const authorizer = adminAuthorizer(new Sessions(admin.digest, store), new GuessThrottle({}, new SharedThrottleStorage(store)));
    const proxies = new TrustedProxies(config.server.trustedProxies);
    const view: GatewayView = {
      adminTokenDigest: admin.digest,
      authorizeAdmin: async (req) => {
        try {
          await authorizer.authorize(req, proxies.view(req.remoteAddress, req.headers));
          return undefined;
        } catch (err) {
          if (!(err instanceof AdminError)) throw err;
          const headers = err instanceof TooManyGuesses ? { 'retry-after': String(err.waitSeconds) } : undefined;
          return { status: err.status, body: { error: { message: err.message, code: err.code } }, ...(headers && { headers }) };
        }
      },
      thread: thread?.index,
      inFlight: () => running?.inFlight.size ?? 0,
      upstreams: () => (running ? upstreamStatus(running.currentRouting()) : []),
      usageQueued: () => store.usageQueued(),
      gather: async (topic) => (thread ? thread.gather(topic) : [await answer(topic)].filter((a) => a !== undefined)),
      answer: (topic, answering) => void answers.set(topic, answering),
      addFigure: (figure) => {
        if (figures.some((f) => f.name === figure.name)) throw new Error(`the figure ${figure.name} is reported twice`);
        figures.push(figure);
      },
      figures: () => figures,
    };
    loaded = await loadPlugins(config, store, log, limiter, view);
  } catch (err) {
    await store.close();
    throw err;
  }
  const { plugins, families, dialects, upstreams } = loaded;

  const retirements = new Retirements(log);
  const models = new Map<string, ModelConfig>(config.models.map((m) => [m.id, m]));
  const pipeline = new Pipeline({
    plugins: [...plugins, retirements.plugin],
    // Cool-downs reach the other threads and instances through the limiter, when it is shared;
    // affinity pins reach the other instances through Redis.
    routing: {
      models,
      upstreams,
      channels: new ChannelTable(config.models, config.upstreams, upstreams, undefined, new CoolDowns(limiter.coolDowns), config.affinity, limiter.pins),
    },
    dialects,
    log,
    maxUpstreamBodyBytes: config.server.maxUpstreamBodyBytes,
    maxEventBytes: config.server.maxEventBytes,
  });
  running = pipeline;
  const service = adminService(store, config, loaded);
  service.upstreamReport = () => pipeline.currentRouting().channels.report();
  if (thread) {
    // A usage read served by one thread sees the records the others still hold in their batches.
    answers.set(USAGE_FLUSH, () => store.settle().then(() => true));
    service.settleUsage = () => thread.gather(USAGE_FLUSH, USAGE_FLUSH_TIMEOUT_MS);
  }
  const reloader = new Reloader({
    load: () => loadConfig(source),
    config,
    upstreams,
    makeUpstream: loaded.makeUpstream,
    resolveModels: (models, upstreams) => resolveModels(models, upstreams, families, dialects),
    pipeline,
    retirements,
    applied: (next, upstreams) => service.reconfigure(next.models, channelInfo(next, upstreams)),
    log,
  });
  const release = async () => {
    try {
      for (const plugin of plugins) await plugin.close?.();
      await reloader.closeAll();
      // A thread's limiter belongs to the primary.
      if (!thread?.limiter) await limiter.close?.();
    } finally {
      await store.close();
    }
  };
  let server: Awaited<ReturnType<typeof startServer>>;
  try {
    server = await startServer({
      host: config.server.host,
      port: thread?.port ?? config.server.port,
      sharedPort: thread !== undefined,
      limits: config.server,
      families,
      pipeline,
      jsonRoutes: {
        ...loaded.routes,
        '/admin/': adminRoutes(service, new Sessions(admin.digest, store), {
          proxies: new TrustedProxies(config.server.trustedProxies),
          allowedOrigins: config.admin.allowedOrigins,
          throttle: new GuessThrottle({}, new SharedThrottleStorage(store)),
          warnings: loaded.warnings,
          reload: (actor) => {
            const outcome = reloader.reload(actor);
            if (outcome.applied) thread?.reloaded(actor);
            return outcome;
          },
        }),
      },
      log,
    });
  } catch (err) {
    await release();
    throw err;
  }

  // Only once listening: a start that fails must not use up the one-time demo key.
  const firstStart = thread ? undefined : await createDemoKey(store, families);
  if (!thread) await warnUnpricedBudgets(store, config.models, log);
  // The tokenizer's tables load on the first estimate; failing that, a moment after start, so
  // neither the start nor the first request that needs one waits for them.
  setTimeout(warmTokenizer, TOKENIZER_WARM_DELAY_MS).unref();

  let closing: Promise<void> | undefined;
  return {
    port: server.port,
    store,
    adminToken: admin.token,
    admin,
    families: families.map((f) => f.name),
    firstStart,
    answer,
    reload: async (via) => {
      const outcome = reloader.reload(via);
      // A reload by signal is audited like one through the admin API (with workers, by the primary thread).
      if (outcome.applied && !thread) {
        await service.audit(`signal:${via}`, 'config.reload', null, JSON.stringify(outcome.changes)).catch((err) => log.error({ err }, 'auditing a reload failed'));
      }
      return outcome;
    },
    shutdown: (drainMs = config.server.shutdownTimeoutMs) =>
      (closing ??= (async () => {
        await server.drain(drainMs);
        await release();
      })()),
  };
}

/** Each upstream's pool and the breaker state of its model channels, now. */
function upstreamStatus(routing: Routing): UpstreamStatus[] {
  return routing.channels.report().map((u) => ({
    name: u.name,
    pool: routing.upstreams.get(u.name)?.stats?.(),
    channels: u.channels.map((c) => ({
      model: c.model,
      channel: c.channel,
      state: c.state,
      coolDownSeconds: c.coolingUntil ? Math.max(0, Date.parse(c.coolingUntil) - Date.now()) / 1000 : 0,
    })),
  }));
}

