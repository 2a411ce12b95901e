/**
 * The client families' routes: every endpoint by method and path (families may share one, told
 * apart by `Endpoint.when`), each request made an Exchange and handed to the pipeline unless its
 * framing is wrong or the server is draining or full; the WebSocket routes (socket.ts); and the 404
 * for what no route serves, which suggests the path that is (route-hints.ts).
 */
import type { Config } from '../config/types.js';
import type { ClientFamily, Endpoint } from '../contracts.js';
import { GatewayError } from '../errors.js';
import { Exchange } from '../exchange.js';
import { addSocketRoutes, type OpenSockets } from '../socket.js';
import type { HttpRequest, HttpResponse, TemplatedApp } from '../uws.js';
import { bodyFraming } from './body.js';
import { atCapacity, copyHeaders, statusLine, type ServerContext } from './context.js';
import { UwsResponse } from './response.js';
import { RouteHints, type ServedRoute } from './route-hints.js';

type Candidates = { family: ClientFamily; endpoint: Endpoint }[];

/**
 * A 404 for whatever no family endpoint or route serves. When the path is served with its version
 * prefix fixed, the 404 says so, in the shape of the family that serves it (its SDK then shows
 * the message). Otherwise it is in the shape of the one family whose paths it is under
 * (`/v1beta/…` Gemini's, `/v1/messages/…` Anthropic's), and in the OpenAI shape when no one
 * family's are.
 */
export function noRoute(res: HttpResponse, req: HttpRequest, hints?: RouteHints<Candidates>): void {
  const method = req.getMethod().toUpperCase();
  const path = req.getUrl();
  const { message, suggested } = hints?.hint(method, path) ?? { message: `No route for ${method} ${path}.` };
  const { headers } = copyHeaders(req);
  const family = suggested ? (suggested.find((c) => !c.endpoint.when || c.endpoint.when(headers)) ?? suggested[0]!).family : hints && ownerOf(hints.nearest(path), headers);
  let status = 404;
  let body: string;
  if (family) {
    const err = new GatewayError('not_found', message);
    status = family.errorStatus?.(err) ?? err.status;
    body = family.errorBody(err);
  } else {
    body = JSON.stringify({ error: { message, type: 'invalid_request_error', param: null, code: 'not_found' } });
  }
  res.cork(() => {
    res.writeStatus(statusLine(status)).writeHeader('content-type', 'application/json');
    // A HEAD reply has no body: one would be read as the start of the next response.
    if (method === 'HEAD') res.endWithoutBody();
    else res.end(body);
  });
}

/** The one family of the nearest routes (those whose condition the headers meet, when several are). */
function ownerOf(nearest: Candidates[], headers: Record<string, string>): ClientFamily | undefined {
  const candidates = nearest.flat();
  const families = new Set(candidates.map((c) => c.family));
  if (families.size <= 1) return candidates[0]?.family;
  const chosen = new Set(candidates.filter((c) => c.endpoint.when?.(headers)).map((c) => c.family));
  return chosen.size === 1 ? [...chosen][0] : undefined;
}

/**
 * Serves every family's endpoints and sockets; returns what the 404 of an unserved path suggests
 * from (the caller adds that catch-all last, after its other routes).
 */
export function addFamilyRoutes(app: TemplatedApp, families: ClientFamily[], context: ServerContext, sockets: OpenSockets, limits: Config['server']): RouteHints<Candidates> {
  const { pipeline } = context;
  /** Endpoints by method and path: families may share one (a model list), told apart by `when`. */
  const routes = new Map<string, Candidates>();
  /** Every family path, sockets and probes too, for what a 404 suggests. */
  const served: ServedRoute<Candidates>[] = [];
  for (const family of families) {
    addSocketRoutes(app, family, pipeline, {
      limits: limits.websocket,
      maxMessageBytes: limits.maxBodyBytes,
      writeStallMs: limits.writeStallMs,
      copyHeaders: (req) => copyHeaders(req).headers,
      sockets,
      refuse: () => (context.draining ? 'shutting_down' : context.overloaded() ? 'overloaded' : undefined),
    });
    for (const endpoint of family.endpoints) {
      served.push({ method: endpoint.method, pattern: endpoint.path, value: [{ family, endpoint }] });
      if (endpoint.kind === 'socket') continue;
      const key = `${endpoint.method} ${endpoint.path}`;
      routes.set(key, [...(routes.get(key) ?? []), { family, endpoint }]);
    }
  }
  for (const candidates of routes.values()) {
    // Endpoints with a condition are asked first; one without takes what they leave.
    candidates.sort((a, b) => Number(!a.endpoint.when) - Number(!b.endpoint.when));
    const { method, path, kind } = candidates[0]!.endpoint;
    if (kind === 'probe') {
      app[method](path, (res) => void res.cork(() => res.writeStatus(statusLine(200)).endWithoutBody(0)));
      continue;
    }
    const paramCount = path.split('/').filter((s) => s.startsWith(':')).length;
    const serve = (res: HttpResponse, req: HttpRequest) => {
      const { headers, repeated } = copyHeaders(req);
      const chosen = candidates.find((c) => !c.endpoint.when || c.endpoint.when(headers));
      // The path is served, for requests that say which API they speak: no other path to suggest.
      if (!chosen) return noRoute(res, req);
      const { family, endpoint } = chosen;
      const params = Array.from({ length: paramCount }, (_, i) => req.getParameter(i) ?? '');
      const ex = new Exchange(family, endpoint, req.getMethod().toUpperCase(), req.getUrl(), req.getQuery() ?? '', headers, params);
      const framing = endpoint.method === 'post' ? bodyFraming(headers, repeated, limits.maxBodyBytes) : { length: 0 };
      const out = new UwsResponse(res, context, ex, framing);
      if (framing.error) return pipeline.reject(ex, out, framing.error);
      if (context.draining) return pipeline.reject(ex, out, new GatewayError('shutting_down', 'The gateway is shutting down.', null, undefined, undefined, 5));
      if (context.overloaded()) return pipeline.reject(ex, out, atCapacity());
      pipeline.accept(ex, out);
    };
    app[method](path, serve);
    // HEAD gets what GET would, headers alone (UwsResponse leaves the body out).
    if (method === 'get') app.head(path, serve);
  }
  return new RouteHints(served.map((r) => ({ ...r, value: routes.get(`${r.method} ${r.pattern}`) ?? r.value })));
}
