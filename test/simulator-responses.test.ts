import t from 'tap';
import { recordingSink, rejection, startSimulatorProcess } from './helpers.js';
import { Ajv } from 'ajv';
import OpenAI from 'openai';
import type { Response as OAResponse, ResponseInputItem, ResponseStreamEvent } from 'openai/resources/responses/responses';
import { createResponse, routeResponses } from '../plugins/upstreams/simulator/responses.js';
import type { SimReply } from '../plugins/upstreams/simulator/reply.js';
import simulatorPlugin, { simulatorUpstream } from '../plugins/upstreams/simulator/index.js';
import type { BootContext, UpstreamFactory } from '../src/contracts.js';
import { GatewayError } from '../src/errors.js';

// ---------------------------------------------------------------------------------------------
// Helpers

type Json = Record<string, any>;
type TapTest = Parameters<Parameters<typeof t.test>[0]>[0];


interface Frame {
  event: string | undefined;
  data: Json;
}

/** Splits event-stream text into frames, keeping the `event:` line next to the parsed `data:`. */
function frames(text: string): Frame[] {
  return text
    .split('\n\n')
    .filter((block) => block.trim() !== '')
    .map((block) => {
      let event: string | undefined;
      let data = '';
      for (const line of block.split('\n')) {
        if (line.startsWith('event: ')) event = line.slice(7);
        else if (line.startsWith('data: ')) data += line.slice(6);
      }
      return { event, data: JSON.parse(data) as Json };
    });
}

function scriptText(reply: SimReply): string {
  return reply.steps.map((s) => s.bytes).join('');
}

function body(fields: Json): string {
  return JSON.stringify({ model: 'sim-chat', input: 'Tell me about rivers.', ...fields });
}

/** A non-stream reply's Response object. */
function responseOf(reply: SimReply): Json {
  return JSON.parse(scriptText(reply)) as Json;
}

const TERMINAL = new Set(['response.completed', 'response.incomplete', 'response.failed']);

/**
 * Checks a Responses event stream the way strict clients read one (section 2.8/2.9): sequence
 * numbers from 0, created then in_progress first, items appended at contiguous output indexes
 * with unique ids, every item event pointing at an open item, done texts equal to their deltas,
 * one terminal event last whose output equals the items as they were done. Returns the terminal
 * Response (undefined when the stream has none).
 */
function checkStream(t: TapTest, events: Json[], label: string): Json | undefined {
  let problems = 0;
  const check = (ok: boolean, what: string) => {
    if (!ok) {
      problems++;
      t.fail(`${label}: ${what}`);
    }
  };
  events.forEach((e, i) => check(e.sequence_number === i, `sequence_number ${String(e.sequence_number)} at position ${i}`));
  check(events[0]?.type === 'response.created', 'starts with response.created');
  check(events[1]?.type === 'response.in_progress', 'then response.in_progress');
  check(events[0]?.response?.status === 'in_progress' && events[0]?.response?.output?.length === 0, 'created: in progress, no output');

  const items: { id: string; type: string; done?: Json }[] = [];
  const ids = new Set<string>();
  const deltas = new Map<string, string>();
  let terminal: Json | undefined;
  for (const [i, e] of events.entries()) {
    if (terminal) check(false, `${e.type} after the terminal event`);
    const type = e.type as string;
    if (TERMINAL.has(type)) {
      terminal = e.response as Json;
      continue;
    }
    if (type === 'response.created' || type === 'response.in_progress') {
      check(i < 2, `${type} only at the start`);
      continue;
    }
    if (type === 'response.output_item.added') {
      check(e.output_index === items.length, `output_item.added at index ${String(e.output_index)}, expected ${items.length}`);
      check(typeof e.item.id === 'string' && e.item.id !== '' && !ids.has(e.item.id), `item id ${String(e.item.id)} is new and non-empty`);
      ids.add(e.item.id);
      items.push({ id: e.item.id, type: e.item.type });
      continue;
    }
    const item = items[e.output_index];
    check(item !== undefined && item.done === undefined, `${type} for an open item at ${String(e.output_index)}`);
    if (!item) continue;
    if (type === 'response.output_item.done') {
      check(e.item.id === item.id && e.item.type === item.type, `${type}: same item`);
      item.done = e.item;
      continue;
    }
    check(e.item_id === item.id, `${type}: item_id ${String(e.item_id)} is ${item.id}`);
    const key = `${item.id}/${type.replace(/\.(delta|done)$/, '')}`;
    if (type.endsWith('.delta')) deltas.set(key, (deltas.get(key) ?? '') + e.delta);
    else if (type === 'response.output_text.done' || type === 'response.reasoning_summary_text.done') {
      check(e.text === (deltas.get(key) ?? ''), `${type}: text equals its deltas`);
    } else if (type === 'response.function_call_arguments.done') {
      check(e.arguments === (deltas.get(key) ?? ''), `${type}: arguments equal their deltas`);
    }
  }
  if (terminal) {
    check(events.filter((e) => TERMINAL.has(e.type)).length === 1, 'exactly one terminal event');
    check(items.every((item) => item.done !== undefined), 'every item is done before the end');
    t.same(terminal.output, items.map((item) => item.done), `${label}: terminal output equals the done items`);
  }
  t.equal(problems, 0, `${label}: stream is well formed`);
  return terminal;
}

