import t from 'tap';
import { recordingSink } from './helpers.js';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { Ajv } from 'ajv';
import { Ajv2020 } from 'ajv/dist/2020.js';
import { countTokens } from 'gpt-tokenizer';
import { plan, parseDirectives, units, type EngineInput, type JsonSchema, type SimMessage } from '../plugins/upstreams/simulator/engine.js';
import { chatCompletion, routeChat, type SimReply } from '../plugins/upstreams/simulator/chat.js';
import simulatorPlugin, { simulatorUpstream } from '../plugins/upstreams/simulator/index.js';
import type { BootContext, UpstreamCall, UpstreamFactory } from '../src/contracts.js';
import { GatewayError } from '../src/errors.js';
import { SseSplitter, frameData } from '../src/sse.js';
import { estimateTokens } from '../src/tokens.js';

// ---------------------------------------------------------------------------------------------
// Helpers

const user = (text: string, images = 0): SimMessage => ({ role: 'user', text, images });

function input(overrides: Partial<EngineInput> = {}): EngineInput {
  return { messages: [user('Tell me about rivers.')], tools: [], toolChoice: 'none', responseFormat: 'text', n: 1, ...overrides };
}

function textOf(p: ReturnType<typeof plan>, index = 0): string {
  return units(p.choices[index]).join('');
}

type Chunk = Record<string, unknown> & { choices: Record<string, unknown>[] };

/** Splits SSE bytes into parsed chunk objects, with the literal '[DONE]' kept as a string. */
function parseSse(bytes: string): (Chunk | '[DONE]')[] {
  const out: (Chunk | '[DONE]')[] = [];
  new SseSplitter().push(
    Buffer.from(bytes),
    (frame) => {
      const data = frameData(frame);
      if (data !== null) out.push(data === '[DONE]' ? '[DONE]' : (JSON.parse(data) as Chunk));
      return true;
    },
    () => {},
  );
  return out;
}

function scriptBytes(reply: SimReply): string {
  return reply.steps.map((s) => s.bytes).join('');
}

interface Completion {
  id: string;
  object: string;
  created: number;
  model: string;
  choices: {
    index: number;
    message: { content: string | null; tool_calls?: { id: string; function: { name: string; arguments: string } }[] };
    finish_reason: string;
  }[];
  usage: { prompt_tokens: number; completion_tokens: number };
}

function completion(reply: SimReply): Completion {
  return JSON.parse(scriptBytes(reply)) as Completion;
}

function chatBody(fields: Record<string, unknown>): string {
  return JSON.stringify({ model: 'sim-chat', messages: [{ role: 'user', content: 'Hello there' }], ...fields });
}

// ---------------------------------------------------------------------------------------------
// Engine

t.test('engine: deterministic answers made of single o200k tokens', async (t) => {
  const a = plan(input());
  const b = plan(input());
  t.same(a, b, 'same conversation, same plan');
  const choice = a.choices[0];
  t.equal(choice.kind, 'text');
  t.equal(units(choice).length, 16, 'default length is 16 tokens');
  t.equal(choice.finishReason, 'stop');
  for (const token of units(choice)) t.equal(countTokens(token), 1, `${JSON.stringify(token)} is one o200k token`);
  t.equal(a.usage.outputTokens, 16);
  t.match(textOf(a), /^[A-Z][a-z]+( [a-z]+)+\.$/, 'reads as a sentence');
  t.not(textOf(plan(input({ messages: [user('Something else entirely.')] }))), textOf(a), 'another conversation, another answer');

  const three = plan(input({ n: 3 }));
  t.equal(three.choices.length, 3);
  t.equal(three.usage.outputTokens, 48, 'usage sums all choices');
  t.ok(new Set(three.choices.map((_, i) => textOf(three, i))).size > 1, 'choices differ from each other');
});

