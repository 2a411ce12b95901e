/**
 * Chat completions end to end: the official openai SDK → Sluice (real uWS server) → the
 * openai-chat upstream plugin → the simulator in its own process.
 */
import { Ajv } from 'ajv';
import OpenAI from 'openai';
import t from 'tap';
import { chatGatewayYaml, eventually, startSimulatorProcess, startTestGateway } from './helpers.js';

const sim = await startSimulatorProcess();
const gw = await startTestGateway(chatGatewayYaml(sim.url));
t.teardown(async () => {
  await gw.stop();
  await sim.stop();
});

const client = (apiKey = gw.key) => new OpenAI({ apiKey, baseURL: `${gw.url}/v1`, maxRetries: 0 });
const openai = client();
const user = (content: string) => [{ role: 'user' as const, content }];

async function usageFor(requestId: string | null | undefined) {
  const { body } = await gw.admin('GET', '/admin/usage');
  return body.records.find((r: any) => r.requestId === requestId);
}

t.test('non-streaming completion', async (t) => {
  const { data, response } = await openai.chat.completions
    .create({ model: 'sim-chat', messages: user('Say something [[sim tokens=5]]') })
    .withResponse();
  t.equal(data.object, 'chat.completion');
  t.equal(data.choices[0]!.finish_reason, 'stop');
  t.ok(data.choices[0]!.message.content!.trim().length > 0, 'has text');
  t.equal(data.usage!.completion_tokens, 5);
  t.ok(data.usage!.prompt_tokens > 0);
  const record = await eventually(() => usageFor(response.headers.get('x-request-id')), 'usage record');
  t.match(await record, { model: 'sim-chat', upstream: 'sim', family: 'chat', status: 200, completionTokens: 5, estimated: false, streamed: false, outcome: 'finished' });
});

t.test('streaming without include_usage: no usage chunk reaches the client, usage still recorded', async (t) => {
  const { data: stream, response } = await openai.chat.completions
    .create({ model: 'sim-chat', messages: user('Stream please [[sim tokens=7]]'), stream: true })
    .withResponse();
  t.equal(response.headers.get('cache-control'), 'no-cache');
  t.equal(response.headers.get('x-accel-buffering'), 'no');
  let text = '';
  let finish: string | null = null;
  let sawUsageChunk = false;
  for await (const chunk of stream) {
    if (chunk.choices.length === 0) sawUsageChunk = true;
    text += chunk.choices[0]?.delta.content ?? '';
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  t.equal(sawUsageChunk, false, 'the injected usage chunk was dropped');
  t.equal(finish, 'stop');
  t.ok(text.trim().split(/\s+/).length >= 5, 'text arrived');
  const record = await eventually(() => usageFor(response.headers.get('x-request-id')), 'usage record');
  const r = await record;
  t.match(r, { completionTokens: 7, estimated: false, streamed: true, outcome: 'finished' });
  t.ok(r.ttfbMs !== null && r.ttfbMs >= 0, 'time to first byte recorded');
});

t.test('streaming without include_usage: no chunk has a usage field, not even the null the upstream writes when asked', async (t) => {
  const post = (body: object) => fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { authorization: `Bearer ${gw.key}`, 'content-type': 'application/json' }, body: JSON.stringify(body) });
  const request = { model: 'sim-chat', messages: user('Stream please [[sim tokens=12]]'), stream: true };
  const raw = await (await post(request)).text();
  const events = raw.split('\n\n').filter((f) => f.startsWith('data: {')).map((f) => JSON.parse(f.slice(6)));
  t.ok(events.length >= 12, `${events.length} chunks`);
  t.same(events.filter((e) => 'usage' in e), [], 'no chunk carries usage');
  // Asked for by the client, the upstream's chunks reach it as they are: usage null in each, then the usage chunk.
  const asked = (await (await post({ ...request, stream_options: { include_usage: true } })).text()).split('\n\n').filter((f) => f.startsWith('data: {')).map((f) => JSON.parse(f.slice(6)));
  t.ok(asked.slice(0, -1).every((e) => e.usage === null), 'usage: null in every chunk the client asked for');
  t.equal(asked.at(-1).usage?.completion_tokens, 12);
});

t.test('streaming with include_usage: the client gets the usage chunk', async (t) => {
  const stream = await openai.chat.completions.create({
    model: 'sim-chat',
    messages: user('Count [[sim tokens=4]]'),
    stream: true,
    stream_options: { include_usage: true },
  });
  let usage: OpenAI.CompletionUsage | undefined | null;
  for await (const chunk of stream) if (chunk.usage) usage = chunk.usage;
  t.equal(usage?.completion_tokens, 4);
});

