import { isDeepStrictEqual } from 'node:util';
import t from 'tap';
import fc from 'fast-check';
import { Ajv } from 'ajv';
import Anthropic from '@anthropic-ai/sdk';
import type { ContentBlockParam, MessageCreateParamsNonStreaming, MessageParam, Tool } from '@anthropic-ai/sdk/resources/messages';
import { recordingSink, startSimulatorProcess } from './helpers.js';
import { anthropicUpstream } from '../plugins/upstreams/anthropic/index.js';
import { simulatorUpstream } from '../plugins/upstreams/simulator/index.js';
import { thinkingSignature } from '../plugins/upstreams/simulator/messages.js';

type Json = Record<string, any>;

const sim = await startSimulatorProcess();
t.teardown(() => sim.stop());

// No retries: a 429 or 529 must reach the test as it was sent.
const client = new Anthropic({ apiKey: 'sim-key', baseURL: sim.url, maxRetries: 0 });

const weather: Tool = {
  name: 'get_weather',
  description: 'Weather in a city',
  input_schema: {
    type: 'object',
    properties: { city: { type: 'string', minLength: 2 }, unit: { type: 'string', enum: ['celsius', 'fahrenheit'] }, days: { type: 'integer', minimum: 1, maximum: 7 } },
    required: ['city', 'unit', 'days'],
    additionalProperties: false,
  },
};

function ask(text: string, fields: Partial<MessageCreateParamsNonStreaming> = {}): MessageCreateParamsNonStreaming {
  return { model: 'sim-messages', max_tokens: 1000, messages: [{ role: 'user', content: text }], ...fields };
}

/** The SDK's error for a request that must fail. */
async function apiError(promise: Promise<unknown>): Promise<InstanceType<typeof Anthropic.APIError>> {
  try {
    await promise;
  } catch (err) {
    if (err instanceof Anthropic.APIError) return err;
    throw err;
  }
  throw new Error('the request succeeded');
}

