/**
 * The conformance matrix: every client family (openai chat, openai Responses, @google/genai,
 * @anthropic-ai/sdk) on every upstream family (chat, Responses, Gemini, Messages), for text, a tool
 * round trip and JSON output, streamed and not. Each cell checks the answer as the client sees it,
 * and the recorded usage.
 */
import Anthropic from '@anthropic-ai/sdk';
import { GoogleGenAI, type Content, type FunctionCall, type Part } from '@google/genai';
import { Ajv } from 'ajv';
import OpenAI from 'openai';
import t from 'tap';
import { eventually, simulatorUpstreams, startStack } from './helpers.js';

const { gw } = await startStack(
  (simUrl) => `
${simulatorUpstreams(simUrl)}models:
  - { id: up-chat, upstream: chat, upstreamModel: sim-chat }
  - { id: up-responses, upstream: responses, upstreamModel: sim-responses }
  - { id: up-gemini, upstream: gemini, upstreamModel: sim-gemini }
  - { id: up-messages, upstream: messages, upstreamModel: sim-messages }
`,
);

const openai = new OpenAI({ apiKey: gw.key, baseURL: `${gw.url}/v1`, maxRetries: 0 });
const google = new GoogleGenAI({ apiKey: gw.key, httpOptions: { baseUrl: gw.url } });
const anthropic = new Anthropic({ apiKey: gw.key, baseURL: gw.url, maxRetries: 0 });

const weatherSchema = { type: 'object', properties: { city: { type: 'string' } }, required: ['city'], additionalProperties: false };
const bookSchema = { type: 'object', properties: { title: { type: 'string' }, pages: { type: 'integer' } }, required: ['title', 'pages'], additionalProperties: false };

interface Call {
  id: string;
  name: string;
  args: string;
}

/** One client family, seen as the three things the matrix asks of it. */
interface Client {
  text(model: string, prompt: string, stream: boolean): Promise<{ text: string; usage?: { input: number; output: number } }>;
  /** First turn: the model calls get_weather. Second turn: it answers from the result. */
  tool(model: string, stream: boolean): Promise<{ call: Call; answer: string }>;
  json(model: string, stream: boolean): Promise<string>;
}

const chatClient: Client = {
  async text(model, prompt, stream) {
    if (!stream) {
      const r = await openai.chat.completions.create({ model, messages: [{ role: 'user', content: prompt }] });
      return { text: r.choices[0]!.message.content ?? '', usage: r.usage && { input: r.usage.prompt_tokens, output: r.usage.completion_tokens } };
    }
    const s = await openai.chat.completions.create({ model, messages: [{ role: 'user', content: prompt }], stream: true, stream_options: { include_usage: true } });
    let text = '';
    let usage;
    for await (const c of s) {
      text += c.choices[0]?.delta.content ?? '';
      if (c.usage) usage = { input: c.usage.prompt_tokens, output: c.usage.completion_tokens };
    }
    return { text, usage };
  },
  async tool(model, stream) {
    const tools: OpenAI.ChatCompletionTool[] = [{ type: 'function', function: { name: 'get_weather', parameters: weatherSchema } }];
    const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: 'user', content: 'Weather in Oslo?' }];
    let call: Call;
    let finish: string | null | undefined;
    if (!stream) {
      const r = await openai.chat.completions.create({ model, messages, tools });
      const c = r.choices[0]!.message.tool_calls![0]!;
      if (c.type !== 'function') throw new Error('not a function call');
      call = { id: c.id, name: c.function.name, args: c.function.arguments };
      finish = r.choices[0]!.finish_reason;
    } else {
      const s = await openai.chat.completions.create({ model, messages, tools, stream: true });
      call = { id: '', name: '', args: '' };
      for await (const c of s) {
        for (const d of c.choices[0]?.delta.tool_calls ?? []) {
          if (d.index !== 0) throw new Error(`unexpected tool index ${d.index}`);
          call.id ||= d.id ?? '';
          call.name ||= d.function?.name ?? '';
          call.args += d.function?.arguments ?? '';
        }
        finish = c.choices[0]?.finish_reason ?? finish;
      }
    }
    if (finish !== 'tool_calls') throw new Error(`finish_reason ${finish}, not tool_calls`);
    messages.push({ role: 'assistant', content: null, tool_calls: [{ id: call.id, type: 'function', function: { name: call.name, arguments: call.args } }] });
    messages.push({ role: 'tool', tool_call_id: call.id, content: 'Sunny' });
    const r = await openai.chat.completions.create({ model, messages, tools });
    return { call, answer: r.choices[0]!.message.content ?? '' };
  },
  async json(model, stream) {
    const response_format = { type: 'json_schema' as const, json_schema: { name: 'book', schema: bookSchema, strict: true } };
    if (!stream) return (await openai.chat.completions.create({ model, messages: [{ role: 'user', content: 'A book' }], response_format })).choices[0]!.message.content ?? '';
    let text = '';
    for await (const c of await openai.chat.completions.create({ model, messages: [{ role: 'user', content: 'A book' }], response_format, stream: true })) text += c.choices[0]?.delta.content ?? '';
    return text;
  },
};

