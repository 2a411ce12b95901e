/**
 * Details of the wire that a client of one family on an upstream of another depends on, each found
 * by a black-box run against the reference (shared reference/protocols.md) and failing before its
 * fix. Thought signatures: a Gemini 3 upstream refuses a replayed call without its signature, so a
 * chat or Responses agent on it failed at its second turn; the signature now rides in the call's
 * id, as it already did for Messages clients, and a call the gateway has no signature for (history
 * from elsewhere) gets the bypass value Google documents.
 */
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import OpenAI from 'openai';
import t from 'tap';
import WebSocket from 'ws';
import { toolIdWithSignature } from '../src/tool-call-ids.js';
import { eventually, simulatorUpstreams, startStack } from './helpers.js';

/**
 * An upstream that refuses, in chat's shape (`message.refusal`, `delta.refusal`) and Responses'
 * (a `refusal` part, `response.refusal.delta`): the simulator never refuses in these families.
 */
const REFUSAL = 'I cannot help with that.';
const refuser = createServer((req, res) => {
  let raw = '';
  req.on('data', (d) => (raw += d));
  req.on('end', () => {
    const { stream } = JSON.parse(raw);
    const responses = req.url!.endsWith('/responses');
    if (!stream) {
      res.writeHead(200, { 'content-type': 'application/json' });
      return res.end(
        JSON.stringify(
          responses
            ? { id: 'resp_r', object: 'response', created_at: 1, status: 'completed', model: 'r', output: [{ type: 'message', id: 'msg_r', role: 'assistant', status: 'completed', content: [{ type: 'refusal', refusal: REFUSAL }] }], usage: { input_tokens: 3, output_tokens: 6, total_tokens: 9 } }
            : { id: 'chatcmpl-r', object: 'chat.completion', created: 1, model: 'r', choices: [{ index: 0, message: { role: 'assistant', content: null, refusal: REFUSAL }, finish_reason: 'stop' }], usage: { prompt_tokens: 3, completion_tokens: 6, total_tokens: 9 } },
        ),
      );
    }
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    const event = (type: string, fields: object) => `event: ${type}\ndata: ${JSON.stringify({ type, ...fields })}\n\n`;
    const chunk = (delta: object, finish: string | null) => `data: ${JSON.stringify({ id: 'chatcmpl-r', object: 'chat.completion.chunk', created: 1, model: 'r', choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;
    res.end(
      responses
        ? event('response.created', { response: { id: 'resp_r', status: 'in_progress' } }) +
            event('response.refusal.delta', { item_id: 'msg_r', output_index: 0, content_index: 0, delta: REFUSAL }) +
            event('response.completed', { response: { id: 'resp_r', status: 'completed', output: [], usage: { input_tokens: 3, output_tokens: 6, total_tokens: 9 } } })
        : chunk({ role: 'assistant', refusal: REFUSAL }, null) + chunk({}, 'stop') + 'data: [DONE]\n\n',
    );
  });
});
await new Promise<void>((resolve) => refuser.listen(0, '127.0.0.1', resolve));
t.teardown(() => new Promise((resolve) => refuser.close(resolve)));
const refuserUrl = `http://127.0.0.1:${(refuser.address() as AddressInfo).port}/v1`;

const { sim, gw } = await startStack(
  (simUrl) => `${simulatorUpstreams(simUrl)}  refuser-chat: { kind: openai-chat, baseUrl: "${refuserUrl}" }
  refuser-responses: { kind: openai-responses, baseUrl: "${refuserUrl}" }
models:
  - { id: refuses-chat, upstream: refuser-chat }
  - { id: refuses-responses, upstream: refuser-responses }
  - { id: sim-chat, upstream: chat }
  - { id: sim-responses, upstream: responses }
  - { id: sim-gemini, upstream: gemini }
  - { id: sim-messages, upstream: messages }
  - { id: capped, upstream: chat, upstreamModel: sim-chat, maxOutputTokens: { max: 1000 } }
  - { id: vendor/model-x, upstream: chat, upstreamModel: sim-chat }
  - { id: clamped, upstream: chat, upstreamModel: sim-chat, maxOutputTokens: { max: 1000, overMax: clamp } }
`,
);
const openai = new OpenAI({ apiKey: gw.key, baseURL: `${gw.url}/v1`, maxRetries: 0 });
type Json = any;
const lastUpstreamRequest = async (): Promise<Json> => ((await (await fetch(`${sim.url}/stats`)).json()) as Json).lastRequest;
const weather = { name: 'get_weather', description: 'The weather in a city', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } };

t.test('Gemini thought signatures survive a chat client\'s tool loop, streamed or not', async (t) => {
  const tools = [{ type: 'function' as const, function: weather }];
  const ask = [{ role: 'user' as const, content: 'Weather in Oslo?' }];
  for (const stream of [false, true]) {
    let call: { id: string; name: string; arguments: string };
    if (stream) {
      const parts = { id: '', name: '', arguments: '' };
      for await (const c of await openai.chat.completions.create({ model: 'sim-gemini', reasoning_effort: 'low', tools, messages: ask, stream: true })) {
        const d = c.choices[0]?.delta.tool_calls?.[0];
        if (d?.id) parts.id = d.id;
        if (d?.function?.name) parts.name = d.function.name;
        parts.arguments += d?.function?.arguments ?? '';
      }
      call = parts;
    } else {
      const first = await openai.chat.completions.create({ model: 'sim-gemini', reasoning_effort: 'low', tools, messages: ask });
      const c = first.choices[0]!.message.tool_calls![0]! as { id: string; function: { name: string; arguments: string } };
      call = { id: c.id, ...c.function };
    }
    t.match(call.id, /__sig__/, `stream ${stream}: the call's id carries its signature`);
    const second = await openai.chat.completions.create({
      model: 'sim-gemini',
      reasoning_effort: 'low',
      tools,
      messages: [...ask, { role: 'assistant', content: null, tool_calls: [{ id: call.id, type: 'function', function: { name: call.name, arguments: call.arguments } }] }, { role: 'tool', tool_call_id: call.id, content: 'Sunny' }],
    });
    t.equal(second.choices[0]!.finish_reason, 'stop', `stream ${stream}: the second turn is answered`);
    const replayed = (await lastUpstreamRequest()).contents[1].parts.find((p: Json) => p.functionCall);
    t.match(replayed.thoughtSignature, /^[A-Za-z0-9+/]{43}=$/, `stream ${stream}: the upstream got the signature it made back`);
  }
});

t.test('Gemini thought signatures survive a Responses client\'s tool loop', async (t) => {
  const tools = [{ type: 'function' as const, strict: false, ...weather }];
  let streamed: Json;
  for await (const e of await openai.responses.create({ model: 'sim-gemini', reasoning: { effort: 'low' }, tools, input: 'Weather in Oslo?', stream: true })) {
    if (e.type === 'response.output_item.done' && e.item.type === 'function_call') streamed = e.item;
  }
  t.match(streamed.call_id, /__sig__/, "streamed, the call's call_id carries its signature");
  const first = await openai.responses.create({ model: 'sim-gemini', reasoning: { effort: 'low' }, tools, input: 'Weather in Oslo?' });
  const call = first.output.find((o) => o.type === 'function_call') as Json;
  t.match(call.call_id, /__sig__/, "the call's call_id carries its signature");
  const second = await openai.responses.create({
    model: 'sim-gemini',
    reasoning: { effort: 'low' },
    tools,
    input: [{ role: 'user', content: 'Weather in Oslo?' }, call, { type: 'function_call_output', call_id: call.call_id, output: 'Sunny' }],
  });
  t.equal(second.status, 'completed', 'the second turn is answered');
  const replayed = (await lastUpstreamRequest()).contents[1].parts.find((p: Json) => p.functionCall);
  t.match(replayed.thoughtSignature, /^[A-Za-z0-9+/]{43}=$/, 'the upstream got the signature it made back');
});

t.test('a call the gateway has no signature for reaches Gemini with the documented bypass, and is answered', async (t) => {
  const r = await openai.chat.completions.create({
    model: 'sim-gemini',
    reasoning_effort: 'low',
    tools: [{ type: 'function', function: weather }],
    messages: [
      { role: 'user', content: 'Weather in Oslo?' },
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_from_elsewhere', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Oslo"}' } }] },
      { role: 'tool', tool_call_id: 'call_from_elsewhere', content: 'Sunny' },
    ],
  });
  t.equal(r.choices[0]!.finish_reason, 'stop');
  const replayed = (await lastUpstreamRequest()).contents[1].parts.find((p: Json) => p.functionCall);
  t.equal(replayed.thoughtSignature, 'skip_thought_signature_validator');
  // An id carrying what the gateway made for another family (an Anthropic turn's thinking) is no signature of Gemini's.
  const thinking = Buffer.from(JSON.stringify({ 'sluice.anthropic.thinking': [{ type: 'thinking', thinking: 'Claude thought', signature: 'c2ln' }] })).toString('base64');
  const carried = toolIdWithSignature('toolu_1', thinking);
  await openai.chat.completions.create({
    model: 'sim-gemini',
    reasoning_effort: 'low',
    tools: [{ type: 'function', function: weather }],
    messages: [
      { role: 'user', content: 'Weather in Oslo?' },
      { role: 'assistant', content: null, tool_calls: [{ id: carried, type: 'function', function: { name: 'get_weather', arguments: '{"city":"Oslo"}' } }] },
      { role: 'tool', tool_call_id: carried, content: 'Sunny' },
    ],
  });
  const sent = JSON.stringify(await lastUpstreamRequest());
  t.match(sent, '"thoughtSignature":"skip_thought_signature_validator"', 'the bypass, not the other family\'s blob');
  t.notMatch(sent, 'Claude thought', "and Claude's thinking does not reach Google");
});