const weatherTool: OpenAI.ChatCompletionTool = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Weather for a city',
    parameters: {
      type: 'object',
      properties: { city: { type: 'string' }, unit: { type: 'string', enum: ['c', 'f'] } },
      required: ['city', 'unit'],
      additionalProperties: false,
    },
  },
};

t.test('tool call round trip, streaming and not', async (t) => {
  const first = await openai.chat.completions.create({ model: 'sim-chat', messages: user('Weather in Oslo?'), tools: [weatherTool] });
  const call = first.choices[0]!.message.tool_calls?.[0];
  t.equal(first.choices[0]!.finish_reason, 'tool_calls');
  t.equal(call?.type, 'function');
  if (call?.type !== 'function') return;
  t.equal(call.function.name, 'get_weather');
  const args = JSON.parse(call.function.arguments);
  t.ok(new Ajv().validate(weatherTool.function.parameters!, args), 'arguments validate against the schema');

  // The same call streamed: fragments merge by index into the same arguments.
  const stream = await openai.chat.completions.create({ model: 'sim-chat', messages: user('Weather in Oslo?'), tools: [weatherTool], stream: true });
  let streamedArgs = '';
  for await (const chunk of stream) for (const d of chunk.choices[0]?.delta.tool_calls ?? []) streamedArgs += d.function?.arguments ?? '';
  t.same(JSON.parse(streamedArgs), args);

  const second = await openai.chat.completions.create({
    model: 'sim-chat',
    tools: [weatherTool],
    messages: [
      ...user('Weather in Oslo?'),
      { role: 'assistant', content: null, tool_calls: [call] },
      { role: 'tool', tool_call_id: call.id, content: 'Sunny and 21 degrees' },
    ],
  });
  t.equal(second.choices[0]!.finish_reason, 'stop');
  t.match(second.choices[0]!.message.content, /^The tool returned: Sunny and 21 degrees/);
});

t.test('json_schema structured output', async (t) => {
  const schema = {
    type: 'object',
    properties: { name: { type: 'string' }, age: { type: 'integer', minimum: 0 }, tags: { type: 'array', items: { type: 'string' } } },
    required: ['name', 'age', 'tags'],
    additionalProperties: false,
  };
  const res = await openai.chat.completions.create({
    model: 'sim-chat',
    messages: user('A person as JSON'),
    response_format: { type: 'json_schema', json_schema: { name: 'person', schema, strict: true } },
  });
  const value = JSON.parse(res.choices[0]!.message.content!);
  t.ok(new Ajv().validate(schema, value), 'output validates against the schema');
});

t.test('image input', async (t) => {
  const pixel = 'data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==';
  const res = await openai.chat.completions.create({
    model: 'sim-chat',
    messages: [{ role: 'user', content: [{ type: 'text', text: 'What is this?' }, { type: 'image_url', image_url: { url: pixel } }] }],
  });
  t.match(res.choices[0]!.message.content, /^I see 1 image/);
});

t.test('GET /v1/models lists exactly what the group may use', async (t) => {
  const all = await openai.models.list();
  t.same(all.data.map((m) => m.id).sort(), ['sim-basic', 'sim-chat', 'sim-impatient', 'sim-unreachable']);
  const group = await gw.admin('POST', '/admin/groups', { name: 'basic-only', models: ['sim-basic'], families: ['chat'] });
  t.equal(group.status, 201);
  const key = await gw.admin('POST', '/admin/keys', { group: 'basic-only', name: 'limited' });
  const limited = await client(key.body.key).models.list();
  t.same(limited.data.map((m) => m.id), ['sim-basic']);
  t.match(limited.data[0], { object: 'model', owned_by: 'sluice' });
});

