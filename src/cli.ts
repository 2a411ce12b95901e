/**
 * The command line: `serve` runs the gateway; `groups`, `keys`, `usage` and the rest work on the
 * data directory and the config file directly, with the same rules as the admin API.
 */
import { userInfo } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { AdminError, UNSAFE_TEXT } from './admin/service.js';
import { ConfigError, loadConfig } from './config/load.js';
import type { Config } from './config/types.js';
import { openStore, requireStoreData, type Gateway } from './boot.js';
import { adminService, loadPlugins, startGateway, type Loaded } from './gateway.js';
import { createLogger } from './log.js';
import type { Budget, Limits } from './store/store.js';
import { uwsVersion } from './uws.js';
import { sqliteDriverName } from './store/sqlite-driver.js';

const usage = `Usage: sluice <command> [options]

  serve                                   run the gateway (default)
  groups list                             with each budget's spend in its current period
  groups create NAME --models a,b|* --families chat,... [--mcp-tools server/tool,server/*] [LIMITS]
  groups update NAME [--rename NEW] [--models ...] [--families ...] [--mcp-tools ...|none] [LIMITS]
  groups delete NAME
  keys list                               with each budget's spend in its current period
  keys create --group NAME [--name LABEL] [--expires ISO-TIME] [LIMITS]  prints the secret once
  keys update ID [--name LABEL] [--group NAME] [--expires ISO-TIME|none] [LIMITS]
  keys disable ID | keys enable ID | keys delete ID
  keys move ID --group NAME
  models list                             models, how they serve each family, channel health
  upstreams list                          each upstream's channels as configured; breaker states
                                          live only in the running gateway (GET /admin/upstreams
                                          or the console's Models page)
  usage [--key ID] [--group NAME] [--model ID] [--since DATE] [--until DATE] [--limit N] [--csv]
  usage series [--bucket MS] [same filters]  usage over time
  requests [--status 4xx|503] [same filters]  the latest exchanges, with their errors
  audit [--action ACTION] [--since DATE] [--until DATE] [--limit N]  who changed what

LIMITS (a group's are its keys' defaults; a key's replace them field by field):
  --rpm N  --tpm N  --concurrency N      requests per minute, tokens per minute, requests at once;
                                          "none" removes that one (e.g. --tpm none)
  --no-limits                             removes every limit
  --budget AMOUNT/PERIOD                  PERIOD is day, month (both from midnight UTC) or total,
                                          AMOUNT in the models' prices' currency: --budget 25/month;
                                          --budget none removes it

Options: --config PATH (or SLUICE_CONFIG); SLUICE_DATA_DIR, SLUICE_HOST, SLUICE_PORT,
SLUICE_ADMIN_TOKEN and SLUICE_LOG_LEVEL override the config file.`;

const options = {
  config: { type: 'string' },
  group: { type: 'string' },
  name: { type: 'string' },
  models: { type: 'string' },
  families: { type: 'string' },
  'mcp-tools': { type: 'string' },
  rename: { type: 'string' },
  key: { type: 'string' },
  model: { type: 'string' },
  since: { type: 'string' },
  until: { type: 'string' },
  limit: { type: 'string' },
  bucket: { type: 'string' },
  csv: { type: 'boolean' },
  expires: { type: 'string' },
  status: { type: 'string' },
  action: { type: 'string' },
  rpm: { type: 'string' },
  tpm: { type: 'string' },
  concurrency: { type: 'string' },
  'no-limits': { type: 'boolean' },
  budget: { type: 'string' },
  help: { type: 'boolean', short: 'h' },
} as const;

/**
 * The form of one command in the usage above (`keys move ID --group NAME`), for a refusal to
 * show; a command without an action is its `list` or the one form it has.
 */
function commandUsage([resource = 'serve', action = 'list']: string[]): string {
  const forms = usage.split('\n').filter((l) => /^  [a-z]/.test(l)).flatMap((l) => l.trim().split(/\s{2,}/)[0]!.split(' | '));
  const form =
    forms.find((f) => f === `${resource} ${action}` || f.startsWith(`${resource} ${action} `)) ??
    (action === 'list' ? forms.find((f) => f === resource || f.startsWith(`${resource} [`)) : undefined);
  return form ? `usage: sluice ${form}` : 'sluice --help lists the commands';
}