t.test('engine: directives steer length, timing and faults', async (t) => {
  t.same(parseDirectives('go [[sim tokens=5 tps=50 ttft_ms=200 error=503 cut_after=2]] now'), {
    tokens: 5,
    tps: 50,
    ttftMs: 200,
    errorStatus: 503,
    cutAfter: 2,
  });
  t.same(
    parseDirectives('[[sim tokens=abc tps=-1 error=99 cut_after=1.5 colour=blue ttft_ms= tokens=5=3 junk]]'),
    { tokens: 16, tps: 0, ttftMs: 0 },
    'unknown keys and bad values are ignored',
  );
  t.same(parseDirectives('no directive here'), { tokens: 16, tps: 0, ttftMs: 0 });

  const p = plan(input({ messages: [user('Hi [[sim tokens=5 tps=40 ttft_ms=25 cut_after=3 error=429]]')] }));
  t.equal(units(p.choices[0]).length, 5);
  t.same(p.timing, { ttftMs: 25, tokensPerSecond: 40 });
  t.same(p.fault, { errorStatus: 429, cutAfter: 3 });

  const earlier = plan(input({ messages: [user('[[sim tokens=3]]'), { role: 'assistant', text: 'Ok.', images: 0 }, user('Again')] }));
  t.equal(units(earlier.choices[0]).length, 16, 'only the last user message counts');
  t.equal(units(plan(input({ messages: [user('[[sim tokens=0]]')] })).choices[0]).length, 0, 'an empty answer is allowed');
});

t.test('engine: max tokens and stop sequences', async (t) => {
  const capped = plan(input({ messages: [user('[[sim tokens=10]]')], maxTokens: 4 }));
  t.equal(units(capped.choices[0]).length, 4);
  t.equal(capped.choices[0].finishReason, 'length');
  t.equal(capped.usage.outputTokens, 4);

  const full = textOf(plan(input()));
  const stop = full.split(' ')[3];
  const stopped = plan(input({ stop: ['never-appears', stop] }));
  t.equal(textOf(stopped), full.slice(0, full.indexOf(stop)), 'cut right before the stop sequence');
  t.equal(stopped.choices[0].finishReason, 'stop');
  t.equal(stopped.usage.outputTokens, units(stopped.choices[0]).length, 'usage counts what was emitted');

  const exact = plan(input({ maxTokens: 16 }));
  t.equal(exact.choices[0].finishReason, 'stop', 'a cap the answer fits in is no length finish');
});

t.test('engine: image counts and tool results lead the answer', async (t) => {
  const two = plan(input({ messages: [user('What is this? [[sim tokens=10]]', 2)] }));
  t.match(textOf(two), /^I see 2 images\. [A-Z]/);
  t.equal(units(two.choices[0]).length, 10, 'the prefix counts toward the length');
  t.match(textOf(plan(input({ messages: [user('Look', 1)] }))), /^I see 1 image\./);

  const words = Array.from({ length: 30 }, (_, i) => `w${i}`).join(' ');
  const afterTool = plan(
    input({
      messages: [
        user('Weather in Paris? [[sim tokens=40]]'),
        { role: 'assistant', text: '', images: 0, toolCalls: [{ name: 'get_weather', argumentsJson: '{"city":"Paris"}' }] },
        { role: 'tool', text: words, images: 0 },
      ],
      tools: [{ name: 'get_weather' }],
      toolChoice: 'auto',
    }),
  );
  t.equal(afterTool.choices[0].kind, 'text', 'no tool call right after a tool result');
  const text = textOf(afterTool);
  t.ok(text.startsWith(`The tool returned: ${words.split(' ').slice(0, 20).join(' ')}. `), text);
  t.notOk(text.includes('w20'), 'the tool result is cut to 20 words');
});

const ajv = new Ajv();
const ajv2020 = new Ajv2020();

