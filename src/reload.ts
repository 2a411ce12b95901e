/**
 * Config reload without a restart (`SIGHUP`, `POST /admin/reload`): the config file is read and
 * checked again exactly as at start, new upstreams are built with the kinds loaded at start, and
 * the pipeline's routing is swapped whole. Exchanges under way finish on the routing they began
 * with; an upstream that is replaced or removed is closed once every exchange that could still use
 * it is done. Settings read only at start are not reloaded: a file that changes them is refused.
 */
import { isDeepStrictEqual } from 'node:util';
import type { Logger } from 'pino';
import { ChannelTable } from './channels/table.js';
import type { Config, ModelConfig } from './config/types.js';
import type { Plugin, Upstream } from './contracts.js';
import type { ExchangeView } from './contracts.js';
import type { Pipeline } from './pipeline.js';

/** Names added, removed and changed between two configs. */
export interface Changes {
  added: string[];
  removed: string[];
  changed: string[];
}

export type ReloadOutcome = { applied: true; changes: { upstreams: Changes; models: Changes } } | { applied: false; reasons: string[] };

/**
 * Sections the running gateway read once at start: the listener, the store, the limiter, the
 * plugins, the logger, the response cache's store, and the MCP servers (a reload never starts a
 * command).
 */
const restartOnly = ['server', 'dataDir', 'adminToken', 'admin', 'log', 'usage', 'store', 'limiter', 'plugins', 'responseCache', 'mcp'] as const;

export interface ReloaderOptions {
  /** Reads and checks the config file again, as at start; throws the start-up message. */
  load(): Config;
  /** The config and upstreams running now. */
  config: Config;
  upstreams: Map<string, Upstream>;
  /** Builds upstream `name` of a config; throws on bad options, as at start. */
  makeUpstream(config: Config, name: string): Upstream;
  /** Resolves the models' families against their upstreams; throws as at start. */
  resolveModels(models: ModelConfig[], upstreams: Map<string, Upstream>): void;
  pipeline: Pipeline;
  /** Where replaced upstreams wait to be closed; its plugin must be in the pipeline's. */
  retirements: Retirements;
  /** Called after the pipeline switched, to show the new models and upstreams (the admin API). */
  applied(config: Config, upstreams: Map<string, Upstream>): void;
  log: Logger;
}

/**
 * Upstreams taken out of the routing, each closed once every exchange that could still call it is
 * done. Its plugin runs in the done phase, so it sees every exchange end.
 */
export class Retirements {
  private readonly pending = new Set<{ upstreams: Upstream[]; users: Set<ExchangeView> }>();

  readonly plugin: Plugin = {
    name: 'reload',
    done: (ex) => {
      for (const retirement of this.pending) {
        if (retirement.users.delete(ex) && retirement.users.size === 0) {
          this.pending.delete(retirement);
          closeUpstreams(retirement.upstreams, this.log, 'retired upstream closed');
        }
      }
    },
  };

  constructor(private readonly log: Logger) {}

  /** Closes `upstreams` once every one of `users` (the exchanges in flight when they left the routing) is done. */
  retire(upstreams: Upstream[], users: Set<ExchangeView>): void {
    if (users.size === 0) closeUpstreams(upstreams, this.log, 'retired upstream closed');
    else this.pending.add({ upstreams, users });
  }

  /** Shutdown: hands over the upstreams still waiting, to be closed with the rest. */
  takeAll(): Upstream[] {
    const all = [...this.pending].flatMap((r) => r.upstreams);
    this.pending.clear();
    return all;
  }
}

/**
 * Applies config reloads. A reload runs start to end in one synchronous step (read, check, build,
 * swap), so two reloads never interleave: the second sees what the first applied.
 */
export class Reloader {
  private config: Config;
  private upstreams: Map<string, Upstream>;
  private closed = false;

  constructor(private readonly options: ReloaderOptions) {
    this.config = options.config;
    this.upstreams = options.upstreams;
  }