/** A tiny PDF, base64. */
const PDF = Buffer.from('%PDF-1.4\n1 0 obj <<>> endobj\ntrailer <<>>\n%%EOF\n').toString('base64');

t.test('a PDF reaches each upstream as that upstream takes it: raw base64 for Gemini, a data URL with a name for OpenAI', async (t) => {
  const fromChat = await openai.chat.completions.create({
    model: 'sim-gemini',
    messages: [{ role: 'user', content: [{ type: 'file', file: { file_data: `data:application/pdf;base64,${PDF}`, filename: 'doc.pdf' } }, { type: 'text', text: 'Summarize' }] }],
  });
  t.equal(fromChat.choices[0]!.finish_reason, 'stop', 'a chat client\'s PDF on Gemini is answered');
  t.same((await lastUpstreamRequest()).contents[0].parts[0], { inlineData: { mimeType: 'application/pdf', data: PDF } }, 'Gemini got the bytes, not a data URL');

  const fromMessages = await fetch(`${gw.url}/v1/messages`, {
    method: 'POST',
    headers: { 'x-api-key': gw.key, 'anthropic-version': '2023-06-01', 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'sim-gemini', max_tokens: 32, messages: [{ role: 'user', content: [{ type: 'document', source: { type: 'base64', media_type: 'application/pdf', data: PDF } }, { type: 'text', text: 'Summarize' }] }] }),
  });
  t.equal(fromMessages.status, 200, 'a Messages document on Gemini is answered');

  const body = JSON.stringify({ contents: [{ role: 'user', parts: [{ inlineData: { mimeType: 'application/pdf', data: PDF } }, { text: 'Summarize' }] }] });
  for (const model of ['sim-chat', 'sim-responses', 'sim-messages']) {
    const res = await fetch(`${gw.url}/v1beta/models/${model}:generateContent`, { method: 'POST', headers: { 'x-goog-api-key': gw.key, 'content-type': 'application/json' }, body });
    t.equal(res.status, 200, `a Gemini client's PDF on ${model} is answered`);
    const sent = await lastUpstreamRequest();
    const part = JSON.stringify(sent);
    if (model === 'sim-messages') t.match(part, `"source":{"type":"base64","media_type":"application/pdf","data":"${PDF}"}`, `${model}: a base64 document`);
    else t.match(part, `"file_data":"data:application/pdf;base64,${PDF}","filename":"document.pdf"`, `${model}: a data URL with a name`);
  }
});