const toolSchemas: [string, JsonSchema, Ajv | Ajv2020][] = [
  [
    'weather',
    { type: 'object', properties: { location: { type: 'string' }, unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } }, required: ['location'] },
    ajv,
  ],
  [
    'every type',
    {
      type: 'object',
      additionalProperties: false,
      required: ['count', 'ratio', 'flag', 'nothing', 'kind', 'tags', 'nested', 'either', 'one', 'maybe', 'short'],
      properties: {
        count: { type: 'integer', minimum: 3, maximum: 9 },
        ratio: { type: 'number', exclusiveMinimum: 0, maximum: 0.5 },
        flag: { type: 'boolean' },
        nothing: { type: 'null' },
        kind: { const: 'fixed' },
        tags: { type: 'array', items: { type: 'string' }, minItems: 3, uniqueItems: true },
        nested: {
          type: 'object',
          additionalProperties: false,
          required: ['inner'],
          properties: { inner: { type: 'object', properties: { deep: { type: 'integer', multipleOf: 5, minimum: 7 } }, required: ['deep'] } },
        },
        either: { anyOf: [{ type: 'string', minLength: 10 }, { type: 'number' }] },
        one: { oneOf: [{ type: 'integer' }, { type: 'string' }] },
        maybe: { type: ['string', 'null'], maxLength: 3 },
        short: { type: 'string', maxLength: 2 },
      },
    },
    ajv,
  ],
  [
    'recursive $defs with allOf',
    {
      $defs: {
        Node: {
          type: 'object',
          additionalProperties: false,
          required: ['name', 'children'],
          properties: { name: { type: 'string' }, children: { type: 'array', items: { $ref: '#/$defs/Node' } } },
        },
      },
      type: 'object',
      required: ['root', 'pair'],
      properties: {
        root: { $ref: '#/$defs/Node' },
        pair: { type: 'array', prefixItems: [{ type: 'integer' }, { type: 'boolean' }], minItems: 2, items: false },
        merged: { allOf: [{ type: 'object', required: ['a'], properties: { a: { type: 'string' } } }, { type: 'object', required: ['b'], properties: { b: { type: 'integer' } } }] },
      },
    },
    ajv2020,
  ],
];

t.test('engine: tool arguments validate against their JSON schemas', async (t) => {
  for (const [label, parameters, validator] of toolSchemas) {
    const p = plan(input({ tools: [{ name: 'fn', parameters }], toolChoice: 'auto' }));
    const choice = p.choices[0];
    if (choice.kind !== 'tool_call') {
      t.fail(`${label}: expected a tool call`);
      continue;
    }
    const validate = validator.compile(parameters);
    const args: unknown = JSON.parse(choice.argumentsJson);
    t.ok(validate(args), `${label}: ${choice.argumentsJson} ${JSON.stringify(validate.errors)}`);
    t.equal(choice.fragments.join(''), choice.argumentsJson, `${label}: fragments concatenate to the arguments`);
    t.ok(choice.fragments.length > 1, `${label}: streamed in several fragments`);
    t.equal(p.usage.outputTokens, choice.fragments.length, `${label}: one output token per fragment`);
    t.equal(choice.finishReason, 'tool_calls');
    t.match(choice.callId, /^[A-Za-z0-9]{24}$/);
  }

  const bare = plan(input({ tools: [{ name: 'ping' }], toolChoice: 'required' })).choices[0];
  t.same(bare.kind === 'tool_call' && [bare.name, bare.argumentsJson], ['ping', '{}'], 'no parameters gives {}');

  const tools = [{ name: 'first' }, { name: 'second', parameters: { type: 'object', properties: { q: { type: 'string' } } } }];
  const named = plan(input({ tools, toolChoice: { name: 'second' } })).choices[0];
  t.same(named.kind === 'tool_call' && [named.name, named.argumentsJson], ['second', '{"q":"sample"}'], 'the named tool is called');
  t.equal(plan(input({ tools, toolChoice: 'none' })).choices[0].kind, 'text', "tool choice 'none' answers in text");

  const cut = plan(input({ tools: [{ name: 'fn', parameters: toolSchemas[1][1] }], toolChoice: 'auto', maxTokens: 3 }));
  t.equal(cut.choices[0].finishReason, 'length', 'arguments cut by max tokens end with length');
  t.equal(cut.usage.outputTokens, 3);
});

t.test('engine: JSON response formats', async (t) => {
  const obj = plan(input({ responseFormat: 'json_object' }));
  const parsed = JSON.parse(textOf(obj)) as { answer: string };
  t.type(parsed.answer, 'string');
  t.equal(parsed.answer, textOf(plan(input())), 'the answer is the text answer, wrapped');
  t.equal(obj.usage.outputTokens, units(obj.choices[0]).length);
  t.ok(units(obj.choices[0]).length > 3, 'streamed as several fragments');

  const schema = toolSchemas[1][1];
  const structured = plan(input({ responseFormat: { schema } }));
  t.ok(ajv.compile(schema)(JSON.parse(textOf(structured))), 'json_schema output validates');
  t.equal(structured.choices[0].finishReason, 'stop');
  t.equal(structured.usage.outputTokens, units(structured.choices[0]).length);
});