/**
 * The arguments, or the process ends with one line naming the option and the command's usage:
 * an unknown option or a missing value used to throw from here, before main() could catch it.
 */
const { values, positionals } = (() => {
  try {
    return parseArgs({ allowPositionals: true, options });
  } catch (err) {
    const option = /'(-[^' ]+)/.exec((err as Error).message)?.[1];
    const code = (err as { code?: string }).code;
    const problem =
      code === 'ERR_PARSE_ARGS_UNKNOWN_OPTION'
        ? `unknown option ${option}`
        : code === 'ERR_PARSE_ARGS_INVALID_OPTION_VALUE'
          ? /does not take/.test((err as Error).message) ? `${option} takes no value` : `${option} needs a value`
          : (err as Error).message.split('\n')[0];
    // Read leniently, the arguments still name the command.
    const command = parseArgs({ allowPositionals: true, options, strict: false }).positionals.slice(0, 2);
    process.stderr.write(`sluice: ${problem}; ${commandUsage(command)}\n`);
    process.exit(2);
  }
})();

/** Output that is printed as it is rather than as JSON. */
class Csv {
  constructor(readonly text: string) {}
}

/**
 * JSON for a terminal. JSON.stringify escapes C0 controls in strings but leaves DEL, C1 and bidi
 * controls raw, and stored strings (a model id a key holder sent) may hold them: they are written
 * as `\u` escapes, which read back as the same JSON. Its own line breaks (the indent) stay.
 */
const terminalJson = (value: unknown) =>
  JSON.stringify(value, null, 2).replace(UNSAFE_TEXT, (c) => (c === '\n' ? c : `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`));

const list = (s: string | undefined) => s?.split(',').map((x) => x.trim()).filter(Boolean);

const usageError = (message: string) => new AdminError(400, 'usage', message);

/** `--mcp-tools a/b,c/*` sets a group's MCP grants; `--mcp-tools none` clears them. */
function mcpToolsOption(): { mcpTools?: string[] } {
  const given = values['mcp-tools'];
  if (given === undefined) return {};
  return { mcpTools: given === 'none' ? [] : (list(given) ?? []) };
}

/**
 * `limits` and `budget` from --rpm, --tpm, --concurrency, --no-limits and --budget, for a body;
 * the limits given are laid over `current` (an update changes only the fields named).
 */
function limitOptions(current: Limits | null = null): { limits?: Limits | null; budget?: Budget | null } {
  const named = (['rpm', 'tpm', 'concurrency'] as const).filter((f) => values[f] !== undefined);
  const out: { limits?: Limits | null; budget?: Budget | null } = {};
  if (values['no-limits']) {
    if (named.length) throw usageError(`--no-limits removes every limit: give it without --${named.join(', --')}`);
    out.limits = null;
  } else if (named.length) {
    const limits: Limits = { ...current };
    for (const f of named) {
      const v = values[f]!;
      if (v === 'none') delete limits[f];
      else if (/^\d+$/.test(v)) limits[f] = Number(v);
      else throw usageError(`--${f} takes a whole number, or none to remove it (got "${v}")`);
    }
    out.limits = Object.keys(limits).length ? limits : null;
  }
  if (values.budget !== undefined) {
    const m = /^(\d+(?:\.\d+)?)\/(day|month|total)$/.exec(values.budget);
    if (values.budget === 'none') out.budget = null;
    else if (m) out.budget = { amount: Number(m[1]), period: m[2] as Budget['period'] };
    else throw usageError(`--budget takes AMOUNT/PERIOD with PERIOD day, month or total (25/month), or none (got "${values.budget}")`);
  }
  return out;
}

/**
 * What `upstreams list` shows: the configured channels of each upstream. Breaker states live in
 * the running gateway's memory, which the CLI does not reach.
 */
