/**
 * Boot: config → store → plugins → upstreams → pipeline → server, and the way back down.
 * Plugins are loaded by the names listed in config; the core imports none of them.
 */
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import type { Logger } from 'pino';
import { adminRoutes } from './admin/http.js';
import { AdminService } from './admin/service.js';
import { Sessions } from './admin/sessions.js';
import { resolveAdminToken } from './admin/token.js';
import { loadConfig, type Config, type LoadOptions, type ModelConfig } from './config.js';
import type { BootContext, ClientFamily, JsonHandler, Plugin, PluginFactory, Upstream, UpstreamDialect, UpstreamFactory } from './contracts.js';
import { ChannelTable } from './channels/table.js';
import { Pipeline } from './pipeline.js';
import { Reloader, Retirements, type ReloadOutcome } from './reload.js';
import { startServer } from './server.js';
import { MemoryLimiter } from './limiter-memory.js';
import { spendInUsage } from './limiter.js';
import { CachedStore } from './store/cache.js';
import { JournaledStore, type JournalOptions } from './store/journal.js';
import { SqliteStore } from './store/sqlite.js';
import { TrustedProxies } from './trusted-proxies.js';

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
}

const pluginName = /^[a-z0-9-]+(\/[a-z0-9-]+)*$/;

/**
 * Loads the plugins in config order, builds the upstream channels from their kinds, and records
 * on each model which families it serves and how.
 */
export async function loadPlugins(config: Config, store: CachedStore, log: Logger): Promise<Loaded> {
  const plugins: Plugin[] = [];
  const families: ClientFamily[] = [];
  const dialects = new Map<string, UpstreamDialect>();
  const kinds = new Map<string, UpstreamFactory>();
  const routes: Record<string, JsonHandler> = {};
  const limiter = new MemoryLimiter(spendInUsage(store));
  const context = (name: string, options: Record<string, unknown>, current = config): BootContext => ({
    config: current,
    store,
    limiter,
    log: log.child({ plugin: name }),
    options,
    addFamily: (family) => {
      if (families.some((f) => f.name === family.name)) throw new Error(`plugins: the ${family.name} family is added twice (by "${name}")`);
      families.push(family);
    },
    addDialect: (dialect) => {
      if (dialects.has(dialect.family)) throw new Error(`plugins: a dialect of the ${dialect.family} family is added twice (by "${name}")`);
      dialects.set(dialect.family, dialect);
    },
    addUpstreamKind: (kind, make) => kinds.set(kind, make),
    addRoute: (prefix, handler) => (routes[prefix] = handler),
  });
  for (const entry of config.plugins) {
    if (!entry.module && !pluginName.test(entry.name)) throw new Error(`plugins: "${entry.name}" is not a plugin name`);
    const url = entry.module ? pathToFileURL(entry.module) : new URL(`../plugins/${entry.name}/index.js`, import.meta.url);
    let factory: PluginFactory;
    try {
      factory = (await import(url.href)).default;
    } catch (err) {
      throw new Error(`plugins: cannot load "${entry.name}": ${(err as Error).message}`);
    }
    plugins.push(await factory(context(entry.name, entry.options)));
  }

  const makeUpstream = (current: Config, name: string): Upstream => {
    const { kind, ...options } = current.upstreams[name]!;
    const make = kinds.get(kind);
    if (!make) throw new Error(`upstreams.${name}.kind: no loaded plugin provides "${kind}" (available: ${[...kinds.keys()].join(', ') || 'none'})`);
    return make(name, options, context(`upstream ${name}`, options, current));
  };
  const upstreams = new Map(Object.keys(config.upstreams).map((name) => [name, makeUpstream(config, name)]));
  resolveModels(config.models, upstreams, families, dialects);
  return { plugins, families, dialects, upstreams, routes, makeUpstream };
}

/** Records on each model which families it serves and how; throws when its channels speak different families. */
export function resolveModels(models: ModelConfig[], upstreams: Map<string, Upstream>, families: ClientFamily[], dialects: Map<string, UpstreamDialect>): void {
  for (const model of models) {
    const family = upstreams.get(model.upstream)!.family;
    const other = model.channels.find((c) => upstreams.get(c.upstream)!.family !== family);
    if (other) throw new Error(`models.${model.id}.channels: every channel must speak one family (${model.upstream} speaks ${family}, ${other.upstream} ${upstreams.get(other.upstream)!.family})`);
    // Without a dialect for the upstream's family the model is offered on no family.
    if (dialects.has(family)) resolveFamilies(model, family, families);
  }
}

function resolveFamilies(model: ModelConfig, upstreamFamily: string, families: ClientFamily[]): void {
  for (const family of families) {
    if (model.offeredFamilies && !model.offeredFamilies.includes(family.name)) continue;
    model.families[family.name] = family.name === upstreamFamily ? 'native' : (family.translationMode?.(upstreamFamily) ?? 'translated');
  }
}

