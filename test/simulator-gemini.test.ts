import t from 'tap';
import { recordingSink, rejection, startSimulatorProcess } from './helpers.js';
import { Ajv } from 'ajv';
import { ApiError, FunctionCallingConfigMode, GoogleGenAI, Type, type Content, type GenerateContentResponse } from '@google/genai';
import { countTokens } from 'gpt-tokenizer';
import { generateContent, routeGemini, toJsonSchema } from '../plugins/upstreams/simulator/gemini.js';
import type { SimReply } from '../plugins/upstreams/simulator/reply.js';
import simulatorPlugin, { routeSimulator, simulatorUpstream } from '../plugins/upstreams/simulator/index.js';
import type { BootContext, UpstreamFactory } from '../src/contracts.js';

// ---------------------------------------------------------------------------------------------
// Helpers

type Json = Record<string, any>;

function scriptText(reply: SimReply): string {
  return reply.steps.map((s) => s.bytes).join('');
}

function bodyOf(reply: SimReply): Json {
  return JSON.parse(scriptText(reply)) as Json;
}

/** A request body with one user turn, plus `fields`. */
function body(fields: Json = {}, text = 'Tell me about rivers.'): string {
  return JSON.stringify({ contents: [{ role: 'user', parts: [{ text }] }], ...fields });
}

/** Prompt tokens the simulator charges for one plain user turn. */
function promptTokens(text: string): number {
  return countTokens(text) + 4;
}

/** The `data:` payloads of an SSE body, checking the framing Gemini uses on the way. */
function sseChunks(t: Tap, text: string): Json[] {
  t.notMatch(text, /^event:/m, 'no event: lines');
  t.notMatch(text, /\[DONE\]/, 'no terminator');
  t.ok(text.endsWith('\n\n'), 'the last event is complete');
  const blocks = text.split('\n\n').filter((b) => b !== '');
  for (const block of blocks) t.match(block, /^data: \{[^\n]*\}$/, 'one data line per event');
  return blocks.map((b) => JSON.parse(b.slice('data: '.length)) as Json);
}

type Tap = Parameters<Parameters<typeof t.test>[0]>[0];


/** Google's error body inside an ApiError's message. */
function apiErrorBody(err: unknown): Json | undefined {
  if (!(err instanceof ApiError)) return undefined;
  const start = err.message.indexOf('{');
  return JSON.parse(err.message.slice(start)) as Json;
}

const weatherParameters = {
  type: Type.OBJECT,
  properties: {
    city: { type: Type.STRING, description: 'The city' },
    unit: { type: Type.STRING, enum: ['celsius', 'fahrenheit'] },
    days: { type: Type.INTEGER, minimum: 1, maximum: 7 },
    note: { type: Type.STRING, nullable: true },
  },
  required: ['city', 'unit'],
};

const ajv = new Ajv();

// ---------------------------------------------------------------------------------------------
// Scripts, without a socket

