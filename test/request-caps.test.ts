/**
 * Request-shape caps (messages, tools, content parts, nesting depth, model-id length) in every
 * family's error shape, the inputs that used to pass validation and then crash a canonical
 * conversion, percent-encoding in Gemini paths, and formula cells in the usage CSV export.
 */
import t, { type Test } from 'tap';
import WebSocket from 'ws';
import { eventually, startTestGateway, type TestGateway } from './helpers.js';

/** A gateway on the embedded simulators (sim-chat, sim-responses, sim-gemini), with extra server YAML. */
async function gateway(server = ''): Promise<TestGateway> {
  const gw = await startTestGateway((dataDir) => `dataDir: ${dataDir}\nserver: { shutdownTimeoutMs: 2000${server} }\n`);
  t.teardown(() => gw.stop());
  return gw;
}

const gw = await gateway();
const small = await gateway(', requestCaps: { messages: 3, tools: 2, contentParts: 5, depth: 8, modelIdLength: 12 }');
const wide = await gateway(', requestCaps: { contentParts: 200000 }');

type Family = 'chat' | 'responses' | 'gemini';

/** POSTs to a family's generate endpoint; for Gemini, `target` is the path's `{model}:{method}`. */
function call(g: TestGateway, family: Family, body: unknown, target = 'sim-gemini:generateContent') {
  return post(g, { chat: '/v1/chat/completions', responses: '/v1/responses', gemini: `/v1beta/models/${target}` }[family], body);
}