/**
 * The data dir's store behind its usage journal and the cache layer; only the gateway owns the
 * journal, the CLI reads it.
 */
export async function openStore(dataDir: string, journal: JournalOptions = { owner: false }): Promise<CachedStore> {
  mkdirSync(dataDir, { recursive: true, mode: 0o700 });
  return new CachedStore(await JournaledStore.open(new SqliteStore(join(dataDir, 'sluice.db')), join(dataDir, 'usage.journal'), journal));
}

export function adminService(store: CachedStore, config: Config, loaded: Loaded): AdminService {
  return new AdminService(store, config.models, channelInfo(config, loaded.upstreams), loaded.families.map((f) => f.name));
}

const channelInfo = (config: Config, upstreams: Map<string, Upstream>) =>
  [...upstreams.values()].map((u) => ({ name: u.name, kind: config.upstreams[u.name]!.kind, family: u.family }));

export interface Gateway {
  port: number;
  store: CachedStore;
  adminToken: string;
  /** Set only on the first start: shown once, never stored. */
  firstStart?: { demoKey: string };
  /** Reads the config file again and applies it (SIGHUP, POST /admin/reload); `via` names who asked. */
  reload(via: string): ReloadOutcome;
  shutdown(): Promise<void>;
}

/** `source` is how `config` was loaded: a reload loads it the same way again. */
export async function startGateway(config: Config, log: Logger, source: LoadOptions = {}): Promise<Gateway> {
  const store = await openStore(config.dataDir, { owner: true, fsync: config.usage.journalFsync, log });
  let loaded: Loaded;
  let adminToken: string;
  try {
    ({ token: adminToken } = resolveAdminToken(config.dataDir, config.adminToken));
    loaded = await loadPlugins(config, store, log);
  } catch (err) {
    await store.close();
    throw err;
  }
  const { plugins, families, dialects, upstreams } = loaded;

  const retirements = new Retirements(log);
  const models = new Map<string, ModelConfig>(config.models.map((m) => [m.id, m]));
  const pipeline = new Pipeline({
    plugins: [...plugins, retirements.plugin],
    routing: { models, upstreams, channels: new ChannelTable(config.models, config.upstreams, upstreams) },
    dialects,
    log,
    maxUpstreamBodyBytes: config.server.maxUpstreamBodyBytes,
    maxEventBytes: config.server.maxEventBytes,
  });
  const admin = adminService(store, config, loaded);
  admin.upstreamReport = () => pipeline.currentRouting().channels.report();
  const reloader = new Reloader({
    load: () => loadConfig(source),
    config,
    upstreams,
    makeUpstream: loaded.makeUpstream,
    resolveModels: (models, upstreams) => resolveModels(models, upstreams, families, dialects),
    pipeline,
    retirements,
    applied: (next, upstreams) => admin.reconfigure(next.models, channelInfo(next, upstreams)),
    log,
  });
  const release = async () => {
    try {
      for (const plugin of plugins) await plugin.close?.();
      await reloader.closeAll();
    } finally {
      await store.close();
    }
  };
  let server: Awaited<ReturnType<typeof startServer>>;
  try {
    server = await startServer({
      host: config.server.host,
      port: config.server.port,
      limits: config.server,
      families,
      pipeline,
      jsonRoutes: {
        ...loaded.routes,
        '/admin/': adminRoutes(admin, new Sessions(adminToken), {
          proxies: new TrustedProxies(config.server.trustedProxies),
          allowedOrigins: config.admin.allowedOrigins,
          reload: (actor) => reloader.reload(actor),
        }),
      },
      log,
    });
  } catch (err) {
    await release();
    throw err;
  }

  // Only once listening: a start that fails must not use up the one-time demo key.
  let firstStart: Gateway['firstStart'];
  if ((await store.listGroups()).length === 0) {
    await store.createGroup({ name: 'default', models: ['*'], families: families.map((f) => f.name) });
    const { secret } = await store.createKey({ group: 'default', name: 'demo' });
    firstStart = { demoKey: secret };
  }

  let closing: Promise<void> | undefined;
  return {
    port: server.port,
    store,
    adminToken,
    firstStart,
    reload: (via) => {
      const outcome = reloader.reload(via);
      // A reload by signal is audited like one through the admin API.
      if (outcome.applied) {
        admin.audit(`signal:${via}`, 'config.reload', null, JSON.stringify(outcome.changes)).catch((err) => log.error({ err }, 'auditing a reload failed'));
      }
      return outcome;
    },
    shutdown: () =>
      (closing ??= (async () => {
        await server.drain(config.server.shutdownTimeoutMs);
        await release();
      })()),
  };
}
