/**
 * The admin API over HTTP, JSON in and out. Callers authenticate with `Authorization: Bearer
 * <admin token>` (scripts, the CLI's peers) or with the console's session cookie, in which case
 * every state-changing call must also carry the session's CSRF token in `x-csrf-token`.
 * Wrong tokens are throttled (throttle.ts), state-changing calls must come from an allowed
 * origin (origin.ts), and cookies are `Secure` when a trusted proxy says the client used TLS.
 * Each change is audited with who made it: `admin-token@ADDRESS` or `console:SESSION@ADDRESS`
 * (the first characters of the session id, enough to tell sessions apart).
 */
import type { JsonHandler, JsonReply, JsonRequest } from '../contracts.js';
import type { ReloadOutcome } from '../reload.js';
import type { ForwardedView, TrustedProxies } from '../trusted-proxies.js';
import { checkOrigin, normalizeOrigin } from './origin.js';
import { AdminError, type AdminService } from './service.js';
import { StoreUnavailableError } from '../store/store.js';
import { DEVICE_COOKIE, SESSION_COOKIE, cookieValue, type Sessions } from './sessions.js';
import { GuessThrottle, addressKey } from './throttle.js';

export interface AdminHttpOptions {
  proxies: TrustedProxies;
  /** Origins besides the gateway's own that may make state-changing calls (`admin.allowedOrigins`). */
  allowedOrigins: readonly string[];
  /** Reads the config file again and applies it (`POST /admin/reload`); `actor` is who asked. */
  reload(actor: string): ReloadOutcome;
  /** Wrong-token counting; by default in this process's memory. */
  throttle?: GuessThrottle;
  /** What stands wrong with how the gateway runs (an open gateway): every console session shows it. */
  warnings?: readonly string[];
}

const DEVICE_MAX_AGE_S = 365 * 24 * 60 * 60;
const safeMethods = new Set(['GET', 'HEAD', 'OPTIONS']);

const cookie = (name: string, value: string, maxAgeSeconds: number, path: string, secure: boolean) =>
  `${name}=${value}; HttpOnly; SameSite=Strict; Path=${path}; Max-Age=${maxAgeSeconds}${secure ? '; Secure' : ''}`;

export class TooManyGuesses extends AdminError {
  constructor(readonly waitSeconds: number) {
    super(429, 'too_many_attempts', `too many wrong admin tokens from this client; try again in ${waitSeconds} s`);
  }
}

/** A token this long (a generated one has 45 characters, about 190 random bits) is never refused by the throttle. */
export const UNGUESSABLE_TOKEN_CHARS = 32;

export const bearerToken = (authorization: string | undefined) =>
  authorization?.startsWith('Bearer ') ? authorization.slice(7).trim() : undefined;

/**
 * Checks a token with `isAdmin` unless `client` is waiting out its wrong ones (TooManyGuesses);
 * a wrong token counts against it and throws a 401. The admin API and /metrics share it.
 */
export const checkAdminToken = (throttle: GuessThrottle, isAdmin: (token: string) => boolean, client: string, token: string): Promise<void> =>
  throttle.serially(client, async () => {
    // The store is unreachable: tokens are still checked, unthrottled until it is back.
    const wait = await throttle.waitFor(client).catch(unlessStoreAway(0));
    if (wait) {
      // A long token (every generated one) is past guessing, so a stranger's wrong tries from the
      // same address (a NAT, a scraper's host) must not lock it out. A short operator-chosen token
      // stays behind the throttle: there the throttle is what stops the guessing.
      if (token.length >= UNGUESSABLE_TOKEN_CHARS && isAdmin(token)) return;
      throw new TooManyGuesses(wait);
    }
    if (isAdmin(token)) return;
    await throttle.failed(client).catch(unlessStoreAway(0));
    throw new AdminError(401, 'invalid_admin_token', 'wrong admin token');
  });

/**
 * Who may call an admin route: the admin token (throttled) or a console session, which must prove
 * with its CSRF token that a state-changing call is not forged. Returns the actor the audit log
 * names, or throws AdminError. The admin API and plugins' admin routes (GatewayView.authorizeAdmin) share it.
 */
