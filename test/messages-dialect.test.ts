/**
 * The Messages upstream dialect: the openai (chat and Responses) and @google/genai SDKs on an
 * Anthropic upstream (the simulator speaking Messages, in its own process), streamed and not:
 * text with usage, a tool round trip, JSON output through a forced tool, thinking across turns
 * (carried by Gemini's thought signatures, left out safely where a family has no slot), and the
 * upstream's errors in each family's shape.
 */
import { GoogleGenAI, type Content, type Part } from '@google/genai';
import { Ajv } from 'ajv';
import OpenAI from 'openai';
import t from 'tap';
import { eventually, startStack } from './helpers.js';

const { sim, gw } = await startStack(
  (simUrl) => `upstreams:
  anthropic: { kind: anthropic, baseUrl: "${simUrl}/v1", apiKey: upstream-key }
models:
  - { id: claude, upstream: anthropic, upstreamModel: sim-messages, maxOutputTokens: { default: 4000, max: 8192 } }
`,
);

type Json = Record<string, any>;
const openai = new OpenAI({ apiKey: gw.key, baseURL: `${gw.url}/v1`, maxRetries: 0 });
const google = new GoogleGenAI({ apiKey: gw.key, httpOptions: { baseUrl: gw.url } });
const ajv = new Ajv();
const weather = { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] };
const book = { type: 'object', properties: { title: { type: 'string' }, pages: { type: 'integer' } }, required: ['title', 'pages'], additionalProperties: false };
const lastUpstreamRequest = async (): Promise<Json> => ((await (await fetch(`${sim.url}/stats`)).json()) as Json).lastRequest;

t.test('chat client: text, usage with cache reads, streamed and not', async (t) => {
  const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hi [[sim tokens=6 cached=4]]' }];
  const r = await openai.chat.completions.create({ model: 'claude', messages });
  t.ok(r.choices[0]!.message.content, 'text');
  t.equal(r.choices[0]!.finish_reason, 'stop');
  t.equal(r.usage!.completion_tokens, 6);
  t.equal(r.usage!.prompt_tokens_details!.cached_tokens, 4, 'cache reads are cached tokens');
  const sent = await lastUpstreamRequest();
  t.same(sent.system, [{ type: 'text', text: 'Be brief.' }], 'the system message became the system prompt');
  t.equal(sent.max_tokens, 4000, 'max_tokens from the model default, as Anthropic requires one');

  let text = '';
  let usage: OpenAI.CompletionUsage | undefined;
  for await (const c of await openai.chat.completions.create({ model: 'claude', messages, stream: true, stream_options: { include_usage: true } })) {
    text += c.choices[0]?.delta.content ?? '';
    usage = c.usage ?? usage;
  }
  t.equal(text, r.choices[0]!.message.content);
  t.match(usage, { prompt_tokens: r.usage!.prompt_tokens, completion_tokens: 6, prompt_tokens_details: { cached_tokens: 4 } });
});