const responsesClient: Client = {
  async text(model, prompt, stream) {
    const r = stream ? await openai.responses.stream({ model, input: prompt }).finalResponse() : await openai.responses.create({ model, input: prompt });
    return { text: r.output_text, usage: r.usage && { input: r.usage.input_tokens, output: r.usage.output_tokens } };
  },
  async tool(model, stream) {
    const tools = [{ type: 'function' as const, name: 'get_weather', parameters: weatherSchema, strict: true }];
    const input: OpenAI.Responses.ResponseInputItem[] = [{ role: 'user', content: 'Weather in Oslo?' }];
    const r = stream ? await openai.responses.stream({ model, input, tools }).finalResponse() : await openai.responses.create({ model, input, tools });
    const c = r.output.find((i) => i.type === 'function_call');
    if (c?.type !== 'function_call') throw new Error('no function_call item');
    input.push({ type: 'function_call', call_id: c.call_id, name: c.name, arguments: c.arguments });
    input.push({ type: 'function_call_output', call_id: c.call_id, output: 'Sunny' });
    const second = await openai.responses.create({ model, input, tools });
    return { call: { id: c.call_id, name: c.name, args: c.arguments }, answer: second.output_text };
  },
  async json(model, stream) {
    const text = { format: { type: 'json_schema' as const, name: 'book', schema: bookSchema, strict: true } };
    const r = stream ? await openai.responses.stream({ model, input: 'A book', text }).finalResponse() : await openai.responses.create({ model, input: 'A book', text });
    return r.output_text;
  },
};

const geminiClient: Client = {
  async text(model, prompt, stream) {
    if (!stream) {
      const r = await google.models.generateContent({ model, contents: prompt });
      const u = r.usageMetadata;
      return { text: r.text ?? '', usage: u && { input: u.promptTokenCount!, output: u.candidatesTokenCount! + (u.thoughtsTokenCount ?? 0) } };
    }
    let text = '';
    let usage;
    for await (const c of await google.models.generateContentStream({ model, contents: prompt })) {
      text += c.text ?? '';
      if (c.usageMetadata?.promptTokenCount !== undefined) usage = { input: c.usageMetadata.promptTokenCount, output: c.usageMetadata.candidatesTokenCount! + (c.usageMetadata.thoughtsTokenCount ?? 0) };
    }
    return { text, usage };
  },
  async tool(model, stream) {
    const config = { tools: [{ functionDeclarations: [{ name: 'get_weather', parametersJsonSchema: weatherSchema }] }] };
    const contents: Content[] = [{ role: 'user', parts: [{ text: 'Weather in Oslo?' }] }];
    let calls: FunctionCall[] = [];
    let parts: Part[] = [];
    if (!stream) {
      const r = await google.models.generateContent({ model, contents, config });
      calls = r.functionCalls ?? [];
      parts = r.candidates![0]!.content!.parts!;
    } else {
      for await (const c of await google.models.generateContentStream({ model, contents, config })) {
        calls.push(...(c.functionCalls ?? []));
        parts.push(...(c.candidates?.[0]?.content?.parts ?? []).filter((p) => p.functionCall));
      }
    }
    const fc = calls[0];
    if (!fc || calls.length !== 1) throw new Error(`expected one call, got ${calls.length}`);
    // The model turn is replayed exactly (signatures included), then one user turn with the result.
    contents.push({ role: 'model', parts: parts.filter((p) => p.functionCall) });
    contents.push({ role: 'user', parts: [{ functionResponse: { name: fc.name!, id: fc.id, response: { output: 'Sunny' } } }] });
    const second = await google.models.generateContent({ model, contents, config });
    return { call: { id: fc.id ?? '', name: fc.name!, args: JSON.stringify(fc.args) }, answer: second.text ?? '' };
  },
  async json(model, stream) {
    const config = { responseMimeType: 'application/json', responseJsonSchema: bookSchema };
    if (!stream) return (await google.models.generateContent({ model, contents: 'A book', config })).text ?? '';
    let text = '';
    for await (const c of await google.models.generateContentStream({ model, contents: 'A book', config })) text += c.text ?? '';
    return text;
  },
};

