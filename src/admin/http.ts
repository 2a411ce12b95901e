/** The admin API over HTTP: `Authorization: Bearer <admin token>`, JSON in and out. */
import { createHash, timingSafeEqual } from 'node:crypto';
import type { JsonHandler, JsonReply } from '../server.js';
import { AdminError, type AdminService } from './service.js';

const digest = (s: string) => createHash('sha256').update(s).digest();

export function adminRoutes(service: AdminService, adminToken: string): JsonHandler {
  const expected = digest(adminToken);
  const authorized = (header: string | undefined) =>
    !!header && header.startsWith('Bearer ') && timingSafeEqual(digest(header.slice(7).trim()), expected);

  return ({ method, path, query, headers, body }): JsonReply => {
    if (!authorized(headers.authorization)) {
      return error(new AdminError(401, 'invalid_admin_token', 'missing or wrong admin token (Authorization: Bearer <admin token>)'));
    }
    try {
      const [, , resource, id, extra] = path.split('/').map(decodeURIComponent);
      if (extra !== undefined) throw new AdminError(404, 'not_found', `no route for ${method} ${path}`);
      const json = () => parseJson(body);
      switch (`${method} ${resource}${id !== undefined ? '/:id' : ''}`) {
        case 'GET groups':
          return { status: 200, body: { data: service.listGroups() } };
        case 'POST groups':
          return { status: 201, body: service.createGroup(json()) };
        case 'PATCH groups/:id':
          return { status: 200, body: service.updateGroup(id!, json()) };
        case 'DELETE groups/:id':
          service.deleteGroup(id!);
          return { status: 200, body: { deleted: true, name: id } };
        case 'GET keys':
          return { status: 200, body: { data: service.listKeys() } };
        case 'GET keys/:id':
          return { status: 200, body: service.getKey(id!) };
        case 'POST keys':
          return { status: 201, body: service.createKey(json()) };
        case 'PATCH keys/:id':
          return { status: 200, body: service.updateKey(id!, json()) };
        case 'DELETE keys/:id':
          service.deleteKey(id!);
          return { status: 200, body: { deleted: true, id } };
        case 'GET usage':
          return { status: 200, body: service.usage(Object.fromEntries(query)) };
        default:
          throw new AdminError(404, 'not_found', `no route for ${method} ${path}`);
      }
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
