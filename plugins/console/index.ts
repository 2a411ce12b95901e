/**
 * The web console at `/console`: a static single page that uses only the admin API. Files are
 * read once at boot and kept with a gzip copy and an ETag; the page gets a strict CSP.
 */
import { createHash } from 'node:crypto';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { extname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { gzipSync } from 'node:zlib';
import { definePlugin, type JsonReply } from '../../src/plugin-api.js';

const root = fileURLToPath(new URL('../../../', import.meta.url));

const contentTypes: Record<string, string> = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
  '.ico': 'image/x-icon',
};

interface Asset {
  type: string;
  plain: Buffer;
  gzip: Buffer;
  etag: string;
}

function asset(path: string): Asset {
  const plain = readFileSync(path);
  return {
    type: contentTypes[extname(path)] ?? 'application/octet-stream',
    plain,
    gzip: gzipSync(plain, { level: 9 }),
    etag: `"${createHash('sha256').update(plain).digest('base64url').slice(0, 22)}"`,
  };
}

/** Every file of a folder (one level), by URL path. */
function folder(dir: string, urlPrefix: string, only?: string[]): [string, Asset][] {
  if (!existsSync(dir)) return [];
  return readdirSync(dir)
    .filter((f) => contentTypes[extname(f)] && (!only || only.includes(f)))
    .map((f) => [`${urlPrefix}${f}`, asset(join(dir, f))]);
}

export default definePlugin((ctx) => {
  const assets = new Map<string, Asset>([
    ...folder(join(root, 'plugins/console/static'), '/console/'),
    ...folder(join(root, 'dist/console/app'), '/console/app/'),
    ...folder(join(root, 'node_modules/uplot/dist'), '/console/vendor/', ['uPlot.esm.js', 'uPlot.min.css']),
  ]);
  const index = assets.get('/console/index.html');
  if (!index || !assets.has('/console/app/main.js')) {
    ctx.log.warn('the console is not built (run npm run build); /console will answer 503');
  }
  // The import map is the page's one inline script: allow exactly it.
  const importMap = /<script type="importmap">([\s\S]*?)<\/script>/.exec(index?.plain.toString() ?? '')?.[1];
  const scriptSources = ["'self'", ...(importMap ? [`'sha256-${createHash('sha256').update(importMap).digest('base64')}'`] : [])];
  const security = {
    'content-security-policy': `default-src 'self'; script-src ${scriptSources.join(' ')}; style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'`,
    'x-content-type-options': 'nosniff',
    'x-frame-options': 'DENY',
    'referrer-policy': 'no-referrer',
  };

  ctx.addRoute('/console', ({ method, path, headers }): JsonReply => {
    if (method !== 'GET' && method !== 'HEAD') return { status: 405, body: { error: { message: 'method not allowed', code: 'method_not_allowed' } } };
    const file = path === '/console' || path === '/console/' ? index : assets.get(path);
    if (!file) {
      if (!index) return { status: 503, body: { error: { message: 'the console is not built; run npm run build', code: 'console_not_built' } } };
      return { status: 404, body: { error: { message: `no console file ${path}`, code: 'not_found' } } };
    }
    const common = { etag: file.etag, 'cache-control': 'no-cache', vary: 'accept-encoding', ...security };
    if (headers['if-none-match'] === file.etag) return { status: 304, raw: { contentType: file.type, data: '' }, headers: common };
    const gzip = /\bgzip\b/.test(headers['accept-encoding'] ?? '');
    return {
      status: 200,
      raw: { contentType: file.type, data: gzip ? file.gzip : file.plain },
      headers: gzip ? { ...common, 'content-encoding': 'gzip' } : common,
    };
  });
  return { name: 'console' };
});