/** The output as sent: without the `parsed`/`parsed_arguments` fields the SDK's parser adds. */
function withoutParsed(output: unknown): unknown {
  return JSON.parse(JSON.stringify(output, (key, value: unknown) => (key === 'parsed' || key === 'parsed_arguments' ? undefined : value)));
}

const weatherSchema = {
  type: 'object',
  properties: { location: { type: 'string' }, unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } },
  required: ['location', 'unit'],
  additionalProperties: false,
};

const ajv = new Ajv();

// ---------------------------------------------------------------------------------------------
// Scripts, without a socket

t.test('responses: bad requests get OpenAI-shaped 400s naming the field', async (t) => {
  const user = { role: 'user', content: 'Hello' };
  const call = { type: 'function_call', call_id: 'call_1', name: 'f', arguments: '{}' };
  const cases: [string, string, string | null][] = [
    ['not json', '{oops', null],
    ['no model', JSON.stringify({ input: 'hi' }), 'model'],
    ['no input', JSON.stringify({ model: 'sim-chat' }), 'input'],
    ['chat messages', body({ input: undefined, messages: [user] }), 'messages'],
    ['chat response_format', body({ response_format: { type: 'json_object' } }), 'response_format'],
    ['function_call without call_id', body({ input: [user, { type: 'function_call', name: 'f', arguments: '{}' }] }), 'input[1].call_id'],
    ['output without call_id', body({ input: [user, call, { type: 'function_call_output', output: 'x' }] }), 'input[2].call_id'],
    ['output for an unknown call', body({ input: [user, { type: 'function_call_output', call_id: 'call_9', output: 'x' }] }), 'input[1].call_id'],
    ['input_text in assistant history', body({ input: [user, { role: 'assistant', content: [{ type: 'input_text', text: 'x' }] }] }), 'input[1].content[0].type'],
    ['output_text from the user', body({ input: [{ role: 'user', content: [{ type: 'output_text', text: 'x' }] }] }), 'input[0].content[0].type'],
    ['tool role', body({ input: [{ role: 'tool', content: 'x' }] }), 'input[0].role'],
    ['unknown item', body({ input: [{ type: 'telepathy' }] }), 'input[0].type'],
    ['chat-style function tool', body({ tools: [{ type: 'function', function: { name: 'f' } }] }), 'tools[0].name'],
    ['unknown tool type', body({ tools: [{ type: 'teleport' }] }), 'tools[0].type'],
    ['tool choice of a missing function', body({ tools: [{ type: 'function', name: 'f' }], tool_choice: { type: 'function', name: 'g' } }), 'tool_choice'],
    ['chat-style json_schema', body({ text: { format: { type: 'json_schema', json_schema: { name: 'x', schema: {} } } } }), 'text.format.name'],
    ['max_output_tokens below 1', body({ max_output_tokens: 0 }), 'max_output_tokens'],
    ['bad reasoning summary', body({ reasoning: { summary: 'verbose' } }), 'reasoning.summary'],
    ['previous_response_id', body({ previous_response_id: 'resp_123' }), 'previous_response_id'],
  ];
  for (const [label, raw, param] of cases) {
    const reply = createResponse(raw);
    t.equal(reply.status, 400, label);
    const parsed = JSON.parse(scriptText(reply)) as { error: Json };
    t.same(Object.keys(parsed.error), ['message', 'type', 'param', 'code'], `${label}: error keys`);
    t.equal(parsed.error.type, 'invalid_request_error', label);
    t.equal(parsed.error.param, param, `${label}: param`);
  }
  t.match(responseOf(createResponse(body({ previous_response_id: 'resp_123' }))), { error: { code: 'previous_response_not_found', message: /resp_123/ } });
  t.equal(routeResponses('GET', '/responses', undefined), undefined, 'wrong method is not a responses route');
  t.equal(routeResponses('POST', '/chat/completions', body({})), undefined, 'nor is another path');
  t.equal(routeResponses('POST', '/responses?x=1', body({}))?.status, 200, 'a query string is ignored');
});