const messagesClient: Client = {
  async text(model, prompt, stream) {
    const params = { model, max_tokens: 256, messages: [{ role: 'user' as const, content: prompt }] };
    const m = stream ? await anthropic.messages.stream(params).finalMessage() : await anthropic.messages.create(params);
    const text = m.content.map((b) => (b.type === 'text' ? b.text : '')).join('');
    // Anthropic counts cache reads and writes apart from input_tokens.
    const input = m.usage.input_tokens + (m.usage.cache_read_input_tokens ?? 0) + (m.usage.cache_creation_input_tokens ?? 0);
    return { text, usage: { input, output: m.usage.output_tokens } };
  },
  async tool(model, stream) {
    const tools: Anthropic.Tool[] = [{ name: 'get_weather', input_schema: weatherSchema as Anthropic.Tool.InputSchema }];
    const messages: Anthropic.MessageParam[] = [{ role: 'user', content: 'Weather in Oslo?' }];
    const turn = (msgs: Anthropic.MessageParam[]) => {
      const params = { model, max_tokens: 256, tools, messages: msgs };
      return stream ? anthropic.messages.stream(params).finalMessage() : anthropic.messages.create(params);
    };
    const first = await turn(messages);
    const use = first.content.find((b): b is Anthropic.ToolUseBlock => b.type === 'tool_use')!;
    // The assistant turn is replayed exactly, then one user turn with the result.
    messages.push({ role: 'assistant', content: first.content }, { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: 'Sunny' }] });
    const second = await turn(messages);
    const answer = second.content.map((b) => (b.type === 'text' ? b.text : '')).join('');
    return { call: { id: use.id, name: use.name, args: JSON.stringify(use.input) }, answer };
  },
  async json(model, stream) {
    const params = { model, max_tokens: 256, messages: [{ role: 'user' as const, content: 'A book' }], output_config: { format: { type: 'json_schema', schema: bookSchema } } };
    const m = stream ? await anthropic.messages.stream(params as any).finalMessage() : await anthropic.messages.create(params as any);
    return m.content.map((b) => (b.type === 'text' ? b.text : '')).join('');
  },
};

const clients: Record<string, Client> = { chat: chatClient, responses: responsesClient, gemini: geminiClient, messages: messagesClient };
const models = { chat: 'up-chat', responses: 'up-responses', gemini: 'up-gemini', messages: 'up-messages' };
const ajv = new Ajv();

for (const [clientFamily, client] of Object.entries(clients)) {
  for (const [upstreamFamily, model] of Object.entries(models)) {
    for (const stream of [false, true]) {
      const cell = `${clientFamily} client × ${upstreamFamily} upstream, ${stream ? 'stream' : 'non-stream'}`;
      t.test(cell, async (t) => {
        const text = await client.text(model, `Say something [[sim tokens=9]]`, stream);
        t.ok(text.text.trim().length > 0, 'text arrived');
        t.equal(text.usage?.output, 9, 'output tokens as the upstream counted them');
        t.ok((text.usage?.input ?? 0) > 0, 'input tokens reported');

        const { call, answer } = await client.tool(model, stream);
        t.equal(call.name, 'get_weather');
        t.ok(ajv.validate(weatherSchema, JSON.parse(call.args)), 'call arguments validate');
        t.match(answer, /^The tool returned: .*Sunny/, 'the answer uses the tool result');

        const json = await client.json(model, stream);
        t.ok(ajv.validate(bookSchema, JSON.parse(json)), 'JSON output validates against the schema');
      });
    }
  }
}

t.test('every matrix request was recorded with usage', async (t) => {
  const { body } = await eventually(async () => {
    const r = await gw.admin('GET', '/admin/usage?limit=1000');
    return r.body.totals.requests >= 4 * 4 * 2 * 4 ? r : undefined;
  }, 'usage records');
  const records = body.records as any[];
  t.equal(records.filter((r) => r.status !== 200).length, 0, 'no failed requests');
  t.ok(records.every((r) => r.promptTokens > 0 && r.completionTokens > 0), 'every record has tokens');
  t.ok(records.every((r) => !r.estimated), 'none had to be estimated');
  t.same(new Set(records.map((r) => r.family)), new Set(['chat', 'responses', 'gemini', 'messages']));
});
