/**
 * The Messages front door end to end: the official `@anthropic-ai/sdk` → Sluice → every upstream
 * family (chat, Responses and Gemini translated, Messages passed through), each a real simulator
 * process. Text, streams, tool round trips, thinking, Claude Code's request shape, count_tokens,
 * the model list, errors in Anthropic's shape, the max_tokens clamp and usage as recorded.
 */
import Anthropic from '@anthropic-ai/sdk';
import { Ajv } from 'ajv';
import t from 'tap';
import { eventually, simulatorUpstreams, startStack } from './helpers.js';

// A simulator process and every upstream family: near tap's default 60 s on two busy cores.
t.setTimeout(180_000);

const { sim, gw } = await startStack(
  (simUrl) => `
${simulatorUpstreams(simUrl)}  anthropic: { kind: anthropic, baseUrl: "${simUrl}/v1", apiKey: upstream-key }
models:
  - { id: up-chat, upstream: chat, upstreamModel: sim-chat, maxOutputTokens: { max: 8192, overMax: clamp } }
  - { id: up-responses, upstream: responses, upstreamModel: sim-responses, maxOutputTokens: { max: 8192, overMax: clamp } }
  - { id: up-gemini, upstream: gemini, upstreamModel: sim-gemini, maxOutputTokens: { max: 8192, overMax: clamp } }
  - { id: up-messages, upstream: anthropic, upstreamModel: sim-messages, maxOutputTokens: { max: 8192, overMax: clamp } }
  - { id: strict-chat, upstream: chat, upstreamModel: sim-chat, maxOutputTokens: { max: 4096 } }
  - { id: strict-messages, upstream: anthropic, upstreamModel: sim-messages, maxOutputTokens: { max: 4096 } }
  - { id: lenient-messages, upstream: anthropic, upstreamModel: sim-messages, features: { unsupportedTools: drop } }
  - { id: search-messages, upstream: anthropic, upstreamModel: sim-messages, features: { serverTools: [web_search] } }
`,
  { maxBodyBytes: 1024 * 1024 },
);

type Json = Record<string, any>;
const client = (apiKey = gw.key) => new Anthropic({ apiKey, baseURL: gw.url, maxRetries: 0 });
const anthropic = client();
const models = ['up-chat', 'up-responses', 'up-gemini', 'up-messages'];
const ajv = new Ajv();
const weather = { type: 'object' as const, properties: { city: { type: 'string' } }, required: ['city'] };
const tools: Anthropic.Tool[] = [{ name: 'get_weather', description: 'Weather in a city', input_schema: weather }];
const user = (content: string): Anthropic.MessageParam[] => [{ role: 'user', content }];

const usageRecords = async (): Promise<Json[]> => (await gw.admin('GET', '/admin/usage?limit=1000')).body.records;
const simStats = async (): Promise<Json> => (await (await fetch(`${sim.url}/stats`)).json()) as Json;