/** A raw POST, for what the SDK would never send. */
async function post(path: string, body: unknown, headers: Record<string, string> = { 'x-api-key': 'k', 'anthropic-version': '2023-06-01' }) {
  const res = await fetch(`${sim.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) });
  return { status: res.status, headers: res.headers, text: await res.text() };
}

/** The events of an SSE body, checking that each `event:` line names its data's type. */
function sseEvents(t: Tap, text: string): Json[] {
  const frames = text.split('\n\n').filter((f) => f !== '');
  return frames.map((frame) => {
    const m = /^event: (\S+)\ndata: (.*)$/.exec(frame);
    t.ok(m, `an event: and a data: line (${frame.slice(0, 40)})`);
    const data = JSON.parse(m![2]) as Json;
    t.equal(data.type, m![1], 'the event line names the data type');
    return data;
  });
}

type Tap = Parameters<Parameters<typeof t.test>[0]>[0];

t.test('create: a text answer in Anthropic shape, with its usage and request id', async (t) => {
  const { data, response } = await client.messages.create(ask('Tell me about rivers. [[sim tokens=7]]')).withResponse();
  t.match(data.id, /^msg_/);
  t.equal(data.type, 'message');
  t.equal(data.role, 'assistant');
  t.equal(data.model, 'sim-messages');
  t.equal(data.content.length, 1);
  t.equal(data.content[0].type, 'text');
  t.equal(data.stop_reason, 'end_turn');
  t.equal(data.stop_sequence, null);
  t.equal(data.usage.output_tokens, 7, 'one output token per generated piece');
  t.ok(data.usage.input_tokens > 0);
  t.equal(data.usage.cache_read_input_tokens, 0);
  t.equal(data.usage.cache_creation_input_tokens, 0);
  t.match(response.headers.get('request-id'), /^req_/);
  const again = await client.messages.create(ask('Tell me about rivers. [[sim tokens=7]]'));
  t.same(again.content, data.content, 'the same conversation gets the same answer');
});

t.test('usage: input_tokens excludes cache reads and writes; count_tokens counts the whole prompt', async (t) => {
  const prompt = 'A long shared preamble about rivers. [[sim cached=6 cache_write=4]]';
  const message = await client.messages.create(ask(prompt));
  const { usage } = message;
  t.equal(usage.cache_read_input_tokens, 6);
  t.equal(usage.cache_creation_input_tokens, 4);
  t.same(usage.cache_creation, { ephemeral_5m_input_tokens: 4, ephemeral_1h_input_tokens: 0 });
  const counted = await client.messages.countTokens({ model: 'sim-messages', messages: [{ role: 'user', content: prompt }] });
  t.equal(usage.input_tokens + usage.cache_read_input_tokens! + usage.cache_creation_input_tokens!, counted.input_tokens, 'input + cache read + cache write = the counted prompt');
  t.ok(usage.input_tokens > 0);

  const stream = client.messages.stream({ ...ask(prompt), max_tokens: 200 });
  let start: Json | undefined;
  stream.on('streamEvent', (event) => {
    if (event.type === 'message_start') start = event.message.usage;
  });
  const final = await stream.finalMessage();
  t.match(start, { input_tokens: usage.input_tokens, cache_read_input_tokens: 6, cache_creation_input_tokens: 4 }, 'message_start carries the real input figures');
  t.same(final.usage, usage, 'message_delta completes the same usage as the non-stream answer');

  const messages: MessageParam[] = [{ role: 'user', content: 'Tell me about rivers.' }];
  const bare = await client.messages.countTokens({ model: 'sim-messages', messages });
  const withSystem = await client.messages.countTokens({ model: 'sim-messages', system: 'Be brief and exact.', messages });
  t.ok(withSystem.input_tokens > bare.input_tokens, 'the system prompt is counted');
  const refused = await apiError(client.messages.countTokens({ model: 'sim-messages', max_tokens: 10, messages: [{ role: 'user', content: 'hi' }] } as never));
  t.equal(refused.status, 400, 'count_tokens takes no max_tokens');
  t.match(refused.apiMessage, 'max_tokens: Extra inputs are not permitted');
});

t.test('stream: events in Anthropic order, and finalMessage() assembles them', async (t) => {
  const res = await post('/v1/messages', { ...ask('Weather in Paris, please.'), stream: true, tools: [weather], thinking: { type: 'enabled', budget_tokens: 1024 }, max_tokens: 2000 });
  t.equal(res.status, 200);
  t.match(res.headers.get('content-type'), /^text\/event-stream/);
  const events = sseEvents(t, res.text);
  const types = events.map((e) => e.type);
  t.equal(types[0], 'message_start');
  t.equal(types[1], 'ping');
  t.same(types.slice(-2), ['message_delta', 'message_stop']);
  // Blocks: start, deltas, stop, one at a time, indexes from 0.
  let open: number | undefined;
  let next = 0;
  for (const e of events) {
    if (e.type === 'content_block_start') {
      t.equal(open, undefined, 'the previous block stopped first');
      t.equal(e.index, next++);
      open = e.index;
    } else if (e.type === 'content_block_delta') t.equal(e.index, open, 'deltas go to the open block');
    else if (e.type === 'content_block_stop') {
      t.equal(e.index, open);
      open = undefined;
    }
  }
  const starts = events.filter((e) => e.type === 'content_block_start').map((e) => e.content_block.type);
  t.same(starts, ['thinking', 'tool_use'], 'thinking first, then the call');
  const deltas = events.filter((e) => e.type === 'content_block_delta').map((e) => e.delta.type);
  t.equal(deltas.filter((d) => d === 'signature_delta').length, 1, 'one signature');
  t.ok(deltas.indexOf('signature_delta') > deltas.lastIndexOf('thinking_delta'), 'the signature ends the thinking');
  const pieces = events.filter((e) => e.delta?.type === 'input_json_delta').map((e) => e.delta.partial_json as string);
  t.ok(pieces.filter((p) => p !== '').length >= 3, 'the input arrives in several pieces');
  t.same(JSON.parse(pieces.join('')), { city: 'sample', unit: 'celsius', days: 1 });
  const delta = events.at(-2)!;
  t.equal(delta.delta.stop_reason, 'tool_use');
  t.equal(delta.usage.output_tokens, deltas.filter((d) => d === 'thinking_delta' || d === 'input_json_delta').length - 1, 'cumulative output: thinking and argument pieces');

  const final = await client.messages.stream(ask('Tell me about lakes. [[sim tokens=9]]')).finalMessage();
  t.equal(final.content[0].type, 'text');
  t.equal(final.usage.output_tokens, 9);
});

t.test('tool use round trip: schema-true arguments, then the answer reads the result', async (t) => {
  const ajv = new Ajv();
  const first = await client.messages.create(ask('What is the weather in Paris?', { tools: [weather] }));
  t.equal(first.stop_reason, 'tool_use');
  const call = first.content.find((b) => b.type === 'tool_use');
  if (call?.type !== 'tool_use') return t.fail('no tool_use block');
  t.match(call.id, /^toolu_[a-zA-Z0-9_-]+$/);
  t.equal(call.name, 'get_weather');
  t.ok(ajv.validate(weather.input_schema, call.input), 'the input validates against input_schema');

  const history: MessageParam[] = [
    { role: 'user', content: 'What is the weather in Paris?' },
    { role: 'assistant', content: first.content },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: call.id, content: 'Sunny and mild, 21 degrees.' }] },
  ];
  const second = await client.messages.create({ ...ask(''), messages: history, tools: [weather] });
  t.equal(second.stop_reason, 'end_turn');
  t.match(second.content[0], { type: 'text', text: /^The tool returned: Sunny and mild, 21 degrees\./ });

  const forced = await client.messages.create(ask('Anything.', { tools: [{ ...weather, name: 'other' }, weather], tool_choice: { type: 'tool', name: 'get_weather' } }));
  t.match(forced.content[0], { type: 'tool_use', name: 'get_weather' }, 'tool_choice names the tool');
  const none = await client.messages.create(ask('Anything.', { tools: [weather], tool_choice: { type: 'none' } }));
  t.equal(none.content[0].type, 'text', 'tool_choice none answers in text');
  const several = await client.messages.create(ask('Both. [[sim parallel=2]]', { tools: [weather, { ...weather, name: 'get_time' }] }));
  t.same(several.content.map((b) => b.type === 'tool_use' && b.name), ['get_weather', 'get_time'], 'parallel calls');
  const single = await client.messages.create(ask('Both. [[sim parallel=2]]', { tools: [weather, { ...weather, name: 'get_time' }], tool_choice: { type: 'auto', disable_parallel_tool_use: true } }));
  t.equal(single.content.length, 1, 'disable_parallel_tool_use: one call');
});

t.test('thinking: signed blocks verified on the next turn; a changed, dropped or forged one is refused', async (t) => {
  const thinking = { type: 'enabled', budget_tokens: 1024 } as const;
  const first = await client.messages.create(ask('Weather in Oslo?', { tools: [weather], thinking, max_tokens: 4000 }));
  t.same(first.content.map((b) => b.type), ['thinking', 'tool_use']);
  const block = first.content[0];
  if (block.type !== 'thinking') return t.fail('no thinking block');
  t.ok(block.thinking.length > 0 && block.signature.length > 0);
  t.equal(block.signature, thinkingSignature(block.thinking));
  const call = first.content[1];
  if (call.type !== 'tool_use') return t.fail('no tool_use block');

  const turn = (assistant: ContentBlockParam[]) =>
    client.messages.create({
      ...ask(''),
      max_tokens: 4000,
      thinking,
      tools: [weather],
      messages: [
        { role: 'user', content: 'Weather in Oslo?' },
        { role: 'assistant', content: assistant },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: call.id, content: 'Cold.' }] },
      ],
    });
  const replayed = await turn([block, call]);
  t.equal(replayed.stop_reason, 'end_turn', 'the replayed signature is accepted');
  t.equal(replayed.content[0].type, 'thinking', 'interleaved thinking after the tool result');

  const flipped = block.signature[0] === 'A' ? 'B' + block.signature.slice(1) : 'A' + block.signature.slice(1);
  const corrupted = await apiError(turn([{ ...block, signature: flipped }, call]));
  t.equal(corrupted.status, 400);
  t.equal(corrupted.type, 'invalid_request_error');
  t.equal(corrupted.apiMessage, 'messages.1.content.0: Invalid `signature` in `thinking` block');
  const edited = await apiError(turn([{ ...block, thinking: block.thinking + ' ' }, call]));
  t.match(edited.apiMessage, 'Invalid `signature` in `thinking` block', 'the text is bound to its signature');
  const unsigned = await apiError(turn([{ type: 'thinking', thinking: block.thinking } as never, call]));
  t.match(unsigned.apiMessage, 'messages.1.content.0.thinking.signature: Field required');
  const dropped = await apiError(turn([call]));
  t.match(dropped.apiMessage, /^messages\.1\.content\.0\.type: Expected `thinking` or `redacted_thinking`, but found `tool_use`/);

  const adaptive = await client.messages.create(ask('Hi.', { thinking: { type: 'adaptive', display: 'omitted' } }));
  t.match(adaptive.content[0], { type: 'thinking', thinking: '' }, 'display omitted: empty text, signature kept');
  t.equal((adaptive.content[0] as { signature: string }).signature, thinkingSignature(''));
  const disabled = await client.messages.create(ask('Hi.', { thinking: { type: 'disabled' } }));
  t.equal(disabled.content[0].type, 'text');
  const budget = await apiError(client.messages.create(ask('Hi.', { thinking: { type: 'enabled', budget_tokens: 2000 }, max_tokens: 2000 })));
  t.match(budget.apiMessage, /^`max_tokens` must be greater than `thinking.budget_tokens`/);
  const forced = await apiError(client.messages.create(ask('Hi.', { thinking, max_tokens: 4000, tools: [weather], tool_choice: { type: 'any' } })));
  t.match(forced.apiMessage, 'Thinking may not be enabled when tool_choice forces tool use.');
});

t.test('stop reasons: max_tokens, stop_sequence, refusal', async (t) => {
  const short = await client.messages.create(ask('Tell me a long story. [[sim tokens=50]]', { max_tokens: 5 }));
  t.equal(short.stop_reason, 'max_tokens');
  t.equal(short.usage.output_tokens, 5);
  const free = await client.messages.create(ask('A story. [[sim tokens=30]]'));
  const text = (free.content[0] as { text: string }).text;
  const stopAt = text.split(' ').slice(3, 5).join(' ');
  const stopped = await client.messages.create(ask('A story. [[sim tokens=30]]', { stop_sequences: ['zzz-never', stopAt] }));
  t.equal(stopped.stop_reason, 'stop_sequence');
  t.equal(stopped.stop_sequence, stopAt);
  t.equal((stopped.content[0] as { text: string }).text, text.slice(0, text.indexOf(stopAt)), 'the text ends before the stop sequence');
  const refused = await client.messages.create(ask('Something. [[sim block=1]]'));
  t.equal(refused.stop_reason, 'refusal');
  t.same(refused.content, []);
  t.match(refused.stop_details, { type: 'refusal', category: 'general_harms' });
});

t.test('validation: what Anthropic refuses, refused in its shape', async (t) => {
  const cases: [string, Json, RegExp | string][] = [
    ['no max_tokens', { model: 'm', messages: [{ role: 'user', content: 'hi' }] }, 'max_tokens: Field required'],
    ['an OpenAI field', { ...ask('hi'), n: 2 }, 'n: Extra inputs are not permitted'],
    ['context_management without its beta', { ...ask('hi'), context_management: { edits: [] } }, 'context_management: Extra inputs are not permitted'],
    ['an empty text block', ask('', { messages: [{ role: 'user', content: [{ type: 'text', text: '' }] }] }), 'messages.0.content.0.text: text content blocks must be non-empty'],
    ['whitespace text', ask('', { messages: [{ role: 'user', content: [{ type: 'text', text: ' \n' }] }] }), /must contain non-whitespace text/],
    ['an empty user message', ask(''), 'messages.0: user messages must have non-empty content'],
    [
      'tool_use without its result',
      ask('', {
        messages: [
          { role: 'user', content: 'hi' },
          { role: 'assistant', content: [{ type: 'tool_use', id: 'toolu_1', name: 'get_weather', input: {} }] },
          { role: 'user', content: 'go on' },
        ],
      }),
      /^messages\.1: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_1\./,
    ],
    [
      'a tool_result for no call',
      ask('', { messages: [{ role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_9', content: 'x' }] }] }),
      /^messages\.0\.content\.0: unexpected `tool_use_id` found in `tool_result` blocks: toolu_9\./,
    ],
    [
      'a tool_result after text',
      ask('', {
        messages: [
          { role: 'user', content: 'hi' },
          { role: 'assistant', content: [{ type: 'tool_use', id: 'toolu_1', name: 'get_weather', input: {} }] },
          { role: 'user', content: [{ type: 'text', text: 'here' }, { type: 'tool_result', tool_use_id: 'toolu_1', content: 'x' }] },
        ],
      }),
      /`tool_result` blocks must come first/,
    ],
    ['a tool id with a dot', ask('', { messages: [{ role: 'user', content: 'hi' }, { role: 'assistant', content: [{ type: 'tool_use', id: 'call.1', name: 'f', input: {} }] }] }), /tool_use\.id: String should match pattern/],
    ['a tool name with a slash', ask('hi', { tools: [{ name: 'a/b', input_schema: { type: 'object' } }] }), /tools\.0\.custom\.name: String should match pattern/],
    ['a system message first', ask('', { messages: [{ role: 'system', content: 'x' }, { role: 'user', content: 'hi' }] }), /^messages\.0: a `system` message must follow a `user` message/],
    ['temperature above 1', { ...ask('hi'), temperature: 1.5 }, 'temperature: Input should be less than or equal to 1'],
    ['a bad image type', ask('', { messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/bmp' as 'image/png', data: 'AA==' } }] }] }), /media_type: Input should be/],
  ];
  for (const [what, body, message] of cases) {
    const res = await post('/v1/messages', body);
    t.equal(res.status, 400, what);
    const json = JSON.parse(res.text) as Json;
    t.match(json, { type: 'error', error: { type: 'invalid_request_error', message }, request_id: /^req_/ }, what);
  }
  const beta = await post('/v1/messages', { ...ask('hi'), context_management: { edits: [] } }, { 'x-api-key': 'k', 'anthropic-version': '2023-06-01', 'anthropic-beta': 'claude-code-20250219, context-management-2025-06-27' });
  t.equal(beta.status, 200, 'context_management with its beta');
  const claudeCode = await post(
    '/v1/messages?beta=true',
    {
      ...ask('', {
        messages: [
          { role: 'user', content: [{ type: 'text', text: 'hi', cache_control: { type: 'ephemeral' } }] },
          { role: 'system', content: 'Reminder: be brief.' },
        ],
      }),
      system: [{ type: 'text', text: 'x-anthropic-billing-header: cc_version=2.1.330' }],
      metadata: { user_id: '{"session_id":"s"}' },
      thinking: { type: 'adaptive' },
      output_config: { effort: 'high' },
      max_tokens: 32000,
    },
    { 'x-api-key': 'k', 'anthropic-version': '2023-06-01' },
  );
  t.equal(claudeCode.status, 200, "Claude Code's request shape: ?beta=true, a trailing system message, adaptive thinking, output_config");

  const noKey = await post('/v1/messages', ask('hi'), { 'anthropic-version': '2023-06-01' });
  t.equal(noKey.status, 401);
  t.match(JSON.parse(noKey.text), { type: 'error', error: { type: 'authentication_error', message: 'x-api-key header is required' } });
  const bearer = await post('/v1/messages', ask('hi'), { authorization: 'Bearer anything', 'anthropic-version': '2023-06-01' });
  t.equal(bearer.status, 200, 'a Bearer token is a credential too');
  const noVersion = await post('/v1/messages', ask('hi'), { 'x-api-key': 'k' });
  t.equal(noVersion.status, 400);
  t.match(JSON.parse(noVersion.text), { error: { type: 'invalid_request_error', message: 'anthropic-version: header is required' } });
  const broken = await fetch(`${sim.url}/v1/messages`, { method: 'POST', headers: { 'x-api-key': 'k', 'anthropic-version': '2023-06-01' }, body: '{"model":' });
  t.match(await broken.json(), { type: 'error', error: { type: 'invalid_request_error' } }, 'unreadable JSON');
});

t.test('error shapes: each status its Anthropic type, through the SDK', async (t) => {
  const types: [number, string, unknown][] = [
    [400, 'invalid_request_error', Anthropic.BadRequestError],
    [401, 'authentication_error', Anthropic.AuthenticationError],
    [403, 'permission_error', Anthropic.PermissionDeniedError],
    [404, 'not_found_error', Anthropic.NotFoundError],
    [413, 'request_too_large', Anthropic.APIError],
    [429, 'rate_limit_error', Anthropic.RateLimitError],
    [500, 'api_error', Anthropic.InternalServerError],
    [504, 'timeout_error', Anthropic.APIError],
    [529, 'overloaded_error', Anthropic.APIError],
  ];
  for (const [status, type, cls] of types) {
    const err = await apiError(client.messages.create(ask(`Hi. [[sim error=${status}]]`)));
    t.equal(err.status, status);
    t.equal(err.type, type, `${status} is ${type}`);
    t.ok(err instanceof (cls as typeof Anthropic.APIError));
    t.match(err.error, { type: 'error', error: { type, message: /simulated/ }, request_id: /^req_/ });
    t.match(err.requestID, /^req_/);
  }
  const set = (faults: Json) => fetch(`${sim.url}/faults`, { method: 'POST', body: JSON.stringify(faults) });
  await set({ status: 529, retryAfter: 2 });
  const overloaded = await apiError(client.messages.create(ask('Hi.')));
  await set({});
  t.equal(overloaded.type, 'overloaded_error', 'a process fault on /v1/messages is in Anthropic shape');
  t.equal(overloaded.headers?.get('retry-after'), '2');
  t.equal((await client.messages.create(ask('Hi.'))).type, 'message', 'cleared');
  const missing = await apiError(client.models.retrieve('no-such-model'));
  t.equal(missing.status, 404);
  t.equal(missing.type, 'not_found_error');
});

t.test('faults mid-stream: an error event after the start, in the SDK as an APIError', async (t) => {
  for (const [directive, type] of [
    ['cut_after=3', 'overloaded_error'],
    ['cut_after=2 error=500', 'api_error'],
    ['cut_after=99', 'overloaded_error'],
  ] as const) {
    const texts: string[] = [];
    const stream = client.messages.stream(ask(`Tell me about rivers. [[sim tokens=8 ${directive}]]`));
    stream.on('text', (delta) => texts.push(delta));
    const err = await apiError(stream.finalMessage());
    t.equal(err.type, type, directive);
    t.match(err.error, { type: 'error', error: { type } });
    const expected = directive === 'cut_after=99' ? 8 : Number(/cut_after=(\d+)/.exec(directive)![1]);
    t.equal(texts.length, expected, `${directive}: the text before the failure arrived`);
  }
  const raw = await post('/v1/messages', { ...ask('Tell me. [[sim tokens=8 cut_after=1]]'), stream: true });
  t.equal(raw.status, 200, 'the stream had started');
  const events = sseEvents(t, raw.text);
  t.same(events.at(-1), { type: 'error', error: { type: 'overloaded_error', message: 'Overloaded (simulated)' } });
  t.notOk(events.some((e) => e.type === 'message_stop'), 'no message_stop after the error');
  const upfront = await apiError(client.messages.stream(ask('Hi. [[sim error=529]]')).finalMessage());
  t.equal(upfront.status, 529, 'error= without cut_after fails before the stream');
});

t.test('models: the Anthropic list when anthropic-version is sent, OpenAI shape without', async (t) => {
  const ids: string[] = [];
  for await (const model of client.models.list()) {
    t.equal(model.type, 'model');
    ids.push(model.id);
  }
  t.same(ids, ['sim-messages']);
  t.match(await client.models.retrieve('sim-messages'), { id: 'sim-messages', type: 'model', display_name: String, created_at: String });
  const openai = (await (await fetch(`${sim.url}/v1/models`)).json()) as Json;
  t.equal(openai.object, 'list', 'without the header, the OpenAI list');
});

t.test('property: a stream concatenates to the non-stream answer', async (t) => {
  const tools = [weather, { name: 'lookup', input_schema: { type: 'object' as const, properties: { q: { type: 'string' }, n: { type: 'integer', minimum: 3 } }, required: ['q'] } }];
  await fc.assert(
    fc.asyncProperty(
      fc.record({
        words: fc.array(fc.constantFrom('river', 'stone', 'light', 'sky', 'why', 'how'), { minLength: 1, maxLength: 6 }),
        tokens: fc.integer({ min: 0, max: 40 }),
        maxTokens: fc.integer({ min: 1, max: 60 }),
        useTools: fc.boolean(),
        thinking: fc.constantFrom('off', 'enabled', 'adaptive'),
        stop: fc.boolean(),
        cache: fc.integer({ min: 0, max: 5 }),
      }),
      async ({ words, tokens, maxTokens, useTools, thinking, stop, cache }) => {
        const params: MessageCreateParamsNonStreaming = ask(`${words.join(' ')} [[sim tokens=${tokens} cached=${cache}]]`, {
          max_tokens: thinking === 'enabled' ? 1024 + maxTokens : maxTokens,
          ...(useTools && { tools }),
          ...(thinking === 'enabled' && { thinking: { type: 'enabled', budget_tokens: 1024 } }),
          ...(thinking === 'adaptive' && { thinking: { type: 'adaptive' } }),
          ...(stop && { stop_sequences: [' the', '.'] }),
        });
        const whole = await client.messages.create(params);
        const streamed = await client.messages.stream(params).finalMessage();
        // The SDK's accumulator adds a parsed_output slot of its own.
        const { id: _a, ...a } = whole;
        const { id: _b, parsed_output: _p, ...b } = streamed as typeof streamed & { parsed_output?: unknown };
        if (isDeepStrictEqual(b, a)) return true;
        t.same(b, a, 'stream and non-stream differ');
        return false;
      },
    ),
    { numRuns: 40 },
  );
  t.pass('40 random requests: the same message both ways');
});

t.test('the anthropic upstream kind: x-api-key and anthropic-version on the way, a client version kept', async (t) => {
  const upstream = anthropicUpstream('claude', { baseUrl: `${sim.url}/v1`, apiKey: 'upstream-key' });
  t.equal(upstream.family, 'messages');
  t.teardown(() => upstream.close?.());
  const send = async (headers: Record<string, string>) => {
    const rec = recordingSink();
    upstream.send({ method: 'POST', path: '/messages', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(ask('Hi.')) }, rec.sink);
    await rec.done;
    const stats = (await (await fetch(`${sim.url}/stats`)).json()) as Json;
    return { status: rec.status(), body: JSON.parse(rec.text()) as Json, seen: stats.lastHeaders as Json };
  };
  const plain = await send({});
  t.equal(plain.status, 200);
  t.equal(plain.body.type, 'message');
  t.same(plain.seen, { 'x-api-key': 'upstream-key', 'anthropic-version': '2023-06-01' }, 'the configured key and the default version');
  const passthrough = await send({ 'anthropic-version': '2023-01-01', 'anthropic-beta': 'context-management-2025-06-27' });
  t.same(passthrough.seen, { 'x-api-key': 'upstream-key', 'anthropic-version': '2023-01-01', 'anthropic-beta': 'context-management-2025-06-27' }, "the client's version and betas go through");
  const configured = anthropicUpstream('claude2', { baseUrl: `${sim.url}/v1`, apiKey: 'k2', anthropicVersion: '2024-02-02' });
  t.teardown(() => configured.close?.());
  const rec = recordingSink();
  configured.send({ method: 'POST', path: '/messages', headers: { 'content-type': 'application/json' }, body: JSON.stringify(ask('Hi.')) }, rec.sink);
  await rec.done;
  const stats = (await (await fetch(`${sim.url}/stats`)).json()) as Json;
  t.equal(stats.lastHeaders['anthropic-version'], '2024-02-02', 'anthropicVersion from config');
  t.throws(() => anthropicUpstream('bad', { baseUrl: `${sim.url}/v1`, anthropicVersion: 5 }), /anthropicVersion/);
});

t.test('in process: family messages lists and answers as Anthropic does', async (t) => {
  const upstream = simulatorUpstream('sim', { family: 'messages' });
  t.equal(upstream.family, 'messages');
  const call = async (method: 'GET' | 'POST', path: string, body?: unknown) => {
    const rec = recordingSink();
    upstream.send({ method, path, headers: {}, body: body === undefined ? undefined : JSON.stringify(body) }, rec.sink);
    await rec.done;
    return { status: rec.status(), body: JSON.parse(rec.text()) as Json };
  };
  t.match(await call('GET', '/models'), { status: 200, body: { data: [{ type: 'model', id: 'sim-messages' }], has_more: false } });
  t.match(await call('POST', '/messages?beta=true', ask('Hi.')), { status: 200, body: { type: 'message', stop_reason: 'end_turn' } });
  t.match(await call('POST', '/messages/count_tokens', { model: 'm', messages: [{ role: 'user', content: 'Hi.' }] }), { status: 200, body: { input_tokens: Number } });
  t.match(await call('GET', '/nowhere'), { status: 404, body: { type: 'error', error: { type: 'not_found_error' } } });
  t.throws(() => simulatorUpstream('x', { family: 'anthropic' }), /'messages'/);
});