t.test('responses: non-stream Response object', async (t) => {
  const r = responseOf(createResponse(body({ instructions: 'Be brief.', metadata: { run: '7' }, temperature: 0.5 })));
  t.match(r.id, /^resp_[0-9a-f]{48}$/);
  t.equal(r.object, 'response');
  t.type(r.created_at, 'number');
  t.equal(r.status, 'completed');
  t.equal(r.error, null);
  t.equal(r.incomplete_details, null);
  t.equal(r.instructions, 'Be brief.');
  t.equal(r.model, 'sim-chat');
  t.same(r.metadata, { run: '7' });
  t.equal(r.temperature, 0.5);
  t.equal(r.top_p, 1);
  t.equal(r.parallel_tool_calls, true);
  t.equal(r.tool_choice, 'auto');
  t.same(r.tools, []);
  t.same(r.text, { format: { type: 'text' }, verbosity: 'medium' });
  t.same(r.reasoning, { effort: null, summary: null });
  t.equal(r.max_output_tokens, null);
  t.equal(r.output.length, 1);
  const [message] = r.output as Json[];
  t.match(message.id, /^msg_[0-9a-f]{48}$/);
  t.same(Object.keys(message).sort(), ['content', 'id', 'role', 'status', 'type']);
  t.match(message, { type: 'message', status: 'completed', role: 'assistant' });
  t.equal(message.content.length, 1);
  t.same(Object.keys(message.content[0]).sort(), ['annotations', 'text', 'type']);
  t.match(message.content[0], { type: 'output_text', annotations: [] });
  t.match(message.content[0].text, /^[A-Z][a-z]+( [a-z]+)+\.$/);
  t.same(r.usage.input_tokens_details, { cached_tokens: 0 });
  t.same(r.usage.output_tokens_details, { reasoning_tokens: 0 });
  t.equal(r.usage.output_tokens, 16);
  t.equal(r.usage.total_tokens, r.usage.input_tokens + 16);

  const again = responseOf(createResponse(body({ instructions: 'Be brief.' })));
  t.equal(again.output[0].content[0].text, message.content[0].text, 'deterministic');
  t.not(again.id, r.id, 'each response gets its own id');
  const bare = responseOf(createResponse(body({})));
  t.ok(bare.usage.input_tokens < r.usage.input_tokens, 'instructions count as input');
});

