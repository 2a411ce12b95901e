/**
 * Content generation end to end with the stock @google/genai SDK (only a base URL and a key),
 * on a native Gemini upstream and on a chat upstream, plus the raw wire forms the SDK does not
 * exercise: the three auth forms, the JSON-array stream, model listing and error bodies.
 */
import { GoogleGenAI, Type } from '@google/genai';
import { Ajv } from 'ajv';
import OpenAI from 'openai';
import t from 'tap';
import { startStack } from './helpers.js';

const { sim, gw } = await startStack(
  (simUrl) => `
upstreams:
  chat: { kind: openai-chat, baseUrl: "${simUrl}/v1" }
  gemini: { kind: gemini, baseUrl: "${simUrl}/v1beta", apiKey: gemini-upstream-key }
models:
  - { id: sim-gemini, upstream: gemini }
  - { id: gem-on-chat, upstream: chat, upstreamModel: sim-chat }
  - { id: lenient-on-chat, upstream: chat, upstreamModel: sim-chat, ignoreParameters: [safetySettings, topK] }
`,
);

const google = (apiKey = gw.key) => new GoogleGenAI({ apiKey, httpOptions: { baseUrl: gw.url } });
const ai = google();
const post = (path: string, body: unknown, headers: Record<string, string> = { 'x-goog-api-key': gw.key }) =>
  fetch(`${gw.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) });
const lastUpstreamRequest = async () => ((await (await fetch(`${sim.url}/stats`)).json()) as { lastRequest: any }).lastRequest;

for (const model of ['sim-gemini', 'gem-on-chat']) {
  t.test(`${model}: generateContent and generateContentStream`, async (t) => {
    const r = await ai.models.generateContent({ model, contents: 'Hello [[sim tokens=6]]', config: { systemInstruction: 'Be kind' } });
    t.ok(r.text && r.text.length > 0);
    t.equal(r.candidates?.[0]?.finishReason, 'STOP');
    t.equal(r.usageMetadata?.candidatesTokenCount, 6);
    t.equal(r.usageMetadata?.totalTokenCount, r.usageMetadata!.promptTokenCount! + 6);

    let text = '';
    let last;
    for await (const chunk of await ai.models.generateContentStream({ model, contents: 'Stream [[sim tokens=7]]' })) {
      text += chunk.text ?? '';
      last = chunk;
    }
    t.ok(text.length > 0);
    t.equal(last?.candidates?.[0]?.finishReason, 'STOP', 'the last event carries the finish reason');
    t.equal(last?.usageMetadata?.candidatesTokenCount, 7, 'and the final usage');
  });

  t.test(`${model}: function calling round trip`, async (t) => {
    const config = {
      tools: [
        {
          functionDeclarations: [
            {
              name: 'get_weather',
              description: 'Weather for a city',
              parameters: { type: Type.OBJECT, properties: { city: { type: Type.STRING }, days: { type: Type.INTEGER, nullable: true } }, required: ['city'] },
            },
          ],
        },
      ],
    };
    const first = await ai.models.generateContent({ model, contents: 'Weather in Bergen?', config });
    const call = first.functionCalls?.[0];
    t.equal(call?.name, 'get_weather');
    t.type(call?.args?.city, 'string');
    t.equal(first.candidates?.[0]?.finishReason, 'STOP', 'Gemini reports STOP for a call');
    const second = await ai.models.generateContent({
      model,
      config,
      contents: [
        { role: 'user', parts: [{ text: 'Weather in Bergen?' }] },
        { role: 'model', parts: first.candidates![0]!.content!.parts! },
        { role: 'user', parts: [{ functionResponse: { name: 'get_weather', id: call?.id, response: { output: 'Drizzle' } } }] },
      ],
    });
    t.match(second.text, /^The tool returned: .*Drizzle/);
  });

  t.test(`${model}: JSON output with a Gemini responseSchema`, async (t) => {
    const r = await ai.models.generateContent({
      model,
      contents: 'A city as JSON',
      config: {
        responseMimeType: 'application/json',
        responseSchema: { type: Type.OBJECT, properties: { name: { type: Type.STRING }, population: { type: Type.INTEGER } }, required: ['name', 'population'] },
      },
    });
    const value = JSON.parse(r.text!);
    t.ok(new Ajv().validate({ type: 'object', properties: { name: { type: 'string' }, population: { type: 'integer' } }, required: ['name', 'population'] }, value));
  });

  t.test(`${model}: inline image`, async (t) => {
    const r = await ai.models.generateContent({
      model,
      contents: [{ role: 'user', parts: [{ text: 'What is this?' }, { inlineData: { mimeType: 'image/png', data: 'iVBORw0KGgo=' } }] }],
    });
    t.match(r.text, /^I see 1 image/);
  });
}

t.test('translation details on a chat upstream', async (t) => {
  // Two results for two calls travel as one user turn with two functionResponse parts; upstream
  // they become two tool messages answering the synthesized call ids.
  await ai.models.generateContent({
    model: 'gem-on-chat',
    contents: [
      { role: 'user', parts: [{ text: 'Two cities' }] },
      { role: 'model', parts: [{ functionCall: { name: 'get_weather', args: { city: 'Oslo' } } }, { functionCall: { name: 'get_weather', args: { city: 'Rome' } } }] },
      { role: 'user', parts: [{ functionResponse: { name: 'get_weather', response: { t: 1 } } }, { functionResponse: { name: 'get_weather', response: { t: 2 } } }] },
    ],
    config: { tools: [{ functionDeclarations: [{ name: 'get_weather', parametersJsonSchema: { type: 'object', properties: { city: { type: 'string' } } } }] }] },
  });
  const sent = await lastUpstreamRequest();
  t.same(sent.messages.map((m: any) => m.role), ['user', 'assistant', 'tool', 'tool']);
  const ids = sent.messages[1].tool_calls.map((c: any) => c.id);
  t.same(sent.messages.slice(2).map((m: any) => m.tool_call_id), ids, 'results answer the synthesized ids in order');
  t.equal(new Set(ids).size, 2);

  const strict = await ai.models
    .generateContent({ model: 'gem-on-chat', contents: 'hi', config: { safetySettings: [{ category: 'HARM_CATEGORY_HARASSMENT' as any, threshold: 'BLOCK_NONE' as any }] } })
    .catch((e) => e);
  t.equal(strict.status, 400);
  t.match(strict.message, /'safetySettings'.*unsupportedParameters\.drop: \[safetySettings\]/);
  const lenient = await ai.models.generateContent({
    model: 'lenient-on-chat',
    contents: 'hi [[sim tokens=2]]',
    config: { safetySettings: [{ category: 'HARM_CATEGORY_HARASSMENT' as any, threshold: 'BLOCK_NONE' as any }], topK: 5 },
  });
  t.ok(lenient.text, 'dropped when the model config says so');
});

t.test('native: the upstream key and a JSON-array stream without alt=sse', async (t) => {
  const res = await post('/v1beta/models/sim-gemini:streamGenerateContent', { contents: [{ role: 'user', parts: [{ text: 'Array [[sim tokens=5]]' }] }] });
  t.equal(res.status, 200);
  t.match(res.headers.get('content-type'), /application\/json/);
  const events = JSON.parse(await res.text());
  t.ok(Array.isArray(events) && events.length > 1, 'a JSON array of increments');
  t.equal(events.at(-1).usageMetadata.candidatesTokenCount, 5);
  const translated = await post('/v1beta/models/gem-on-chat:streamGenerateContent', { contents: [{ role: 'user', parts: [{ text: 'Array [[sim tokens=4]]' }] }] });
  const tEvents = JSON.parse(await translated.text());
  t.equal(tEvents.at(-1).candidates[0].finishReason, 'STOP');
  t.equal(tEvents.at(-1).usageMetadata.candidatesTokenCount, 4);
});

t.test('blocked prompts are reported clearly', async (t) => {
  const native = await ai.models.generateContent({ model: 'sim-gemini', contents: 'bad [[sim block=1]]' });
  t.equal(native.promptFeedback?.blockReason, 'SAFETY', 'Gemini clients see the real answer');
  const openai = new OpenAI({ apiKey: gw.key, baseURL: `${gw.url}/v1`, maxRetries: 0 });
  // A chat client on the Gemini upstream: the blocked prompt is an error, not an empty answer.
  const blocked = await openai.chat.completions.create({ model: 'sim-gemini', messages: [{ role: 'user', content: 'bad [[sim block=1]]' }] }).catch((e) => e);
  t.equal(blocked.status, 400);
  t.equal(blocked.code, 'prompt_blocked');
  t.match(blocked.message, /SAFETY/);
});

t.test('auth: x-svc-api-key, x-goog-api-key and ?key=', async (t) => {
  const body = { contents: [{ role: 'user', parts: [{ text: 'hi [[sim tokens=2]]' }] }] };
  t.equal((await post('/v1beta/models/sim-gemini:generateContent', body, { 'x-svc-api-key': gw.key })).status, 200);
  t.equal((await post('/v1beta/models/sim-gemini:generateContent', body, { 'x-goog-api-key': gw.key })).status, 200);
  t.equal((await post(`/v1beta/models/sim-gemini:generateContent?key=${gw.key}`, body, {})).status, 200);
  const missing = await post('/v1beta/models/sim-gemini:generateContent', body, {});
  t.equal(missing.status, 401);
  t.same(Object.keys(((await missing.json()) as any).error).sort(), ['code', 'message', 'status']);
  const wrong = await google('sk-wrong-key-000000000000').models.generateContent({ model: 'sim-gemini', contents: 'hi' }).catch((e) => e);
  t.equal(wrong.status, 401);
  t.match(wrong.message, /UNAUTHENTICATED/);
});

t.test('403: a group without content generation, or without the model', async (t) => {
  await gw.admin('POST', '/admin/groups', { name: 'openai-only', models: ['*'], families: ['chat', 'responses'] });
  const key = (await gw.admin('POST', '/admin/keys', { group: 'openai-only' })).body.key;
  const denied = await google(key).models.generateContent({ model: 'sim-gemini', contents: 'hi' }).catch((e) => e);
  t.equal(denied.status, 403);
  t.match(denied.message, /PERMISSION_DENIED/);
  const list = await fetch(`${gw.url}/v1beta/models`, { headers: { 'x-goog-api-key': key } });
  t.equal(list.status, 403, 'not even the listing');

  await gw.admin('POST', '/admin/groups', { name: 'gemini-one', models: ['sim-gemini'], families: ['gemini'] });
  const oneKey = (await gw.admin('POST', '/admin/keys', { group: 'gemini-one' })).body.key;
  const other = await google(oneKey).models.generateContent({ model: 'gem-on-chat', contents: 'hi' }).catch((e) => e);
  t.equal(other.status, 403);
  const models = (await (await fetch(`${gw.url}/v1beta/models`, { headers: { 'x-goog-api-key': oneKey } })).json()) as any;
  t.same(models.models.map((m: any) => m.name), ['models/sim-gemini']);
});

t.test('400s in Gemini shape', async (t) => {
  const badJson = await fetch(`${gw.url}/v1beta/models/sim-gemini:generateContent`, { method: 'POST', headers: { 'x-goog-api-key': gw.key }, body: '{"contents": [' });
  t.equal(badJson.status, 400);
  t.match(await badJson.json(), { error: { code: 400, status: 'INVALID_ARGUMENT' } });
  const badRole = await post('/v1beta/models/sim-gemini:generateContent', { contents: [{ role: 'assistant', parts: [{ text: 'x' }] }] });
  t.match(await badRole.json(), { error: { code: 400, status: 'INVALID_ARGUMENT', message: /contents\[0\]\.role/ } });
  // As Google answers it: an unknown model is 404 NOT_FOUND, not a 400.
  const unknown = await post('/v1beta/models/nope:generateContent', { contents: [{ parts: [{ text: 'x' }] }] });
  t.equal(unknown.status, 404);
  t.match(await unknown.json(), { error: { code: 404, status: 'NOT_FOUND', message: /nope/ } });
  const method = await post('/v1beta/models/sim-gemini:embedContent', { contents: [{ parts: [{ text: 'x' }] }] });
  t.equal(method.status, 404);
  t.match(await method.json(), { error: { status: 'NOT_FOUND' } });
  const upstream500 = await ai.models.generateContent({ model: 'sim-gemini', contents: 'fail [[sim error=500]]' }).catch((e) => e);
  t.equal(upstream500.status, 502);
});

t.test('model listing in Gemini shape', async (t) => {
  const list = (await (await fetch(`${gw.url}/v1beta/models`, { headers: { 'x-goog-api-key': gw.key } })).json()) as any;
  const entry = list.models.find((m: any) => m.name === 'models/sim-gemini');
  t.match(entry, { displayName: 'sim-gemini', supportedGenerationMethods: ['generateContent', 'streamGenerateContent'] });
  t.type(entry.inputTokenLimit, 'number');
  t.type(entry.outputTokenLimit, 'number');
  const one = await ai.models.get({ model: 'sim-gemini' });
  t.equal(one.name, 'models/sim-gemini');
  const openaiModels = (await (await fetch(`${gw.url}/v1/models`, { headers: { authorization: `Bearer ${gw.key}` } })).json()) as any;
  t.same(openaiModels.data.find((m: any) => m.id === 'sim-gemini').families, { chat: 'translated', responses: 'translated', gemini: 'native', messages: 'translated' });
  t.same(openaiModels.data.find((m: any) => m.id === 'gem-on-chat').families, { chat: 'native', responses: 'bridge', gemini: 'translated', messages: 'translated' });
});