t.test('401: missing, malformed, unknown and disabled keys', async (t) => {
  const post = (headers: Record<string, string>) =>
    fetch(`${gw.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...headers },
      body: JSON.stringify({ model: 'sim-chat', messages: user('hi') }),
    });
  const missing = await post({});
  t.equal(missing.status, 401);
  t.match(await missing.json(), { error: { code: 'missing_api_key', type: 'invalid_request_error' } });
  t.equal((await post({ authorization: 'Basic abc' })).status, 401);
  const unknown = await client('sk-not-a-real-key-000000000').chat.completions.create({ model: 'sim-chat', messages: user('hi') }).catch((e) => e);
  t.type(unknown, OpenAI.AuthenticationError);
  t.equal(unknown.code, 'invalid_api_key');
  t.notOk(unknown.message.includes('sk-not-a-real-key-000000000'), 'the error does not echo the whole key');

  const created = await gw.admin('POST', '/admin/keys', { group: 'default', name: 'to-disable' });
  const victim = client(created.body.key);
  await victim.chat.completions.create({ model: 'sim-chat', messages: user('hi') });
  t.equal((await gw.admin('PATCH', `/admin/keys/${created.body.id}`, { disabled: true })).status, 200);
  const err = await victim.chat.completions.create({ model: 'sim-chat', messages: user('hi') }).catch((e) => e);
  t.type(err, OpenAI.AuthenticationError);
  t.equal(err.code, 'key_disabled');
});

t.test('403: a model or family the group lacks', async (t) => {
  await gw.admin('POST', '/admin/groups', { name: 'no-chat', models: ['*'], families: ['gemini'] });
  const key = await gw.admin('POST', '/admin/keys', { group: 'no-chat' });
  const noChat = await client(key.body.key).chat.completions.create({ model: 'sim-chat', messages: user('hi') }).catch((e) => e);
  t.type(noChat, OpenAI.PermissionDeniedError);
  t.equal(noChat.code, 'family_not_permitted');

  const basic = await gw.admin('POST', '/admin/keys', { group: 'basic-only' });
  const wrongModel = await client(basic.body.key).chat.completions.create({ model: 'sim-chat', messages: user('hi') }).catch((e) => e);
  t.type(wrongModel, OpenAI.PermissionDeniedError);
  t.equal(wrongModel.code, 'model_not_permitted');
});

t.test('400: unknown model, bad JSON, wrong types, unsupported parameters, output ceiling', async (t) => {
  const unknown = await openai.chat.completions.create({ model: 'nope', messages: user('hi') }).catch((e) => e);
  t.type(unknown, OpenAI.BadRequestError);
  t.equal(unknown.code, 'model_not_found');

  const raw = (body: string) =>
    fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { authorization: `Bearer ${gw.key}`, 'content-type': 'application/json' }, body });
  const badJson = await raw('{"model": "sim-chat", "messages": [');
  t.equal(badJson.status, 400);
  t.match(await badJson.json(), { error: { code: 'invalid_json', type: 'invalid_request_error' } });

  const wrongType = await raw(JSON.stringify({ model: 'sim-chat', messages: 'hi' }));
  t.equal(wrongType.status, 400);
  t.match(await wrongType.json(), { error: { param: 'messages', message: /messages/ } });

  const missingModel = await raw(JSON.stringify({ messages: user('hi') }));
  t.match(await missingModel.json(), { error: { param: 'model', code: 'invalid_request' } });

  const badRole = await raw(JSON.stringify({ model: 'sim-chat', messages: [{ role: 'robot', content: 'x' }] }));
  t.match(await badRole.json(), { error: { param: 'messages[0].role' } });

  const badTemp = await raw(JSON.stringify({ model: 'sim-chat', messages: user('hi'), temperature: 'hot' }));
  t.match(await badTemp.json(), { error: { param: 'temperature' } });

  const tools = await openai.chat.completions.create({ model: 'sim-basic', messages: user('hi'), tools: [weatherTool] }).catch((e) => e);
  t.type(tools, OpenAI.BadRequestError);
  t.equal(tools.code, 'unsupported_parameter');
  t.equal(tools.param, 'tools');

  const temperature = await openai.chat.completions.create({ model: 'sim-basic', messages: user('hi'), temperature: 0.5 }).catch((e) => e);
  t.equal(temperature.param, 'temperature');

  const ceiling = await openai.chat.completions.create({ model: 'sim-chat', messages: user('hi'), max_tokens: 100000 }).catch((e) => e);
  t.type(ceiling, OpenAI.BadRequestError);
  t.equal(ceiling.param, 'max_tokens');
});

t.test('the output ceiling default is applied and max_tokens caps the answer', async (t) => {
  const res = await openai.chat.completions.create({ model: 'sim-chat', messages: user('Long [[sim tokens=50]]'), max_completion_tokens: 3 });
  t.equal(res.choices[0]!.finish_reason, 'length');
  t.equal(res.usage!.completion_tokens, 3);
});

t.test('413: a body over the limit', async (t) => {
  const big = JSON.stringify({ model: 'sim-chat', messages: user('x'.repeat(70_000)) });
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${gw.key}`, 'content-type': 'application/json' },
    body: big,
  });
  t.equal(res.status, 413);
  t.match(await res.json(), { error: { code: 'request_too_large' } });
  // The gateway is still serving.
  const ok = await openai.chat.completions.create({ model: 'sim-chat', messages: user('still there?') });
  t.ok(ok.choices[0]);
});