t.test('max_tokens beside max_completion_tokens: the larger is the ceiling the model rules hold, and the upstream gets one field', async (t) => {
  const both = { max_completion_tokens: 100, max_tokens: 100_000 };
  const refused = await openai.chat.completions.create({ model: 'capped', messages: [{ role: 'user', content: 'Hi' }], ...both }).catch((e) => e);
  t.equal(refused.status, 400, 'over the maximum, whichever field holds it (it reached the upstream before)');
  t.match(refused.error, { param: 'max_tokens', message: /at most 1000/ });
  const clamped = await openai.chat.completions.create({ model: 'clamped', messages: [{ role: 'user', content: 'Hi [[sim tokens=3]]' }], ...both });
  t.equal(clamped.choices[0]!.finish_reason, 'stop');
  const sent = await lastUpstreamRequest();
  t.equal(sent.max_completion_tokens, 1000, 'clamped to the maximum');
  t.notOk('max_tokens' in sent, 'and only in one field');
  await openai.chat.completions.create({ model: 'sim-chat', messages: [{ role: 'user', content: 'Hi [[sim tokens=3]]' }], max_completion_tokens: 300, max_tokens: 200 });
  const within = await lastUpstreamRequest();
  t.same([within.max_completion_tokens, within.max_tokens], [300, undefined], 'within bounds, the larger, in the current field');
});