t.test('engine: input tokens are exact', async (t) => {
  const messages: SimMessage[] = [
    { role: 'system', text: 'You are terse.', images: 0 },
    { role: 'user', text: 'Describe <|endoftext|> these.', images: 2 },
    { role: 'assistant', text: '', images: 0, toolCalls: [{ name: 'lookup', argumentsJson: '{"q":"x"}' }] },
    { role: 'tool', text: 'found it', images: 0 },
  ];
  const plain = (s: string) => countTokens(s, { disallowedSpecial: new Set() });
  const expected =
    plain('You are terse.') + plain('Describe <|endoftext|> these.') + plain('lookup') + plain('{"q":"x"}') + plain('found it') + 4 * 4 + 85 * 2;
  t.equal(plan(input({ messages })).usage.inputTokens, expected);
});

// ---------------------------------------------------------------------------------------------
// Chat rendering

t.test('chat: bad requests get OpenAI-shaped 400s', async (t) => {
  const cases: [string, string, string | null][] = [
    ['not json', '{oops', null],
    ['no model', JSON.stringify({ messages: [] }), 'model'],
    ['messages not an array', chatBody({ messages: 'hi' }), 'messages'],
    ['bad role', chatBody({ messages: [{ role: 'wizard', content: 'x' }] }), 'messages[0].role'],
    ['stream_options without stream', chatBody({ stream_options: { include_usage: true } }), 'stream_options'],
    ['n below 1', chatBody({ n: 0 }), 'n'],
    ['unknown tool choice', chatBody({ tools: [{ type: 'function', function: { name: 'a' } }], tool_choice: { type: 'function', function: { name: 'b' } } }), 'tool_choice'],
    ['bad response format', chatBody({ response_format: { type: 'yaml' } }), 'response_format.type'],
  ];
  for (const [label, body, param] of cases) {
    const reply = chatCompletion(body);
    t.equal(reply.status, 400, label);
    const parsed = JSON.parse(scriptBytes(reply)) as { error: Record<string, unknown> };
    t.same(Object.keys(parsed.error), ['message', 'type', 'param', 'code'], `${label}: error keys`);
    t.equal(parsed.error.type, 'invalid_request_error', label);
    t.equal(parsed.error.param, param, `${label}: param`);
  }
});