function configuredUpstreams(config: Config, loaded: Loaded) {
  return {
    note: 'channels as configured; breaker states live only in the running gateway: GET /admin/upstreams or the console',
    data: [...loaded.upstreams.values()].map((u) => ({
      name: u.name,
      kind: config.upstreams[u.name]!.kind,
      family: u.family,
      channels: config.models.flatMap((m) =>
        m.channels.filter((c) => c.upstream === u.name).map((c) => ({ model: m.id, channel: c.name, upstreamModel: c.upstreamModel, priority: c.priority, weight: c.weight })),
      ),
    })),
  };
}

/**
 * What every start prints: where to go and where the admin token is. Secrets appear only on the
 * first successful start, the one time they can be shown.
 */
function startBanner(config: Config, gateway: Gateway, url: string): string {
  const tokenFile = join(config.dataDir, 'admin-token');
  const lines = [`Sluice listening on ${url} (data in ${config.dataDir})`];
  const sqlite = config.store.kind === 'sqlite' ? `, SQLite through ${sqliteDriverName()}` : '';
  lines.push(`  runtime:     Node ${process.versions.node}, uWebSockets.js ${uwsVersion()}${sqlite}`);
  if (gateway.workers) lines.push(`  workers:     ${gateway.workers.size} threads`);
  if (config.plugins.some((p) => p.name === 'console')) lines.push(`  console:     ${url}/console`);
  if (config.adminToken) lines.push(`  admin token: from ${process.env.SLUICE_ADMIN_TOKEN ? 'SLUICE_ADMIN_TOKEN' : 'the config file (adminToken)'}`);
  else if (gateway.admin.source === 'shared-store') lines.push('  admin token: the one made by the first instance on this store (in its data dir)');
  // Also after a first start that failed to listen: that one wrote the file but showed nothing.
  else if (gateway.firstStart) lines.push(`  admin token: ${gateway.adminToken}   (also in ${tokenFile})`);
  else lines.push(`  admin token: in ${tokenFile}`);
  if (gateway.firstStart) lines.push(`  demo key (group "default", shown only now): ${gateway.firstStart.demoKey}`);
  if (config.allowAnonymous) lines.push('  WARNING:     allowAnonymous is on: without an authenticating plugin anyone may call every model');
  return lines.join('\n') + '\n';
}

async function serve(config: Config): Promise<void> {
  const log = createLogger(config.log.level);
  // The same file as main() loaded: a reload reads it again.
  const gateway = await startGateway(config, log, { path: values.config ?? process.env.SLUICE_CONFIG });
  const url = `http://${config.server.host}:${gateway.port}`;
  const stop = (signal: string) => {
    log.info({ signal }, 'shutting down: draining in-flight requests');
    gateway.shutdown().then(
      () => {
        log.info('shutdown complete');
        log.flush?.();
        process.exit(0);
      },
      (err) => {
        log.error({ err }, 'shutdown failed');
        process.exit(1);
      },
    );
  };
  process.once('SIGTERM', () => stop('SIGTERM'));
  process.once('SIGINT', () => stop('SIGINT'));
  // The reload logs its outcome: the changes, or why the running config stays.
  process.on('SIGHUP', () => void gateway.reload('SIGHUP'));
  // Announced once the signals are handled: a supervisor may stop it as soon as it reads this.
  process.stdout.write(startBanner(config, gateway, url));
  log.info({ url, models: config.models.map((m) => m.id) }, 'sluice listening');
}