t.test("Gemini's snake_case spellings are read as their camelCase ones: by every check, and by the upstream", async (t) => {
  const group = await gw.admin('POST', '/admin/groups', { name: 'snake', models: ['*'], families: ['gemini'], limits: { tpm: 2000 } });
  t.equal(group.status, 201);
  const key = (await gw.admin('POST', '/admin/keys', { group: 'snake' })).body.key as string;
  const generate = (body: unknown) =>
    fetch(`${gw.url}/v1beta/models/sim-gemini:generateContent`, { method: 'POST', headers: { 'x-goog-api-key': key, 'content-type': 'application/json' }, body: JSON.stringify(body) });
  const asked = await generate({
    system_instruction: { parts: [{ text: 'Be brief.' }] },
    contents: [{ role: 'user', parts: [{ text: 'Hi [[sim tokens=3]]', partMetadata: { session_id: 's1' } }] }],
    generation_config: { candidate_count: 2, max_output_tokens: 8 },
    tools: [{ function_declarations: [{ name: 'look_up', parameters: { type: 'OBJECT', properties: { city_name: { type: 'STRING' } } } }] }],
  });
  t.equal(asked.status, 200);
  t.equal(((await asked.json()) as Json).candidates.length, 2, 'two candidates, as asked');
  const sent = await lastUpstreamRequest();
  t.match(sent, { systemInstruction: { parts: [{ text: 'Be brief.' }] }, generationConfig: { candidateCount: 2, maxOutputTokens: 8 } }, 'the upstream got camelCase');
  t.same(Object.keys(sent.tools[0].functionDeclarations[0].parameters.properties), ['city_name'], "a property's own name is the caller's, kept");
  t.same(sent.contents[0].parts[0].partMetadata, { session_id: 's1' }, "so are a part's metadata"); 
  const large = await generate({ system_instruction: { parts: [{ text: 'word '.repeat(5000) }] }, contents: [{ role: 'user', parts: [{ text: 'Hi' }] }] });
  t.equal(large.status, 429, 'a system_instruction counts against the token limit (it passed before)');
  const both = await generate({ contents: [{ role: 'user', parts: [{ text: 'Hi' }] }], generationConfig: { maxOutputTokens: 8 }, generation_config: { max_output_tokens: 9000 } });
  t.equal(both.status, 400, 'both spellings of one field are refused');
  t.match(await both.text(), /Both 'generation_config' and 'generationConfig' are set/);
});

