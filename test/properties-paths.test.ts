/**
 * Property-based test of path and query handling: random paths (bad percent-encoding, encoded
 * invalid UTF-8, odd characters) and query strings on every route, with every method, with and
 * without credentials, never get a 5xx, and the process keeps serving.
 */
import { Agent, request } from 'node:http';
import fc from 'fast-check';
import t from 'tap';
import { startTestGateway } from './helpers.js';

const gw = await startTestGateway((dataDir) => `dataDir: ${dataDir}\nserver: { shutdownTimeoutMs: 2000 }\n`);
const agent = new Agent({ keepAlive: true, maxSockets: 1 });
t.teardown(async () => {
  agent.destroy();
  await gw.stop();
});
const { port } = new URL(gw.url);

/** One raw request: node's client sends the path as it is (fetch would normalise it). */
function send(method: string, path: string, headers: Record<string, string>, body?: string): Promise<{ status: number; text: string }> {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, method, path, headers, agent }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, text: Buffer.concat(chunks).toString() }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(body);
  });
}

// Printable ASCII but space (what a request line can carry), weighted towards path syntax.
const char = fc.oneof(
  fc.integer({ min: 0x21, max: 0x7e }).map((c) => String.fromCharCode(c)),
  fc.constantFrom('/', '%', ':', '.', '..', '?', '&', '=', '+', 'models/', ':generateContent', ':streamGenerateContent', 'sim-gemini'),
);
const hex = fc.constantFrom(...'0123456789abcdefABCDEFgz%');
const percent = fc.oneof(
  fc.tuple(hex, hex).map(([a, b]) => `%${a}${b}`),
  fc.tuple(hex).map(([a]) => `%${a}`),
  // Encoded bytes, often invalid UTF-8.
  fc.uint8Array({ minLength: 1, maxLength: 4 }).map((bytes) => [...bytes].map((b) => `%${b.toString(16).padStart(2, '0')}`).join('')),
);
const segment = fc.array(fc.oneof(char, percent), { maxLength: 16 }).map((parts) => parts.join(''));
const prefixes = ['/v1/chat/completions', '/v1/responses', '/v1/models', '/v1beta/models', '/v1beta/models/', '/admin/', '/admin/keys/', '/admin/usage', '/console/', '/console/api/', '/healthz', '/v1/', '/'];
const path = fc.tuple(fc.constantFrom(...prefixes), fc.option(segment, { nil: '' })).map(([prefix, rest]) => prefix + rest);
const query = fc.option(fc.array(fc.tuple(segment, segment).map(([k, v]) => `${k}=${v}`), { maxLength: 4 }).map((pairs) => `?${pairs.join('&')}`), { nil: '' });

const validBodies: Record<string, string> = {
  '/v1/chat/completions': JSON.stringify({ model: 'sim-chat', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 }),
  '/v1/responses': JSON.stringify({ model: 'sim-chat', input: 'hi', max_output_tokens: 2 }),
  '/v1beta/': JSON.stringify({ contents: [{ parts: [{ text: 'hi' }] }], generationConfig: { maxOutputTokens: 2 } }),
};
const bodyFor = (p: string) => Object.entries(validBodies).find(([prefix]) => p.startsWith(prefix))?.[1] ?? '{}';

t.test('random paths and queries on every route never get a 5xx', async (t) => {
  const credentials = fc.constantFrom('none', 'key', 'admin');
  await fc.assert(
    fc.asyncProperty(fc.constantFrom('GET', 'POST', 'DELETE', 'PATCH', 'PUT', 'OPTIONS'), path, query, credentials, async (method, p, q, who) => {
      const headers: Record<string, string> = { 'content-type': 'application/json' };
      if (who === 'key') Object.assign(headers, { authorization: `Bearer ${gw.key}`, 'x-goog-api-key': gw.key });
      if (who === 'admin') headers.authorization = `Bearer ${gw.adminToken}`;
      const res = await send(method, p + q, headers, method === 'POST' ? bodyFor(p) : undefined);
      if (res.status < 200 || res.status >= 500) throw new Error(`${method} ${p + q}: ${res.status} ${res.text.slice(0, 300)}`);
    }),
    { numRuns: 1500 },
  );
  t.equal((await fetch(`${gw.url}/healthz`)).status, 200, 'the process still serves /healthz');
});
