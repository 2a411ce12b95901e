/**
 * A 404 for a path Sluice does not serve suggests the path it does serve when the client only
 * left out (or doubled, or mistook) the API version prefix, in the shape of the family that
 * serves it, and suggests nothing when no such path exists. A path under one family's own paths
 * (`/v1beta/…`, `/v1/messages/…`) gets its 404 in that family's shape, so its SDK shows it.
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

const call = async (method: string, path: string) => {
  const res = await fetch(gw.url + path, {
    method,
    headers: { authorization: `Bearer ${gw.key}`, 'content-type': 'application/json' },
    body: method === 'POST' ? '{}' : undefined,
  });
  return { status: res.status, body: (await res.json()) as any };
};
const messageOf = (body: any): string => body.error.message;

t.test('a missing version prefix: the path that exists, and where to fix it', async (t) => {
  const cases: [string, string, string, string][] = [
    ['POST', '/chat/completions', 'POST /v1/chat/completions', '/v1'],
    ['POST', '/responses', 'POST /v1/responses', '/v1'],
    ['POST', '/messages', 'POST /v1/messages', '/v1'],
    ['POST', '/messages/count_tokens', 'POST /v1/messages/count_tokens', '/v1'],
    ['POST', '/models/sim-chat:generateContent', 'POST /v1beta/models/sim-chat:generateContent', '/v1beta'],
  ];
  for (const [method, path, suggested, prefix] of cases) {
    const { status, body } = await call(method, path);
    t.equal(status, 404, `${method} ${path}`);
    t.equal(
      messageOf(body),
      `No route for ${method} ${path}. Did you mean ${suggested}? Set your client's base URL to end in ${prefix}.`,
    );
  }
});

t.test('two paths that fit: both are named', async (t) => {
  const { status, body } = await call('GET', '/models');
  t.equal(status, 404);
  t.equal(
    messageOf(body),
    "No route for GET /models. Did you mean GET /v1/models or GET /v1beta/models? Set your client's base URL to end in /v1 or /v1beta, whichever its API uses.",
  );
});

t.test('the 404 is in the shape of the family that serves the suggested path', async (t) => {
  t.match((await call('POST', '/chat/completions')).body, { error: { type: 'invalid_request_error', code: 'not_found', param: null } });
  t.match((await call('POST', '/messages')).body, { type: 'error', error: { type: 'not_found_error' } });
  t.match((await call('POST', '/models/sim-chat:generateContent')).body, { error: { code: 404, status: 'NOT_FOUND' } });
});

t.test('a doubled or mistaken prefix', async (t) => {
  t.equal(
    messageOf((await call('POST', '/v1/v1/chat/completions')).body),
    "No route for POST /v1/v1/chat/completions. Did you mean POST /v1/chat/completions? The path repeats /v1: your client's base URL already ends in it.",
  );
  t.equal(
    messageOf((await call('POST', '/v1/models/sim-chat:generateContent')).body),
    'No route for POST /v1/models/sim-chat:generateContent. Did you mean POST /v1beta/models/sim-chat:generateContent? This path is served under /v1beta, not /v1.',
  );
});

t.test('nothing is suggested when nothing fits', async (t) => {
  const nothing = [['POST', '/nowhere'], ['GET', '/chat/completions'], ['POST', '/v2/chat'], ['POST', '/completions'], ['POST', '/v1/nowhere'], ['GET', '/v1/models/sim-chat/extra'], ['GET', '/']];
  for (const [method, path] of nothing) {
    const { status, body } = await call(method!, path!);
    t.equal(status, 404, `${method} ${path}`);
    t.equal(messageOf(body), `No route for ${method} ${path}.`);
    t.match(body, { error: { type: 'invalid_request_error', code: 'not_found' } });
  }
});

t.test("a path under one family's own paths gets its 404 in that family's shape", async (t) => {
  const anthropic = [['POST', '/v1/messages/batches'], ['GET', '/v1/messages'], ['POST', '/v1/messages/']];
  for (const [method, path] of anthropic) {
    const { status, body } = await call(method!, path!);
    t.equal(status, 404, `${method} ${path}`);
    t.match(body, { type: 'error', error: { type: 'not_found_error', message: `No route for ${method} ${path}.` } }, `${method} ${path}: Anthropic's shape`);
  }
  const google = [['POST', '/v1beta/models/sim-chat:generateContent/x'], ['POST', '/v1beta/cachedContents'], ['GET', '/v1beta/files']];
  for (const [method, path] of google) {
    const { status, body } = await call(method!, path!);
    t.equal(status, 404, `${method} ${path}`);
    t.match(body, { error: { code: 404, status: 'NOT_FOUND', message: `No route for ${method} ${path}.` } }, `${method} ${path}: Google's shape`);
  }
});