  /** Reloads the config file; `via` names who asked, for the log. */
  reload(via: string): ReloadOutcome {
    const { log } = this.options;
    const outcome = this.apply();
    if (outcome.applied) log.info({ via, changes: outcome.changes }, 'config reloaded');
    else log.error({ via, reasons: outcome.reasons }, 'config reload refused; the running config stays');
    return outcome;
  }

  /** Shutdown: closes the upstreams in use and those still retiring; later reloads are refused. */
  async closeAll(): Promise<void> {
    this.closed = true;
    await Promise.all([...this.upstreams.values(), ...this.options.retirements.takeAll()].map((u) => u.close?.()));
  }

  private apply(): ReloadOutcome {
    if (this.closed) return { applied: false, reasons: ['the gateway is shutting down'] };
    const { load, makeUpstream, resolveModels, pipeline } = this.options;
    let next: Config;
    try {
      next = load();
    } catch (err) {
      return { applied: false, reasons: [(err as Error).message] };
    }
    const fixed = restartOnly.flatMap((key) => changedKeys(this.config[key], next[key], key));
    if (fixed.length > 0) return { applied: false, reasons: fixed.map((key) => `${key}: changes only at restart`) };

    const upstreamChanges = diff(this.config.upstreams, next.upstreams);
    const built: Upstream[] = [];
    const upstreams = new Map<string, Upstream>();
    try {
      for (const name of Object.keys(next.upstreams)) {
        // An unchanged upstream keeps its object, and with it its connections and channel state.
        let upstream = this.upstreams.get(name);
        if (!upstream || upstreamChanges.changed.includes(name)) built.push((upstream = makeUpstream(next, name)));
        upstreams.set(name, upstream);
      }
      resolveModels(next.models, upstreams);
    } catch (err) {
      closeUpstreams(built, this.options.log);
      return { applied: false, reasons: [(err as Error).message] };
    }

    const kept = new Set(upstreams.values());
    const replaced = [...this.upstreams.values()].filter((u) => !kept.has(u));
    const modelChanges = diff(byId(this.config.models), byId(next.models));
    // Channels that did not change keep their circuit breakers.
    const channels = new ChannelTable(next.models, next.upstreams, upstreams, pipeline.currentRouting().channels, undefined, next.affinity);
    pipeline.reconfigure({ models: new Map(next.models.map((m) => [m.id, m])), upstreams, channels });
    this.config = next;
    this.upstreams = upstreams;
    this.options.applied(next, upstreams);
    // Every exchange that may hold the old routing is in flight now; later ones get the new one.
    if (replaced.length > 0) this.options.retirements.retire(replaced, new Set(pipeline.inFlight.values()));
    return { applied: true, changes: { upstreams: upstreamChanges, models: modelChanges } };
  }
}

function closeUpstreams(upstreams: Upstream[], log: Logger, closedMessage?: string): void {
  for (const upstream of upstreams) {
    Promise.resolve(upstream.close?.()).then(
      () => closedMessage && log.info({ upstream: upstream.name }, closedMessage),
      (err) => log.error({ err, upstream: upstream.name }, 'closing an upstream failed'),
    );
  }
}

const byId = (models: ModelConfig[]) => Object.fromEntries(models.map((m) => [m.id, m]));

function diff(before: Record<string, unknown>, after: Record<string, unknown>): Changes {
  const names = (from: Record<string, unknown>, not: Record<string, unknown>) => Object.keys(from).filter((n) => !Object.hasOwn(not, n));
  return {
    added: names(after, before),
    removed: names(before, after),
    changed: Object.keys(after).filter((n) => Object.hasOwn(before, n) && !isDeepStrictEqual(before[n], after[n])),
  };
}

/** The dotted keys whose values differ, down to the leaves of nested objects (lists compare whole). */
function changedKeys(before: unknown, after: unknown, at: string): string[] {
  const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);
  if (!isObject(before) || !isObject(after)) return isDeepStrictEqual(before, after) ? [] : [at];
  const keys = new Set([...Object.keys(before), ...Object.keys(after)]);
  return [...keys].flatMap((key) => changedKeys(before[key], after[key], `${at}.${key}`));
}
