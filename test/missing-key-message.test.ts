/**
 * A request without an API key is told which header to send, in its own family's terms: the
 * header that family's clients use, and the others Sluice also accepts there.
 */
import t from 'tap';
import { startTestGateway } from './helpers.js';

const gw = await startTestGateway(
  (dataDir) => `
dataDir: ${dataDir}
upstreams: { sim: { kind: simulator } }
models: [{ id: sim-chat, upstream: sim }]
`,
);
t.teardown(() => gw.stop());

const body = JSON.stringify({ model: 'sim-chat', messages: [{ role: 'user', content: 'hi' }] });
const call = (method: string, path: string, headers: Record<string, string> = {}) =>
  fetch(gw.url + path, { method, headers: { 'content-type': 'application/json', ...headers }, body: method === 'POST' ? body : undefined });

t.test('chat and Responses: Authorization: Bearer', async (t) => {
  for (const [method, path] of [['POST', '/v1/chat/completions'], ['POST', '/v1/responses'], ['GET', '/v1/models']]) {
    const res = await call(method!, path!);
    t.equal(res.status, 401, path);
    const { error } = (await res.json()) as any;
    t.equal(error.code, 'missing_api_key');
    t.equal(error.type, 'invalid_request_error');
    t.match(error.message, 'Authorization: Bearer YOUR_KEY', `${path}: ${error.message}`);
    t.notMatch(error.message, /x-api-key|x-goog-api-key/, 'no other family\'s header');
  }
});

t.test('Gemini: x-goog-api-key, also x-svc-api-key and ?key=', async (t) => {
  for (const [method, path] of [['POST', '/v1beta/models/sim-chat:generateContent'], ['GET', '/v1beta/models']]) {
    const res = await call(method!, path!);
    t.equal(res.status, 401, path);
    const { error } = (await res.json()) as any;
    t.match(error, { code: 401, status: 'UNAUTHENTICATED' });
    t.match(error.message, 'x-goog-api-key: YOUR_KEY', `${path}: ${error.message}`);
    t.match(error.message, 'x-svc-api-key');
    t.match(error.message, '?key=');
    t.notMatch(error.message, /Authorization: Bearer/, 'Bearer is not accepted here');
  }
});

t.test('Messages: x-api-key, also Authorization: Bearer', async (t) => {
  for (const [method, path] of [['POST', '/v1/messages'], ['POST', '/v1/messages/count_tokens'], ['GET', '/v1/models']]) {
    const res = await call(method!, path!, { 'anthropic-version': '2023-06-01' });
    t.equal(res.status, 401, path);
    const body = (await res.json()) as any;
    t.match(body, { type: 'error', error: { type: 'authentication_error' } });
    t.match(body.error.message, 'x-api-key: YOUR_KEY', `${path}: ${body.error.message}`);
    t.match(body.error.message, 'Authorization: Bearer YOUR_KEY');
  }
});

t.test('each header named is one the family really accepts', async (t) => {
  const accepted: [string, string, Record<string, string>][] = [
    ['POST', '/v1/chat/completions', { authorization: `Bearer ${gw.key}` }],
    ['POST', '/v1/responses', { authorization: `Bearer ${gw.key}` }],
    ['POST', '/v1beta/models/sim-chat:generateContent', { 'x-goog-api-key': gw.key }],
    ['POST', '/v1beta/models/sim-chat:generateContent', { 'x-svc-api-key': gw.key }],
    ['POST', `/v1beta/models/sim-chat:generateContent?key=${gw.key}`, {}],
    ['POST', '/v1/messages', { 'x-api-key': gw.key, 'anthropic-version': '2023-06-01' }],
    ['POST', '/v1/messages', { authorization: `Bearer ${gw.key}`, 'anthropic-version': '2023-06-01' }],
  ];
  for (const [method, path, headers] of accepted) {
    const res = await call(method, path, headers);
    t.not(res.status, 401, `${path} with ${Object.keys(headers)[0] ?? '?key='}`);
    await res.arrayBuffer();
  }
});