t.test('gemini: bad requests get Google-shaped 400s', async (t) => {
  const user = { role: 'user', parts: [{ text: 'Hi' }] };
  const call = { role: 'model', parts: [{ functionCall: { name: 'f', args: {} } }] };
  const twoCalls = { role: 'model', parts: [{ functionCall: { name: 'f', args: {} } }, { functionCall: { name: 'f', args: { a: 1 } } }] };
  const answer = (n: number) => ({ role: 'user', parts: Array.from({ length: n }, () => ({ functionResponse: { name: 'f', response: { output: 'ok' } } })) });
  const fTool = { tools: [{ functionDeclarations: [{ name: 'f' }] }] };
  const cases: [string, string, RegExp][] = [
    ['not json', '{oops', /Invalid JSON payload/],
    ['no contents', JSON.stringify({}), /contents is not specified/],
    ['empty contents', JSON.stringify({ contents: [] }), /contents is not specified/],
    ['bad role', JSON.stringify({ contents: [{ role: 'assistant', parts: [{ text: 'x' }] }] }), /valid role: user, model/],
    ['empty parts', JSON.stringify({ contents: [{ role: 'user', parts: [] }] }), /parts must not be empty/],
    ['two data fields', JSON.stringify({ contents: [{ parts: [{ text: 'x', inlineData: { mimeType: 'image/png', data: 'AA==' } }] }] }), /oneof field 'data' is already set/],
    ['a part without data', JSON.stringify({ contents: [{ parts: [{}] }] }), /contents\[0\]\.parts\[0\]/],
    ['bad base64', JSON.stringify({ contents: [{ parts: [{ inlineData: { mimeType: 'image/png', data: 'no base64!' } }] }] }), /Base64 decoding failed/],
    ['call turn first', JSON.stringify({ contents: [call, answer(1)] }), /function call turn comes immediately after a user turn/],
    ['call after a model turn', JSON.stringify({ contents: [user, { role: 'model', parts: [{ text: 'x' }] }, call, answer(1)] }), /function call turn comes/],
    ['too few responses', JSON.stringify({ contents: [user, twoCalls, answer(1)] }), /number of function response parts is equal/],
    ['too many responses', JSON.stringify({ contents: [user, call, answer(2)] }), /number of function response parts is equal/],
    ['text instead of responses', JSON.stringify({ contents: [user, call, user] }), /number of function response parts is equal/],
    ['responses without a call', JSON.stringify({ contents: [user, { role: 'model', parts: [{ text: 'x' }] }, answer(1)] }), /number of function response parts/],
    ['response in a model turn', JSON.stringify({ contents: [user, { role: 'model', parts: [{ functionResponse: { name: 'f', response: {} } }] }] }), /belongs in a user turn/],
    ['response that is not an object', JSON.stringify({ contents: [user, call, { role: 'user', parts: [{ functionResponse: { name: 'f', response: 'ok' } }] }] }), /function_response\.response/],
    ['bad function name', body({ tools: [{ functionDeclarations: [{ name: '9lives' }] }] }), /Invalid function name/],
    ['unknown Schema keyword', body({ tools: [{ functionDeclarations: [{ name: 'f', parameters: { type: 'OBJECT', properties: { a: { type: 'STRING' } }, additionalProperties: false } }] }] }), /Unknown name "additionalProperties"/],
    ['type list', body({ tools: [{ functionDeclarations: [{ name: 'f', parameters: { type: 'OBJECT', properties: { a: { type: ['string', 'null'] } } } }] }] }), /Proto field is not repeating/],
    ['empty OBJECT properties', body({ tools: [{ functionDeclarations: [{ name: 'f', parameters: { type: 'OBJECT', properties: {} } }] }] }), /should be non-empty for OBJECT type/],
    ['both parameter dialects', body({ tools: [{ functionDeclarations: [{ name: 'f', parameters: { type: 'STRING' }, parametersJsonSchema: {} }] }] }), /mutually exclusive/],
    ['bad mode', body({ ...fTool, toolConfig: { functionCallingConfig: { mode: 'SOMETIMES' } } }), /mode/],
    ['allowed names with AUTO', body({ ...fTool, toolConfig: { functionCallingConfig: { mode: 'AUTO', allowedFunctionNames: ['f'] } } }), /only allowed when mode is ANY/],
    ['allowed name not declared', body({ ...fTool, toolConfig: { functionCallingConfig: { mode: 'ANY', allowedFunctionNames: ['g'] } } }), /'g' is not declared/],
    ['unsupported mime type', body({ generationConfig: { responseMimeType: 'text/csv' } }), /response_mime_type/],
    ['schema without JSON', body({ generationConfig: { responseSchema: { type: 'STRING' } } }), /requires response_mime_type application\/json/],
    ['too many candidates', body({ generationConfig: { candidateCount: 9 } }), /candidates are supported/],
    ['maxOutputTokens 0', body({ generationConfig: { maxOutputTokens: 0 } }), /maxOutputTokens/],
    ['bad thinking budget', body({ generationConfig: { thinkingConfig: { thinkingBudget: -2 } } }), /thinking_budget/],
  ];
  for (const [label, raw, message] of cases) {
    const reply = generateContent('sim-gemini', raw);
    t.equal(reply.status, 400, label);
    const parsed = bodyOf(reply);
    t.same(Object.keys(parsed), ['error'], `${label}: one error key`);
    t.same(Object.keys(parsed.error), ['code', 'message', 'status'], `${label}: error keys`);
    t.equal(parsed.error.code, 400, `${label}: code`);
    t.equal(parsed.error.status, 'INVALID_ARGUMENT', `${label}: status`);
    t.match(parsed.error.message, message, `${label}: message`);
  }

  // What the real API accepts passes: a full round trip, snake_case names, a bare signature part.
  const fine = generateContent('sim-gemini', JSON.stringify({ contents: [user, twoCalls, answer(2)], ...fTool }));
  t.equal(fine.status, 200, 'two calls answered by two responses in one user turn');
  const snake = generateContent(
    'sim-gemini',
    JSON.stringify({
      contents: [{ role: 'user', parts: [{ text: 'Hi' }, { inline_data: { mime_type: 'image/png', data: 'iVBORw0KGgo=' } }] }],
      system_instruction: { parts: [{ text: 'Be brief.' }] },
      generation_config: { max_output_tokens: 3 },
    }),
  );
  t.equal(snake.status, 200, 'snake_case field names');
  t.match(bodyOf(snake), { candidates: [{ finishReason: 'MAX_TOKENS', content: { parts: [{ text: 'I see 1' }] } }] }, 'snake_case fields take effect');
  const signed = generateContent('sim-gemini', JSON.stringify({ contents: [user, { role: 'model', parts: [{ text: 'Ok.' }, { thoughtSignature: 'c2tpcA==' }] }, user] }));
  t.equal(signed.status, 200, 'a part carrying only a thought signature');
});

