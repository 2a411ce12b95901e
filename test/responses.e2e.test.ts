/**
 * The Responses family end to end: the official openai SDK and the Vercel AI SDK against a native
 * Responses upstream (passthrough) and a chat-only upstream (the bridge), plus chat clients on a
 * Responses upstream. Upstreams are the simulator in its own process.
 */
import { createOpenAI } from '@ai-sdk/openai';
import { generateText, jsonSchema, streamText, tool } from 'ai';
import { Ajv } from 'ajv';
import OpenAI from 'openai';
import t from 'tap';
import { eventually, startStack } from './helpers.js';

const { sim, gw } = await startStack(
  (simUrl) => `
upstreams:
  chat-only: { kind: openai-chat, baseUrl: "${simUrl}/v1" }
  native: { kind: openai-responses, baseUrl: "${simUrl}/v1" }
models:
  - { id: sim-chat, upstream: chat-only }
  - { id: sim-responses, upstream: native, features: { serverTools: [web_search] } }
  - { id: sim-responses-hosted, upstream: native, upstreamModel: sim-responses, features: { serverTools: [web_search, file_search] } }
  - { id: sim-plain, upstream: chat-only, upstreamModel: sim-chat, features: { reasoning: false, temperature: false } }
`,
);

const openai = new OpenAI({ apiKey: gw.key, baseURL: `${gw.url}/v1`, maxRetries: 0 });
const lastUpstreamRequest = async () => ((await (await fetch(`${sim.url}/stats`)).json()) as { lastRequest: any }).lastRequest;
const usageFor = async (requestId: string | null) => (await gw.admin('GET', '/admin/usage')).body.records.find((r: any) => r.requestId === requestId);

const weather = {
  type: 'function' as const,
  name: 'get_weather',
  description: 'Weather for a city',
  strict: true,
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'], additionalProperties: false },
};