t.test('responses: stream framing, order and consistency with the non-stream answer', async (t) => {
  const reply = createResponse(body({ stream: true }));
  t.equal(reply.status, 200);
  t.equal(reply.headers['content-type'], 'text/event-stream; charset=utf-8');
  t.notOk(reply.cut);
  const text = scriptText(reply);
  t.notOk(text.includes('[DONE]'), 'no [DONE] sentinel');
  t.match(text, /^event: response\.created\ndata: \{/, 'each frame has an event line, then a data line');
  const fs = frames(text);
  t.ok(fs.every((f) => f.event === f.data.type), 'the event line names the data type');
  const events = fs.map((f) => f.data);
  t.same(
    events.map((e) => e.type),
    [
      'response.created',
      'response.in_progress',
      'response.output_item.added',
      'response.content_part.added',
      ...Array<string>(16).fill('response.output_text.delta'),
      'response.output_text.done',
      'response.content_part.done',
      'response.output_item.done',
      'response.completed',
    ],
    'the plain text sequence of section 2.8',
  );
  const final = checkStream(t, events, 'text');
  const nonStream = responseOf(createResponse(body({})));
  t.equal(final?.output[0].content[0].text, nonStream.output[0].content[0].text, 'same text as the non-stream answer');
  t.same(final?.usage, nonStream.usage, 'same usage');
  t.match(events[2].item, { type: 'message', status: 'in_progress', role: 'assistant', content: [] });
  t.same(events[3].part, { type: 'output_text', text: '', annotations: [] });
  t.equal(events[0].response.id, final?.id, 'one response id throughout');
  t.equal(events[0].response.usage, null, 'no usage before the end');
});

t.test('responses: function calls, reasoning summaries and web search in streams', async (t) => {
  const tools = [{ type: 'function', name: 'get_weather', parameters: weatherSchema }];
  const call = frames(scriptText(createResponse(body({ stream: true, tools })))).map((f) => f.data);
  const callFinal = checkStream(t, call, 'function call');
  t.same(
    [call[2].type, call.at(-4)?.type, call.at(-3)?.type, call.at(-2)?.type],
    ['response.output_item.added', 'response.function_call_arguments.delta', 'response.function_call_arguments.done', 'response.output_item.done'],
  );
  t.match(call[2].item, { type: 'function_call', arguments: '', status: 'in_progress', name: 'get_weather' });
  t.match(call[2].item.id, /^fc_/);
  t.match(call[2].item.call_id, /^call_[A-Za-z0-9]{24}$/);
  t.ok(call.filter((e) => e.type === 'response.function_call_arguments.delta').every((e) => e.item_id === call[2].item.id), 'deltas carry the fc id, not the call id');
  t.match(call.at(-3), { name: 'get_weather' });
  const fc = callFinal?.output[0] as Json;
  t.ok(ajv.compile(weatherSchema)(JSON.parse(fc.arguments as string)), `arguments validate: ${String(fc.arguments)}`);
  t.equal(fc.status, 'completed');

  const searched = frames(
    scriptText(createResponse(body({ stream: true, input: 'Please SEARCH for river facts [[sim tokens=4]]', tools: [{ type: 'web_search' }], reasoning: { effort: 'low', summary: 'auto' } }))),
  ).map((f) => f.data);
  const final = checkStream(t, searched, 'reasoning and search');
  t.same(
    final?.output.map((o: Json) => o.type),
    ['reasoning', 'web_search_call', 'message'],
    'reasoning first, the search before the answer',
  );
  const [reasoning, search] = final?.output as Json[];
  t.match(reasoning.id, /^rs_/);
  t.equal(reasoning.summary.length, 1);
  t.match(reasoning.summary[0], { type: 'summary_text', text: /^[A-Z].+\.$/ });
  t.same(search, { type: 'web_search_call', id: search.id, status: 'completed', action: { type: 'search', query: 'Please SEARCH for river facts' } });
  t.match(search.id, /^ws_/);
  const summaryDeltas = searched.filter((e) => e.type === 'response.reasoning_summary_text.delta').length;
  t.equal(final?.usage.output_tokens_details.reasoning_tokens, summaryDeltas, 'one reasoning token per summary delta');
  t.equal(final?.usage.output_tokens, summaryDeltas + 4, 'reasoning tokens count as output');
  const order = searched.map((e) => e.type).filter((type) => !type.endsWith('.delta'));
  t.same(order, [
    'response.created',
    'response.in_progress',
    'response.output_item.added',
    'response.reasoning_summary_part.added',
    'response.reasoning_summary_text.done',
    'response.reasoning_summary_part.done',
    'response.output_item.done',
    'response.output_item.added',
    'response.web_search_call.in_progress',
    'response.web_search_call.searching',
    'response.web_search_call.completed',
    'response.output_item.done',
    'response.output_item.added',
    'response.content_part.added',
    'response.output_text.done',
    'response.content_part.done',
    'response.output_item.done',
    'response.completed',
  ]);
  t.same(searched[2].item, { type: 'reasoning', id: reasoning.id, summary: [] });

  const noWord = responseOf(createResponse(body({ input: 'Tell me about rivers.', tools: [{ type: 'web_search' }] })));
  t.same(noWord.output.map((o: Json) => o.type), ['message'], 'no search without the word');
  const refused = responseOf(createResponse(body({ input: 'search rivers', tools: [{ type: 'web_search' }], tool_choice: 'none' })));
  t.same(refused.output.map((o: Json) => o.type), ['message'], "tool_choice 'none' searches nothing");
  const noTool = responseOf(createResponse(body({ input: 'search rivers' })));
  t.same(noTool.output.map((o: Json) => o.type), ['message'], 'no search without the tool');
});

t.test('responses: max_output_tokens makes the response incomplete', async (t) => {
  const capped = responseOf(createResponse(body({ input: '[[sim tokens=40]]', max_output_tokens: 16 })));
  t.equal(capped.status, 'incomplete');
  t.same(capped.incomplete_details, { reason: 'max_output_tokens' });
  t.equal(capped.max_output_tokens, 16);
  t.equal(capped.usage.output_tokens, 16);
  t.equal(capped.output[0].status, 'incomplete', 'the cut message is incomplete too');

  const events = frames(scriptText(createResponse(body({ input: '[[sim tokens=40]]', max_output_tokens: 16, stream: true })))).map((f) => f.data);
  const final = checkStream(t, events, 'incomplete');
  t.equal(events.at(-1)?.type, 'response.incomplete', 'the terminal event is response.incomplete');
  t.equal(final?.status, 'incomplete');
  t.equal(events.filter((e) => e.type === 'response.output_text.delta').length, 16);

  // Reasoning spends the budget first: with 5 tokens there is only a cut summary.
  const starved = responseOf(createResponse(body({ max_output_tokens: 5, reasoning: { summary: 'concise' } })));
  t.equal(starved.status, 'incomplete');
  t.same(starved.output.map((o: Json) => o.type), ['reasoning']);
  t.same(starved.usage.output_tokens_details, { reasoning_tokens: 5 });
  t.equal(starved.usage.output_tokens, 5);

  const fits = responseOf(createResponse(body({ input: '[[sim tokens=10]]', max_output_tokens: 10 })));
  t.equal(fits.status, 'completed', 'an answer that fits is complete');
});

t.test('responses: pacing, cuts and error statuses', async (t) => {
  const paced = createResponse(body({ stream: true, input: '[[sim tokens=3 tps=100 ttft_ms=40]]' }));
  t.same(paced.steps.map((s) => s.delayMs), [40, 10, 10], 'ttft, then one interval per token');
  t.match(paced.steps[0].bytes, /response\.created[\s\S]*response\.output_text\.delta/, 'the opening events go with the first token');
  t.match(paced.steps.at(-1)!.bytes, /event: response\.completed\n/, 'the terminal event goes with the last token');

  const reasoned = createResponse(body({ stream: true, input: '[[sim tokens=3 tps=100 ttft_ms=40]]', reasoning: { summary: 'auto' } }));
  const summaryTokens = (frames(scriptText(reasoned)).at(-1)?.data.response.usage.output_tokens_details.reasoning_tokens ?? 0) as number;
  t.ok(summaryTokens > 0);
  t.equal(reasoned.steps.length, summaryTokens + 3, 'summary deltas are paced like tokens');

  const slow = createResponse(body({ input: '[[sim tokens=3 tps=100 ttft_ms=30]]' }));
  t.same(slow.steps.map((s) => s.delayMs), [50], 'a non-stream answer arrives with its last token');

  const cut = createResponse(body({ stream: true, input: '[[sim tokens=8 cut_after=3]]' }));
  t.ok(cut.cut, 'the transport is told to drop the connection');
  const cutEvents = frames(scriptText(cut)).map((f) => f.data);
  t.equal(cutEvents.filter((e) => e.type === 'response.output_text.delta').length, 3);
  t.notOk(cutEvents.some((e) => TERMINAL.has(e.type)), 'no terminal event');
  t.equal(checkStream(t, cutEvents, 'cut'), undefined);

  const late = createResponse(body({ stream: true, input: '[[sim tokens=4 cut_after=100]]' }));
  t.ok(late.cut);
  const lateEvents = frames(scriptText(late)).map((f) => f.data);
  t.equal(lateEvents.at(-1)?.type, 'response.output_item.done', 'a cut beyond the answer drops only the terminal event');

  t.notOk(createResponse(body({ input: '[[sim cut_after=1]]' })).cut, 'cut_after does not apply to non-stream answers');

  for (const [status, type, code] of [
    [500, 'server_error', null],
    [429, 'requests', 'rate_limit_exceeded'],
    [401, 'invalid_request_error', 'invalid_api_key'],
  ] as const) {
    const reply = createResponse(body({ stream: true, input: `[[sim error=${status}]]` }));
    t.equal(reply.status, status);
    t.equal(reply.headers['content-type'], 'application/json');
    t.match(responseOf(reply), { error: { message: String, type, param: null, code } });
  }
});

// ---------------------------------------------------------------------------------------------
// The official SDK against the standalone server

t.test('openai SDK against the standalone server', async (t) => {
  const sim = await startSimulatorProcess();
  t.teardown(() => sim.stop());
  const base = sim.url;

  // Every request the SDK sends is counted, to check /stats against.
  let sent = 0;
  let lastBody: unknown;
  const countingFetch: typeof fetch = (input, init) => {
    sent++;
    lastBody = typeof init?.body === 'string' ? JSON.parse(init.body) : undefined;
    return fetch(input, init);
  };
  const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'sk-simulator', maxRetries: 0, fetch: countingFetch });
  const model = 'sim-chat';

  await t.test('text', async (t) => {
    const r = await client.responses.create({ model, input: 'Tell me about rivers.' });
    t.equal(r.object, 'response');
    t.equal(r.status, 'completed');
    t.match(r.id, /^resp_/);
    t.match(r.output_text, /^[A-Z][a-z]+( [a-z]+)+\.$/, 'the SDK gathers output_text');
    t.equal(r.usage?.output_tokens, 16);
    t.equal(r.usage?.total_tokens, (r.usage?.input_tokens ?? NaN) + 16);
    // The same conversation asked over Chat Completions gets the same answer.
    const chat = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'Tell me about rivers.' }] });
    t.equal(r.output_text, chat.choices[0].message.content, 'same answer as chat for the same conversation');
    t.equal(r.usage?.input_tokens, chat.usage?.prompt_tokens, 'same input token count as chat');

    const items = await client.responses.create({
      model,
      instructions: 'You are terse.',
      input: [{ role: 'user', content: [{ type: 'input_text', text: 'What is this?' }, { type: 'input_image', image_url: 'https://example.com/a.png', detail: 'auto' }] }],
    });
    t.match(items.output_text, /^I see 1 image\. /, 'input_image parts are counted');
    t.equal(items.instructions, 'You are terse.');
  });

  await t.test('function call round trip', async (t) => {
    const tools: OpenAI.Responses.Tool[] = [{ type: 'function', name: 'get_weather', parameters: weatherSchema, strict: true }];
    const question: ResponseInputItem = { role: 'user', content: 'What is the weather in Paris?' };
    const first = await client.responses.create({ model, input: [question], tools });
    t.equal(first.output.length, 1);
    const call = first.output[0];
    if (call.type !== 'function_call') throw new Error(`expected a function call, got ${call.type}`);
    t.match(call.id, /^fc_/);
    t.match(call.call_id, /^call_/);
    t.equal(call.name, 'get_weather');
    t.equal(call.status, 'completed');
    t.ok(ajv.compile(weatherSchema)(JSON.parse(call.arguments)), `arguments validate: ${call.arguments}`);
    t.match(first.tools, [{ type: 'function', name: 'get_weather', parameters: weatherSchema, strict: true }]);

    const output: ResponseInputItem = { type: 'function_call_output', call_id: call.call_id, output: 'Sunny and 21 degrees' };
    const second = await client.responses.create({ model, input: [question, call, output], tools });
    t.same(second.output.map((o) => o.type), ['message'], 'no second call right after a tool result');
    t.match(second.output_text, /^The tool returned: Sunny and 21 degrees\. [A-Z]/);
    t.equal(second.status, 'completed');

    // The same history over Chat Completions: the families map onto the same conversation.
    const chat = await client.chat.completions.create({
      model,
      messages: [
        { role: 'user', content: 'What is the weather in Paris?' },
        { role: 'assistant', content: null, tool_calls: [{ id: call.call_id, type: 'function', function: { name: call.name, arguments: call.arguments } }] },
        { role: 'tool', tool_call_id: call.call_id, content: 'Sunny and 21 degrees' },
      ],
      tools: [{ type: 'function', function: { name: 'get_weather', parameters: weatherSchema } }],
    });
    t.equal(second.output_text, chat.choices[0].message.content);
    t.equal(second.usage?.input_tokens, chat.usage?.prompt_tokens);

    t.match(
      await rejection(client.responses.create({ model, input: [question, { type: 'function_call_output', call_id: 'call_unknown', output: 'x' }], tools })),
      { status: 400, param: 'input[1].call_id' },
      'an output for a call never made is refused',
    );
    const missingId = { type: 'function_call_output', output: 'x' } as unknown as ResponseInputItem;
    const err = await rejection(client.responses.create({ model, input: [question, call, missingId], tools }));
    t.ok(err instanceof OpenAI.BadRequestError, 'a BadRequestError');
    t.match(err, { status: 400, param: 'input[2].call_id', code: 'missing_required_parameter' }, 'an output without call_id is refused');
  });

  await t.test('json_schema via text.format', async (t) => {
    const schema = {
      type: 'object',
      properties: { city: { type: 'string' }, population: { type: 'integer', minimum: 1000 }, tags: { type: 'array', items: { type: 'string' }, minItems: 2 } },
      required: ['city', 'population', 'tags'],
      additionalProperties: false,
    };
    const r = await client.responses.create({ model, input: 'Describe Paris as JSON.', text: { format: { type: 'json_schema', name: 'city', schema, strict: true } } });
    const value: unknown = JSON.parse(r.output_text);
    const validate = ajv.compile(schema);
    t.ok(validate(value), `${r.output_text} ${JSON.stringify(validate.errors)}`);
    t.match(r.text, { format: { type: 'json_schema', name: 'city' } });

    const object = await client.responses.create({ model, input: 'Reply in JSON.', text: { format: { type: 'json_object' } } });
    t.type((JSON.parse(object.output_text) as { answer?: unknown }).answer, 'string');
  });

  await t.test('max_output_tokens gives an incomplete response', async (t) => {
    const r = await client.responses.create({ model, input: 'Go on. [[sim tokens=40]]', max_output_tokens: 16 });
    t.equal(r.status, 'incomplete');
    t.equal(r.incomplete_details?.reason, 'max_output_tokens');
    t.equal(r.usage?.output_tokens, 16);
  });

  await t.test('reasoning summary', async (t) => {
    const r = await client.responses.create({ model, input: 'Think first. [[sim tokens=6]]', reasoning: { effort: 'low', summary: 'detailed' } });
    t.same(r.output.map((o) => o.type), ['reasoning', 'message']);
    const reasoning = r.output[0];
    if (reasoning.type !== 'reasoning') throw new Error('expected reasoning');
    t.match(reasoning.id, /^rs_/);
    t.ok(reasoning.summary[0]?.text.length > 0, 'a summary text');
    const reasoningTokens = r.usage?.output_tokens_details.reasoning_tokens ?? 0;
    t.ok(reasoningTokens > 0, 'reasoning tokens are reported');
    t.equal(r.usage?.output_tokens, reasoningTokens + 6, 'and counted in output tokens');
    t.match(r.reasoning, { effort: 'low', summary: 'detailed' });
  });

  await t.test('streams the SDK accumulates', async (t) => {
    const requests: OpenAI.Responses.ResponseCreateParamsStreaming[] = [
      { model, input: 'Tell me about rivers.', stream: true },
      { model, input: 'What is the weather?', tools: [{ type: 'function', name: 'get_weather', parameters: weatherSchema, strict: true }], stream: true },
      { model, input: 'Please search the web for rivers.', tools: [{ type: 'web_search' }], reasoning: { summary: 'auto' }, stream: true },
      { model, input: 'Long one [[sim tokens=40]]', max_output_tokens: 20, stream: true },
    ];
    for (const { stream: _, ...params } of requests) {
      const label = String(params.input);
      const stream = client.responses.stream(params);
      const events: ResponseStreamEvent[] = [];
      for await (const event of stream) events.push(event);
      const final: OAResponse = await stream.finalResponse();
      const terminal = checkStream(t, events as unknown as Json[], label);
      t.equal(final.id, terminal?.id, `${label}: the SDK's final response is the terminal one`);
      t.same(withoutParsed(final.output), terminal?.output, `${label}: the accumulated output equals the terminal output`);
      const text = events.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta).join('');
      t.equal(final.output_text, text, `${label}: output_text is the deltas`);
      const nonStream = await client.responses.create(params as OpenAI.Responses.ResponseCreateParamsNonStreaming);
      t.equal(nonStream.output_text, final.output_text, `${label}: same text without streaming`);
      t.same(nonStream.usage, final.usage, `${label}: same usage without streaming`);
      t.same(nonStream.output.map((o) => o.type), final.output.map((o) => o.type), `${label}: same item types`);
    }
  });

  await t.test('error directives', async (t) => {
    const limited = await rejection(client.responses.create({ model, input: '[[sim error=429]]' }));
    t.ok(limited instanceof OpenAI.RateLimitError, 'a RateLimitError');
    t.match(limited, { status: 429, code: 'rate_limit_exceeded', type: 'requests' });
    const failed = await rejection(client.responses.stream({ model, input: 'Hi [[sim error=503]]' }).finalResponse());
    t.ok(failed instanceof OpenAI.InternalServerError, 'also when streaming');
    t.match(failed, { status: 503, type: 'server_error' });
    t.match(await rejection(client.responses.create({ model, input: 'x', previous_response_id: 'resp_abc' })), {
      status: 400,
      param: 'previous_response_id',
      code: 'previous_response_not_found',
    });
  });

  await t.test('a cut stream ends without a terminal event', async (t) => {
    const stream = await client.responses.create({ model, input: '[[sim tokens=30 tps=1000 cut_after=5]]', stream: true });
    const types: string[] = [];
    let failure: unknown;
    try {
      for await (const event of stream) types.push(event.type);
    } catch (err) {
      failure = err;
    }
    t.ok(failure instanceof Error, `the iteration fails when the connection drops: ${String(failure)}`);
    t.equal(types.filter((type) => type === 'response.output_text.delta').length, 5, 'five deltas arrived first');
    t.notOk(types.includes('response.completed'), 'no response.completed was seen');
    t.notOk(types.some((type) => TERMINAL.has(type)), 'nor any other terminal event');
    t.same(types.slice(0, 2), ['response.created', 'response.in_progress']);

    await t.rejects(client.responses.stream({ model, input: '[[sim tokens=30 cut_after=2]]' }).finalResponse(), 'finalResponse() rejects on a cut');
  });

  await t.test('the wire carries event and data lines', async (t) => {
    const res = await fetch(`${base}/v1/responses`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: body({ stream: true, input: '[[sim tokens=3]]' }) });
    sent++;
    lastBody = JSON.parse(body({ stream: true, input: '[[sim tokens=3]]' }));
    t.equal(res.status, 200);
    t.equal(res.headers.get('content-type'), 'text/event-stream; charset=utf-8');
    const text = await res.text();
    const fs = frames(text);
    t.ok(fs.length > 0 && fs.every((f) => f.event !== undefined && f.event === f.data.type), 'every frame names its type in both lines');
    t.equal(fs.at(-1)?.event, 'response.completed');
    t.notOk(text.includes('[DONE]'));
  });

  await t.test('/stats counts both endpoints', async (t) => {
    const stats = (await (await fetch(`${base}/stats`)).json()) as { requests: number; aborted: number; lastRequest: unknown };
    t.ok(sent > 10, 'many requests were sent');
    t.equal(stats.requests, sent, 'every chat and responses request is counted');
    t.same(stats.lastRequest, lastBody, 'lastRequest is the latest body');
    t.equal(stats.aborted, 0, 'cuts are no client aborts');
    await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'Last one.' }] });
    const after = (await (await fetch(`${base}/stats`)).json()) as { requests: number; lastRequest: { messages?: unknown } };
    t.equal(after.requests, sent);
    t.same(after.lastRequest.messages, [{ role: 'user', content: 'Last one.' }], 'a chat request is the latest again');
  });
});