t.test('gemini: Schema dialect to JSON Schema', async (t) => {
  const converted = toJsonSchema(weatherParameters, 'parameters');
  t.same(converted, {
    type: 'object',
    properties: {
      city: { type: 'string', description: 'The city' },
      unit: { type: 'string', enum: ['celsius', 'fahrenheit'] },
      days: { type: 'integer', minimum: 1, maximum: 7 },
      note: { type: ['string', 'null'] },
    },
    required: ['city', 'unit'],
  });
  t.same(toJsonSchema({ type: 'array', items: { type: 'STRING', enum: ['a'], nullable: true }, min_items: '2', propertyOrdering: [] }, 'x'), {
    type: 'array',
    items: { type: ['string', 'null'], enum: ['a', null] },
    minItems: 2,
  }, 'lower-case types, snake_case keys, int64 strings; propertyOrdering dropped');
  t.same(toJsonSchema({ anyOf: [{ type: 'INTEGER' }, { type: 'TYPE_UNSPECIFIED' }] }, 'x'), { anyOf: [{ type: 'integer' }, {}] });
  t.throws(() => toJsonSchema({ type: 'OBJECT', properties: { a: { type: 'STRING', const: 'x' } } }, 'p'), /Unknown name "const" at 'p\.properties\[a\]'/);
  t.throws(() => toJsonSchema({ type: 'WHATEVER' }, 'p'), /Type\), "WHATEVER"/);
});

t.test('gemini: routes, model from the path, query string', async (t) => {
  const options = { models: ['sim-gemini', 'other'] };
  t.equal(routeGemini('POST', '/models/sim-gemini:generateContent', body(), options)?.status, 200);
  t.equal(bodyOf(routeGemini('POST', '/models/models/sim-gemini:generateContent', body(), options)!).modelVersion, 'sim-gemini', 'a models/ prefix is stripped');
  t.equal(bodyOf(routeGemini('POST', '/models/any-model%3AgenerateContent', body(), options)!).modelVersion, 'any-model', 'an encoded colon');
  const sse = routeGemini('POST', '/models/sim-gemini:streamGenerateContent?alt=sse&key=x', body(), options)!;
  t.equal(sse.headers['content-type'], 'text/event-stream; charset=utf-8');
  const array = routeGemini('POST', '/models/sim-gemini:streamGenerateContent', body(), options)!;
  t.equal(array.headers['content-type'], 'application/json');
  t.ok(Array.isArray(JSON.parse(scriptText(array))), 'without alt=sse the stream is one JSON array');
  t.equal(routeGemini('POST', '/models/sim-gemini:streamGenerateContent?alt=json', body(), options)?.headers['content-type'], 'application/json');
  t.equal(routeGemini('POST', '/models/sim-gemini:embedContent', body(), options), undefined, 'unknown method');
  t.equal(routeGemini('GET', '/models/sim-gemini:generateContent', undefined, options), undefined, 'wrong HTTP method');
  t.equal(routeGemini('POST', '/chat/completions', body(), options), undefined);
  t.same(bodyOf(routeGemini('GET', '/models?pageSize=50', undefined, options)!).models.map((m: Json) => m.name), ['models/sim-gemini', 'models/other']);
  t.match(bodyOf(routeGemini('GET', '/models/other', undefined, options)!), { name: 'models/other', supportedGenerationMethods: ['generateContent', 'countTokens'] });
  const missing = routeGemini('GET', '/models/nope', undefined, options)!;
  t.equal(missing.status, 404);
  t.match(bodyOf(missing), { error: { code: 404, status: 'NOT_FOUND', message: /models\/nope/ } });
  t.equal(routeGemini('POST', '/models/sim-gemini:countTokens', JSON.stringify({ contents: [{ parts: [{ text: 'Hi there' }] }] }), options)?.steps[0].bytes, JSON.stringify({ totalTokens: promptTokens('Hi there'), promptTokensDetails: [{ modality: 'TEXT', tokenCount: promptTokens('Hi there') }] }));

  // The shared router: POSTs for every listing, GETs only when Gemini lists.
  t.equal(routeSimulator('POST', '/models/sim-gemini:generateContent', body(), { models: ['c'] })?.status, 200, 'an OpenAI listing router still generates Gemini content');
  t.match(bodyOf(routeSimulator('GET', '/models', undefined, { models: ['c'] })!), { object: 'list', data: [{ id: 'c' }] });
  t.equal(routeSimulator('GET', '/models/sim-gemini', undefined, { models: ['c'] }), undefined);
  t.match(bodyOf(routeSimulator('GET', '/models', undefined, { models: ['c'], geminiModels: ['g'], listing: 'gemini' })!), { models: [{ name: 'models/g' }] });
});

t.test('gemini: stream chunks add up to the non-stream answer', async (t) => {
  const request = (fields: Json) => body({ generationConfig: { candidateCount: 2, ...fields } }, 'Rivers? [[sim tokens=5]]');
  const whole = bodyOf(generateContent('sim-gemini', request({})));
  const chunks = sseChunks(t, scriptText(generateContent('sim-gemini', request({}), 'sse')));
  for (const index of [0, 1]) {
    const mine = chunks.flatMap((c) => (c.candidates as Json[]).filter((k) => k.index === index));
    t.equal(mine.map((k) => k.content.parts.map((p: Json) => p.text).join('')).join(''), whole.candidates[index].content.parts[0].text, `candidate ${index}: text`);
    t.same(mine.filter((k) => k.finishReason).map((k) => k.finishReason), ['STOP'], `candidate ${index}: one finish`);
    t.ok(mine.at(-1)?.finishReason, `candidate ${index}: finish on its last chunk`);
  }
  t.not(whole.candidates[0].content.parts[0].text, whole.candidates[1].content.parts[0].text, 'candidates differ');
  t.same(chunks.at(-1)!.usageMetadata, whole.usageMetadata, 'the last usage equals the final usage');
  t.equal(whole.usageMetadata.candidatesTokenCount, 10, 'usage sums the candidates');
});