/** A raw call to the gateway, as Claude Code makes it (`?beta=true`, x-api-key, betas). */
function post(path: string, body: unknown, headers: Record<string, string> = {}) {
  return fetch(`${gw.url}${path}`, {
    method: 'POST',
    headers: { 'x-api-key': gw.key, 'anthropic-version': '2023-06-01', 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
}

/** The events of an SSE body, in order. */
function events(text: string): { event: string; data: Json }[] {
  return text
    .split('\n\n')
    .filter((f) => f.includes('data:'))
    .map((f) => ({ event: /^event: (.*)$/m.exec(f)?.[1] ?? '', data: JSON.parse(/^data: (.*)$/m.exec(f)![1]!) }));
}

for (const model of models) {
  t.test(`${model}: create and stream, with usage as the upstream counted it`, async (t) => {
    const created = await anthropic.messages.create({ model, max_tokens: 100, messages: user('Say something [[sim tokens=9]]') });
    t.match(created, { type: 'message', role: 'assistant', model, stop_reason: 'end_turn' });
    t.ok(created.content.length === 1 && created.content[0]!.type === 'text' && created.content[0]!.text.trim(), 'one text block');
    t.equal(created.usage.output_tokens, 9);
    t.ok(created.usage.input_tokens > 0);

    const stream = anthropic.messages.stream({ model, max_tokens: 100, messages: user('Say something [[sim tokens=9]]') });
    let deltas = '';
    stream.on('text', (text) => (deltas += text));
    const final = await stream.finalMessage();
    t.equal(final.stop_reason, 'end_turn');
    t.equal(final.usage.output_tokens, 9, 'message_delta carries the output tokens');
    t.equal(final.usage.input_tokens, created.usage.input_tokens, 'the final input tokens are the upstream figures');
    t.equal(final.content[0]!.type === 'text' && final.content[0]!.text, deltas, 'the accumulated text is the deltas');
  });

  for (const streamed of [false, true]) {
    t.test(`${model}: a tool round trip, ${streamed ? 'streamed' : 'not streamed'}`, async (t) => {
      const messages = user('Weather in Oslo?');
      const first = streamed
        ? await anthropic.messages.stream({ model, max_tokens: 200, tools, messages }).finalMessage()
        : await anthropic.messages.create({ model, max_tokens: 200, tools, messages });
      t.equal(first.stop_reason, 'tool_use');
      const call = first.content.find((b) => b.type === 'tool_use');
      if (call?.type !== 'tool_use') throw new Error('no tool_use block');
      t.equal(call.name, 'get_weather');
      t.match(call.id, /^[A-Za-z0-9_-]+$/, 'the id matches the pattern Anthropic requires');
      t.ok(ajv.validate(weather, call.input), 'the input validates against the schema');
      const second = await anthropic.messages.create({
        model,
        max_tokens: 200,
        tools,
        messages: [...messages, { role: 'assistant', content: first.content }, { role: 'user', content: [{ type: 'tool_result', tool_use_id: call.id, content: 'Sunny' }] }],
      });
      t.equal(second.stop_reason, 'end_turn');
      t.match(second.content.find((b) => b.type === 'text'), { text: /^The tool returned: .*Sunny/ });
    });
  }

  t.test(`${model}: Claude Code's request shape`, async (t) => {
    const body = {
      model,
      max_tokens: 64000,
      stream: true,
      system: [
        { type: 'text', text: 'x-anthropic-billing-header: cc_version=2.1.330.abc; cc_entrypoint=cli;' },
        { type: 'text', text: 'You are Claude Code.', cache_control: { type: 'ephemeral' } },
      ],
      messages: [
        { role: 'user', content: [{ type: 'text', text: 'Hello [[sim tokens=4]]', cache_control: { type: 'ephemeral', ttl: '1h' } }] },
        { role: 'system', content: 'The date is 2026-11-23.' },
      ],
      tools: [
        {
          name: 'Read',
          description: 'Reads a file',
          input_schema: { $schema: 'https://json-schema.org/draft/2020-12/schema', type: 'object', properties: { file_path: { type: 'string' }, limit: { type: 'integer', exclusiveMinimum: 0 } }, required: ['file_path'], additionalProperties: false },
        },
        { name: 'WebFetch', description: 'Fetches a page', input_schema: { type: 'object', properties: { url: { type: 'string', const: 'x' } } }, defer_loading: true },
      ],
      tool_choice: { type: 'auto' },
      thinking: { type: 'adaptive' },
      output_config: { effort: 'high' },
      context_management: { edits: [{ type: 'clear_thinking_20251015', keep: 'all' }] },
      metadata: { user_id: JSON.stringify({ device_id: 'd', session_id: 's' }) },
    };
    const res = await post('/v1/messages?beta=true', body, { 'anthropic-beta': 'claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27' });
    t.equal(res.status, 200, 'accepted');
    const seen = events(await res.text());
    t.equal(seen[0]!.event, 'message_start');
    t.ok(seen[0]!.data.message.usage.input_tokens > 0, 'message_start carries input tokens');
    t.equal(seen.at(-2)!.event, 'message_delta');
    t.equal(seen.at(-1)!.event, 'message_stop');
    t.equal(seen.at(-2)!.data.usage.output_tokens >= 4, true);
    const upstream = (await simStats()).lastRequest;
    if (model === 'up-messages') {
      t.equal(upstream.max_tokens, 8192, 'max_tokens clamped to the model max');
      t.same(upstream.context_management, body.context_management, 'passthrough keeps what only Messages can say');
    } else {
      t.notMatch(JSON.stringify(upstream), /x-anthropic-billing-header/, 'the billing line is kept from translated upstreams');
      t.match(JSON.stringify(upstream), /The date is 2026-11-23/, 'the mid-conversation system message reached the upstream');
    }
  });
}

t.test('a stream is exactly message_start, ping, blocks started, filled and stopped in order, message_delta, message_stop', async (t) => {
  for (const model of models) {
    const res = await post('/v1/messages', { model, max_tokens: 300, stream: true, tools, messages: user('Weather in Oslo? [[sim tokens=3]]') });
    t.equal(res.headers.get('content-type'), 'text/event-stream; charset=utf-8');
    const seen = events(await res.text());
    t.ok(seen.every((e) => e.event === e.data.type), `${model}: every event line names its data's type`);
    t.equal(seen[0]!.event, 'message_start');
    let open: number | undefined;
    let next = 0;
    for (const e of seen.slice(1, -2)) {
      if (e.event === 'ping') continue;
      if (e.event === 'content_block_start') {
        t.equal(open, undefined, `${model}: no block starts while another is open`);
        t.equal(e.data.index, next++, `${model}: block indexes count up from 0`);
        open = e.data.index;
      } else if (e.event === 'content_block_delta') t.equal(e.data.index, open, `${model}: deltas go to the open block`);
      else if (e.event === 'content_block_stop') {
        t.equal(e.data.index, open);
        open = undefined;
      } else t.fail(`${model}: unexpected ${e.event}`);
    }
    t.equal(open, undefined, `${model}: every block was stopped`);
    t.match(seen.at(-2), { event: 'message_delta', data: { delta: { stop_reason: 'tool_use' }, usage: { output_tokens: Number } } });
    t.match(seen.at(-1), { event: 'message_stop' });
  }
});

t.test('thinking: signatures pass byte for byte to a Messages upstream, which checks them on the next turn', async (t) => {
  const thinking = { type: 'enabled' as const, budget_tokens: 1024 };
  const messages = user('Weather in Oslo?');
  const first = await anthropic.messages.stream({ model: 'up-messages', max_tokens: 2000, thinking, tools, messages }).finalMessage();
  const block = first.content.find((b) => b.type === 'thinking');
  if (block?.type !== 'thinking') throw new Error('no thinking block');
  t.ok(block.signature.length > 0, 'the thinking is signed');
  const call = first.content.find((b) => b.type === 'tool_use')!;
  const result: Anthropic.MessageParam = { role: 'user', content: [{ type: 'tool_result', tool_use_id: (call as Anthropic.ToolUseBlock).id, content: 'Sunny' }] };
  const second = await anthropic.messages.create({ model: 'up-messages', max_tokens: 2000, thinking, tools, messages: [...messages, { role: 'assistant', content: first.content }, result] });
  t.equal(second.stop_reason, 'end_turn', 'the upstream took the replayed signature');
  const forged = [{ ...block, signature: `${block.signature.slice(0, -4)}AAA=` }, ...first.content.filter((b) => b.type !== 'thinking')];
  const refused = await anthropic.messages.create({ model: 'up-messages', max_tokens: 2000, thinking, tools, messages: [...messages, { role: 'assistant', content: forged }, result] }).catch((e) => e);
  t.type(refused, Anthropic.BadRequestError, 'a changed signature is refused by the upstream, with its own words');
  t.match(refused.error, { type: 'error', error: { type: 'invalid_request_error', message: /signature/ } });
});

t.test('thinking on translated upstreams: adaptive and enabled both work; Gemini thought signatures ride in the tool id', async (t) => {
  for (const model of ['up-chat', 'up-responses', 'up-gemini']) {
    for (const thinking of [{ type: 'adaptive' as const }, { type: 'enabled' as const, budget_tokens: 2048 }]) {
      const r = await anthropic.messages.create({ model, max_tokens: 4000, thinking, messages: user('Think [[sim tokens=3]]') });
      t.equal(r.stop_reason, 'end_turn', `${model} ${thinking.type}`);
    }
  }
  const thinking = { type: 'enabled' as const, budget_tokens: 2048 };
  const first = await anthropic.messages.create({ model: 'up-gemini', max_tokens: 4000, thinking, tools, messages: user('Weather in Oslo?') });
  const call = first.content.find((b) => b.type === 'tool_use') as Anthropic.ToolUseBlock;
  const [, carried] = call.id.split('__sig__');
  t.ok(carried, 'the call id carries the thought signature');
  t.equal(Buffer.from(Buffer.from(carried!, 'base64url').toString(), 'base64').length, 32, 'it is the simulator signature, intact');
  const second = await anthropic.messages.create({
    model: 'up-gemini',
    max_tokens: 4000,
    thinking,
    tools,
    messages: [...user('Weather in Oslo?'), { role: 'assistant', content: first.content }, { role: 'user', content: [{ type: 'tool_result', tool_use_id: call.id, content: 'Sunny' }] }],
  });
  t.equal(second.stop_reason, 'end_turn');
  const replayed = (await simStats()).lastRequest.contents[1].parts.find((p: Json) => p.functionCall);
  t.equal(replayed.thoughtSignature, Buffer.from(carried!, 'base64url').toString(), 'the upstream got its signature back');
});

t.test('count_tokens: a local estimate, no upstream call and no usage record', async (t) => {
  const before = await simStats();
  const recordsBefore = (await usageRecords()).length;
  const small = await anthropic.messages.countTokens({ model: 'up-messages', messages: user('Hello') });
  const large = await anthropic.messages.countTokens({ model: 'up-chat', system: 'Be brief.', tools, messages: user('Hello, how is the weather in Oslo today?') });
  t.ok(small.input_tokens > 0);
  t.ok(large.input_tokens > small.input_tokens, 'grows with the prompt');
  const raw = await post('/v1/messages/count_tokens?beta=true', { model: 'up-gemini', messages: user('Hi') });
  t.same(Object.keys((await raw.json()) as Json), ['input_tokens']);
  t.equal((await simStats()).requests, before.requests, 'no upstream call');
  await new Promise((r) => setTimeout(r, 200));
  t.equal((await usageRecords()).length, recordsBefore, 'no usage record');
  const unknown = await anthropic.messages.countTokens({ model: 'nope', messages: user('Hi') }).catch((e) => e);
  t.type(unknown, Anthropic.NotFoundError);
  const invalid = await post('/v1/messages/count_tokens', { model: 'up-chat', messages: [] });
  t.equal(invalid.status, 400);
});

t.test('GET /v1/models: Anthropic list with anthropic-version, OpenAI list without', async (t) => {
  const listed: string[] = [];
  for await (const m of anthropic.models.list({ limit: 2 })) {
    t.match(m, { type: 'model', display_name: String, created_at: /^\d{4}-\d\d-\d\dT/ });
    listed.push(m.id);
  }
  t.same(listed, [...models, 'strict-chat', 'strict-messages', 'lenient-messages', 'search-messages'], 'pages of two follow after_id to the end');
  const page = await (await fetch(`${gw.url}/v1/models?limit=2`, { headers: { 'x-api-key': gw.key, 'anthropic-version': '2023-06-01' } })).json();
  t.match(page, { has_more: true, first_id: 'up-chat', last_id: 'up-responses' });
  const openai = await (await fetch(`${gw.url}/v1/models`, { headers: { authorization: `Bearer ${gw.key}` } })).json();
  t.match(openai, { object: 'list', data: [{ object: 'model', id: 'up-chat' }] });
});

t.test('HEAD /api/hello answers 200 without a key', async (t) => {
  const res = await fetch(`${gw.url}/api/hello`, { method: 'HEAD' });
  t.equal(res.status, 200);
});

t.test('auth: x-api-key and Authorization: Bearer', async (t) => {
  const bearer = new Anthropic({ authToken: gw.key, apiKey: null, baseURL: gw.url, maxRetries: 0 });
  t.equal((await bearer.messages.create({ model: 'up-chat', max_tokens: 10, messages: user('Hi') })).type, 'message');
  const missing = await post('/v1/messages', { model: 'up-chat', max_tokens: 10, messages: user('Hi') }, { 'x-api-key': '' });
  t.equal(missing.status, 401);
  const wrong = await client('sk-wrong-key-0000000000').messages.create({ model: 'up-chat', max_tokens: 10, messages: user('Hi') }).catch((e) => e);
  t.type(wrong, Anthropic.AuthenticationError);
  t.match(wrong.error, { type: 'error', error: { type: 'authentication_error', message: String } });
});

t.test('errors in Anthropic shape: 403, 404, 400, 413, 429', async (t) => {
  await gw.admin('POST', '/admin/groups', { name: 'openai-only', models: ['*'], families: ['chat', 'responses'] });
  const openaiOnly = (await gw.admin('POST', '/admin/keys', { group: 'openai-only' })).body.key;
  const forbidden = await client(openaiOnly).messages.create({ model: 'up-chat', max_tokens: 10, messages: user('Hi') }).catch((e) => e);
  t.type(forbidden, Anthropic.PermissionDeniedError, 'a group without the messages family');
  t.match(forbidden.error, { error: { type: 'permission_error' } });

  const unknown = await anthropic.messages.create({ model: 'no-such-model', max_tokens: 10, messages: user('Hi') }).catch((e) => e);
  t.type(unknown, Anthropic.NotFoundError);
  t.match(unknown.error, { error: { type: 'not_found_error', message: /no-such-model/ } });

  for (const [body, field] of [
    [{ model: 'up-chat', messages: user('Hi') }, 'max_tokens'],
    [{ model: 'up-chat', max_tokens: 10, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64' } }] }] }, 'messages[0].content[0].source.media_type'],
    [{ model: 'up-chat', max_tokens: 10, messages: user('Hi'), tools: [{ name: 'bad name', input_schema: {} }] }, 'tools[0].name'],
    [{ model: 'up-chat', max_tokens: 10, messages: user('Hi'), thinking: { type: 'enabled', budget_tokens: 10 } }, 'thinking.budget_tokens'],
    [{ model: 'up-chat', max_tokens: 10, messages: user('Hi'), tool_choice: { type: 'tool' } }, 'tool_choice.name'],
  ] as const) {
    const res = await post('/v1/messages', body);
    t.equal(res.status, 400);
    const error = (await res.json()) as Json;
    t.match(error, { type: 'error', error: { type: 'invalid_request_error', message: String } });
    t.ok(error.error.message.includes(`'${field}'`), `names ${field}: ${error.error.message}`);
  }
  const notJson = await post('/v1/messages', '{"model":');
  t.match(await notJson.json(), { type: 'error', error: { type: 'invalid_request_error' } });

  const tooLarge = await post('/v1/messages', { model: 'up-chat', max_tokens: 10, messages: user('x'.repeat(2 * 1024 * 1024)) });
  t.equal(tooLarge.status, 413);
  t.match(await tooLarge.json(), { type: 'error', error: { type: 'request_too_large' } });

  await gw.admin('POST', '/admin/groups', { name: 'one-a-minute', models: ['*'], families: ['messages'], limits: { rpm: 1 } });
  const limited = client((await gw.admin('POST', '/admin/keys', { group: 'one-a-minute' })).body.key);
  await limited.messages.create({ model: 'up-chat', max_tokens: 10, messages: user('Hi') });
  const throttled = await limited.messages.create({ model: 'up-chat', max_tokens: 10, messages: user('Hi') }).catch((e) => e);
  t.type(throttled, Anthropic.RateLimitError);
  t.match(throttled.error, { error: { type: 'rate_limit_error' } });
  t.ok(Number(throttled.headers.get('retry-after')) >= 1, 'with retry-after');
});

t.test('max_tokens above the model max: clamped where the model says so, refused elsewhere', async (t) => {
  for (const model of ['up-chat', 'up-messages']) {
    // The SDK streams a request this large, as Claude Code does.
    const r = await anthropic.messages.stream({ model, max_tokens: 128000, messages: user('Hi [[sim tokens=3]]') }).finalMessage();
    t.equal(r.stop_reason, 'end_turn', `${model}: clamped`);
    const sent = (await simStats()).lastRequest;
    t.equal(sent.max_tokens ?? sent.max_completion_tokens, 8192, `${model}: the upstream was asked for the max`);
  }
  for (const model of ['strict-chat', 'strict-messages']) {
    const err = await anthropic.messages.stream({ model, max_tokens: 128000, messages: user('Hi') }).finalMessage().catch((e) => e);
    t.type(err, Anthropic.BadRequestError, `${model}: refused`);
    t.match(err.error, { error: { type: 'invalid_request_error', message: /max_tokens is too large/ } });
  }
});

t.test('what a translated upstream cannot say follows the model rules, naming the client\'s parameter', async (t) => {
  const refused = await anthropic.messages.create({ model: 'up-responses', max_tokens: 10, stop_sequences: ['END'], messages: user('Hi') }).catch((e) => e);
  t.type(refused, Anthropic.BadRequestError);
  t.match(refused.error, { error: { type: 'invalid_request_error', message: /'stop_sequences'/ } });
  const search = { type: 'web_search_20250305', name: 'web_search' } as const;
  const noSearch = await anthropic.messages.create({ model: 'up-chat', max_tokens: 10, tools: [search], messages: user('Hi') }).catch((e) => e);
  t.match(noSearch.error, { error: { type: 'invalid_request_error', message: /'tools\[0\]'.*web_search/ } }, 'a server tool the upstream cannot run');
  const refusedNative = await anthropic.messages.create({ model: 'up-messages', max_tokens: 10, tools: [search], messages: user('Hi') }).catch((e) => e);
  t.type(refusedNative, Anthropic.BadRequestError, 'nor one a native model does not offer');

  await anthropic.messages.create({ model: 'lenient-messages', max_tokens: 10, tools: [search, ...tools], messages: user('Hi') });
  t.same((await simStats()).lastRequest.tools, tools, 'a model whose policy drops it sends the other tools as they were');
  await anthropic.messages.create({ model: 'search-messages', max_tokens: 10, tools: [search, ...tools], messages: user('Hi') });
  t.same((await simStats()).lastRequest.tools, [search, ...tools], 'a model that offers it passes it on');
});

t.test('stop reasons: max_tokens from a translated length finish', async (t) => {
  for (const model of ['up-chat', 'up-gemini']) {
    const created = await anthropic.messages.create({ model, max_tokens: 3, messages: user('Long [[sim tokens=50]]') });
    t.equal(created.stop_reason, 'max_tokens', model);
    const streamed = await anthropic.messages.stream({ model, max_tokens: 3, messages: user('Long [[sim tokens=50]]') }).finalMessage();
    t.equal(streamed.stop_reason, 'max_tokens', `${model}, streamed`);
  }
});

t.test('passthrough forwards anthropic-version and anthropic-beta unchanged; translated upstreams ignore betas', async (t) => {
  const betas = 'interleaved-thinking-2025-05-14,context-management-2025-06-27';
  const res = await post('/v1/messages', { model: 'up-messages', max_tokens: 10, messages: user('Hi') }, { 'anthropic-beta': betas });
  t.equal(res.status, 200);
  t.match((await simStats()).lastHeaders, { 'anthropic-version': '2023-06-01', 'anthropic-beta': betas, 'x-api-key': 'upstream-key' });
  const translated = await post('/v1/messages', { model: 'up-chat', max_tokens: 10, messages: user('Hi') }, { 'anthropic-beta': 'no-such-beta-2099-01-01' });
  t.equal(translated.status, 200);
});

t.test('a failure after the stream started is an error event; the SDK reports it', async (t) => {
  for (const model of ['up-chat', 'up-messages']) {
    const res = await post('/v1/messages', { model, max_tokens: 100, stream: true, messages: user('Long [[sim tokens=50 cut_after=5]]') });
    t.equal(res.status, 200);
    const seen = events(await res.text());
    t.equal(seen[0]!.event, 'message_start');
    t.match(seen.at(-1), { event: 'error', data: { type: 'error', error: { type: String, message: String } } }, `${model}: ends with an error event`);
    t.notOk(seen.some((e) => e.event === 'message_stop'), `${model}: no message_stop`);
    const err = await anthropic.messages.stream({ model, max_tokens: 100, messages: user('Long [[sim tokens=50 cut_after=5]]') }).finalMessage().catch((e) => e);
    t.type(err, Anthropic.APIError, `${model}: the SDK throws`);
  }
});

t.test('usage: cache reads and writes convert both ways and are recorded', async (t) => {
  const native = await anthropic.messages.create({ model: 'up-messages', max_tokens: 10, messages: user('Cached [[sim tokens=2 cached=3 cache_write=2]]') });
  t.match(native.usage, { cache_read_input_tokens: 3, cache_creation_input_tokens: 2 });
  const translated = await anthropic.messages.create({ model: 'up-chat', max_tokens: 10, messages: user('Cached [[sim tokens=2 cached=3]]') });
  t.equal(translated.usage.cache_read_input_tokens, 3, 'OpenAI cached tokens are Anthropic cache reads');
  const streamed = await anthropic.messages.stream({ model: 'up-chat', max_tokens: 10, messages: user('Cached [[sim tokens=2 cached=3]]') }).finalMessage();
  t.equal(streamed.usage.cache_read_input_tokens, 3, 'also when streamed');
  t.equal(streamed.usage.input_tokens, translated.usage.input_tokens, 'input tokens leave the cache reads out');
  const records = await eventually(async () => {
    const all = (await usageRecords()).filter((r) => r.family === 'messages' && r.upstream === 'anthropic' && r.cachedInputTokens === 3);
    return all.length ? all : undefined;
  }, 'the usage record');
  t.match(records[0], { cachedInputTokens: 3, cacheWriteTokens: 2, promptTokens: native.usage.input_tokens + 5, completionTokens: 2, estimated: false });
});

t.test('every request was recorded with the messages family and real usage', async (t) => {
  const records = (await usageRecords()).filter((r) => r.family === 'messages' && r.status === 200);
  t.ok(records.length > 30);
  t.ok(records.every((r) => r.promptTokens > 0 && r.completionTokens > 0), 'every record has tokens');
  t.same(new Set(records.map((r) => r.upstream)), new Set(['chat', 'responses', 'gemini', 'anthropic']));
});

t.test('switching from a translated model to an Anthropic one: the unsigned thinking Sluice wrote is not sent on', async (t) => {
  // A thinking block as a translated model gives it to a Messages client: text, no signature.
  const history: Anthropic.MessageParam[] = [
    { role: 'user', content: 'Think about it.' },
    { role: 'assistant', content: [{ type: 'thinking', thinking: 'Let me see.', signature: '' }, { type: 'text', text: 'Done.' }] },
    { role: 'user', content: 'And now?' },
  ];
  const answer = await anthropic.messages.create({ model: 'up-messages', max_tokens: 64, messages: history });
  t.equal(answer.stop_reason, 'end_turn', 'the Anthropic upstream took the conversation');
  const sent = (await simStats()).lastRequest;
  t.same(sent.messages[1].content, [{ type: 'text', text: 'Done.' }], 'the unsigned block was left out, the rest kept');
});
