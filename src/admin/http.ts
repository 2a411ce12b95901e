/**
 * The admin API over HTTP, JSON in and out. Callers authenticate with `Authorization: Bearer
 * <admin token>` (scripts, the CLI's peers) or with the console's session cookie, in which case
 * every state-changing call must also carry the session's CSRF token in `x-csrf-token`.
 */
import type { JsonHandler, JsonReply, JsonRequest } from '../server.js';
import { AdminError, type AdminService } from './service.js';
import { SESSION_COOKIE, cookieValue, type Sessions } from './sessions.js';

const sessionCookie = (value: string, maxAgeSeconds: number) =>
  `${SESSION_COOKIE}=${value}; HttpOnly; SameSite=Strict; Path=/; Max-Age=${maxAgeSeconds}`;

export function adminRoutes(service: AdminService, sessions: Sessions): JsonHandler {
  /** Throws unless the caller is the admin; a cookie session must prove it is not a forged request. */
  const authorize = ({ method, headers }: JsonRequest): void => {
    const auth = headers.authorization;
    if (auth?.startsWith('Bearer ') && sessions.isAdminToken(auth.slice(7).trim())) return;
    const session = sessions.get(cookieValue(headers.cookie, SESSION_COOKIE));
    if (!session) throw new AdminError(401, 'invalid_admin_token', 'missing or wrong admin token (Authorization: Bearer <admin token>)');
    if (method !== 'GET' && headers['x-csrf-token'] !== session.csrfToken) {
      throw new AdminError(403, 'csrf', 'missing or wrong x-csrf-token header for this session');
    }
  };

  const session = (req: JsonRequest): JsonReply => {
    const id = cookieValue(req.headers.cookie, SESSION_COOKIE);
    if (req.method === 'POST') {
      const wait = sessions.lockedFor(req.remoteAddress);
      if (wait) return { ...error(new AdminError(429, 'too_many_attempts', `too many wrong tokens; try again in ${wait} s`)), headers: { 'retry-after': String(wait) } };
      const { token } = (parseJson(req.body) ?? {}) as { token?: unknown };
      const started = typeof token === 'string' ? sessions.login(req.remoteAddress, token) : undefined;
      if (!started) return error(new AdminError(401, 'invalid_admin_token', 'wrong admin token'));
      const { csrfToken, expiresAt } = started.session;
      return {
        status: 200,
        body: { csrfToken, expiresAt },
        headers: { 'set-cookie': sessionCookie(started.id, Math.floor((expiresAt - Date.now()) / 1000)), 'cache-control': 'no-store' },
      };
    }
    const current = sessions.get(id);
    if (req.method === 'GET') {
      if (!current) return error(new AdminError(401, 'invalid_admin_token', 'no session'));
      return { status: 200, body: { csrfToken: current.csrfToken, expiresAt: current.expiresAt }, headers: { 'cache-control': 'no-store' } };
    }
    if (req.method === 'DELETE') {
      authorize(req);
      sessions.logout(id);
      return { status: 200, body: { loggedOut: true }, headers: { 'set-cookie': sessionCookie('', 0) } };
    }
    throw new AdminError(405, 'method_not_allowed', `${req.method} is not allowed on /admin/session`);
  };

  return (req): JsonReply => {
    const { method, path, query, body } = req;
    try {
      const [, , resource, id, extra] = path.split('/').map(decodeURIComponent);
      if (resource === 'session' && id === undefined) return session(req);
      authorize(req);
      if (extra !== undefined) throw new AdminError(404, 'not_found', `no route for ${method} ${path}`);
      const filters = Object.fromEntries(query);
      switch (`${method} ${resource}${id !== undefined ? '/:id' : ''}`) {
        case 'GET groups':
          return { status: 200, body: { data: service.listGroups() } };
        case 'POST groups':
          return { status: 201, body: service.createGroup(parseJson(body)) };
        case 'PATCH groups/:id':
          return { status: 200, body: service.updateGroup(id!, parseJson(body)) };
        case 'DELETE groups/:id':
          service.deleteGroup(id!);
          return { status: 200, body: { deleted: true, name: id } };
        case 'GET keys':
          return { status: 200, body: { data: service.listKeys() } };
        case 'GET keys/:id':
          return { status: 200, body: service.getKey(id!) };
        case 'POST keys':
          return { status: 201, body: service.createKey(parseJson(body)) };
        case 'PATCH keys/:id':
          return { status: 200, body: service.updateKey(id!, parseJson(body)) };
        case 'DELETE keys/:id':
          service.deleteKey(id!);
          return { status: 200, body: { deleted: true, id } };
        case 'GET models':
          return { status: 200, body: service.listModels() };
        case 'GET usage':
          return { status: 200, body: service.usage(filters) };
        case 'GET usage/:id':
          if (id !== 'series') break;
          return { status: 200, body: service.usageSeries(filters) };
        case 'GET usage.csv':
          return {
            status: 200,
            raw: { contentType: 'text/csv; charset=utf-8', data: service.usageCsv(filters) },
            headers: { 'content-disposition': 'attachment; filename="sluice-usage.csv"' },
          };
      }
      throw new AdminError(404, 'not_found', `no route for ${method} ${path}`);
    } catch (err) {
      if (err instanceof AdminError) return error(err);
      throw err;
    }
  };
}

function parseJson(body: Buffer): unknown {
  try {
    return JSON.parse(body.toString('utf8'));
  } catch {
    throw new AdminError(400, 'invalid_json', 'the request body is not valid JSON');
  }
}

function error(err: AdminError): JsonReply {
  return { status: err.status, body: { error: { message: err.message, type: 'admin_error', code: err.code } } };
}
