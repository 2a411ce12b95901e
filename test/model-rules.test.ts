/**
 * One model-rules step for every family: each rule, sent by each client family (chat, Responses,
 * Gemini) to a native (passthrough) and to translated upstreams, gets the same class of answer.
 * A refusal names the client's own parameter; a drop or a default is checked in what the upstream
 * (the simulator process) received.
 */
import tap, { type Test } from 'tap';
import { eventually, simulatorUpstreams, startStack } from './helpers.js';

const families = ['chat', 'responses', 'gemini'] as const;
type Family = (typeof families)[number];

// Per upstream family: a strict model (features off, refuse) and a lenient one (drop).
const { sim, gw } = await startStack(
  (simUrl) => `
${simulatorUpstreams(simUrl)}models:
${families
  .map(
    (f) => `  - id: ${f}-strict
    upstream: ${f}
    upstreamModel: sim-${f}
    maxOutputTokens: { default: 7, max: 50 }
    features: { tools: false, jsonSchema: false, vision: false, temperature: false, reasoning: false, unsupportedTools: reject, unsupportedParameters: { policy: reject } }
  - id: ${f}-lenient
    upstream: ${f}
    upstreamModel: sim-${f}
    maxOutputTokens: { default: 7, max: 50 }
    features: { unsupportedTools: drop, unsupportedParameters: { policy: drop } }
  - { id: ${f}-plain, upstream: ${f}, upstreamModel: sim-${f} }
  - { id: ${f}-capped, upstream: ${f}, upstreamModel: sim-${f}, maxOutputTokens: { max: 30 } }`,
  )
  .join('\n')}
  - { id: chat-clamped, upstream: chat, upstreamModel: sim-chat, maxOutputTokens: { max: 30, overMax: clamp } }
`,
);