t.test('upstream failures: 500 becomes 502, 429 passes through', async (t) => {
  const e500 = await openai.chat.completions.create({ model: 'sim-chat', messages: user('fail [[sim error=500]]') }).catch((e) => e);
  t.type(e500, OpenAI.InternalServerError);
  t.equal(e500.status, 502);
  t.equal(e500.code, 'upstream_error');

  const e429 = await openai.chat.completions.create({ model: 'sim-chat', messages: user('busy [[sim error=429]]') }).catch((e) => e);
  t.type(e429, OpenAI.RateLimitError);

  const streamed = await openai.chat.completions
    .create({ model: 'sim-chat', messages: user('fail [[sim error=503]]'), stream: true })
    .catch((e) => e);
  t.equal(streamed.status, 503, 'a stream that fails before it starts gets a status, not a stream');
});

t.test('unreachable upstream → 503, first-byte timeout → 504', async (t) => {
  const down = await openai.chat.completions.create({ model: 'sim-unreachable', messages: user('hi') }).catch((e) => e);
  t.equal(down.status, 503);
  t.equal(down.code, 'upstream_unavailable');
  const slow = await openai.chat.completions.create({ model: 'sim-impatient', messages: user('hi [[sim ttft_ms=2000]]') }).catch((e) => e);
  t.equal(slow.status, 504);
  t.equal(slow.code, 'upstream_timeout');
});

t.test('a stream cut midway ends with an error event and estimated usage', async (t) => {
  const { data: stream, response } = await openai.chat.completions
    .create({ model: 'sim-chat', messages: user('cut [[sim tokens=40 cut_after=5]]'), stream: true })
    .withResponse();
  let text = '';
  const err = await (async () => {
    for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? '';
  })().catch((e) => e);
  t.type(err, OpenAI.APIError, 'the SDK raises the error frame');
  t.match(err.message, /upstream/i);
  t.ok(text.length > 0, 'tokens before the cut arrived');
  const r = await eventually(() => usageFor(response.headers.get('x-request-id')), 'usage record');
  const record = await r;
  t.match(record, { outcome: 'error', estimated: true, streamed: true });
  t.ok(record.completionTokens >= 3 && record.completionTokens <= 8, `estimated ${record.completionTokens} tokens for 5 delivered`);
});

t.test('a client abort midway aborts the upstream and records usage as aborted', async (t) => {
  const before = (await (await fetch(`${sim.url}/stats`)).json()) as { aborted: number };
  const controller = new AbortController();
  const { data: stream, response } = await openai.chat.completions
    .create({ model: 'sim-chat', messages: user('slow [[sim tokens=400 tps=50]]'), stream: true }, { signal: controller.signal })
    .withResponse();
  let chunks = 0;
  await (async () => {
    for await (const _ of stream) if (++chunks === 4) controller.abort();
  })().catch(() => {});
  const stats = await eventually(async () => {
    const s = (await (await fetch(`${sim.url}/stats`)).json()) as { aborted: number };
    return s.aborted > before.aborted ? s : undefined;
  }, 'the simulator to see the abort');
  t.ok(await stats, 'upstream request was aborted');
  const r = await eventually(() => usageFor(response.headers.get('x-request-id')), 'usage record');
  const record = await r;
  t.match(record, { outcome: 'aborted', estimated: true, streamed: true });
  t.ok(record.completionTokens > 0 && record.completionTokens < 400, `estimated ${record.completionTokens} tokens`);
});

t.test('unknown fields pass through to the upstream untouched', async (t) => {
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${gw.key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'sim-chat', messages: user('echo [[sim tokens=2]]'), vendor_extension: { x: 1 }, seed: 7 }),
  });
  t.equal(res.status, 200);
  const seen = (await (await fetch(`${sim.url}/stats`)).json()) as { lastRequest: Record<string, unknown> };
  t.same(seen.lastRequest.vendor_extension, { x: 1 });
  t.equal(seen.lastRequest.seed, 7);
  t.equal(seen.lastRequest.max_completion_tokens, 512, 'the default output ceiling was added');
});

t.test('logs: one access line per request, never a credential', async (t) => {
  const lines = gw.logs.filter((l) => l.msg === 'request');
  t.ok(lines.length > 10, `${lines.length} access lines`);
  const text = JSON.stringify(gw.logs);
  t.notOk(text.includes(gw.key), 'the demo key is never logged');
  t.notOk(text.includes('upstream-secret-123'), 'the upstream key is never logged');
  t.ok(lines.every((l) => typeof l.req === 'string' && typeof l.latencyMs === 'number'));
  t.ok(lines.some((l) => typeof l.keyId === 'string' && String(l.keyId).startsWith('key_') && (l as any).tokens?.out > 0));
});