// ---------------------------------------------------------------------------------------------
// Through the official SDK, against the standalone server

t.test('standalone server with @google/genai', async (t) => {
  const sim = await startSimulatorProcess();
  t.teardown(() => sim.stop());
  const base = sim.url;
  const ai = new GoogleGenAI({ apiKey: 'x', httpOptions: { baseUrl: base } });
  const model = 'sim-gemini';
  const stats = async () => (await (await fetch(`${base}/stats`)).json()) as { requests: number; aborted: number; lastRequest: Json };
  const collect = async (stream: AsyncGenerator<GenerateContentResponse>) => {
    const out: GenerateContentResponse[] = [];
    for await (const chunk of stream) out.push(chunk);
    return out;
  };

  t.test('generateContent', async (t) => {
    const prompt = 'Tell me about rivers.';
    const r = await ai.models.generateContent({ model, contents: prompt });
    t.equal(r.candidates?.length, 1);
    const [c] = r.candidates!;
    t.equal(c.finishReason, 'STOP');
    t.equal(c.index, 0);
    t.equal(c.content?.role, 'model');
    t.equal(c.content?.parts?.length, 1);
    t.match(r.text, /^[A-Z][a-z]+( [a-z]+)+\.$/, 'a sentence');
    t.same(r.usageMetadata, { promptTokenCount: promptTokens(prompt), candidatesTokenCount: 16, totalTokenCount: promptTokens(prompt) + 16 });
    t.equal(r.modelVersion, 'sim-gemini');
    t.match(r.responseId, /^[A-Za-z0-9]{22}$/);
    const again = await ai.models.generateContent({ model, contents: prompt });
    t.equal(again.text, r.text, 'deterministic');
    t.not(again.responseId, r.responseId, 'each response gets its own id');
    t.match(await stats(), { lastRequest: { contents: [{ role: 'user', parts: [{ text: prompt }] }] } }, '/stats keeps the last body');

    const system = await ai.models.generateContent({ model, contents: prompt, config: { systemInstruction: 'Be brief.' } });
    t.equal(system.usageMetadata?.promptTokenCount, promptTokens(prompt) + promptTokens('Be brief.'), 'the system instruction counts as input');

    const capped = await ai.models.generateContent({ model, contents: `${prompt} [[sim tokens=10]]`, config: { maxOutputTokens: 4 } });
    t.equal(capped.candidates?.[0].finishReason, 'MAX_TOKENS');
    t.equal(capped.usageMetadata?.candidatesTokenCount, 4);

    const counted = await ai.models.countTokens({ model, contents: prompt });
    t.equal(counted.totalTokens, promptTokens(prompt), 'countTokens agrees with promptTokenCount');
  });

  t.test('generateContentStream', async (t) => {
    const contents = 'Stream it. [[sim tokens=6]]';
    const whole = await ai.models.generateContent({ model, contents });
    const chunks = await collect(await ai.models.generateContentStream({ model, contents }));
    t.equal(chunks.length, 6, 'a chunk per token');
    t.equal(chunks.map((c) => c.text).join(''), whole.text, 'increments add up to the answer');
    t.ok(chunks.every((c) => c.candidates?.[0].content?.parts?.length === 1), 'each chunk holds only its new part');
    t.equal(new Set(chunks.map((c) => c.responseId)).size, 1, 'one responseId on every chunk');
    t.ok(chunks.every((c) => c.modelVersion === 'sim-gemini'), 'modelVersion on every chunk');
    t.same(chunks.map((c) => c.usageMetadata?.candidatesTokenCount), [1, 2, 3, 4, 5, 6], 'running totals');
    t.same(chunks.map((c) => c.candidates?.[0].finishReason ?? null), [null, null, null, null, null, 'STOP'], 'the finish on the last chunk only');
    t.same(chunks.at(-1)!.usageMetadata, whole.usageMetadata);

    const empty = await collect(await ai.models.generateContentStream({ model, contents: '[[sim tokens=0]]' }));
    t.equal(empty.length, 1);
    t.same(empty[0].candidates?.[0], { content: { role: 'model', parts: [{ text: '' }] }, finishReason: 'STOP', index: 0 }, 'an empty answer: one empty text part with the finish');

    const raw = await fetch(`${base}/v1beta/models/${model}:streamGenerateContent?alt=sse`, { method: 'POST', body: body({}, contents) });
    t.equal(raw.headers.get('content-type'), 'text/event-stream; charset=utf-8');
    const events = sseChunks(t, await raw.text());
    t.equal(events.length, 6);
    t.same(Object.keys(events[0]), ['candidates', 'usageMetadata', 'modelVersion', 'responseId']);
  });

  t.test('function calling round trip', async (t) => {
    const tools = [{ functionDeclarations: [{ name: 'get_weather', description: 'Weather in a city', parameters: weatherParameters }] }];
    const question: Content = { role: 'user', parts: [{ text: 'What is the weather in Paris?' }] };
    const first = await ai.models.generateContent({ model, contents: [question], config: { tools } });
    const [call] = first.functionCalls ?? [];
    t.equal(first.functionCalls?.length, 1);
    t.equal(call?.name, 'get_weather');
    t.equal(call?.id, undefined, 'no call id, like the real API');
    t.equal(first.candidates?.[0].finishReason, 'STOP', 'a call finishes with STOP');
    t.ok(ajv.validate(toJsonSchema(weatherParameters, 'p') as object, call?.args), `args validate: ${ajv.errorsText()}`);
    t.type(call?.args, 'object');
    t.equal(first.candidates?.[0].content?.parts?.[0].thoughtSignature, undefined, 'no signature without thoughts');

    const modelTurn = first.candidates![0].content!;
    const result: Content = { role: 'user', parts: [{ functionResponse: { name: 'get_weather', response: { output: 'Sunny and 22 degrees' } } }] };
    const second = await ai.models.generateContent({ model, contents: [question, modelTurn, result], config: { tools } });
    t.equal(second.functionCalls, undefined, 'no call after a function response');
    t.match(second.text, /^The tool returned: Sunny and 22 degrees\. [A-Z]/);
    t.equal(second.candidates?.[0].finishReason, 'STOP');

    const unanswered = apiErrorBody(await rejection(ai.models.generateContent({ model, contents: [question, modelTurn, question], config: { tools } })));
    t.match(unanswered, { error: { code: 400, status: 'INVALID_ARGUMENT', message: /number of function response parts/ } }, 'rule 4.9 through the SDK');

    const none = await ai.models.generateContent({ model, contents: [question], config: { tools, toolConfig: { functionCallingConfig: { mode: FunctionCallingConfigMode.NONE } } } });
    t.equal(none.functionCalls, undefined, 'mode NONE: text');
    t.type(none.text, 'string');

    const jsonTools = [{ functionDeclarations: [{ name: 'a' }, { name: 'lookup', parametersJsonSchema: { type: 'object', properties: { id: { type: 'string', format: 'uuid' } }, required: ['id'], additionalProperties: false } }] }];
    const picked = await ai.models.generateContent({
      model,
      contents: [question],
      config: { tools: jsonTools, toolConfig: { functionCallingConfig: { mode: FunctionCallingConfigMode.ANY, allowedFunctionNames: ['lookup'] } } },
    });
    t.same(picked.functionCalls, [{ name: 'lookup', args: { id: '00000000-0000-4000-8000-000000000000' } }], 'ANY + allowedFunctionNames picks that function; parametersJsonSchema is read');

    const streamed = await collect(await ai.models.generateContentStream({ model, contents: [question], config: { tools } }));
    const callChunks = streamed.filter((c) => c.functionCalls);
    t.equal(callChunks.length, 1, 'the call arrives in one chunk');
    t.same(callChunks[0].functionCalls, first.functionCalls, 'whole, with complete args');
    t.equal(streamed.at(-1)?.candidates?.[0].finishReason, 'STOP');
    t.equal(streamed.at(-1)?.usageMetadata?.candidatesTokenCount, first.usageMetadata?.candidatesTokenCount);
  });

  t.test('JSON output', async (t) => {
    const responseSchema = {
      type: Type.OBJECT,
      properties: { name: { type: Type.STRING }, rating: { type: Type.NUMBER, minimum: 3 }, tags: { type: Type.ARRAY, items: { type: Type.STRING }, minItems: '2' } },
      required: ['name', 'rating', 'tags'],
    };
    const r = await ai.models.generateContent({ model, contents: 'Rate a river.', config: { responseMimeType: 'application/json', responseSchema } });
    const value = JSON.parse(r.text ?? '') as Json;
    t.ok(ajv.validate(toJsonSchema(responseSchema, 's') as object, value), `validates: ${ajv.errorsText()}`);
    t.equal(value.tags.length, 2);
    t.match(await stats(), { lastRequest: { generationConfig: { responseMimeType: 'application/json', responseSchema: { type: 'OBJECT' } } } }, 'sent as Gemini Schema');

    const jsonSchema = { type: 'object', properties: { ok: { type: 'boolean' } }, required: ['ok'], additionalProperties: false };
    const viaJsonSchema = await ai.models.generateContent({ model, contents: 'Ok?', config: { responseMimeType: 'application/json', responseJsonSchema: jsonSchema } });
    t.same(JSON.parse(viaJsonSchema.text ?? ''), { ok: true }, 'responseJsonSchema');

    const free = await ai.models.generateContent({ model, contents: 'Anything.', config: { responseMimeType: 'application/json' } });
    t.match(JSON.parse(free.text ?? ''), { answer: /^[A-Z]/ }, 'JSON without a schema');
  });

  t.test('inline image', async (t) => {
    const image = { inlineData: { mimeType: 'image/png', data: Buffer.from('not really a png').toString('base64') } };
    const withImage = await ai.models.generateContent({ model, contents: [{ role: 'user', parts: [image, { text: 'What is this?' }] }] });
    t.match(withImage.text, /^I see 1 image\. [A-Z]/);
    const without = await ai.models.generateContent({ model, contents: 'What is this?' });
    t.equal(withImage.usageMetadata!.promptTokenCount! - without.usageMetadata!.promptTokenCount!, 85, 'an image costs 85 prompt tokens');
    const pdf = await ai.models.generateContent({ model, contents: [{ role: 'user', parts: [{ inlineData: { mimeType: 'application/pdf', data: 'JVBERg==' } }, { text: 'What is this?' }] }] });
    t.notMatch(pdf.text, /image/, 'a PDF is no image');
  });

  t.test('includeThoughts', async (t) => {
    const config = { thinkingConfig: { includeThoughts: true } };
    const r = await ai.models.generateContent({ model, contents: 'Think first.', config });
    const parts = r.candidates?.[0].content?.parts ?? [];
    t.equal(parts.length, 2);
    t.equal(parts[0].thought, true, 'thoughts come first');
    t.match(parts[0].text, /^\*\*Planning/);
    t.equal(parts[1].thought, undefined);
    t.equal(r.text, parts[1].text, 'the SDK text skips thoughts');
    const usage = r.usageMetadata!;
    t.equal(usage.thoughtsTokenCount, 15);
    t.equal(usage.candidatesTokenCount, 16, 'candidates exclude thoughts');
    t.equal(usage.totalTokenCount, usage.promptTokenCount! + 16 + 15);

    const off = await ai.models.generateContent({ model, contents: 'Think first.', config: { thinkingConfig: { includeThoughts: true, thinkingBudget: 0 } } });
    t.equal(off.candidates?.[0].content?.parts?.length, 1, 'budget 0: no thoughts');
    t.notOk('thoughtsTokenCount' in off.usageMetadata!, 'and no thoughtsTokenCount');

    const starved = await ai.models.generateContent({ model, contents: 'Think first.', config: { ...config, maxOutputTokens: 5 } });
    t.equal(starved.candidates?.[0].finishReason, 'MAX_TOKENS', 'thoughts spend maxOutputTokens first');
    t.same(starved.candidates?.[0].content?.parts?.map((p) => p.thought), [true]);
    t.equal(starved.usageMetadata?.thoughtsTokenCount, 5);

    const tools = [{ functionDeclarations: [{ name: 'get_weather', parameters: weatherParameters }] }];
    const called = await ai.models.generateContent({ model, contents: 'Weather?', config: { ...config, tools } });
    const callPart = called.candidates?.[0].content?.parts?.find((p) => p.functionCall);
    t.match(callPart?.thoughtSignature, /^[A-Za-z0-9+/]{43}=$/, 'the call carries a base64 signature');
    t.equal(Buffer.from(callPart!.thoughtSignature!, 'base64').length, 32);
    const again = await ai.models.generateContent({ model, contents: 'Weather?', config: { ...config, tools } });
    t.equal(again.candidates?.[0].content?.parts?.find((p) => p.functionCall)?.thoughtSignature, callPart?.thoughtSignature, 'deterministic');

    const chunks = await collect(await ai.models.generateContentStream({ model, contents: 'Think first. [[sim tokens=3]]', config }));
    const thoughtChunks = chunks.filter((c) => c.candidates?.[0].content?.parts?.[0].thought);
    t.equal(thoughtChunks.length, 15, 'thoughts stream before the answer');
    t.equal(chunks.indexOf(thoughtChunks.at(-1)!), 14);
    t.same(chunks.map((c) => c.usageMetadata?.thoughtsTokenCount), [...Array.from({ length: 15 }, (_, i) => i + 1), 15, 15, 15]);
  });

  t.test('error directive', async (t) => {
    for (const [status, name] of [
      [429, 'RESOURCE_EXHAUSTED'],
      [503, 'UNAVAILABLE'],
      [401, 'UNAUTHENTICATED'],
      [504, 'DEADLINE_EXCEEDED'],
    ] as const) {
      const err = await rejection(ai.models.generateContent({ model, contents: `Hi [[sim error=${status}]]` }));
      t.ok(err instanceof ApiError, `${status}: an ApiError`);
      t.equal((err as ApiError).status, status);
      t.match(apiErrorBody(err), { error: { code: status, status: name, message: /\(simulated\)$/ } });
    }
    const streamed = await rejection(ai.models.generateContentStream({ model, contents: 'Hi [[sim error=500]]' }).then(collect));
    t.equal((streamed as ApiError).status, 500, 'a stream fails before its first chunk');
    t.match(apiErrorBody(streamed), { error: { status: 'INTERNAL' } });
  });

  t.test('cut stream', async (t) => {
    const seen: GenerateContentResponse[] = [];
    const err = await rejection(
      (async () => {
        for await (const chunk of await ai.models.generateContentStream({ model, contents: 'Hi [[sim tokens=20 tps=1000 cut_after=3]]' })) seen.push(chunk);
      })(),
    );
    t.ok(err instanceof Error, 'the stream ends in an error');
    t.notOk(err instanceof ApiError, 'a dropped connection, not an API error');
    t.equal(seen.length, 3, 'three chunks before the cut');
    t.ok(seen.every((c) => c.candidates?.[0].finishReason === undefined), 'no finish before the cut');

    const beyond = await fetch(`${base}/v1beta/models/${model}:streamGenerateContent?alt=sse`, { method: 'POST', body: body({}, '[[sim tokens=2 cut_after=9]]') });
    let text = '';
    const reader = beyond.body!.getReader();
    const ended = await rejection(
      (async () => {
        for (;;) {
          const { done, value } = await reader.read();
          if (done) return;
          text += Buffer.from(value).toString('utf8');
        }
      })(),
    );
    t.ok(ended, 'a cut beyond the answer still drops the connection');
    t.equal(text.split('\n\n').filter(Boolean).length, 2);
    t.notMatch(text, /finishReason/);
    t.equal((await stats()).aborted, 0, 'a cut is no client abort');
  });

  t.test('blocked prompt', async (t) => {
    const r = await ai.models.generateContent({ model, contents: 'Something bad [[sim block=1]]' });
    t.equal(r.candidates, undefined, 'no candidates');
    t.equal(r.promptFeedback?.blockReason, 'SAFETY');
    t.equal(r.text, undefined);
    t.equal(r.usageMetadata?.promptTokenCount, promptTokens('Something bad [[sim block=1]]'));
    t.equal(r.usageMetadata?.candidatesTokenCount, undefined);
    const chunks = await collect(await ai.models.generateContentStream({ model, contents: 'Something bad [[sim block=1]]' }));
    t.equal(chunks.length, 1);
    t.equal(chunks[0].promptFeedback?.blockReason, 'SAFETY', 'streamed: one chunk with the feedback');
    t.equal(chunks[0].candidates, undefined);
  });

  t.test('JSON array stream without alt=sse', async (t) => {
    const contents = '[[sim tokens=4]]';
    const res = await fetch(`${base}/v1beta/models/${model}:streamGenerateContent`, { method: 'POST', body: body({}, contents), headers: { 'x-goog-api-key': 'x' } });
    t.equal(res.status, 200);
    t.equal(res.headers.get('content-type'), 'application/json');
    const text = await res.text();
    t.match(text, /^\[\{.*\}\]$/s, 'one array');
    t.equal(text.split(',\r\n{').length, 4, 'elements separated by ,CRLF');
    const elements = JSON.parse(text) as Json[];
    const sse = sseChunks(t, await (await fetch(`${base}/v1beta/models/${model}:streamGenerateContent?alt=sse`, { method: 'POST', body: body({}, contents) })).text());
    const strip = (c: Json) => ({ ...c, responseId: undefined });
    t.same(elements.map(strip), sse.map(strip), 'the same chunks as the SSE stream');
    t.equal(elements.at(-1)!.candidates[0].finishReason, 'STOP');

    const cut = await fetch(`${base}/v1beta/models/${model}:streamGenerateContent`, { method: 'POST', body: body({}, '[[sim tokens=4 cut_after=2]]') });
    t.ok(await rejection(cut.text()), 'a cut array stream fails to read');
  });

  t.test('listing and unknown routes', async (t) => {
    const listed: string[] = [];
    for await (const m of await ai.models.list()) listed.push(m.name ?? '');
    t.same(listed, ['models/sim-gemini', 'models/sim-gemini-lite']);
    const info = await ai.models.get({ model: 'sim-gemini-lite' });
    t.equal(info.name, 'models/sim-gemini-lite');
    t.same(info.supportedActions, ['generateContent', 'countTokens']);
    t.ok((info.inputTokenLimit ?? 0) > 0 && (info.outputTokenLimit ?? 0) > 0);
    const missing = await rejection(ai.models.get({ model: 'gemini-nope' }));
    t.equal((missing as ApiError).status, 404);
    t.match(apiErrorBody(missing), { error: { status: 'NOT_FOUND' } });

    const other = await fetch(`${base}/v1beta/tunedModels/x:generateContent`, { method: 'POST', body: body() });
    t.equal(other.status, 404);
    t.match(await other.json(), { error: { code: 404, status: 'NOT_FOUND' } });
    const chatOnV1beta = await fetch(`${base}/v1beta/chat/completions`, { method: 'POST', body: '{}' });
    t.equal(chatOnV1beta.status, 404, 'the Gemini root serves only Gemini routes');
    t.match(await (await fetch(`${base}/v1/models`)).json(), { object: 'list', data: [{ id: 'sim-chat' }] }, 'the OpenAI listing is unchanged');
    const garbage = await fetch(`${base}/v1beta/models/${model}:generateContent`, { method: 'POST', body: '{' });
    t.equal(garbage.status, 400);
    t.match(await garbage.json(), { error: { code: 400, status: 'INVALID_ARGUMENT' } });
  });

  t.test('stats count Gemini generation', async (t) => {
    const before = (await stats()).requests;
    await ai.models.generateContent({ model, contents: 'one' });
    await collect(await ai.models.generateContentStream({ model, contents: 'two' }));
    await ai.models.countTokens({ model, contents: 'not generation' });
    await fetch(`${base}/v1beta/models`);
    const after = await stats();
    t.equal(after.requests, before + 2, 'generate and stream count; countTokens and listing do not');
    t.same(after.lastRequest, { contents: [{ parts: [{ text: 'two' }], role: 'user' }] });
  });
});