type Json = Record<string, any>;
const image = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==';
const fn = { name: 'get_weather', description: 'Weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } };
const schema = { type: 'object', properties: { a: { type: 'string' } }, required: ['a'], additionalProperties: false };

/** Each rule's request fragment in each client family's words, and the parameter a refusal names. */
interface Shape {
  fields: Json;
  param: string;
}
const rules: Record<string, Record<Family, Shape>> = {
  tools: {
    chat: { fields: { tools: [{ type: 'function', function: fn }] }, param: 'tools' },
    responses: { fields: { tools: [{ type: 'function', ...fn }] }, param: 'tools' },
    gemini: { fields: { tools: [{ functionDeclarations: [fn] }] }, param: 'tools' },
  },
  jsonSchema: {
    chat: { fields: { response_format: { type: 'json_schema', json_schema: { name: 'r', schema } } }, param: 'response_format' },
    responses: { fields: { text: { format: { type: 'json_schema', name: 'r', schema } } }, param: 'text.format' },
    gemini: { fields: { generationConfig: { responseMimeType: 'application/json', responseJsonSchema: schema } }, param: 'generationConfig.responseSchema' },
  },
  vision: {
    chat: { fields: { messages: [{ role: 'user', content: [{ type: 'text', text: 'hi' }, { type: 'image_url', image_url: { url: `data:image/png;base64,${image}` } }] }] }, param: 'messages[0].content[1]' },
    responses: { fields: { input: [{ role: 'user', content: [{ type: 'input_text', text: 'hi' }, { type: 'input_image', image_url: `data:image/png;base64,${image}` }] }] }, param: 'input[0].content[1]' },
    gemini: { fields: { contents: [{ role: 'user', parts: [{ text: 'hi' }, { inlineData: { mimeType: 'image/png', data: image } }] }] }, param: 'contents[0].parts[1]' },
  },
  temperature: {
    chat: { fields: { temperature: 0.5 }, param: 'temperature' },
    responses: { fields: { temperature: 0.5 }, param: 'temperature' },
    gemini: { fields: { generationConfig: { temperature: 0.5 } }, param: 'generationConfig.temperature' },
  },
  reasoning: {
    chat: { fields: { reasoning_effort: 'low' }, param: 'reasoning_effort' },
    responses: { fields: { reasoning: { effort: 'low' } }, param: 'reasoning' },
    gemini: { fields: { generationConfig: { thinkingConfig: { thinkingBudget: 1024 } } }, param: 'generationConfig.thinkingConfig' },
  },
};

/** A parameter only the client's own family can express: logprobs. */
const logprobs: Record<Family, Shape & { sent: (body: Json) => unknown }> = {
  chat: { fields: { logprobs: true }, param: 'logprobs', sent: (b) => b.logprobs },
  responses: { fields: { top_logprobs: 2 }, param: 'top_logprobs', sent: (b) => b.top_logprobs },
  gemini: { fields: { generationConfig: { responseLogprobs: true } }, param: 'generationConfig.responseLogprobs', sent: (b) => b.generationConfig?.responseLogprobs },
};

/** A tool the upstream would have to run itself. */
const serverTool: Record<Family, Shape & { sent: (body: Json) => unknown }> = {
  chat: { fields: { web_search_options: {} }, param: 'web_search_options', sent: (b) => b.web_search_options },
  responses: { fields: { tools: [{ type: 'web_search' }] }, param: 'tools[0]', sent: (b) => b.tools?.find((x: Json) => x.type === 'web_search') },
  gemini: { fields: { tools: [{ googleSearch: {} }] }, param: 'tools[0].googleSearch', sent: (b) => b.tools?.find((x: Json) => x.googleSearch) },
};

/** The output ceiling in each family's words, as the client sends it and as the upstream receives it. */
const ceiling: Record<Family, { ask: (n: number) => Json; param: string; sent: (body: Json) => unknown }> = {
  chat: { ask: (n) => ({ max_completion_tokens: n }), param: 'max_completion_tokens', sent: (b) => b.max_completion_tokens ?? b.max_tokens },
  responses: { ask: (n) => ({ max_output_tokens: n }), param: 'max_output_tokens', sent: (b) => b.max_output_tokens },
  gemini: { ask: (n) => ({ generationConfig: { maxOutputTokens: n } }), param: 'generationConfig.maxOutputTokens', sent: (b) => b.generationConfig?.maxOutputTokens },
};

const base: Record<Family, Json> = {
  chat: { messages: [{ role: 'user', content: 'hi [[sim tokens=3]]' }] },
  responses: { input: 'hi [[sim tokens=3]]' },
  gemini: { contents: [{ role: 'user', parts: [{ text: 'hi [[sim tokens=3]]' }] }] },
};

/** Merges one level deep, so two fragments can share `generationConfig`. */
function body(family: Family, model: string, ...fragments: Json[]): Json {
  const out: Json = family === 'gemini' ? { ...base[family] } : { model, ...base[family] };
  for (const f of fragments) {
    for (const [k, v] of Object.entries(f)) out[k] = v && typeof v === 'object' && !Array.isArray(v) && out[k] ? { ...out[k], ...v } : v;
  }
  return out;
}

async function send(family: Family, model: string, ...fragments: Json[]): Promise<{ status: number; json: Json }> {
  const path = { chat: '/v1/chat/completions', responses: '/v1/responses', gemini: `/v1beta/models/${model}:generateContent` }[family];
  const auth: Record<string, string> = family === 'gemini' ? { 'x-goog-api-key': gw.key } : { authorization: `Bearer ${gw.key}` };
  const res = await fetch(`${gw.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', ...auth }, body: JSON.stringify(body(family, model, ...fragments)) });
  return { status: res.status, json: (await res.json()) as Json };
}

/** The parameter an error body names, in each family's error shape (Gemini's has none: the message). */
function refused(t: Test, family: Family, res: { status: number; json: Json }, param: string, code = 'unsupported_parameter'): void {
  t.equal(res.status, 400, `${family}: refused`);
  if (family === 'gemini') {
    t.equal(res.json.error.status, 'INVALID_ARGUMENT');
    t.ok(res.json.error.message.includes(param), `${family}: names ${param}`);
  } else {
    t.equal(res.json.error.code, code);
    t.equal(res.json.error.param, param);
  }
}

const lastUpstreamRequest = async (): Promise<Json> => ((await (await fetch(`${sim.url}/stats`)).json()) as { lastRequest: Json }).lastRequest;

for (const client of families) {
  for (const upstream of families) {
    const route = upstream === client ? 'native' : 'translated';
    tap.test(`${client} client on a ${upstream} upstream (${route})`, async (t) => {
      for (const [rule, shapes] of Object.entries(rules)) {
        const shape = shapes[client];
        refused(t, client, await send(client, `${upstream}-strict`, shape.fields), shape.param);
        t.equal((await send(client, `${upstream}-lenient`, shape.fields)).status, 200, `${rule}: served where the model supports it`);
      }

      // Parameters an upstream cannot express: kept on a native upstream, else by the model's policy.
      const lp = logprobs[client];
      if (route === 'native') {
        for (const model of [`${upstream}-strict`, `${upstream}-lenient`]) {
          t.equal((await send(client, model, lp.fields)).status, 200, 'the native upstream takes it');
          t.ok(lp.sent(await lastUpstreamRequest()), 'and it reaches the upstream');
        }
      } else {
        refused(t, client, await send(client, `${upstream}-strict`, lp.fields), lp.param);
        t.equal((await send(client, `${upstream}-lenient`, lp.fields)).status, 200, 'dropped by policy');
      }

      // Server-side tools: no upstream here offers one, so refused or dropped by the model's setting.
      const tool = serverTool[client];
      refused(t, client, await send(client, `${upstream}-strict`, tool.fields), tool.param);
      t.equal((await send(client, `${upstream}-lenient`, tool.fields)).status, 200, 'the server tool is dropped');
      t.notOk(serverTool[upstream].sent(await lastUpstreamRequest()), 'and never reaches the upstream');

      // The output ceiling: above max refused; none given gets the default.
      refused(t, client, await send(client, `${upstream}-strict`, ceiling[client].ask(100)), ceiling[client].param, 'invalid_value');
      t.equal((await send(client, `${upstream}-strict`)).status, 200);
      t.equal(ceiling[upstream].sent(await lastUpstreamRequest()), 7, 'the default ceiling reached the upstream');
      t.equal((await send(client, `${upstream}-strict`, ceiling[client].ask(20))).status, 200);
      t.equal(ceiling[upstream].sent(await lastUpstreamRequest()), 20, "the client's own ceiling is kept");
      t.equal((await send(client, `${upstream}-capped`)).status, 200);
      t.equal(ceiling[upstream].sent(await lastUpstreamRequest()), 30, 'with a max and no default, leaving the limit out gets the max');
    });
  }
}

tap.test('a model with no policy set drops sampling hints (Gemini CLI always sends topK) and refuses the rest', async (t) => {
  for (const upstream of ['chat', 'responses'] as const) {
    const res = await send('gemini', `${upstream}-plain`, { generationConfig: { topK: 64, topP: 0.9, temperature: 0.2 } });
    t.equal(res.status, 200, `topK dropped on a ${upstream} upstream`);
    const sent = await lastUpstreamRequest();
    t.equal(sent.top_p, 0.9, 'topP has a place upstream and is kept');
    t.equal(sent.top_k, undefined);
    refused(t, 'gemini', await send('gemini', `${upstream}-plain`, { safetySettings: [{ category: 'HARM_CATEGORY_HARASSMENT', threshold: 'BLOCK_NONE' }] }), 'safetySettings');
  }
  // A chat client's stop sequences have no place in a Responses request.
  refused(t, 'chat', await send('chat', 'responses-plain', { stop: ['x'] }), 'stop');
  t.equal((await send('chat', 'responses-lenient', { stop: ['x'] })).status, 200);
});

tap.test('a dropped server tool is noted in the usage log, the admin API and the CSV', async (t) => {
  const res = await send('responses', 'chat-lenient', { tools: [{ type: 'web_search' }] });
  t.equal(res.status, 200);
  const records: Json[] = await eventually(async () => {
    const stored: Json[] = (await gw.admin('GET', '/admin/usage?model=chat-lenient&limit=100')).body.records;
    return stored.some((r) => r.notes) && stored;
  }, 'a usage record with a note');
  const noted = records.find((r) => r.notes);
  t.equal(noted?.notes, 'dropped tools: web_search');
  t.equal(records.find((r) => r.family === 'chat' && r.status === 200 && !r.notes)?.notes, null, 'nothing dropped: no note');
  const text = await (await fetch(`${gw.url}/admin/usage.csv?model=chat-lenient`, { headers: { authorization: `Bearer ${gw.adminToken}` } })).text();
  t.match(text.split('\r\n')[0], /,notes$/);
  t.match(text, /dropped tools: web_search/);
});

tap.test('a clamped ceiling goes in the field the chat client used, never in both', async (t) => {
  const post = (fields: Json) =>
    fetch(`${gw.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${gw.key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'chat-clamped', messages: [{ role: 'user', content: 'hi' }], ...fields }),
    });
  t.equal((await post({ max_tokens: 999 })).status, 200, 'clamped, not refused');
  let sent = await lastUpstreamRequest();
  t.equal(sent.max_tokens, 30);
  t.equal(sent.max_completion_tokens, undefined);
  t.equal((await post({ max_completion_tokens: 999 })).status, 200);
  sent = await lastUpstreamRequest();
  t.equal(sent.max_completion_tokens, 30);
  t.equal(sent.max_tokens, undefined);
});

// A native request to a model that allows every feature and sets no ceiling skips the canonical
// form and the rules (src/pipeline.ts, rulesMayAct), unless it asks for a server-side tool: the
// rules still see that one, and the plain model (serverTools: [], unsupportedTools: reject) refuses it.
tap.test('a native request the rules cannot act on is served as sent; a server tool in it still meets the rules', async (t) => {
  const everything = { ...rules.tools!.chat.fields, ...rules.jsonSchema!.chat.fields, temperature: 0.2, max_completion_tokens: 500 };
  t.equal((await send('chat', 'chat-plain', everything)).status, 200, 'every feature, no ceiling: served');
  refused(t, 'chat', await send('chat', 'chat-plain', { web_search_options: {} }), 'web_search_options');
});
