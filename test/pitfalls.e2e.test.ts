/**
 * Translation pitfalls other gateways hit (protocols.md 7.11), each through the official SDKs on
 * every client family × upstream family: parallel calls in one streamed Gemini candidate, tool-call
 * indexes across chunks, empty arguments, finish reasons for tool answers, and images as URL and
 * as base64 (with the vision rule).
 */
import { GoogleGenAI, type FunctionCall, type Part } from '@google/genai';
import OpenAI from 'openai';
import t, { type Test } from 'tap';
import { simulatorUpstreams, startStack } from './helpers.js';

const UPSTREAMS = ['chat', 'responses', 'gemini'] as const;
type Upstream = (typeof UPSTREAMS)[number];

const { sim, gw } = await startStack(
  (simUrl) => `
${simulatorUpstreams(simUrl)}models:
  - { id: up-chat, upstream: chat, upstreamModel: sim-chat }
  - { id: up-responses, upstream: responses, upstreamModel: sim-responses }
  - { id: up-gemini, upstream: gemini, upstreamModel: sim-gemini }
  - { id: blind-chat, upstream: chat, upstreamModel: sim-chat, features: { vision: false } }
  - { id: blind-responses, upstream: responses, upstreamModel: sim-responses, features: { vision: false } }
  - { id: blind-gemini, upstream: gemini, upstreamModel: sim-gemini, features: { vision: false } }
`,
);

const openai = new OpenAI({ apiKey: gw.key, baseURL: `${gw.url}/v1`, maxRetries: 0 });
const google = new GoogleGenAI({ apiKey: gw.key, httpOptions: { baseUrl: gw.url } });

type Tools = { name: string; parameters: Record<string, unknown> }[];

/** Three tools, so `[[sim parallel=3]]` calls each once; book's arguments stream in many fragments. */
const TOOLS: Tools = [
  { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } },
  { name: 'get_time', parameters: { type: 'object', properties: { zone: { type: 'string' }, hour24: { type: 'boolean' } }, required: ['zone', 'hour24'] } },
  { name: 'get_book', parameters: { type: 'object', properties: { title: { type: 'string' }, pages: { type: 'integer' }, tags: { type: 'array', items: { type: 'string' } } }, required: ['title', 'pages', 'tags'] } },
];
const PING: Tools = [{ name: 'ping', parameters: { type: 'object', properties: {} } }];

interface Call {
  id: string;
  name: string;
  /** The arguments as the client family carries them: a JSON string (OpenAI) or an object (Gemini). */
  args: unknown;
}

interface ToolAnswer {
  calls: Call[];
  /** chat `finish_reason`, Responses `status`, Gemini `finishReason`. */
  finish: string | undefined;
  /** Streamed chat: the tool-call indexes seen; streamed Gemini: the most calls in one chunk. */
  indexes?: number[];
  mostCallsInOneChunk?: number;
}

const clients: Record<string, (model: string, prompt: string, tools: Tools) => Promise<ToolAnswer>> = {
  async 'chat'(model, prompt, tools) {
    const r = await openai.chat.completions.create({ model, messages: [{ role: 'user', content: prompt }], tools: chatTools(tools) });
    return { calls: chatCalls(r.choices[0]!.message.tool_calls), finish: r.choices[0]!.finish_reason };
  },
  async 'chat stream'(model, prompt, tools) {
    // The SDK's stream helper accumulates deltas by index; it throws on a delta for an unknown call.
    const s = openai.chat.completions.stream({ model, messages: [{ role: 'user', content: prompt }], tools: chatTools(tools) });
    const indexes = new Set<number>();
    for await (const c of s) for (const d of c.choices[0]?.delta.tool_calls ?? []) indexes.add(d.index);
    const r = await s.finalChatCompletion();
    return { calls: chatCalls(r.choices[0]!.message.tool_calls), finish: r.choices[0]!.finish_reason, indexes: [...indexes] };
  },
  async 'responses'(model, prompt, tools) {
    return responsesAnswer(await openai.responses.create({ model, input: prompt, tools: responsesTools(tools) }));
  },
  async 'responses stream'(model, prompt, tools) {
    return responsesAnswer(await openai.responses.stream({ model, input: prompt, tools: responsesTools(tools) }).finalResponse());
  },
  async 'gemini'(model, prompt, tools) {
    const r = await google.models.generateContent({ model, contents: prompt, config: geminiConfig(tools) });
    return { calls: geminiCalls(r.functionCalls ?? []), finish: r.candidates?.[0]?.finishReason };
  },
  async 'gemini stream'(model, prompt, tools) {
    const calls: FunctionCall[] = [];
    let finish: string | undefined;
    let most = 0;
    for await (const c of await google.models.generateContentStream({ model, contents: prompt, config: geminiConfig(tools) })) {
      const fc = c.functionCalls ?? [];
      calls.push(...fc);
      most = Math.max(most, fc.length);
      finish = c.candidates?.[0]?.finishReason ?? finish;
    }
    return { calls: geminiCalls(calls), finish, mostCallsInOneChunk: most };
  },
};

