/**
 * `GET /metrics` in the Prometheus text format (instruments.ts says what is in it). On the
 * gateway's port it takes the admin token (`Authorization: Bearer`), with wrong tokens throttled
 * as the admin API throttles them; the `listen` option also serves it without a token on an
 * address of its own (`127.0.0.1:9464`), for a scraper on a private network.
 *
 * With worker threads every thread records what it serves in its own registry; a scrape, whichever
 * thread takes it, gathers every thread's registry through the primary and adds them up, so it
 * reports the whole instance. Process metrics (CPU, memory, event loop) come from one thread only.
 *
 * Options: `listen` ("host:port", none by default), `processMetrics` (true by default).
 */
import { createHash, timingSafeEqual } from 'node:crypto';
import { createServer, type Server } from 'node:http';
import type { Logger } from 'pino';
import { AggregatorRegistry, collectDefaultMetrics, type MetricObjectWithValues, type MetricValue } from 'prom-client';
import {
  addressKey,
  AdminError,
  bearerToken,
  type CachedStore,
  checkAdminToken,
  definePlugin,
  type GatewayView,
  GuessThrottle,
  type JsonReply,
  type JsonRequest,
  SharedThrottleStorage,
  TooManyGuesses,
  TrustedProxies,
} from '../../src/plugin-api.js';
import { Instruments } from './instruments.js';

/** What threads answer a scrape with: their registry as JSON. */
const TOPIC = 'metrics';

interface MetricsOptions {
  listen?: { host: string; port: number };
  processMetrics: boolean;
}

type Exposition = () => Promise<{ contentType: string; text: string }>;

export default definePlugin(async ({ gateway, options, store, config, log, addRoute }) => {
  const settings = readOptions(options);
  // Loaded to serve nothing (the CLI): nothing to report.
  if (!gateway) return { name: 'metrics' };
  const instruments = new Instruments(gateway);
  // Process-wide figures would be counted once per thread: only the first thread collects them.
  if (settings.processMetrics && !gateway.thread) collectDefaultMetrics({ register: instruments.registry });
  gateway.answer(TOPIC, () => (instruments.addFigures(), instruments.registry.getMetricsAsJSON()));
  const exposition = scrape(gateway, instruments);
  const isAdmin = adminCheck(gateway.adminTokenDigest, store, new TrustedProxies(config.server.trustedProxies));

  addRoute('/metrics', async (req): Promise<JsonReply> => {
    if (req.path !== '/metrics') return failure(404, 'not_found', `no route for ${req.method} ${req.path}`);
    if (req.method !== 'GET' && req.method !== 'HEAD') return failure(405, 'method_not_allowed', `${req.method} is not allowed on /metrics`);
    const refused = await isAdmin(req);
    if (refused) return refused;
    const { contentType, text } = await exposition();
    return { status: 200, raw: { contentType, data: text }, headers: { 'cache-control': 'no-store' } };
  });
  // One listener per instance: the first thread's.
  const server = settings.listen && !gateway.thread ? await listenApart(settings.listen, exposition, log) : undefined;
  return {
    name: 'metrics',
    done(ex) {
      instruments.record(ex);
    },
    close: () => new Promise<void>((resolve) => (server ? server.close(() => resolve()) : resolve())),
  };
});

/** This thread's registry, or with worker threads every thread's added up. */
function scrape(gateway: GatewayView, instruments: Instruments): Exposition {
  if (gateway.thread === undefined) {
    return async () => {
      instruments.addFigures();
      return { contentType: instruments.registry.contentType, text: await instruments.registry.metrics() };
    };
  }
  return async () => {
    const parts = (await gateway.gather(TOPIC)) as MetricObjectWithValues<MetricValue<string>>[][];
    const merged = AggregatorRegistry.aggregate(parts);
    return { contentType: merged.contentType, text: await merged.metrics() };
  };
}

/**
 * Undefined for the admin's bearer token, else the reply refusing the request. Wrong tokens count
 * in the throttle the admin API uses (shared state, so also across threads and instances); a
 * store that cannot be reached throttles nothing, and the token is still checked.
 */
function adminCheck(digest: string, store: CachedStore, proxies: TrustedProxies): (req: JsonRequest) => Promise<JsonReply | undefined> {
  const expected = Buffer.from(digest, 'hex');
  const throttle = new GuessThrottle({}, new SharedThrottleStorage(store));
  const isAdmin = (token: string) => timingSafeEqual(createHash('sha256').update(token).digest(), expected);
  return async ({ headers, remoteAddress }) => {
    const token = bearerToken(headers.authorization);
    if (!token) return failure(401, 'invalid_admin_token', 'missing admin token (Authorization: Bearer <admin token>)');
    try {
      await checkAdminToken(throttle, isAdmin, addressKey(proxies.view(remoteAddress, headers).client), token);
      return undefined;
    } catch (err) {
      if (!(err instanceof AdminError)) throw err;
      return failure(err.status, err.code, err.message, err instanceof TooManyGuesses ? { 'retry-after': String(err.waitSeconds) } : undefined);
    }
  };
}

/** Serves the exposition without a token on an address of its own. */
function listenApart(address: { host: string; port: number }, exposition: Exposition, log: Logger): Promise<Server> {
  const server = createServer((req, res) => {
    const path = req.url?.split('?')[0];
    if (path !== '/metrics' || (req.method !== 'GET' && req.method !== 'HEAD')) {
      res.writeHead(path === '/metrics' ? 405 : 404, { 'content-type': 'text/plain' }).end(path === '/metrics' ? 'method not allowed\n' : 'not found\n');
      return;
    }
    exposition().then(
      ({ contentType, text }) => res.writeHead(200, { 'content-type': contentType, 'cache-control': 'no-store' }).end(req.method === 'HEAD' ? undefined : text),
      (err) => {
        log.error({ err }, 'metrics scrape failed');
        res.writeHead(500, { 'content-type': 'text/plain' }).end('scrape failed\n');
      },
    );
  });
  return new Promise((resolve, reject) => {
    server.once('error', (err) => reject(new Error(`plugins.metrics.options.listen: cannot listen on ${address.host}:${address.port}: ${err.message}`)));
    server.listen(address.port, address.host, () => {
      const { port } = server.address() as { port: number };
      log.info({ url: `http://${address.host.includes(':') ? `[${address.host}]` : address.host}:${port}/metrics` }, 'metrics listening');
      resolve(server);
    });
  });
}

function failure(status: number, code: string, message: string, headers?: Record<string, string>): JsonReply {
  return { status, body: { error: { code, message } }, ...(headers && { headers }) };
}

function readOptions(raw: Record<string, unknown>): MetricsOptions {
  const { listen, processMetrics = true, ...rest } = raw;
  const unknown = Object.keys(rest)[0];
  if (unknown) throw new Error(`plugins.metrics.options.${unknown}: unknown option (listen, processMetrics)`);
  if (typeof processMetrics !== 'boolean') throw new Error('plugins.metrics.options.processMetrics: must be true or false');
  if (listen === undefined) return { processMetrics };
  const m = typeof listen === 'string' ? /^(?:\[([0-9a-fA-F:.]+)\]|([^:\s]+)):(\d{1,5})$/.exec(listen) : null;
  const port = Number(m?.[3]);
  if (!m || port > 65535) throw new Error('plugins.metrics.options.listen: must be "host:port", e.g. "127.0.0.1:9464" or "[::1]:9464"');
  return { listen: { host: (m[1] ?? m[2])!, port }, processMetrics };
}