for (const stream of [false, true]) {
  t.test(`chat client: a tool round trip with thinking, ${stream ? 'streamed' : 'not streamed'}`, async (t) => {
    const tools: OpenAI.ChatCompletionTool[] = [{ type: 'function', function: { name: 'get_weather', parameters: weather } }];
    const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: 'user', content: 'Weather in Oslo?' }];
    let call = { id: '', name: '', args: '' };
    let reasoning = '';
    if (stream) {
      for await (const c of await openai.chat.completions.create({ model: 'claude', reasoning_effort: 'low', messages, tools, stream: true })) {
        const d = c.choices[0]?.delta as (OpenAI.ChatCompletionChunk.Choice.Delta & { reasoning_content?: string }) | undefined;
        reasoning += d?.reasoning_content ?? '';
        for (const tc of d?.tool_calls ?? []) call = { id: call.id || (tc.id ?? ''), name: call.name || (tc.function?.name ?? ''), args: call.args + (tc.function?.arguments ?? '') };
      }
    } else {
      const r = await openai.chat.completions.create({ model: 'claude', reasoning_effort: 'low', messages, tools });
      const tc = r.choices[0]!.message.tool_calls![0] as OpenAI.ChatCompletionMessageFunctionToolCall;
      reasoning = (r.choices[0]!.message as { reasoning_content?: string }).reasoning_content ?? '';
      call = { id: tc.id, name: tc.function.name, args: tc.function.arguments };
    }
    t.ok(reasoning.length > 0, 'thinking reached the client as reasoning');
    t.equal(call.name, 'get_weather');
    t.ok(ajv.validate(weather, JSON.parse(call.args)));
    t.match((await lastUpstreamRequest()).thinking, { type: 'enabled', budget_tokens: 1024 }, 'reasoning_effort became a thinking budget');
    messages.push({ role: 'assistant', content: null, tool_calls: [{ id: call.id, type: 'function', function: { name: call.name, arguments: call.args } }] });
    messages.push({ role: 'tool', tool_call_id: call.id, content: 'Sunny' });
    const second = await openai.chat.completions.create({ model: 'claude', reasoning_effort: 'low', messages, tools });
    t.match(second.choices[0]!.message.content, /^The tool returned: .*Sunny/, 'the upstream took the turn');
    const sent = await lastUpstreamRequest();
    // The turn's signed thinking rode in the call's id (src/tool-call-ids.ts), so thinking stays on.
    t.match(sent.thinking, { type: 'enabled', budget_tokens: 1024 }, 'thinking stays on: the replayed tool turn has its signed thinking back');
    t.match(sent.messages.at(-2).content[0], { type: 'thinking', signature: /./ }, 'the thinking block, signed, ahead of the call');
    const [upstreamId] = call.id.split('__sig__');
    t.same(sent.messages.at(-1).content[0], { type: 'tool_result', tool_use_id: upstreamId, content: [{ type: 'text', text: 'Sunny' }] });
  });
}

t.test('chat client: JSON output through a forced tool, streamed and not', async (t) => {
  const response_format = { type: 'json_schema' as const, json_schema: { name: 'book', schema: book, strict: true } };
  const r = await openai.chat.completions.create({ model: 'claude', messages: [{ role: 'user', content: 'A book' }], response_format });
  t.ok(ajv.validate(book, JSON.parse(r.choices[0]!.message.content!)), 'the answer is the JSON');
  t.equal(r.choices[0]!.finish_reason, 'stop', 'not a tool call to the client');
  t.match(await lastUpstreamRequest(), { tool_choice: { type: 'tool', name: 'book' }, tools: [{ name: 'book', input_schema: book }] });
  let text = '';
  for await (const c of await openai.chat.completions.create({ model: 'claude', messages: [{ role: 'user', content: 'A book' }], response_format, stream: true })) text += c.choices[0]?.delta.content ?? '';
  t.ok(ajv.validate(book, JSON.parse(text)));
  const list = await openai.chat.completions.create({
    model: 'claude',
    messages: [{ role: 'user', content: 'Some words' }],
    response_format: { type: 'json_schema', json_schema: { name: 'words', schema: { type: 'array', items: { type: 'string' } } } },
  });
  t.ok(Array.isArray(JSON.parse(list.choices[0]!.message.content!)), 'a schema that is not an object is wrapped and unwrapped');
});