async function post(g: TestGateway, path: string, body: unknown) {
  const res = await fetch(g.url + path, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${g.key}`, 'x-goog-api-key': g.key },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await res.text();
  return { status: res.status, text, body: JSON.parse(text) };
}

/** Asserts a 400 in the family's error shape whose message is exactly `message`. */
function refused(t: Test, family: Family, res: { status: number; body: any }, message: string, param: string | null = null) {
  t.equal(res.status, 400, message);
  if (family === 'gemini') t.same(res.body, { error: { code: 400, message, status: 'INVALID_ARGUMENT' } });
  else t.same(res.body, { error: { message, type: 'invalid_request_error', param, code: 'invalid_request' } });
}

const many = <T>(n: number, f: (i: number) => T): T[] => Array.from({ length: n }, (_, i) => f(i));
const chatTool = (i: number) => ({ type: 'function', function: { name: `f${i}`, parameters: { type: 'object', properties: {} } } });

t.test('chat: messages, tools and content parts are capped at the defaults', async (t) => {
  const user = { role: 'user', content: 'hi' };
  refused(t, 'chat', await call(gw, 'chat', { model: 'sim-chat', messages: many(3000, () => user) }), 'messages has 3000 items; the limit is 2048 (server.requestCaps.messages).', 'messages');
  refused(t, 'chat', await call(gw, 'chat', { model: 'sim-chat', messages: many(100_000, () => user) }), 'messages has 100000 items; the limit is 2048 (server.requestCaps.messages).', 'messages');
  t.equal((await call(gw, 'chat', { model: 'sim-chat', messages: many(2048, () => user), max_tokens: 2 })).status, 200, '2048 messages pass');

  refused(t, 'chat', await call(gw, 'chat', { model: 'sim-chat', messages: [user], tools: many(129, chatTool) }), 'tools has 129 tools; the limit is 128 (server.requestCaps.tools).', 'tools');
  t.equal((await call(gw, 'chat', { model: 'sim-chat', messages: [user], tools: many(128, chatTool), max_tokens: 2 })).status, 200, '128 tools pass');

  const parts = many(10_001, () => ({ type: 'text', text: 'a' }));
  refused(t, 'chat', await call(gw, 'chat', { model: 'sim-chat', messages: [{ role: 'user', content: parts }] }), 'The request has 10001 content parts; the limit is 10000 (server.requestCaps.contentParts).');
});

t.test('nesting deeper than the cap is refused before anything recursive sees it', async (t) => {
  // Seven levels lead to `default` (body, tools, tools[0], function, parameters, properties, deep).
  const body = (depth: number) =>
    `{"model":"sim-gemini","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"tools":[{"type":"function","function":{"name":"f",` +
    `"parameters":{"type":"object","properties":{"deep":{"type":"array","default":${'['.repeat(depth)}${']'.repeat(depth)}}}}}}]}`;
  refused(t, 'chat', await call(gw, 'chat', body(100_000)), 'The request is nested more than 64 levels deep; the limit is 64 (server.requestCaps.depth).');
  refused(t, 'chat', await call(gw, 'chat', body(58)), 'The request is nested more than 64 levels deep; the limit is 64 (server.requestCaps.depth).');
  t.equal((await call(gw, 'chat', body(57))).status, 200, '64 levels pass');
  // Brackets inside strings, escaped quotes included, do not count.
  const text = `${'['.repeat(200)} \\" ${'{'.repeat(200)}`;
  t.equal((await call(gw, 'chat', `{"model":"sim-chat","max_tokens":2,"messages":[{"role":"user","content":"${text}"}]}`)).status, 200);
});

t.test('the model id is capped and the long id is neither echoed nor stored', async (t) => {
  const long = 'm'.repeat(100_000);
  const res = await call(gw, 'chat', { model: long, messages: [{ role: 'user', content: 'hi' }] });
  refused(t, 'chat', res, 'model is 100000 characters long; the limit is 256 (server.requestCaps.modelIdLength).', 'model');
  refused(t, 'responses', await call(gw, 'responses', { model: long, input: 'hi' }), 'model is 100000 characters long; the limit is 256 (server.requestCaps.modelIdLength).', 'model');
  const gemini = await call(gw, 'gemini', { contents: [{ parts: [{ text: 'hi' }] }] }, `${'g'.repeat(300)}:generateContent`);
  refused(t, 'gemini', gemini, 'model is 300 characters long; the limit is 256 (server.requestCaps.modelIdLength).');

  const records = await eventually(async () => {
    const { body } = await gw.admin('GET', '/admin/usage?limit=1000');
    return body.records.length >= 3 && body.records;
  }, 'usage records');
  t.ok(records.every((r: any) => (r.model ?? '').length <= 256), 'no stored model id is longer than the cap');
  t.notOk(gw.logs.some((l) => JSON.stringify(l).includes('m'.repeat(300))), 'nor logged');

  // 3,000 characters: far past the 64-character cap, yet inside the 4 KB request head that uWS
  // 20.57 serves (a longer one gets its 431 before Sluice sees it, see http-edges).
  const listed = await fetch(`${gw.url}/v1beta/models/${'x'.repeat(3000)}`, { headers: { 'x-goog-api-key': gw.key } });
  t.equal(listed.status, 404);
  t.equal(((await listed.json()) as any).error.message, `Model models/${'x'.repeat(64)}… is not found or not available to this key.`, 'an unknown id is echoed truncated');
});

t.test('each cap comes from server.requestCaps and applies to every family', async (t) => {
  const limit = (what: string, n: number, cap: string, limit: number) => `${what} has ${n} ${what === 'tools' ? 'tools' : 'items'}; the limit is ${limit} (server.requestCaps.${cap}).`;
  const chatUser = { role: 'user', content: 'hi' };
  refused(t, 'chat', await call(small, 'chat', { model: 'sim-chat', messages: many(4, () => chatUser) }), limit('messages', 4, 'messages', 3), 'messages');
  refused(t, 'responses', await call(small, 'responses', { model: 'sim-chat', input: many(4, () => chatUser) }), limit('input', 4, 'messages', 3), 'input');
  const contents = (n: number, parts = 1) => many(n, () => ({ role: 'user', parts: many(parts, () => ({ text: 'hi' })) }));
  refused(t, 'gemini', await call(small, 'gemini', { contents: contents(4) }), limit('contents', 4, 'messages', 3));

  refused(t, 'chat', await call(small, 'chat', { model: 'sim-chat', messages: [chatUser], tools: many(3, chatTool) }), limit('tools', 3, 'tools', 2), 'tools');
  const namespace = { type: 'namespace', name: 'ns', tools: many(3, (i) => ({ type: 'function', name: `f${i}` })) };
  refused(t, 'responses', await call(small, 'responses', { model: 'sim-chat', input: 'hi', tools: [namespace] }), limit('tools', 3, 'tools', 2), 'tools');
  const declarations = [{ functionDeclarations: many(3, (i) => ({ name: `f${i}` })) }];
  refused(t, 'gemini', await call(small, 'gemini', { contents: contents(1), tools: declarations }), limit('tools', 3, 'tools', 2));

  const parts = 'The request has 6 content parts; the limit is 5 (server.requestCaps.contentParts).';
  refused(t, 'chat', await call(small, 'chat', { model: 'sim-chat', messages: [chatUser, { role: 'user', content: many(5, () => ({ type: 'text', text: 'a' })) }] }), parts);
  refused(t, 'responses', await call(small, 'responses', { model: 'sim-chat', input: [{ role: 'user', content: many(6, () => ({ type: 'input_text', text: 'a' })) }] }), parts);
  refused(t, 'gemini', await call(small, 'gemini', { contents: contents(2, 3) }), parts);

  const depth = 'The request is nested more than 8 levels deep; the limit is 8 (server.requestCaps.depth).';
  refused(t, 'responses', await call(small, 'responses', { model: 'sim-chat', input: 'hi', metadata: { a: [[[[[[[1]]]]]]] } }), depth);
  refused(t, 'gemini', await call(small, 'gemini', { contents: contents(1), generationConfig: { responseSchema: { items: { items: { items: { items: { items: { items: {} } } } } } } } }), depth);

  refused(t, 'chat', await call(small, 'chat', { model: 'sim-chat-basic', messages: [chatUser] }), 'model is 14 characters long; the limit is 12 (server.requestCaps.modelIdLength).', 'model');
  t.equal((await call(small, 'chat', { model: 'sim-chat', messages: many(3, () => chatUser), max_tokens: 2 })).status, 200, 'at the caps, requests pass');
});

t.test('inputs that passed validation and then crashed a conversion get a 400', async (t) => {
  const user = { role: 'user', content: 'hi' };
  for (const model of ['sim-gemini', 'sim-responses']) {
    const noFunction = await call(gw, 'chat', { model, messages: [user, { role: 'assistant', tool_calls: [{ id: 'c1', type: 'function' }] }, { role: 'tool', tool_call_id: 'c1', content: 'x' }] });
    refused(t, 'chat', noFunction, "Invalid request: 'messages[1].tool_calls[0].function' is required.", 'messages[1].tool_calls[0].function');
    const choice = await call(gw, 'chat', { model, messages: [user], tools: [chatTool(0)], tool_choice: { type: 'function' } });
    refused(t, 'chat', choice, "Invalid request: 'tool_choice.function' is required.", 'tool_choice.function');
  }
  for (const model of ['sim-chat', 'sim-gemini']) {
    const allowed = await call(gw, 'responses', { model, input: 'hi', tools: [{ type: 'function', name: 'f' }], tool_choice: { type: 'allowed_tools', mode: 'auto' } });
    refused(t, 'responses', allowed, "Invalid request: 'tool_choice.tools' is required.", 'tool_choice.tools');
    const output = await call(gw, 'responses', { model, input: [{ type: 'custom_tool_call_output', call_id: 'c1', output: [null] }] });
    refused(t, 'responses', output, "Invalid request: 'input[0].output[0]' must be object.", 'input[0].output[0]');
  }
});

t.test('150k content parts are translated without overflowing the stack', async (t) => {
  const content = many(150_000, () => ({ type: 'output_text', text: 'a ' }));
  const res = await call(wide, 'responses', { model: 'sim-chat', max_output_tokens: 4, input: [{ role: 'user', content: 'hi' }, { role: 'assistant', content }, { role: 'user', content: 'go on' }] });
  t.equal(res.status, 200, res.text.slice(0, 200));
  t.equal(res.body.object, 'response');
});

t.test('bad percent-encoding in a /v1beta path is a 400 in Google\'s shape', async (t) => {
  const message = 'The model name in the path is not valid percent-encoding.';
  refused(t, 'gemini', await call(gw, 'gemini', { contents: [{ parts: [{ text: 'x' }] }] }, '%E0%A4%A:generateContent'), message);
  const listed = await fetch(`${gw.url}/v1beta/models/%E0%A4%A`, { headers: { 'x-goog-api-key': gw.key } });
  refused(t, 'gemini', { status: listed.status, body: await listed.json() }, message);
  const method = await call(gw, 'gemini', { contents: [{ parts: [{ text: 'x' }] }] }, 'sim-gemini:toString');
  t.equal(method.status, 404, 'a method name from Object.prototype is not a method');
});

t.test('a Responses WebSocket message nested too deep gets an error event and the socket stays usable', async (t) => {
  const ws = new WebSocket(`${gw.url.replace('http', 'ws')}/v1/responses`, { headers: { authorization: `Bearer ${gw.key}` } });
  await new Promise((r) => ws.once('open', r));
  const next = () => new Promise<any>((r) => ws.once('message', (m) => r(JSON.parse(m.toString()))));
  let reply = next();
  ws.send(`{"type":"response.create","model":"sim-chat","input":"hi","metadata":{"a":${'['.repeat(10_000)}${']'.repeat(10_000)}}}`);
  t.match(await reply, { type: 'error', status: 400, error: { message: 'The request is nested more than 64 levels deep; the limit is 64 (server.requestCaps.depth).' } });
  reply = next();
  ws.send(JSON.stringify({ type: 'response.create', model: 'sim-chat', input: 'hi [[sim tokens=2]]' }));
  t.equal((await reply).type, 'response.created');
  ws.close();
});

t.test('the usage CSV neutralises formula cells and still quotes them', async (t) => {
  const models = ['=1+2', '+SUM(A1)', '-2+3', '@cmd', '\tx', '=HYPERLINK("http://x","y"),z'];
  for (const model of models) t.equal((await call(gw, 'chat', { model, messages: [{ role: 'user', content: 'hi' }] })).status, 400);
  const csv = await eventually(async () => {
    const res = await fetch(`${gw.url}/admin/usage.csv?limit=1000`, { headers: { authorization: `Bearer ${gw.adminToken}` } });
    const text = await res.text();
    return text.includes("'@cmd") && text.includes('HYPERLINK') && text;
  }, 'the records in the CSV');
  const rows = csv.split('\r\n');
  const header = rows[0]!.split(',');
  const modelAt = header.indexOf('model');
  // Every text cell quoted; the tab became a space, which a spreadsheet may trim, so it is neutralised too.
  for (const cell of [`"'=1+2"`, `"'+SUM(A1)"`, `"'-2+3"`, `"'@cmd"`, `"' x"`]) {
    t.ok(rows.some((r) => r.split(',')[modelAt] === cell), `${JSON.stringify(cell)} is a cell`);
  }
  t.ok(csv.includes(`,"'=HYPERLINK(""http://x"",""y""),z",`), 'a neutralised cell is still quoted');
});