function chatTools(tools: Tools): OpenAI.ChatCompletionTool[] {
  return tools.map((f) => ({ type: 'function', function: f }));
}

function chatCalls(calls: OpenAI.ChatCompletionMessageToolCall[] | undefined): Call[] {
  return (calls ?? []).map((c) => (c.type === 'function' ? { id: c.id, name: c.function.name, args: c.function.arguments } : { id: c.id, name: '', args: '' }));
}

function responsesTools(tools: Tools): OpenAI.Responses.FunctionTool[] {
  return tools.map((f) => ({ type: 'function', strict: false, ...f }));
}

function responsesAnswer(r: OpenAI.Responses.Response): ToolAnswer {
  const calls = r.output.flatMap((i) => (i.type === 'function_call' ? [{ id: i.call_id, name: i.name, args: i.arguments }] : []));
  return { calls, finish: r.status ?? undefined };
}

function geminiConfig(tools: Tools) {
  return { tools: [{ functionDeclarations: tools.map((f) => ({ name: f.name, parametersJsonSchema: f.parameters })) }] };
}

function geminiCalls(calls: FunctionCall[]): Call[] {
  return calls.map((c) => ({ id: c.id ?? '', name: c.name ?? '', args: c.args }));
}

/** What the finish of a tool answer is called in each client family. */
function toolFinish(client: string): string {
  return client.startsWith('chat') ? 'tool_calls' : client.startsWith('responses') ? 'completed' : 'STOP';
}

/** The arguments as an object: OpenAI families must send a JSON string that parses to one. */
function parsedArgs(t: Test, client: string, call: Call): unknown {
  if (client.startsWith('gemini')) return call.args ?? {};
  t.type(call.args, 'string', `${call.name}: arguments is a string`);
  try {
    return JSON.parse(call.args as string);
  } catch {
    t.fail(`${call.name}: arguments ${JSON.stringify(call.args)} are not JSON`);
    return undefined;
  }
}

