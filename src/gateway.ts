/**
 * Boot: config → store → plugins → upstreams → pipeline → server, and the way back down.
 * Plugins are loaded by the names listed in config; the core imports none of them.
 */
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import type { Logger } from 'pino';
import { adminRoutes } from './admin/http.js';
import { AdminService } from './admin/service.js';
import { resolveAdminToken } from './admin/token.js';
import type { Config, ModelConfig } from './config.js';
import type { BootContext, Codec, Plugin, PluginFactory, Upstream, UpstreamFactory } from './contracts.js';
import { Pipeline } from './pipeline.js';
import { startServer } from './server.js';
import { SqliteStore } from './store/sqlite.js';
import type { Store } from './store/store.js';

export interface LoadedPlugins {
  plugins: Plugin[];
  codecs: Codec[];
  upstreamKinds: Map<string, UpstreamFactory>;
}

const pluginName = /^[a-z0-9-]+(\/[a-z0-9-]+)*$/;

export async function loadPlugins(config: Config, store: Store, log: Logger): Promise<LoadedPlugins> {
  const loaded: LoadedPlugins = { plugins: [], codecs: [], upstreamKinds: new Map() };
  for (const entry of config.plugins) {
    if (!pluginName.test(entry.name)) throw new Error(`plugins: "${entry.name}" is not a plugin name`);
    let factory: PluginFactory;
    try {
      factory = (await import(new URL(`../plugins/${entry.name}/index.js`, import.meta.url).href)).default;
    } catch (err) {
      throw new Error(`plugins: cannot load "${entry.name}": ${(err as Error).message}`);
    }
    const ctx: BootContext = {
      config,
      store,
      log: log.child({ plugin: entry.name }),
      options: entry.options,
      addCodec: (codec) => loaded.codecs.push(codec),
      addUpstreamKind: (kind, make) => loaded.upstreamKinds.set(kind, make),
    };
    loaded.plugins.push(await factory(ctx));
  }
  return loaded;
}

export function openStore(dataDir: string): Store {
  mkdirSync(dataDir, { recursive: true, mode: 0o700 });
  return new SqliteStore(join(dataDir, 'sluice.db'));
}

/** Model ids and families an admin may grant. */
export function adminService(store: Store, config: Config, codecs: Codec[]): AdminService {
  return new AdminService(
    store,
    config.models.map((m) => m.id),
    codecs.map((c) => c.family),
  );
}

export interface Gateway {
  port: number;
  store: Store;
  adminToken: string;
  /** Set only on the first start: shown once, never stored. */
  firstStart?: { adminTokenGenerated: boolean; demoKey: string };
  shutdown(): Promise<void>;
}

export async function startGateway(config: Config, log: Logger): Promise<Gateway> {
  const store = openStore(config.dataDir);
  const { token: adminToken, generated } = resolveAdminToken(config.dataDir, config.adminToken);
  const { plugins, codecs, upstreamKinds } = await loadPlugins(config, store, log);

  const upstreams = new Map<string, Upstream>();
  for (const [name, upstreamConfig] of Object.entries(config.upstreams)) {
    const make = upstreamKinds.get(upstreamConfig.kind);
    if (!make) {
      throw new Error(
        `upstreams.${name}.kind: no loaded plugin provides "${upstreamConfig.kind}" (available: ${[...upstreamKinds.keys()].join(', ') || 'none'})`,
      );
    }
    const { kind: _kind, ...options } = upstreamConfig;
    upstreams.set(name, make(name, options, { config, store, log: log.child({ upstream: name }), options, addCodec() {}, addUpstreamKind() {} }));
  }

  for (const model of config.models) {
    const upstreamFamily = upstreams.get(model.upstream)!.family;
    for (const codec of codecs) {
      if (model.offeredFamilies && !model.offeredFamilies.includes(codec.family)) continue;
      if (codec.family === upstreamFamily) model.families[codec.family] = 'native';
      else if (codecs.some((c) => c.family === upstreamFamily)) {
        model.families[codec.family] = codec.translationMode?.(upstreamFamily) ?? 'translated';
      }
    }
  }

  let firstStart: Gateway['firstStart'];
  if (store.listGroups().length === 0) {
    store.createGroup({ name: 'default', models: ['*'], families: codecs.map((c) => c.family) });
    const { secret } = store.createKey({ group: 'default', name: 'demo' });
    firstStart = { adminTokenGenerated: generated, demoKey: secret };
  }

  const models = new Map<string, ModelConfig>(config.models.map((m) => [m.id, m]));
  const pipeline = new Pipeline(plugins, models, upstreams, new Map(codecs.map((c) => [c.family, c])), (err, ex) => log.error({ err, req: ex.id }, 'done phase failed'));
  const server = await startServer({
    host: config.server.host,
    port: config.server.port,
    maxBodyBytes: config.server.maxBodyBytes,
    codecs,
    pipeline,
    jsonRoutes: { '/admin/': adminRoutes(adminService(store, config, codecs), adminToken) },
    log,
  });

  let closing: Promise<void> | undefined;
  return {
    port: server.port,
    store,
    adminToken,
    firstStart,
    shutdown: () =>
      (closing ??= (async () => {
        await server.drain(config.server.shutdownTimeoutMs);
        for (const plugin of plugins) await plugin.close?.();
        await Promise.all([...upstreams.values()].map((u) => u.close?.()));
        store.close();
      })()),
  };
}