for (const model of ['sim-responses', 'sim-chat']) {
  const how = model === 'sim-chat' ? 'bridged' : 'native';

  t.test(`${how}: responses.create text`, async (t) => {
    const res = await openai.responses.create({ model, input: 'Hello there [[sim tokens=6]]' });
    t.match(res.id, /^resp_/);
    t.equal(res.object, 'response');
    t.equal(res.status, 'completed');
    t.ok(res.output_text.length > 0);
    t.equal(res.usage?.output_tokens, 6);
    t.ok(res.usage!.input_tokens > 0);
    t.equal(res.usage!.total_tokens, res.usage!.input_tokens + 6);
    t.ok(res.usage!.output_tokens_details && res.usage!.input_tokens_details, 'details objects present');
  });

  t.test(`${how}: responses.stream follows the full event sequence`, async (t) => {
    const stream = openai.responses.stream({ model, input: 'Stream to me [[sim tokens=8]]' });
    const events: any[] = [];
    for await (const e of stream) events.push(e);
    const final = await stream.finalResponse();
    t.equal(events[0].type, 'response.created');
    t.equal(events[1].type, 'response.in_progress');
    t.equal(events.at(-1).type, 'response.completed');
    t.same(events.map((e) => e.sequence_number), events.map((_, i) => i), 'sequence numbers count from 0');
    t.same(
      events.filter((e) => !e.type.startsWith('response.output_text.delta')).map((e) => e.type).slice(2, -1),
      ['response.output_item.added', 'response.content_part.added', 'response.output_text.done', 'response.content_part.done', 'response.output_item.done'],
    );
    const deltas = events.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta).join('');
    t.equal(final.output_text, deltas);
    t.equal(final.usage?.output_tokens, 8);
  });

  t.test(`${how}: function call round trip with function_call_output`, async (t) => {
    const first = await openai.responses.create({ model, input: 'Weather in Paris?', tools: [weather] });
    const call = first.output.find((i) => i.type === 'function_call');
    t.ok(call, 'a function_call item');
    if (call?.type !== 'function_call') return;
    t.match(call.id, /^fc_/);
    t.ok(call.call_id);
    t.equal(call.name, 'get_weather');
    t.ok(new Ajv().validate(weather.parameters, JSON.parse(call.arguments)), 'arguments validate');

    // Streamed, the SDK's accumulator must accept the call items.
    const stream = openai.responses.stream({ model, input: 'Weather in Paris?', tools: [weather] });
    const streamed = await stream.finalResponse();
    const streamedCall = streamed.output.find((i) => i.type === 'function_call');
    t.equal(streamedCall?.type === 'function_call' && streamedCall.arguments, call.arguments);

    const second = await openai.responses.create({
      model,
      tools: [weather],
      input: [
        { role: 'user', content: 'Weather in Paris?' },
        { type: 'function_call', call_id: call.call_id, name: call.name, arguments: call.arguments },
        { type: 'function_call_output', call_id: call.call_id, output: 'Rain, 12 degrees' },
      ],
    });
    t.match(second.output_text, /^The tool returned: Rain, 12 degrees/);
  });

  t.test(`${how}: text.format json_schema`, async (t) => {
    const schema = { type: 'object', properties: { title: { type: 'string' }, pages: { type: 'integer' } }, required: ['title', 'pages'], additionalProperties: false };
    const res = await openai.responses.create({ model, input: 'A book as JSON', text: { format: { type: 'json_schema', name: 'book', schema, strict: true } } });
    t.ok(new Ajv().validate(schema, JSON.parse(res.output_text)), 'output validates');
  });

  t.test(`${how}: input_image`, async (t) => {
    const res = await openai.responses.create({
      model,
      input: [{ role: 'user', content: [{ type: 'input_text', text: 'What is it?' }, { type: 'input_image', image_url: 'data:image/png;base64,iVBORw0KGgo=', detail: 'auto' }] }],
    });
    t.match(res.output_text, /^I see 1 image/);
  });

  t.test(`${how}: max_output_tokens leads to incomplete`, async (t) => {
    const res = await openai.responses.create({ model, input: 'Long [[sim tokens=50]]', max_output_tokens: 16 });
    t.equal(res.status, 'incomplete');
    t.same(res.incomplete_details, { reason: 'max_output_tokens' });
    const stream = openai.responses.stream({ model, input: 'Long [[sim tokens=50]]', max_output_tokens: 16 });
    const types: string[] = [];
    for await (const e of stream) types.push(e.type);
    t.equal(types.at(-1), 'response.incomplete');
  });

  t.test(`${how}: an upstream cut midway becomes response.failed`, async (t) => {
    const raw = await fetch(`${gw.url}/v1/responses`, {
      method: 'POST',
      headers: { authorization: `Bearer ${gw.key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model, input: 'cut [[sim tokens=40 cut_after=4]]', stream: true }),
    });
    const text = await raw.text();
    t.notMatch(text, /\[DONE\]/, 'never a chat [DONE]');
    const frames = text.trim().split('\n\n');
    const last = frames.at(-1)!;
    t.match(last, /^event: response\.failed\ndata: /);
    const data = JSON.parse(last.split('\ndata: ')[1]!);
    t.equal(data.response.status, 'failed');
    t.ok(data.response.error.message);
    const numbers = frames.map((f) => JSON.parse(f.split('data: ')[1]!).sequence_number);
    t.same(numbers, numbers.map((_, i) => i), 'the failure continues the numbering');
    const record = await eventually(() => usageFor(raw.headers.get('x-request-id')), 'usage record');
    t.match(record, { outcome: 'error', streamed: true });
  });

  t.test(`${how}: a client abort midway is recorded as aborted`, async (t) => {
    const controller = new AbortController();
    const stream = await openai.responses.create({ model, input: 'slow [[sim tokens=300 tps=60]]', stream: true }, { signal: controller.signal });
    let n = 0;
    await (async () => {
      for await (const _ of stream) if (++n === 6) controller.abort();
    })().catch(() => {});
    const record = await eventually(async () => {
      const { body } = await gw.admin('GET', '/admin/usage');
      return body.records.find((r: any) => r.outcome === 'aborted' && r.model === model);
    }, 'an aborted record');
    t.ok(record.completionTokens > 0 && record.completionTokens < 300, `${record.completionTokens} tokens estimated`);
  });

  t.test(`${how}: Vercel AI SDK (default provider = Responses)`, async (t) => {
    const provider = createOpenAI({ apiKey: gw.key, baseURL: `${gw.url}/v1` });
    const text = await generateText({ model: provider(model), prompt: 'Hi [[sim tokens=5]]' });
    t.ok(text.text.length > 0);
    t.equal(text.usage.outputTokens, 5);
    const streamed = streamText({ model: provider(model), prompt: 'Hi again [[sim tokens=7]]' });
    let out = '';
    for await (const delta of streamed.textStream) out += delta;
    t.ok(out.length > 0);
    t.equal((await streamed.usage).outputTokens, 7);
    const withTool = await generateText({
      model: provider(model),
      prompt: 'Weather in Rome?',
      tools: { get_weather: tool({ description: 'Weather', inputSchema: jsonSchema<{ city: string }>(weather.parameters as any) }) },
    });
    t.equal(withTool.toolCalls[0]?.toolName, 'get_weather');
    t.type((withTool.toolCalls[0]?.input as any)?.city, 'string');
  });
}

t.test('bridge limits', async (t) => {
  const err = (p: Promise<unknown>): Promise<any> => p.catch((e) => e);
  const search = await err(openai.responses.create({ model: 'sim-chat', input: 'search the web', tools: [{ type: 'web_search' }] }));
  t.type(search, OpenAI.BadRequestError);
  t.match(search.message, /'tools\[0\]'.*speaks chat, which cannot run the server-side tool 'web_search'.*unsupportedTools: drop/);

  const custom = await openai.responses.create({
    model: 'sim-chat',
    input: 'Run some SQL',
    tools: [{ type: 'custom', name: 'run_sql', description: 'Runs SQL' }],
  });
  const customCall = custom.output.find((i) => i.type === 'custom_tool_call');
  t.ok(customCall, 'a custom tool comes back as a custom_tool_call');
  t.type(customCall?.type === 'custom_tool_call' && customCall.input, 'string');
  const sent = await lastUpstreamRequest();
  t.match(sent.tools[0], { type: 'function', function: { name: 'run_sql', parameters: { properties: { input: { type: 'string' } } } } });

  const namespaced = await openai.responses.create({
    model: 'sim-chat',
    input: 'Look it up',
    tools: [{ type: 'namespace', name: 'crm', description: 'CRM tools', tools: [{ type: 'function', name: 'find_customer', parameters: { type: 'object', properties: { email: { type: 'string' } }, required: ['email'] } }] } as any],
  });
  const nsCall: any = namespaced.output.find((i) => i.type === 'function_call');
  t.match(nsCall, { name: 'find_customer', namespace: 'crm' }, 'the flattened name is mapped back');
  t.equal((await lastUpstreamRequest()).tools[0].function.name, 'crm__find_customer');

  const clash = await err(
    openai.responses.create({
      model: 'sim-chat',
      input: 'x',
      tools: [{ type: 'function', name: 'crm__find', parameters: null, strict: false }, { type: 'namespace', name: 'crm', description: '', tools: [{ type: 'function', name: 'find' }] } as any],
    }),
  );
  t.type(clash, OpenAI.BadRequestError);
  t.match(clash.message, /both become 'crm__find'/);

  // Consecutive function_call items reach a chat upstream as one assistant message.
  await openai.responses.create({
    model: 'sim-chat',
    input: [
      { role: 'user', content: 'Two cities' },
      { type: 'function_call', call_id: 'call_a', name: 'get_weather', arguments: '{"city":"Oslo"}' },
      { type: 'function_call', call_id: 'call_b', name: 'get_weather', arguments: '{"city":"Rome"}' },
      { type: 'function_call_output', call_id: 'call_a', output: 'cold' },
      { type: 'function_call_output', call_id: 'call_b', output: 'warm' },
    ],
    tools: [weather],
  });
  const merged = await lastUpstreamRequest();
  t.same(merged.messages.map((m: any) => m.role), ['user', 'assistant', 'tool', 'tool']);
  t.equal(merged.messages[1].tool_calls.length, 2);
  t.equal(merged.stream_options, undefined);
});

t.test('bridged streams ask the chat upstream for usage', async (t) => {
  const stream = openai.responses.stream({ model: 'sim-chat', input: 'usage please [[sim tokens=3]]' });
  const final = await stream.finalResponse();
  t.equal(final.usage?.output_tokens, 3);
  t.same((await lastUpstreamRequest()).stream_options, { include_usage: true });
});

t.test('native: server-side web_search passes through; the bridge marks itself in /v1/models', async (t) => {
  const res = await openai.responses.create({ model: 'sim-responses', input: 'Please search for news', tools: [{ type: 'web_search' }] });
  t.ok(res.output.some((i) => i.type === 'web_search_call'));
  // Hosted tools have no name: two of them are not a name collision.
  const two = await openai.responses.create({ model: 'sim-responses-hosted', input: 'Please search for news', tools: [{ type: 'web_search' }, { type: 'file_search', vector_store_ids: ['vs_1'] }] });
  t.equal(two.status, 'completed', 'two hosted tools in one request');
  const models = (await openai.models.list()).data as any[];
  t.same(models.find((m) => m.id === 'sim-chat').families, { chat: 'native', responses: 'bridge', gemini: 'translated', messages: 'translated' });
  t.same(models.find((m) => m.id === 'sim-responses').families, { chat: 'translated', responses: 'native', gemini: 'translated', messages: 'translated' });
});

t.test('400s: previous_response_id, bad items, unsupported parameters', async (t) => {
  const err = (p: Promise<unknown>): Promise<any> => p.catch((e) => e);
  const prev = await err(openai.responses.create({ model: 'sim-responses', input: 'again', previous_response_id: 'resp_123' }));
  t.equal(prev.status, 400);
  t.match(prev.message, /WebSocket/);
  t.equal(prev.param, 'previous_response_id');

  const raw = async (body: object) => {
    const res = await fetch(`${gw.url}/v1/responses`, { method: 'POST', headers: { authorization: `Bearer ${gw.key}`, 'content-type': 'application/json' }, body: JSON.stringify(body) });
    return { status: res.status, body: (await res.json()) as any };
  };
  const noCallId = await raw({ model: 'sim-chat', input: [{ role: 'user', content: 'x' }, { type: 'function_call_output', output: 'y' }] });
  t.equal(noCallId.status, 400);
  t.equal(noCallId.body.error.param, 'input[1].call_id');
  const inputText = await raw({ model: 'sim-chat', input: [{ role: 'assistant', content: [{ type: 'input_text', text: 'x' }] }] });
  t.match(inputText.body.error.param, /^input\[0\]\.content\[0\]/);
  const reasoning = await err(openai.responses.create({ model: 'sim-plain', input: 'x', reasoning: { effort: 'high' } }));
  t.equal(reasoning.code, 'unsupported_parameter');
  t.equal(reasoning.param, 'reasoning');
  const temperature = await err(openai.responses.create({ model: 'sim-plain', input: 'x', temperature: 0.2 }));
  t.equal(temperature.param, 'temperature');
  const notServed = await err(openai.responses.create({ model: 'sim-responses', input: 'x', tools: [{ type: 'file_search', vector_store_ids: ['vs_1'] }] }));
  t.equal(notServed.code, 'unsupported_parameter');
});

t.test('chat clients on a Responses upstream', async (t) => {
  const res = await openai.chat.completions.create({ model: 'sim-responses', messages: [{ role: 'system', content: 'Be brief' }, { role: 'user', content: 'Hi [[sim tokens=4]]' }] });
  t.equal(res.object, 'chat.completion');
  t.equal(res.usage?.completion_tokens, 4);
  t.equal(res.choices[0]!.finish_reason, 'stop');
  t.equal((await lastUpstreamRequest()).instructions, 'Be brief', 'system messages became instructions');

  const stream = await openai.chat.completions.create({ model: 'sim-responses', messages: [{ role: 'user', content: 'Hi [[sim tokens=5]]' }], stream: true, stream_options: { include_usage: true } });
  let text = '';
  let usage: any;
  let finish: string | null | undefined;
  for await (const chunk of stream) {
    text += chunk.choices[0]?.delta.content ?? '';
    finish = chunk.choices[0]?.finish_reason ?? finish;
    usage = chunk.usage ?? usage;
  }
  t.ok(text.length > 0);
  t.equal(finish, 'stop');
  t.equal(usage?.completion_tokens, 5);

  const tools: OpenAI.ChatCompletionTool[] = [{ type: 'function', function: { name: weather.name, parameters: weather.parameters } }];
  const callStream = await openai.chat.completions.create({ model: 'sim-responses', messages: [{ role: 'user', content: 'Weather in Oslo?' }], tools, stream: true });
  let args = '';
  let id = '';
  for await (const chunk of callStream) {
    for (const d of chunk.choices[0]?.delta.tool_calls ?? []) {
      id ||= d.id ?? '';
      args += d.function?.arguments ?? '';
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  t.equal(finish, 'tool_calls');
  t.ok(id, 'the call has an id');
  const second = await openai.chat.completions.create({
    model: 'sim-responses',
    tools,
    messages: [
      { role: 'user', content: 'Weather in Oslo?' },
      { role: 'assistant', content: null, tool_calls: [{ id, type: 'function', function: { name: 'get_weather', arguments: args } }] },
      { role: 'tool', tool_call_id: id, content: 'Snow' },
    ],
  });
  t.match(second.choices[0]!.message.content, /^The tool returned: Snow/);
});
