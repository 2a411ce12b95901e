/**
 * The uWebSockets.js adapter: one app with the client families' routes, the plain JSON routes and
 * the health check, shedding under overload, and draining on shutdown. Every exchange is handed to
 * the pipeline, which owns it to its end. Each concern has its module in server/: the family route
 * table (family-routes.ts), the JSON routes (json-routes.ts), request bodies (body.ts), the write
 * side with its slow-client probes (response.ts), listening and draining (listen.ts), and what they
 * share (context.ts); this module puts them together.
 */
import type { Logger } from 'pino';
import type { Config } from './config/types.js';
import type { ClientFamily, JsonHandler } from './contracts.js';
import type { Pipeline } from './pipeline.js';
import type { OpenSockets } from './socket.js';
import { LiveSet } from './live-set.js';
import { loadUws } from './uws.js';
import type { ServerContext } from './server/context.js';
import { addFamilyRoutes, noRoute } from './server/family-routes.js';
import { addJsonRoutes } from './server/json-routes.js';
import { listen, type RunningServer } from './server/listen.js';

export interface ServerOptions {
  host: string;
  port: number;
  /** Worker threads listen on one port together (the kernel spreads connections between them). */
  sharedPort?: boolean;
  limits: Config['server'];
  /** The client families whose endpoints are served. */
  families: ClientFamily[];
  pipeline: Pipeline;
  /** Extra routes by path prefix, e.g. `/admin/` (a prefix without a trailing slash also matches itself). */
  jsonRoutes?: Record<string, JsonHandler>;
  log: Logger;
}

export function startServer(options: ServerOptions): Promise<RunningServer> {
  const uWS = loadUws();
  const { pipeline, limits, log } = options;
  // No `uWebSockets: 20` header on every response.
  (uWS as unknown as { _cfg(key: string): void })._cfg('silent');
  const app = uWS.App();
  const sockets: OpenSockets = new Set();
  const context: ServerContext = {
    pipeline,
    maxBodyBytes: limits.maxBodyBytes,
    maxInFlightBodyBytes: limits.maxInFlightBodyBytes,
    bodyBytesInFlight: 0,
    writeStallMs: limits.writeStallMs,
    overheadHeader: limits.overheadHeader,
    writers: new LiveSet(),
    draining: false,
    jsonInFlight: 0,
    overloaded: () => pipeline.inFlight.size + sockets.size + context.jsonInFlight >= limits.maxConnections,
  };
  const probeMs = Math.max(50, Math.min(1000, Math.floor(limits.writeStallMs / 8)));
  const prober = setInterval(() => {
    const now = Date.now();
    for (const writer of context.writers.values()) writer.tick(now);
  }, probeMs).unref();

  const hints = addFamilyRoutes(app, options.families, context, sockets, limits);
  addJsonRoutes(app, options.jsonRoutes ?? {}, context, log);

  const health = () => (context.draining ? '{"status":"draining"}' : '{"status":"ok"}');
  app.get('/healthz', (res) => {
    res.cork(() => res.writeHeader('content-type', 'application/json').end(health()));
  });
  // What a GET would answer, without its body (a HEAD reply with one desyncs a keep-alive client).
  // Without a length: uWS 20.30 aborts the process when endWithoutBody is given one.
  app.head('/healthz', (res) => {
    res.cork(() => res.writeHeader('content-type', 'application/json').endWithoutBody());
  });

  app.any('/*', (res, req) => noRoute(res, req, hints));

  return listen(app, options, { context, sockets, prober });
}