t.test("a Gemini Schema's int64 keywords, strings on Google's wire, reach other upstreams as JSON Schema's integers", async (t) => {
  const res = await fetch(`${gw.url}/v1beta/models/sim-chat:generateContent`, {
    method: 'POST',
    headers: { 'x-goog-api-key': gw.key, 'content-type': 'application/json' },
    body: JSON.stringify({
      contents: [{ role: 'user', parts: [{ text: 'Three words' }] }],
      generationConfig: { responseMimeType: 'application/json', responseSchema: { type: 'ARRAY', minItems: '1', maxItems: '3', items: { type: 'STRING', maxLength: '10' } } },
    }),
  });
  t.equal(res.status, 200);
  const schema = (await lastUpstreamRequest()).response_format.json_schema.schema;
  t.strictSame([schema.type, schema.minItems, schema.maxItems, schema.items.maxLength], ['array', 1, 3, 10]);
});

t.test('GET /v1/models/{id}: one model, for the openai SDK and for Anthropic\'s, or each one\'s 404', async (t) => {
  t.match(await openai.models.retrieve('vendor/model-x'), { id: 'vendor/model-x' }, 'an id with a slash, percent-encoded by the SDK');
  const model = await openai.models.retrieve('sim-chat');
  t.match(model, { id: 'sim-chat', object: 'model' }, 'openai models.retrieve');
  const missing = await openai.models.retrieve('no-such-model').catch((e) => e);
  t.equal(missing.status, 404);
  t.match(missing.error, { code: 'model_not_found', param: 'model' });
  const headers = { 'x-api-key': gw.key, 'anthropic-version': '2023-06-01' };
  const anthropic = await fetch(`${gw.url}/v1/models/sim-messages`, { headers });
  t.match(await anthropic.json(), { type: 'model', id: 'sim-messages' }, "Anthropic's model object");
  const gone = await fetch(`${gw.url}/v1/models/no-such-model`, { headers });
  t.equal(gone.status, 404);
  t.match(await gone.json(), { type: 'error', error: { type: 'not_found_error' } });
});

t.test('a system prompt in several blocks reaches a one-string upstream with the blocks apart, not glued', async (t) => {
  const messages = await fetch(`${gw.url}/v1/messages`, {
    method: 'POST',
    headers: { 'x-api-key': gw.key, 'anthropic-version': '2023-06-01', 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'sim-chat', max_tokens: 16, system: [{ type: 'text', text: 'You are terse.' }, { type: 'text', text: 'Answer in English.' }], messages: [{ role: 'user', content: 'Hi' }] }),
  });
  t.equal(messages.status, 200);
  t.equal((await lastUpstreamRequest()).messages[0].content, 'You are terse.\n\nAnswer in English.', 'Messages system blocks on a chat upstream');
  const gemini = await fetch(`${gw.url}/v1beta/models/sim-responses:generateContent`, {
    method: 'POST',
    headers: { 'x-goog-api-key': gw.key, 'content-type': 'application/json' },
    body: JSON.stringify({ systemInstruction: { parts: [{ text: 'You are helpful.' }, { text: 'Answer briefly.' }] }, contents: [{ role: 'user', parts: [{ text: 'Hi' }] }] }),
  });
  t.equal(gemini.status, 200);
  t.equal((await lastUpstreamRequest()).instructions, 'You are helpful.\n\nAnswer briefly.', 'Gemini systemInstruction parts on a Responses upstream');
  await openai.chat.completions.create({ model: 'sim-gemini', messages: [{ role: 'developer', content: [{ type: 'text', text: 'Answer briefly.' }, { type: 'text', text: 'Use English.' }] }, { role: 'user', content: 'Hi' }] });
  t.same((await lastUpstreamRequest()).systemInstruction, { parts: [{ text: 'Answer briefly.\n\nUse English.' }] }, 'a chat developer message in parts on Gemini');
});