export function adminAuthorizer(sessions: Sessions, throttle: GuessThrottle) {
  const checkToken = (client: string, token: string) => checkAdminToken(throttle, (t) => sessions.isAdminToken(t), client, token);
  const authorize = async ({ method, headers }: Pick<JsonRequest, 'method' | 'headers'>, via: ForwardedView): Promise<string> => {
    const bearer = bearerToken(headers.authorization);
    if (bearer !== undefined) {
      await checkToken(addressKey(via.client), bearer);
      return `admin-token@${via.client}`;
    }
    const id = cookieValue(headers.cookie, SESSION_COOKIE);
    const session = await sessions.get(id);
    if (!session) throw new AdminError(401, 'invalid_admin_token', 'missing or wrong admin token (Authorization: Bearer <admin token>)');
    if (!safeMethods.has(method) && headers['x-csrf-token'] !== session.csrfToken) {
      throw new AdminError(403, 'csrf', 'missing or wrong x-csrf-token header for this session');
    }
    return consoleActor(id!, via);
  };
  return { checkToken, authorize };
}

export function adminRoutes(service: AdminService, sessions: Sessions, options: AdminHttpOptions): JsonHandler {
  const { proxies } = options;
  const throttle = options.throttle ?? new GuessThrottle();
  const allowedOrigins = new Set(options.allowedOrigins.map((o) => normalizeOrigin(o) ?? o));
  const warnings = options.warnings ?? [];
  const { checkToken, authorize } = adminAuthorizer(sessions, throttle);

  const session = async (req: JsonRequest, via: ForwardedView): Promise<JsonReply> => {
    const id = cookieValue(req.headers.cookie, SESSION_COOKIE);
    if (req.method === 'POST') {
      const { token } = (parseJson(req.body) ?? {}) as { token?: unknown };
      if (typeof token !== 'string') throw new AdminError(400, 'invalid_request', 'the body must be {"token": "<admin token>"}');
      // A browser that signed in before is throttled on its own, apart from its address.
      const device = sessions.device(cookieValue(req.headers.cookie, DEVICE_COOKIE));
      try {
        await checkToken(device ? `device:${device}` : addressKey(via.client), token);
      } catch (err) {
        // Throttled attempts are not checked, so they are not failed sign-ins.
        if (!(err instanceof TooManyGuesses)) await service.audit(`console@${via.client}`, 'session.sign_in_failed', null, 'wrong admin token');
        throw err;
      }
      const { id: newId, session: started } = await sessions.start();
      await service.audit(consoleActor(newId, via), 'session.sign_in', null, null);
      const cookies = [cookie(SESSION_COOKIE, newId, Math.floor((started.expiresAt - Date.now()) / 1000), '/', via.https)];
      if (!device) cookies.push(cookie(DEVICE_COOKIE, sessions.newDevice(), DEVICE_MAX_AGE_S, '/admin/session', via.https));
      const headers = { 'set-cookie': cookies, 'cache-control': 'no-store' };
      return { status: 200, body: { csrfToken: started.csrfToken, expiresAt: started.expiresAt, warnings }, headers };
    }
    const current = await sessions.get(id);
    if (req.method === 'GET') {
      if (!current) return error(new AdminError(401, 'invalid_admin_token', 'no session'));
      return { status: 200, body: { csrfToken: current.csrfToken, expiresAt: current.expiresAt, warnings }, headers: { 'cache-control': 'no-store' } };
    }
    if (req.method === 'DELETE') {
      const actor = await authorize(req, via);
      await sessions.logout(id);
      await service.audit(actor, 'session.sign_out', null, null);
      return { status: 200, body: { loggedOut: true }, headers: { 'set-cookie': cookie(SESSION_COOKIE, '', 0, '/', via.https) } };
    }
    throw new AdminError(405, 'method_not_allowed', `${req.method} is not allowed on /admin/session`);
  };

  /** What the headers decide: the path, the origin and, but for a sign-in, who is calling. */
  const admit = async (req: Omit<JsonRequest, 'body'>) => {
    const { method, path, headers } = req;
    const [, , resource, id, extra] = path.split('/').map(decodeSegment);
    const via = proxies.view(req.remoteAddress, headers);
    if (!safeMethods.has(method)) {
      const usesCookie = bearerToken(headers.authorization) === undefined && cookieValue(headers.cookie, SESSION_COOKIE) !== undefined;
      checkOrigin(headers.origin, usesCookie, via, allowedOrigins);
    }
    // A sign-in's token is in its body (small, capped like every admin body).
    const signIn = resource === 'session' && id === undefined;
    return { resource, id, extra, via, signIn, actor: signIn ? '' : await authorize(req, via) };
  };

  const refusal = (err: unknown): JsonReply => {
    if (err instanceof AdminError) return error(err);
    // The database is down: the gateway keeps serving cached keys, the admin API says why it cannot.
    if (err instanceof StoreUnavailableError) return error(new AdminError(503, 'store_unavailable', `the store cannot be reached: ${err.message}`), 5);
    throw err;
  };

  const handle: JsonHandler = async (req): Promise<JsonReply> => {
    const { method, path, query, body } = req;
    try {
      const { resource, id, extra, via, signIn, actor } = await admit(req);
      if (signIn) return await session(req, via);
      if (extra !== undefined) throw new AdminError(404, 'not_found', `no route for ${method} ${path}`);
      const filters = Object.fromEntries(query);
      switch (`${method} ${resource}${id !== undefined ? '/:id' : ''}`) {
        case 'GET groups':
          return { status: 200, body: { data: await service.listGroups() } };
        case 'POST groups':
          return { status: 201, body: await service.createGroup(parseJson(body), actor) };
        case 'PATCH groups/:id':
          return { status: 200, body: await service.updateGroup(id!, parseJson(body), actor) };
        case 'DELETE groups/:id':
          await service.deleteGroup(id!, actor);
          return { status: 200, body: { deleted: true, name: id } };
        case 'GET keys':
          return { status: 200, body: { data: await service.listKeys() } };
        case 'GET keys/:id':
          return { status: 200, body: await service.getKey(id!) };
        case 'POST keys':
          return { status: 201, body: await service.createKey(parseJson(body), actor) };
        case 'PATCH keys/:id':
          return { status: 200, body: await service.updateKey(id!, parseJson(body), actor) };
        case 'DELETE keys/:id':
          await service.deleteKey(id!, actor);
          return { status: 200, body: { deleted: true, id } };
        case 'GET models':
          return { status: 200, body: await service.listModels() };
        case 'GET upstreams':
          return { status: 200, body: service.listUpstreams() };
        case 'POST reload': {
          if (body.length > 0) throw new AdminError(400, 'invalid_request', 'reload takes no body: it reads the config file again');
          const outcome = options.reload(actor);
          if (!outcome.applied) {
            return { status: 400, body: { error: { message: outcome.reasons.join('\n'), type: 'admin_error', code: 'invalid_config', reasons: outcome.reasons } } };
          }
          await service.audit(actor, 'config.reload', null, JSON.stringify(outcome.changes));
          return { status: 200, body: outcome };
        }
        case 'GET usage':
          return { status: 200, body: await service.usage(filters) };
        case 'GET requests':
          return { status: 200, body: await service.requests(filters) };
        case 'GET audit':
          return { status: 200, body: await service.auditLog(filters) };
        case 'GET usage/:id':
          if (id !== 'series') break;
          return { status: 200, body: await service.usageSeries(filters) };
        case 'GET usage.csv':
          return {
            status: 200,
            raw: { contentType: 'text/csv; charset=utf-8', data: await service.usageCsv(filters) },
            headers: { 'content-disposition': 'attachment; filename="sluice-usage.csv"' },
          };
      }
      throw new AdminError(404, 'not_found', `no route for ${method} ${path}`);
    } catch (err) {
      return refusal(err);
    }
  };
  // Before a body is read: an unknown caller is refused on its headers, its body never held.
  handle.beforeBody = (req) => admit(req).then(() => undefined, refusal);
  return handle;
}

/** A fallback for when the store cannot be reached; other errors pass. */
const unlessStoreAway =
  <T>(fallback: T) =>
  (err: unknown): T => {
    if (err instanceof StoreUnavailableError) return fallback;
    throw err;
  };

const consoleActor = (sessionId: string, via: ForwardedView) => `console:${sessionId.slice(0, 8)}@${via.client}`;

function parseJson(body: Buffer): unknown {
  try {
    return JSON.parse(body.toString('utf8'));
  } catch {
    throw new AdminError(400, 'invalid_json', 'the request body is not valid JSON');
  }
}

function decodeSegment(segment: string): string {
  try {
    return decodeURIComponent(segment);
  } catch {
    throw new AdminError(400, 'invalid_path', 'the request path has invalid %-encoding');
  }
}

function error(err: AdminError, retryAfterSeconds?: number): JsonReply {
  const reply: JsonReply = { status: err.status, body: { error: { message: err.message, type: 'admin_error', code: err.code } } };
  if (err instanceof TooManyGuesses) reply.headers = { 'retry-after': String(err.waitSeconds) };
  else if (retryAfterSeconds) reply.headers = { 'retry-after': String(retryAfterSeconds) };
  return reply;
}