t.test('chat: non-stream completion', async (t) => {
  const reply = routeChat('POST', '/chat/completions', Buffer.from(chatBody({})), { models: [] });
  if (!reply) throw new Error('no reply');
  t.equal(reply.status, 200);
  t.equal(reply.headers['content-type'], 'application/json');
  t.equal(reply.steps.length, 1);
  const body = completion(reply);
  t.match(body.id, /^chatcmpl-[A-Za-z0-9]+$/);
  t.equal(body.object, 'chat.completion');
  t.type(body.created, 'number');
  t.equal(body.model, 'sim-chat');
  t.same(body.choices[0], {
    index: 0,
    message: { role: 'assistant', content: body.choices[0].message.content, refusal: null, annotations: [] },
    logprobs: null,
    finish_reason: 'stop',
  });
  const expected = plan(input({ messages: [user('Hello there')] }));
  t.equal(body.choices[0].message.content, textOf(expected));
  t.same(body.usage, {
    prompt_tokens: expected.usage.inputTokens,
    completion_tokens: 16,
    total_tokens: expected.usage.inputTokens + 16,
    prompt_tokens_details: { cached_tokens: 0 },
    completion_tokens_details: { reasoning_tokens: 0 },
  });

  const tool = completion(chatCompletion(chatBody({ tools: [{ type: 'function', function: { name: 'f', parameters: toolSchemas[0][1] } }] })));
  t.equal(tool.choices[0].finish_reason, 'tool_calls');
  t.equal(tool.choices[0].message.content, null);
  t.match(tool.choices[0].message.tool_calls?.[0], { id: /^call_/, type: 'function', function: { name: 'f', arguments: /^\{"location":"sample"/ } });

  const allowed = completion(
    chatCompletion(
      chatBody({
        tools: [{ type: 'function', function: { name: 'a' } }, { type: 'function', function: { name: 'b' } }],
        tool_choice: { type: 'allowed_tools', allowed_tools: { mode: 'auto', tools: [{ type: 'function', function: { name: 'b' } }] } },
      }),
    ),
  );
  t.equal(allowed.choices[0].message.tool_calls?.[0].function.name, 'b', 'allowed_tools calls the first listed');
});

t.test('chat: stream scripts parse back into OpenAI chunks', async (t) => {
  const nonStream = completion(chatCompletion(chatBody({})));
  for (const includeUsage of [false, true]) {
    const reply = chatCompletion(chatBody({ stream: true, ...(includeUsage ? { stream_options: { include_usage: true } } : {}) }));
    t.equal(reply.headers['content-type'], 'text/event-stream; charset=utf-8');
    t.equal(reply.steps.length, 1, 'without pacing the whole stream is one step');
    t.notOk(reply.cut);
    const events = parseSse(scriptBytes(reply));
    t.equal(events.at(-1), '[DONE]', 'ends with [DONE]');
    const chunks = events.slice(0, -1) as Chunk[];
    t.ok(chunks.every((c) => c.id === chunks[0].id && c.created === chunks[0].created && c.object === 'chat.completion.chunk'), 'shared id and created');
    t.same(chunks[0].choices[0].delta, { role: 'assistant', content: '' }, 'opens with the role');
    const content = chunks.flatMap((c) => c.choices.map((ch) => (ch.delta as { content?: string }).content ?? '')).join('');
    t.equal(content, nonStream.choices[0].message.content, 'same text as the non-stream answer');
    const contentChunks = chunks.filter((c) => ((c.choices[0]?.delta as { content?: string } | undefined)?.content ?? '') !== '').length;
    const finish = chunks.find((c) => c.choices.length > 0 && c.choices[0].finish_reason !== null);
    t.same(finish?.choices[0], { index: 0, delta: {}, logprobs: null, finish_reason: 'stop' }, 'closes with an empty delta and the reason');
    if (includeUsage) {
      const last = chunks.at(-1)!;
      t.same(last.choices, [], 'usage chunk has no choices');
      t.match(last.usage, { completion_tokens: contentChunks, prompt_tokens: nonStream.usage.prompt_tokens });
      t.ok(chunks.slice(0, -1).every((c) => 'usage' in c && c.usage === null), 'every other chunk says usage: null');
    } else {
      t.ok(chunks.every((c) => !('usage' in c)), 'no usage key without include_usage');
    }
  }
});

t.test('chat: tool-call streams', async (t) => {
  const tools = [{ type: 'function', function: { name: 'get_weather', parameters: toolSchemas[0][1] } }];
  const nonStream = completion(chatCompletion(chatBody({ tools })));
  const call = nonStream.choices[0].message.tool_calls?.[0];
  const chunks = parseSse(scriptBytes(chatCompletion(chatBody({ tools, stream: true })))).slice(0, -1) as Chunk[];
  t.same(chunks[0].choices[0].delta, { role: 'assistant', content: null });
  const header = (chunks[1].choices[0].delta as { tool_calls: unknown[] }).tool_calls[0];
  t.same(header, { index: 0, id: call?.id, type: 'function', function: { name: 'get_weather', arguments: '' } });
  const args = chunks
    .slice(2, -1)
    .map((c) => (c.choices[0].delta as { tool_calls: { index: number; function: { arguments: string } }[] }).tool_calls[0])
    .map((d) => (t.equal(d.index, 0), d.function.arguments))
    .join('');
  t.equal(args, call?.function.arguments, 'fragments add up to the arguments');
  t.equal(chunks.at(-1)!.choices[0].finish_reason, 'tool_calls');
});

t.test('chat: pacing, cuts and error statuses', async (t) => {
  const paced = chatCompletion(chatBody({ stream: true, messages: [{ role: 'user', content: '[[sim tokens=5 tps=100 ttft_ms=50]]' }] }));
  t.same(
    paced.steps.map((s) => s.delayMs),
    [50, 10, 10, 10, 10],
    'ttft, then one interval per token',
  );
  t.match(paced.steps[0].bytes, /"role":"assistant"[\s\S]*"content":"[A-Z]/, 'the role chunk goes with the first token');
  t.match(paced.steps.at(-1)!.bytes, /data: \[DONE\]\n\n$/, 'the finish goes with the last token');

  const slow = chatCompletion(chatBody({ messages: [{ role: 'user', content: '[[sim tokens=3 tps=100 ttft_ms=30]]' }] }));
  t.same(slow.steps.map((s) => s.delayMs), [50], 'a non-stream answer arrives with its last token');

  const cut = chatCompletion(chatBody({ stream: true, messages: [{ role: 'user', content: '[[sim tokens=8 cut_after=3]]' }] }));
  t.ok(cut.cut, 'the transport is told to drop the connection');
  const events = parseSse(scriptBytes(cut));
  t.notOk(events.includes('[DONE]'));
  t.equal(events.length, 4, 'the role chunk and three tokens');
  t.ok((events as Chunk[]).every((c) => c.choices[0].finish_reason === null), 'no finish before the cut');

  const cutOnly = chatCompletion(chatBody({ messages: [{ role: 'user', content: '[[sim cut_after=1]]' }] }));
  t.notOk(cutOnly.cut, 'cut_after does not apply to non-stream answers');

  for (const [status, type, code] of [
    [500, 'server_error', null],
    [429, 'requests', 'rate_limit_exceeded'],
    [400, 'invalid_request_error', null],
  ] as const) {
    const reply = chatCompletion(chatBody({ stream: true, messages: [{ role: 'user', content: `[[sim error=${status}]]` }] }));
    t.equal(reply.status, status);
    t.equal(reply.headers['content-type'], 'application/json');
    t.match(JSON.parse(scriptBytes(reply)), { error: { message: String, type, param: null, code } });
  }
});

t.test('chat: model list and unknown routes', async (t) => {
  const list = routeChat('GET', '/models', undefined, { models: ['a', 'b'] });
  t.same(JSON.parse(scriptBytes(list!)), {
    object: 'list',
    data: [
      { id: 'a', object: 'model', created: 1_700_000_000, owned_by: 'sluice-simulator' },
      { id: 'b', object: 'model', created: 1_700_000_000, owned_by: 'sluice-simulator' },
    ],
  });
  t.equal(routeChat('GET', '/chat/completions', undefined, { models: [] }), undefined, 'wrong method is not a chat route');
  t.equal(routeChat('POST', '/responses', '{}', { models: [] }), undefined);
});

// ---------------------------------------------------------------------------------------------
// In-process upstream

t.test('in-process upstream', async (t) => {
  let factory: UpstreamFactory | undefined;
  const ctx = { options: {}, addUpstreamKind: (kind: string, f: UpstreamFactory) => kind === 'simulator' && (factory = f) } as unknown as BootContext;
  const plugin = await simulatorPlugin(ctx);
  t.equal(plugin.name, 'upstreams/simulator');
  if (!factory) throw new Error('simulator kind not registered');
  const upstream = factory('sim', {}, ctx);
  t.equal(upstream.family, 'chat');
  t.equal(upstream.name, 'sim');
  const post = (content: string, extra: Record<string, unknown> = {}) => ({
    method: 'POST' as const,
    path: '/chat/completions',
    headers: {},
    body: chatBody({ stream: true, messages: [{ role: 'user', content }], ...extra }),
  });

  t.test('streams asynchronously', async (t) => {
    const rec = recordingSink();
    upstream.send(post('hi', { stream_options: { include_usage: true } }), rec.sink);
    t.same(rec.events, [], 'nothing happens inside send()');
    await rec.done;
    t.same(rec.events, ['start', 'data', 'end']);
    t.equal(rec.status(), 200);
    t.equal(rec.headers()['content-type'], 'text/event-stream; charset=utf-8');
    const events = parseSse(rec.text());
    t.equal(events.at(-1), '[DONE]');
    t.match(events.at(-2), { choices: [], usage: { completion_tokens: 16 } });
  });

  t.test('models and unknown paths', async (t) => {
    const rec = recordingSink();
    simulatorUpstream('s', { models: ['x'] }).send({ method: 'GET', path: '/models', headers: {} }, rec.sink);
    await rec.done;
    t.match(JSON.parse(rec.text()), { object: 'list', data: [{ id: 'x' }] });
    const missing = recordingSink();
    upstream.send({ method: 'GET', path: '/nope', headers: {} }, missing.sink);
    await missing.done;
    t.equal(missing.status(), 404);
    t.throws(() => simulatorUpstream('s', { models: 'x' }), /models/);
  });

  t.test('data returning false pauses until resume()', async (t) => {
    const rec = recordingSink((n) => n !== 1);
    const call = upstream.send(post('[[sim tokens=4 tps=200]]'), rec.sink);
    await sleep(80);
    t.same(rec.events, ['start', 'data'], 'held after the refused chunk, though the pacing allows more');
    call.resume();
    await rec.done;
    t.same(rec.events, ['start', 'data', 'data', 'data', 'data', 'end']);
    t.equal(parseSse(rec.text()).at(-1), '[DONE]');
  });

  t.test('pause() holds steps, start and end alike', async (t) => {
    const held = recordingSink();
    const first = upstream.send(post('[[sim tokens=2]]'), held.sink);
    first.pause();
    await sleep(30);
    t.same(held.events, [], 'paused before anything: not even start');
    first.resume();
    first.pause();
    first.resume();
    await held.done;
    t.same(held.events, ['start', 'data', 'end'], 'repeated resume() delivers each step once');

    // Pause from inside the first data call, so timing cannot race the assertion.
    let call: UpstreamCall | undefined;
    const rec = recordingSink((n) => (n === 1 && call?.pause(), true));
    call = upstream.send(post('[[sim tokens=3 tps=20]]'), rec.sink);
    await sleep(150);
    t.same(rec.events, ['start', 'data'], 'held midway though the pacing allows more');
    call.resume();
    await rec.done;
    t.same(rec.events, ['start', 'data', 'data', 'data', 'end']);
  });

  t.test('abort() stops everything', async (t) => {
    const rec = recordingSink();
    const call = upstream.send(post('[[sim tokens=20 tps=200]]'), {
      ...rec.sink,
      data(chunk) {
        call.abort();
        return rec.sink.data(chunk);
      },
    });
    await sleep(150);
    t.same(rec.events, ['start', 'data'], 'no data, end or error after the abort');
    const early = recordingSink();
    upstream.send(post('hi'), early.sink).abort();
    await sleep(20);
    t.same(early.events, [], 'an immediate abort leaves the sink untouched');
  });

  t.test('a cut becomes an upstream error', async (t) => {
    const rec = recordingSink();
    upstream.send(post('[[sim tokens=10 cut_after=2]]'), rec.sink);
    await rec.done;
    t.same(rec.events.at(-1), 'error');
    t.ok(rec.error() instanceof GatewayError);
    t.equal(rec.error()?.code, 'upstream_error');
    t.equal(parseSse(rec.text()).length, 3, 'the role chunk and two tokens arrived first');
  });

  t.test('error directive answers with that status', async (t) => {
    const rec = recordingSink();
    upstream.send(post('[[sim error=503]]'), rec.sink);
    await rec.done;
    t.equal(rec.status(), 503);
    t.match(JSON.parse(rec.text()), { error: { type: 'server_error' } });
  });
});

// ---------------------------------------------------------------------------------------------
// Standalone server

t.test('standalone server process', async (t) => {
  const script = fileURLToPath(new URL('../plugins/upstreams/simulator/server.js', import.meta.url));
  const child = spawn(process.execPath, [script, '--port', '0'], { stdio: ['ignore', 'pipe', 'inherit'] });
  t.teardown(() => {
    child.kill('SIGTERM');
  });
  const line = await new Promise<string>((resolve, reject) => {
    let out = '';
    child.stdout.setEncoding('utf8');
    child.stdout.on('data', (text: string) => {
      out += text;
      if (out.includes('\n')) resolve(out);
    });
    child.once('exit', (code) => reject(new Error(`simulator exited early with ${code}`)));
  });
  const match = /^simulator listening on http:\/\/127\.0\.0\.1:(\d+)\n$/.exec(line);
  t.ok(match, `one listening line: ${JSON.stringify(line)}`);
  const base = `http://127.0.0.1:${match![1]}`;
  const post = (body: string) => fetch(`${base}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });

  t.equal((await fetch(`${base}/healthz`)).status, 200, 'healthz');
  t.match(await (await fetch(`${base}/v1/models`)).json(), { object: 'list', data: [{ id: 'sim-chat' }, { id: 'sim-chat-basic' }] });

  const plain = await post(chatBody({}));
  t.equal(plain.status, 200);
  t.equal(plain.headers.get('content-type'), 'application/json');
  t.match(await plain.json(), { object: 'chat.completion', model: 'sim-chat', choices: [{ finish_reason: 'stop' }], usage: { completion_tokens: 16 } });

  const big = 'word '.repeat(100_000);
  const large = await post(chatBody({ messages: [{ role: 'user', content: big }] }));
  // Beyond its exact budget the count is an estimate, but a deterministic one: a body cut short would count differently.
  t.match(await large.json(), { usage: { prompt_tokens: estimateTokens(big) + 4 } }, 'a large body arriving in many chunks is read whole');

  const streamed = await post(chatBody({ stream: true, messages: [{ role: 'user', content: '[[sim tokens=6 tps=500]]' }] }));
  t.equal(streamed.headers.get('content-type'), 'text/event-stream; charset=utf-8');
  const events = parseSse(await streamed.text());
  t.equal(events.at(-1), '[DONE]');
  t.equal(events.length, 1 + 6 + 1 + 1, 'role, six tokens, finish, [DONE]');

  const cut = await post(chatBody({ stream: true, messages: [{ role: 'user', content: '[[sim tokens=50 tps=1000 cut_after=5]]' }] }));
  t.equal(cut.status, 200);
  const reader = cut.body!.getReader();
  let received = '';
  await t.rejects(
    (async () => {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) return;
        received += Buffer.from(value).toString('utf8');
      }
    })(),
    'the body ends in a network error, not a clean end',
  );
  t.equal(parseSse(received).length, 6, 'the role chunk and five tokens arrived before the cut');

  const stats = async () => (await (await fetch(`${base}/stats`)).json()) as { requests: number; aborted: number; lastRequest: unknown };
  t.match(await stats(), { aborted: 0, lastRequest: { messages: [{ content: '[[sim tokens=50 tps=1000 cut_after=5]]' }] } }, 'a cut is no client abort');

  const controller = new AbortController();
  const dropped = await fetch(`${base}/v1/chat/completions`, {
    method: 'POST',
    body: chatBody({ stream: true, messages: [{ role: 'user', content: '[[sim tokens=100 tps=50]]' }] }),
    signal: controller.signal,
  });
  await dropped.body!.getReader().read();
  controller.abort();
  let seen = await stats();
  for (let i = 0; i < 100 && seen.aborted === 0; i++) seen = (await sleep(10), await stats());
  t.equal(seen.aborted, 1, 'a client dropping midway is counted');
  t.equal(seen.requests, 5, 'every chat request is counted');

  const limited = await post(chatBody({ messages: [{ role: 'user', content: '[[sim error=429]]' }] }));
  t.equal(limited.status, 429);
  t.same(await limited.json(), { error: { message: 'Rate limit reached (simulated).', type: 'requests', param: null, code: 'rate_limit_exceeded' } });

  const garbage = await post('{');
  t.equal(garbage.status, 400);
  t.match(await garbage.json(), { error: { type: 'invalid_request_error' } });

  const missing = await fetch(`${base}/v2/other`);
  t.equal(missing.status, 404);
  t.match(await missing.json(), { error: { message: String, type: 'invalid_request_error', param: null, code: null } });

  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  child.kill('SIGTERM');
  t.equal(await exited, 0, 'SIGTERM exits cleanly');
});