t.test('top-k goes between Anthropic and Gemini, which both take it, and is dropped for OpenAI upstreams, which do not', async (t) => {
  const messages = await fetch(`${gw.url}/v1/messages`, {
    method: 'POST',
    headers: { 'x-api-key': gw.key, 'anthropic-version': '2023-06-01', 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'sim-gemini', max_tokens: 16, top_k: 5, messages: [{ role: 'user', content: 'Hi' }] }),
  });
  t.equal(messages.status, 200);
  t.equal((await lastUpstreamRequest()).generationConfig.topK, 5, "Messages' top_k as Gemini's topK");
  const generate = (model: string) =>
    fetch(`${gw.url}/v1beta/models/${model}:generateContent`, {
      method: 'POST',
      headers: { 'x-goog-api-key': gw.key, 'content-type': 'application/json' },
      body: JSON.stringify({ contents: [{ role: 'user', parts: [{ text: 'Hi' }] }], generationConfig: { topK: 7, maxOutputTokens: 16 } }),
    });
  t.equal((await generate('sim-messages')).status, 200);
  t.equal((await lastUpstreamRequest()).top_k, 7, "Gemini's topK as Anthropic's top_k");
  t.equal((await generate('sim-chat')).status, 200, 'a chat upstream: dropped by default, as before');
  t.notOk('top_k' in (await lastUpstreamRequest()));
});

t.test('a translated Responses answer cut by its ceiling marks its message item incomplete too, streamed or not', async (t) => {
  for (const model of ['sim-chat', 'sim-gemini', 'sim-messages']) {
    const whole = await openai.responses.create({ model, input: 'Hi [[sim tokens=40]]', max_output_tokens: 16 });
    t.equal(whole.status, 'incomplete', `${model}: the response`);
    t.equal((whole.output.find((o) => o.type === 'message') as Json)?.status, 'incomplete', `${model}: its message item`);
    let done: Json;
    let last: Json;
    for await (const e of await openai.responses.create({ model, input: 'Hi [[sim tokens=40]]', max_output_tokens: 16, stream: true })) {
      if (e.type === 'response.output_item.done' && e.item.type === 'message') done = e.item;
      last = e;
    }
    t.equal(last.type, 'response.incomplete', `${model}: streamed, the response`);
    t.equal(done.status, 'incomplete', `${model}: streamed, output_item.done`);
    t.equal(last.response.output.find((o: Json) => o.type === 'message').status, 'incomplete', `${model}: streamed, the final snapshot`);
  }
});

t.test("over the WebSocket, a chained response's objects name the response it continues", async (t) => {
  for (const model of ['sim-chat', 'sim-responses']) {
    const ws = new WebSocket(`${gw.url.replace('http', 'ws')}/v1/responses`, { headers: { authorization: `Bearer ${gw.key}` } });
    const events: Json[] = [];
    ws.on('message', (m) => events.push(JSON.parse(m.toString())));
    await new Promise((resolve, reject) => (ws.once('open', resolve), ws.once('error', reject)));
    const turn = async (fields: Record<string, unknown>) => {
      const from = events.length;
      ws.send(JSON.stringify({ type: 'response.create', model, ...fields }));
      await eventually(() => events.slice(from).find((e) => e.type === 'response.completed'), 'the turn to end');
      return events.slice(from);
    };
    const first = await turn({ input: 'Hi [[sim tokens=3]]' });
    const firstId = first.at(-1).response.id;
    t.equal(first.at(-1).response.previous_response_id, null, `${model}: the first continues none`);
    const second = await turn({ input: 'And? [[sim tokens=3]]', previous_response_id: firstId });
    const objects = second.filter((e) => e.response).map((e) => e.response.previous_response_id);
    t.ok(objects.length >= 2, `${model}: created and completed carry the response`);
    t.same(new Set(objects), new Set([firstId]), `${model}: each names the first`);
    ws.close();
  }
});