// ---------------------------------------------------------------------------------------------
// In-process upstream

t.test('in-process upstream with family: responses', async (t) => {
  let factory: UpstreamFactory | undefined;
  const ctx = { options: {}, addUpstreamKind: (kind: string, f: UpstreamFactory) => kind === 'simulator' && (factory = f) } as unknown as BootContext;
  await simulatorPlugin(ctx);
  if (!factory) throw new Error('simulator kind not registered');
  const upstream = factory('sim-r', { family: 'responses' }, ctx);
  t.equal(upstream.family, 'responses', 'the family comes from the option');
  t.equal(upstream.name, 'sim-r');
  t.equal(factory('sim-c', {}, ctx).family, 'chat', 'chat by default');
  t.equal(factory('sim-c', { family: 'chat' }, ctx).family, 'chat');
  t.throws(() => simulatorUpstream('bad', { family: 'anthropic' }), /family/);

  const post = (path: string, payload: string) => ({ method: 'POST' as const, path, headers: {}, body: payload });

  const streamed = recordingSink();
  upstream.send(post('/responses', body({ stream: true, input: '[[sim tokens=5]]' })), streamed.sink);
  t.same(streamed.events, [], 'nothing happens inside send()');
  await streamed.done;
  t.same(streamed.events, ['start', 'data', 'end']);
  t.equal(streamed.status(), 200);
  const events = frames(streamed.text()).map((f) => f.data);
  const final = checkStream(t, events, 'in-process stream');
  t.equal(final?.status, 'completed');
  t.equal(final?.usage.output_tokens, 5);

  const plain = recordingSink();
  upstream.send(post('/responses', body({})), plain.sink);
  await plain.done;
  t.match(JSON.parse(plain.text()), { object: 'response', status: 'completed', usage: { output_tokens: 16 } });

  const chat = recordingSink();
  upstream.send(post('/chat/completions', JSON.stringify({ model: 'sim-chat', messages: [{ role: 'user', content: 'hi' }] })), chat.sink);
  await chat.done;
  t.match(JSON.parse(chat.text()), { object: 'chat.completion' }, 'the chat path is still served');

  const cut = recordingSink();
  upstream.send(post('/responses', body({ stream: true, input: '[[sim tokens=10 cut_after=2]]' })), cut.sink);
  await cut.done;
  t.equal(cut.events.at(-1), 'error');
  t.ok(cut.error() instanceof GatewayError);
  t.equal(cut.error()?.code, 'upstream_error');
  t.equal(frames(cut.text()).filter((f) => f.data.type === 'response.output_text.delta').length, 2);

  const failed = recordingSink();
  upstream.send(post('/responses', body({ input: '[[sim error=503]]' })), failed.sink);
  await failed.done;
  t.equal(failed.status(), 503);
  t.match(JSON.parse(failed.text()), { error: { type: 'server_error' } });

  const chatFamily = factory('sim-c', {}, ctx);
  const viaChat = recordingSink();
  chatFamily.send(post('/responses', body({})), viaChat.sink);
  await viaChat.done;
  t.equal(viaChat.status(), 200, 'a chat-family simulator answers /responses too');
});