for (const upstream of UPSTREAMS) {
  for (const [client, ask] of Object.entries(clients)) {
    t.test(`parallel calls: ${client} on a ${upstream} upstream`, async (t) => {
      const r = await ask(`up-${upstream}`, 'Weather, time and a book. [[sim parallel=3]]', TOOLS);
      t.same(r.calls.map((c) => c.name), ['get_weather', 'get_time', 'get_book'], 'three separate calls, in order');
      const args = r.calls.map((c) => parsedArgs(t, client, c) as Record<string, unknown>);
      t.same(args.map((a) => Object.keys(a ?? {}).sort()), [['city'], ['hour24', 'zone'], ['pages', 'tags', 'title']], 'each call has its own arguments');
      t.equal(r.finish, toolFinish(client), 'finish reason for a tool answer');
      if (!client.startsWith('gemini')) t.equal(new Set(r.calls.map((c) => c.id)).size, 3, 'distinct call ids');
      if (r.indexes) t.same(r.indexes.sort(), [0, 1, 2], 'a distinct index per call');
      if (r.mostCallsInOneChunk !== undefined && upstream === 'gemini') t.equal(r.mostCallsInOneChunk, 3, 'native Gemini streams the calls in one chunk');
    });

    t.test(`no parameters: ${client} on a ${upstream} upstream`, async (t) => {
      const r = await ask(`up-${upstream}`, 'Ping.', PING);
      t.same(r.calls.map((c) => c.name), ['ping']);
      t.same(parsedArgs(t, client, r.calls[0]!), {}, 'the empty object');
      t.equal(r.finish, toolFinish(client));
    });

    // An upstream that sends no arguments at all (`''`, or a functionCall without args): a translated
    // answer still carries `{}`. Chat on chat is passthrough: its bytes are the upstream's.
    if (!(upstream === 'chat' && client.startsWith('chat')) && !(upstream === 'responses' && client.startsWith('responses'))) {
      t.test(`empty arguments: ${client} on a ${upstream} upstream`, async (t) => {
        const r = await ask(`up-${upstream}`, 'Ping. [[sim empty_args=1 parallel=2]]', [...PING, { name: 'pong', parameters: { type: 'object', properties: {} } }]);
        t.same(r.calls.map((c) => c.name), ['ping', 'pong']);
        for (const call of r.calls) {
          if (client.startsWith('gemini')) t.same(call.args ?? {}, {}, `${call.name}: no arguments`);
          else t.equal(call.args, '{}', `${call.name}: arguments are "{}", not ""`);
        }
        t.equal(r.finish, toolFinish(client));
      });
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Images

/** A 1×1 PNG. */
const PNG = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII=';
/** Never fetched: the gateway passes image URLs on. */
const IMAGE_URL = 'http://127.0.0.1:9/cat.png';

type ImageForm = 'base64' | 'url';

const imageClients: Record<string, (model: string, form: ImageForm) => Promise<string>> = {
  async chat(model, form) {
    const url = form === 'base64' ? `data:image/png;base64,${PNG}` : IMAGE_URL;
    const r = await openai.chat.completions.create({
      model,
      messages: [{ role: 'user', content: [{ type: 'text', text: 'What is this?' }, { type: 'image_url', image_url: { url } }] }],
    });
    return r.choices[0]!.message.content ?? '';
  },
  async responses(model, form) {
    const image_url = form === 'base64' ? `data:image/png;base64,${PNG}` : IMAGE_URL;
    const r = await openai.responses.create({
      model,
      input: [{ role: 'user', content: [{ type: 'input_text', text: 'What is this?' }, { type: 'input_image', image_url, detail: 'auto' }] }],
    });
    return r.output_text;
  },
  async gemini(model, form) {
    const image: Part = form === 'base64' ? { inlineData: { mimeType: 'image/png', data: PNG } } : { fileData: { mimeType: 'image/png', fileUri: IMAGE_URL } };
    const r = await google.models.generateContent({ model, contents: [{ role: 'user', parts: [{ text: 'What is this?' }, image] }] });
    return r.text ?? '';
  },
};

/** The image of the last user turn as the upstream received it, in the upstream's own form. */
async function upstreamImage(upstream: Upstream): Promise<unknown> {
  const { lastRequest } = (await (await fetch(`${sim.url}/stats`)).json()) as { lastRequest: Record<string, unknown[]> };
  const turns = upstream === 'chat' ? lastRequest.messages : upstream === 'responses' ? lastRequest.input : lastRequest.contents;
  const last = turns!.at(-1) as { content?: unknown; parts?: unknown };
  const parts = (upstream === 'gemini' ? last.parts : last.content) as Record<string, unknown>[];
  return parts.find((p) => p.type === 'image_url' || p.type === 'input_image' || p.inlineData || p.fileData);
}

function expectedImage(upstream: Upstream, form: ImageForm): object {
  const dataUrl = `data:image/png;base64,${PNG}`;
  if (upstream === 'chat') return { type: 'image_url', image_url: { url: form === 'base64' ? dataUrl : IMAGE_URL } };
  if (upstream === 'responses') return { type: 'input_image', image_url: form === 'base64' ? dataUrl : IMAGE_URL };
  return form === 'base64' ? { inlineData: { mimeType: 'image/png', data: PNG } } : { fileData: { mimeType: 'image/png', fileUri: IMAGE_URL } };
}

for (const upstream of UPSTREAMS) {
  for (const [client, ask] of Object.entries(imageClients)) {
    for (const form of ['base64', 'url'] as const) {
      t.test(`image as ${form}: ${client} on a ${upstream} upstream`, async (t) => {
        t.match(await ask(`up-${upstream}`, form), /^I see 1 image\./, 'the model saw the image');
        t.match(await upstreamImage(upstream), expectedImage(upstream, form), 'the upstream got it in its own form');
        const refused = (await ask(`blind-${upstream}`, form).catch((err: unknown) => err)) as { status?: number };
        t.equal(refused.status, 400, 'a model without vision refuses it');
      });
    }
  }
}