t.test('tokens an Anthropic upstream wrote to its prompt cache reach chat and Responses clients, streamed or not', async (t) => {
  const input = `${'A long shared prefix. '.repeat(40)}[[sim cached=40 cache_write=20 tokens=3]]`;
  const chat = await openai.chat.completions.create({ model: 'sim-messages', messages: [{ role: 'user', content: input }] });
  t.match(chat.usage?.prompt_tokens_details, { cached_tokens: 40, cache_write_tokens: 20 }, 'chat');
  let streamed: Json;
  for await (const c of await openai.chat.completions.create({ model: 'sim-messages', messages: [{ role: 'user', content: input }], stream: true, stream_options: { include_usage: true } })) streamed = c.usage ?? streamed;
  t.match(streamed.prompt_tokens_details, { cached_tokens: 40, cache_write_tokens: 20 }, 'chat, streamed');
  const responses = await openai.responses.create({ model: 'sim-messages', input });
  t.match(responses.usage?.input_tokens_details, { cached_tokens: 40, cache_write_tokens: 20 }, 'Responses');
  const plain = await openai.chat.completions.create({ model: 'sim-chat', messages: [{ role: 'user', content: 'Hi [[sim tokens=3]]' }] });
  t.notOk('cache_write_tokens' in plain.usage!.prompt_tokens_details!, 'none written: no field, as OpenAI sends it');
});

t.test("JSON output beside the request's own tools on an Anthropic upstream: the tools stay callable, the answer is the JSON", async (t) => {
  const tools = [{ type: 'function' as const, function: weather }];
  const schema = { type: 'object', properties: { summary: { type: 'string' } }, required: ['summary'], additionalProperties: false };
  const response_format = { type: 'json_schema' as const, json_schema: { name: 'report', schema, strict: true } };
  const ask = [{ role: 'user' as const, content: 'Weather in Oslo?' }];
  const first = await openai.chat.completions.create({ model: 'sim-messages', tools, response_format, messages: ask });
  const call = first.choices[0]!.message.tool_calls?.[0] as Json;
  t.equal(call?.function.name, 'get_weather', 'the model calls the tool (before, it was forced to answer through the JSON tool)');
  const sent = await lastUpstreamRequest();
  t.same(sent.output_config, { format: { type: 'json_schema', schema } }, "Anthropic's own structured output");
  t.notOk(sent.tool_choice?.type === 'tool', 'no forced tool');
  const second = await openai.chat.completions.create({
    model: 'sim-messages',
    tools,
    response_format,
    messages: [...ask, first.choices[0]!.message, { role: 'tool', tool_call_id: call.id, content: 'Sunny' }],
  });
  t.equal(second.choices[0]!.finish_reason, 'stop');
  t.type(JSON.parse(second.choices[0]!.message.content!).summary, 'string', 'the final answer is the JSON');
});

/** A 1×1 PNG. */
const PNG = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==';