for (const stream of [false, true]) {
  t.test(`Responses client: text, a tool round trip and JSON, ${stream ? 'streamed' : 'not streamed'}`, async (t) => {
    const create = (body: Omit<OpenAI.Responses.ResponseCreateParamsNonStreaming, 'stream'>) =>
      stream ? openai.responses.stream(body).finalResponse() : openai.responses.create(body);
    const text = await create({ model: 'claude', instructions: 'Be brief.', input: 'Hi [[sim tokens=5]]' });
    t.ok(text.output_text.length > 0);
    t.equal(text.usage!.output_tokens, 5);
    const tools = [{ type: 'function' as const, name: 'get_weather', parameters: weather, strict: true }];
    const input: OpenAI.Responses.ResponseInputItem[] = [{ role: 'user', content: 'Weather in Oslo?' }];
    const first = await create({ model: 'claude', input, tools });
    const call = first.output.find((i) => i.type === 'function_call');
    if (call?.type !== 'function_call') throw new Error('no function call');
    input.push({ type: 'function_call', call_id: call.call_id, name: call.name, arguments: call.arguments }, { type: 'function_call_output', call_id: call.call_id, output: 'Sunny' });
    t.match((await create({ model: 'claude', input, tools })).output_text, /^The tool returned: .*Sunny/);
    const json = await create({ model: 'claude', input: 'A book', text: { format: { type: 'json_schema', name: 'book', schema: book, strict: true } } });
    t.ok(ajv.validate(book, JSON.parse(json.output_text)));
  });

  t.test(`Gemini client: thinking signatures survive a tool round trip in thought signatures, ${stream ? 'streamed' : 'not streamed'}`, async (t) => {
    const config = { tools: [{ functionDeclarations: [{ name: 'get_weather', parametersJsonSchema: weather }] }], thinkingConfig: { thinkingBudget: 2048, includeThoughts: true } };
    const contents: Content[] = [{ role: 'user', parts: [{ text: 'Weather in Oslo?' }] }];
    let parts: Part[] = [];
    if (stream) for await (const c of await google.models.generateContentStream({ model: 'claude', contents, config })) parts.push(...(c.candidates?.[0]?.content?.parts ?? []));
    else parts = (await google.models.generateContent({ model: 'claude', contents, config })).candidates![0]!.content!.parts!;
    t.ok(parts.some((p) => p.thought && p.text), 'the thinking arrived as thoughts');
    const calls = parts.filter((p) => p.functionCall);
    t.equal(calls.length, 1);
    t.ok(calls[0]!.thoughtSignature, 'the call carries a thought signature');
    contents.push({ role: 'model', parts: calls });
    contents.push({ role: 'user', parts: [{ functionResponse: { name: 'get_weather', id: calls[0]!.functionCall!.id, response: { output: 'Sunny' } } }] });
    const second = await google.models.generateContent({ model: 'claude', contents, config });
    t.match(second.text, /The tool returned: .*Sunny/);
    const sent = await lastUpstreamRequest();
    t.equal(sent.messages[1].content[0].type, 'thinking', 'the signed thinking went back first in the assistant turn');
    t.match(sent.thinking, { type: 'enabled' }, 'so thinking stays on, and the upstream verified the signature');
    t.ok(second.candidates![0]!.content!.parts!.some((p) => p.thought), 'the second turn thought too');
  });
}

t.test("the upstream's errors in each family's shape", async (t) => {
  const chat = await openai.chat.completions.create({ model: 'claude', messages: [{ role: 'user', content: 'Hi [[sim error=429]]' }] }).catch((e) => e);
  t.type(chat, OpenAI.RateLimitError, "an upstream 429 in chat's shape");
  const overloaded = await openai.chat.completions.create({ model: 'claude', messages: [{ role: 'user', content: 'Hi [[sim error=529]]' }] }).catch((e) => e);
  t.type(overloaded, OpenAI.InternalServerError);
  t.equal(overloaded.status, 503, "Anthropic's 529 (overloaded) is a 503");
  const gemini = await google.models.generateContent({ model: 'claude', contents: 'Hi [[sim error=400]]' }).catch((e) => e);
  t.match(String(gemini.message), /INVALID_ARGUMENT|400/, "an upstream 400 in Gemini's shape");
  const records = await eventually(async () => {
    const all = ((await gw.admin('GET', '/admin/usage?limit=1000')).body.records as Json[]).filter((r) => r.status === 200);
    return all.length >= 10 ? all : undefined;
  }, 'usage records');
  t.ok(records.every((r) => r.upstream === 'anthropic' && r.promptTokens > 0 && !r.estimated), 'usage came from the upstream');
});