async function manage(config: Config, [resource, action, target]: string[]): Promise<unknown> {
  const log = createLogger('error');
  // Only `serve` makes a data dir and its database; the rest work on the gateway's.
  requireStoreData(config);
  const store = await openStore(config);
  try {
    const loaded = await loadPlugins(config, store, log);
    const admin = adminService(store, config, loaded);
    const filters = { key: values.key, group: values.group, model: values.model, since: values.since, until: values.until, limit: values.limit };
    const actor = `cli:${userInfo().username}`;
    const expires = values.expires === undefined ? {} : { expiresAt: values.expires === 'none' ? null : values.expires };
    const refuse = (problem: string) => usageError(`${resource} ${action} ${problem}; ${commandUsage([resource!, action!])}`);
    const need = (what: string) => {
      if (!target) throw refuse(`needs ${what}`);
      return target;
    };
    /** An update that would change nothing is refused in options, not in the API's body terms. */
    const changes = <T extends object>(body: T, which: string) => {
      if (Object.keys(body).length === 0) throw refuse(`needs one of ${which} at least`);
      return body;
    };
    switch (`${resource} ${action ?? 'list'}`) {
      case 'groups list':
        return await admin.listGroups();
      case 'groups create':
        // A group of MCP tools alone (--mcp-tools) needs neither; the service says what is missing then.
        if ((values.models === undefined || values.families === undefined) && values['mcp-tools'] === undefined) throw refuse('needs --models and --families');
        return await admin.createGroup({ name: need('a NAME'), models: list(values.models) ?? [], families: list(values.families) ?? [], ...mcpToolsOption(), ...limitOptions() }, actor);
      case 'groups update':
        return await admin.updateGroup(
          need('a NAME'),
          changes(
            {
              ...(values.rename && { name: values.rename }),
              ...(values.models && { models: list(values.models) }),
              ...(values.families && { families: list(values.families) }),
              ...mcpToolsOption(),
              ...limitOptions((await admin.listGroups()).find((g) => g.name === target)?.limits),
            },
            '--rename, --models, --families, --mcp-tools, --rpm, --tpm, --concurrency, --no-limits, --budget',
          ),
          actor,
        );
      case 'groups delete':
        await admin.deleteGroup(need('a NAME'), actor);
        return { deleted: true, name: target };
      case 'keys list':
        return await admin.listKeys();
      case 'keys create':
        return await admin.createKey({ group: values.group ?? 'default', ...(values.name && { name: values.name }), ...expires, ...limitOptions() }, actor);
      case 'keys update':
        return await admin.updateKey(
          need('an ID'),
          changes(
            {
              ...(values.name !== undefined && { name: values.name }),
              ...(values.group && { group: values.group }),
              ...expires,
              ...limitOptions((await admin.getKey(need('an ID'))).limits),
            },
            '--name, --group, --expires, --rpm, --tpm, --concurrency, --no-limits, --budget',
          ),
          actor,
        );
      case 'keys disable':
      case 'keys enable':
        return await admin.updateKey(need('an ID'), { disabled: action === 'disable' }, actor);
      case 'keys move':
        // Without --group the body was {}: an update that changed nothing, and was audited.
        if (!values.group) throw refuse('needs --group NAME');
        return await admin.updateKey(need('an ID'), { group: values.group }, actor);
      case 'keys delete':
        await admin.deleteKey(need('an ID'), actor);
        return { deleted: true, id: target };
      case 'models list':
        return await admin.listModels();
      case 'upstreams list':
        return configuredUpstreams(config, loaded);
      case 'usage list':
        return values.csv ? new Csv(await admin.usageCsv(filters)) : await admin.usage(filters);
      case 'usage series':
        return await admin.usageSeries({ ...filters, bucket: values.bucket });
      case 'requests list':
        return (await admin.requests({ ...filters, status: values.status })).data;
      case 'audit list':
        return (await admin.auditLog({ action: values.action, since: values.since, until: values.until, limit: values.limit })).data;
      default:
        throw new AdminError(400, 'usage', `unknown command "${[resource, action].filter(Boolean).join(' ')}"\n\n${usage}`);
    }
  } finally {
    await store.close();
  }
}

async function main(): Promise<void> {
  if (values.help) return void process.stdout.write(usage + '\n');
  const config = loadConfig({ path: values.config ?? process.env.SLUICE_CONFIG });
  const [command = 'serve', ...rest] = positionals;
  if (command === 'serve') return serve(config);
  const result = await manage(config, [command, ...rest]);
  process.stdout.write(result instanceof Csv ? result.text : terminalJson(result) + '\n');
}

main().catch((err) => {
  const message = err instanceof ConfigError ? `invalid configuration: ${err.message}` : err instanceof AdminError ? err.message : (err as Error).message;
  process.stderr.write(`sluice: ${message}\n`);
  process.exit(err instanceof AdminError ? 2 : 1);
});