t.test("an image in a tool's result reaches Responses and Gemini upstreams, not only its text", async (t) => {
  for (const model of ['sim-responses', 'sim-gemini']) {
    const res = await fetch(`${gw.url}/v1/messages`, {
      method: 'POST',
      headers: { 'x-api-key': gw.key, 'anthropic-version': '2023-06-01', 'content-type': 'application/json' },
      body: JSON.stringify({
        model,
        max_tokens: 32,
        tools: [{ name: 'get_weather', input_schema: weather.parameters }],
        messages: [
          { role: 'user', content: 'Weather in Oslo?' },
          { role: 'assistant', content: [{ type: 'tool_use', id: 'toolu_1', name: 'get_weather', input: { city: 'Oslo' } }] },
          { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: [{ type: 'text', text: 'A map:' }, { type: 'image', source: { type: 'base64', media_type: 'image/png', data: PNG } }] }] },
        ],
      }),
    });
    t.equal(res.status, 200, `${model}: answered`);
    const sent = JSON.stringify(await lastUpstreamRequest());
    t.match(sent, PNG, `${model}: the image went with the result`);
    t.match(sent, 'A map:', `${model}: and its text`);
  }
});

t.test('a tool name the upstream would refuse is renamed for it, and the call comes back under the client\'s name', async (t) => {
  const dotted = 'fs.read:file';
  const res = await fetch(`${gw.url}/v1beta/models/sim-messages:generateContent`, {
    method: 'POST',
    headers: { 'x-goog-api-key': gw.key, 'content-type': 'application/json' },
    body: JSON.stringify({
      contents: [{ role: 'user', parts: [{ text: 'Read it [[sim parallel=1]]' }] }],
      tools: [{ functionDeclarations: [{ name: dotted, parametersJsonSchema: { type: 'object', properties: { path: { type: 'string' } } } }] }],
    }),
  });
  t.equal(res.status, 200, 'a Gemini name with . and : on an Anthropic upstream (400 before)');
  const answer = (await res.json()) as Json;
  t.equal(answer.candidates[0].content.parts.find((p: Json) => p.functionCall).functionCall.name, dotted, "the call, under the client's name");
  t.match((await lastUpstreamRequest()).tools[0].name, /^fs_read_file_[0-9a-f]{8}$/, 'the upstream got a name it takes');

  const long = `lookup_${'x'.repeat(93)}`;
  const messages = await fetch(`${gw.url}/v1/messages`, {
    method: 'POST',
    headers: { 'x-api-key': gw.key, 'anthropic-version': '2023-06-01', 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'sim-chat', max_tokens: 64, stream: true, tools: [{ name: long, input_schema: { type: 'object', properties: {} } }], messages: [{ role: 'user', content: 'Look [[sim parallel=1]]' }] }),
  });
  const text = await messages.text();
  t.match(text, `"name":"${long}"`, 'a 100-character Messages name on a chat upstream, streamed: the call under its own name');
  const sent = (await lastUpstreamRequest()).tools[0].function.name;
  t.ok(sent.length <= 64 && sent.startsWith('lookup_x'), `the upstream got ${sent.length} characters`);
});

t.test("a model's refusal reaches a client of another family as its answer's text, with the family's filter finish", async (t) => {
  for (const model of ['refuses-chat', 'refuses-responses']) {
    for (const stream of [false, true]) {
      const messages = await fetch(`${gw.url}/v1/messages`, {
        method: 'POST',
        headers: { 'x-api-key': gw.key, 'anthropic-version': '2023-06-01', 'content-type': 'application/json' },
        body: JSON.stringify({ model, max_tokens: 32, stream, messages: [{ role: 'user', content: 'Do the bad thing' }] }),
      });
      const text = await messages.text();
      t.match(text, REFUSAL, `${model}, stream ${stream}: a Messages client reads the refusal (an empty answer before)`);
      t.match(text, /"stop_reason":"refusal"/, `${model}, stream ${stream}: stop_reason refusal`);
    }
    const gemini = await fetch(`${gw.url}/v1beta/models/${model}:generateContent`, {
      method: 'POST',
      headers: { 'x-goog-api-key': gw.key, 'content-type': 'application/json' },
      body: JSON.stringify({ contents: [{ role: 'user', parts: [{ text: 'Do the bad thing' }] }] }),
    });
    t.match(await gemini.json(), { candidates: [{ content: { parts: [{ text: REFUSAL }] }, finishReason: 'SAFETY' }] }, `${model}: a Gemini client`);
  }
});