// ---------------------------------------------------------------------------------------------
// In-process upstream

t.test('in-process upstream with family: gemini', async (t) => {
  let factory: UpstreamFactory | undefined;
  const ctx = { options: {}, addUpstreamKind: (kind: string, f: UpstreamFactory) => kind === 'simulator' && (factory = f) } as unknown as BootContext;
  await simulatorPlugin(ctx);
  if (!factory) throw new Error('simulator kind not registered');
  const upstream = factory('gem', { family: 'gemini' }, ctx);
  t.equal(upstream.family, 'gemini');
  t.throws(() => simulatorUpstream('bad', { family: 'anthropic' }), /'chat', 'responses', 'gemini' or 'messages'/);
  const post = (path: string, text: string) => ({ method: 'POST' as const, path, headers: {}, body: body({}, text) });
  const send = async (u: typeof upstream, req: Parameters<typeof upstream.send>[0]) => {
    const rec = recordingSink();
    u.send(req, rec.sink);
    t.same(rec.events, [], 'nothing happens inside send()');
    await rec.done;
    return rec;
  };

  const sse = await send(upstream, post('/models/sim-gemini:streamGenerateContent?alt=sse', '[[sim tokens=3 tps=200]]'));
  t.same(sse.events, ['start', 'data', 'data', 'data', 'end'], 'paced: a step per token');
  t.equal(sse.status(), 200);
  t.equal(sse.headers()['content-type'], 'text/event-stream; charset=utf-8');
  const events = sseChunks(t, sse.text());
  t.equal(events.length, 3);
  t.equal(events.at(-1)!.candidates[0].finishReason, 'STOP');

  const array = await send(upstream, post('/models/sim-gemini:streamGenerateContent', '[[sim tokens=3]]'));
  t.equal(array.headers()['content-type'], 'application/json');
  t.equal((JSON.parse(array.text()) as Json[]).length, 3, 'without alt=sse: the JSON array');

  const plain = await send(upstream, post('/models/sim-gemini:generateContent', 'Hello'));
  t.match(JSON.parse(plain.text()), { candidates: [{ finishReason: 'STOP', index: 0 }], modelVersion: 'sim-gemini' });

  const cut = await send(upstream, post('/models/sim-gemini:streamGenerateContent?alt=sse', '[[sim tokens=10 cut_after=2]]'));
  t.equal(cut.events.at(-1), 'error');
  t.equal(cut.error()?.code, 'upstream_error');
  t.equal(sseChunks(t, cut.text()).length, 2, 'two chunks before the cut');

  const failed = await send(upstream, post('/models/sim-gemini:generateContent', '[[sim error=429]]'));
  t.equal(failed.status(), 429);
  t.same(JSON.parse(failed.text()), { error: { code: 429, message: 'Resource has been exhausted (e.g. check quota). (simulated)', status: 'RESOURCE_EXHAUSTED' } });

  const get = (path: string) => ({ method: 'GET' as const, path, headers: {} });
  const listed = await send(simulatorUpstream('g', { family: 'gemini', models: ['gemini-x'] }), get('/models'));
  t.same(JSON.parse(listed.text()).models.map((m: Json) => m.name), ['models/gemini-x'], 'the models option lists Gemini models');
  t.match(JSON.parse((await send(upstream, get('/models'))).text()), { models: [{ name: 'models/sim-gemini' }, { name: 'models/sim-gemini-lite' }] }, 'default Gemini models');
  t.match(JSON.parse((await send(upstream, get('/models/sim-gemini'))).text()), { name: 'models/sim-gemini' });
  const missing = await send(upstream, get('/nope'));
  t.equal(missing.status(), 404);
  t.match(JSON.parse(missing.text()), { error: { code: 404, status: 'NOT_FOUND' } }, 'Google-shaped 404');

  const chat = await send(upstream, { ...post('/chat/completions', ''), body: JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'Hi' }] }) });
  t.match(JSON.parse(chat.text()), { object: 'chat.completion' }, 'a gemini-family simulator answers chat too');
  const chatFamily = factory('c', {}, ctx);
  t.match(JSON.parse((await send(chatFamily, post('/models/sim-gemini:generateContent', 'Hi'))).text()), { candidates: [{ index: 0 }] }, 'and a chat-family one answers Gemini');
  t.match(JSON.parse((await send(chatFamily, get('/models'))).text()), { object: 'list' }, 'while listing OpenAI models');
});
