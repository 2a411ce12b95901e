/**
 * The exact response cache (plugins/response-cache): identical deterministic requests are answered
 * from the cache in the client's own family, a stream as a stream, without an upstream call (the
 * simulator process counts its calls), before the limits, at no cost, and never across groups.
 */
import Anthropic from '@anthropic-ai/sdk';
import { GoogleGenAI, type FunctionDeclaration } from '@google/genai';
import OpenAI from 'openai';
import t from 'tap';
import { createServer } from 'node:http';
import { Redis } from 'ioredis';
import { simulatorUpstreams, startSimulatorProcess, startStack, startTestGateway, eventually, type TestGateway } from './helpers.js';
import { startRedis } from './servers.js';

// Six gateways and their simulators, a Redis: more than tap's default minute on two busy cores.
t.setTimeout(240_000);

const models = `models:
  - { id: cached-chat, upstream: chat, upstreamModel: sim-chat, responseCache: true, prices: { input: 1, output: 2 } }
  - { id: cached-messages, upstream: messages, upstreamModel: sim-messages, responseCache: { ttlSeconds: 600 } }
  - { id: uncached, upstream: chat, upstreamModel: sim-chat }
`;

type Family = 'chat' | 'responses' | 'gemini' | 'messages';

/** One request in a family's own shape, and the answer's text read back from its body or stream. */
async function ask(gw: TestGateway, family: Family, model: string, prompt: string, o: { stream?: boolean; key?: string; temperature?: number | null; header?: string } = {}) {
  const key = o.key ?? gw.key;
  const temperature = o.temperature === undefined ? 0 : o.temperature;
  const t0 = temperature === null ? {} : { temperature };
  const headers: Record<string, string> = { 'content-type': 'application/json', ...(o.header !== undefined && { 'x-sluice-cache': o.header }) };
  let url: string;
  let body: unknown;
  if (family === 'chat') {
    url = '/v1/chat/completions';
    headers.authorization = `Bearer ${key}`;
    body = { model, stream: o.stream ?? false, ...t0, messages: [{ role: 'user', content: prompt }] };
  } else if (family === 'responses') {
    url = '/v1/responses';
    headers.authorization = `Bearer ${key}`;
    body = { model, stream: o.stream ?? false, ...t0, input: prompt };
  } else if (family === 'gemini') {
    url = `/v1beta/models/${model}:${o.stream ? 'streamGenerateContent?alt=sse' : 'generateContent'}`;
    headers['x-goog-api-key'] = key;
    body = { contents: [{ role: 'user', parts: [{ text: prompt }] }], generationConfig: temperature === null ? {} : { temperature } };
  } else {
    url = '/v1/messages';
    headers['x-api-key'] = key;
    headers['anthropic-version'] = '2023-06-01';
    body = { model, max_tokens: 64, stream: o.stream ?? false, ...t0, messages: [{ role: 'user', content: prompt }] };
  }
  const res = await fetch(gw.url + url, { method: 'POST', headers, body: JSON.stringify(body) });
  const raw = await res.text();
  return { status: res.status, cache: res.headers.get('x-sluice-cache'), contentType: res.headers.get('content-type') ?? '', raw, text: res.status === 200 ? textOf(family, raw, res.headers.get('content-type') ?? '') : '' };
}

/** The answer's text, from a whole body or from a stream's events. */
function textOf(family: Family, raw: string, contentType: string): string {
  if (!contentType.includes('event-stream')) {
    const j = JSON.parse(raw);
    if (family === 'chat') return j.choices[0].message.content;
    if (family === 'responses') return j.output.filter((o: any) => o.type === 'message').map((o: any) => o.content.map((c: any) => c.text).join('')).join('');
    if (family === 'gemini') return j.candidates[0].content.parts.map((p: any) => p.text ?? '').join('');
    return j.content.filter((c: any) => c.type === 'text').map((c: any) => c.text).join('');
  }
  let text = '';
  for (const line of raw.split('\n')) {
    if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
    const e = JSON.parse(line.slice(6));
    if (family === 'chat') text += e.choices?.[0]?.delta?.content ?? '';
    else if (family === 'responses') text += e.type === 'response.output_text.delta' ? e.delta : '';
    else if (family === 'gemini') text += (e.candidates?.[0]?.content?.parts ?? []).map((p: any) => p.text ?? '').join('');
    else text += e.type === 'content_block_delta' && e.delta.type === 'text_delta' ? e.delta.text : '';
  }
  return text;
}

const upstreamCalls = async (simUrl: string): Promise<number> => ((await (await fetch(`${simUrl}/stats`)).json()) as { requests: number }).requests;

t.test('every family: a repeat is answered from the cache, whole or streamed, and the upstream is not called', async (t) => {
  const { sim, gw } = await startStack((url) => `${simulatorUpstreams(url)}${models}`);
  for (const family of ['chat', 'responses', 'gemini', 'messages'] as const) {
    for (const model of ['cached-chat', 'cached-messages']) {
      const prompt = `A story for ${family} on ${model}`;
      const first = await ask(gw, family, model, prompt);
      t.equal(first.status, 200, `${family} → ${model}: first answer`);
      t.equal(first.cache, 'miss', `${family} → ${model}: a miss first`);
      t.ok(first.text.length > 0, 'with text');
      const before = await upstreamCalls(sim.url);
      const whole = await ask(gw, family, model, prompt);
      const streamed = await ask(gw, family, model, prompt, { stream: true });
      t.equal(await upstreamCalls(sim.url), before, `${family} → ${model}: neither repeat reached the upstream`);
      t.same([whole.status, whole.cache, whole.text], [200, 'hit', first.text], `${family} → ${model}: the whole answer replayed`);
      t.same([streamed.status, streamed.cache, streamed.text], [200, 'hit', first.text], `${family} → ${model}: replayed as a stream`);
      t.match(streamed.contentType, /event-stream/, 'a stream is a stream');
    }
  }
  // A streamed answer (a passthrough stream, and a translated one) is stored as well, and replayed whole.
  for (const [family, model] of [['messages', 'cached-messages'], ['chat', 'cached-messages']] as const) {
    const prompt = `Streamed first, ${family}`;
    const first = await ask(gw, family, model, prompt, { stream: true });
    t.same([first.status, first.cache], [200, 'miss']);
    const before = await upstreamCalls(sim.url);
    const again = await ask(gw, family, model, prompt);
    t.same([again.status, again.cache, again.text], [200, 'hit', first.text], `${family} → ${model}: a stream's answer replayed whole`);
    t.equal(await upstreamCalls(sim.url), before);
  }
});

t.test('the official SDKs read replayed answers, whole and streamed, with tool calls', async (t) => {
  const { sim, gw } = await startStack((url) => `${simulatorUpstreams(url)}${models}`);
  const openai = new OpenAI({ apiKey: gw.key, baseURL: `${gw.url}/v1`, maxRetries: 0 });
  const google = new GoogleGenAI({ apiKey: gw.key, httpOptions: { baseUrl: gw.url } });
  const anthropic = new Anthropic({ apiKey: gw.key, baseURL: gw.url, maxRetries: 0 });
  const weather = { name: 'get_weather', description: 'The weather in a city', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } };
  const prompt = 'What is the weather in Paris? Use the tool.';
  const chatCall = async (stream: boolean) => {
    const body = { model: 'cached-messages', temperature: 0, tools: [{ type: 'function' as const, function: weather }], messages: [{ role: 'user' as const, content: prompt }] };
    if (!stream) return (await openai.chat.completions.create(body)).choices[0]!.message.tool_calls?.[0];
    const final = await openai.chat.completions.stream({ ...body, stream: true }).finalChatCompletion();
    return final.choices[0]!.message.tool_calls?.[0];
  };
  const messagesCall = async (stream: boolean) => {
    const body = { model: 'cached-chat', max_tokens: 64, temperature: 0, tools: [{ name: weather.name, description: weather.description, input_schema: weather.parameters as Anthropic.Tool.InputSchema }], messages: [{ role: 'user' as const, content: prompt }] };
    const message = stream ? await anthropic.messages.stream(body).finalMessage() : await anthropic.messages.create(body);
    return message.content.find((c) => c.type === 'tool_use');
  };
  const geminiCall = async (stream: boolean) => {
    const request = { model: 'cached-chat', contents: prompt, config: { temperature: 0, tools: [{ functionDeclarations: [weather as FunctionDeclaration] }] } };
    if (!stream) return (await google.models.generateContent(request)).functionCalls?.[0];
    let call;
    for await (const chunk of await google.models.generateContentStream(request)) call ??= chunk.functionCalls?.[0];
    return call;
  };
  for (const [family, call] of [['chat', chatCall], ['messages', messagesCall], ['gemini', geminiCall]] as const) {
    const first = (await call(false)) as any;
    t.ok(first, `${family}: the upstream answered with a tool call`);
    const before = await upstreamCalls(sim.url);
    const whole = (await call(false)) as any;
    const streamed = (await call(true)) as any;
    t.equal(await upstreamCalls(sim.url), before, `${family}: both repeats came from the cache`);
    const argsOf = (c: any) => JSON.stringify(c?.function ? JSON.parse(c.function.arguments) : (c?.input ?? c?.args));
    const nameOf = (c: any) => c?.function?.name ?? c?.name;
    t.same([nameOf(whole), argsOf(whole)], [nameOf(first), argsOf(first)], `${family}: the SDK reads the replayed tool call`);
    t.same([nameOf(streamed), argsOf(streamed)], [nameOf(first), argsOf(first)], `${family}: and the replayed stream`);
  }
  const responses = async (stream: boolean) => {
    const body = { model: 'cached-chat', temperature: 0, input: 'Say something' };
    if (!stream) return (await openai.responses.create(body)).output_text;
    return (await openai.responses.stream(body).finalResponse()).output_text;
  };
  const text = await responses(false);
  const before = await upstreamCalls(sim.url);
  t.same([await responses(false), await responses(true)], [text, text], 'Responses: the SDK reads the replay, whole and streamed');
  t.equal(await upstreamCalls(sim.url), before);
});

t.test('what is cached: temperature 0 or x-sluice-cache: use; bypass; opted-in models; no upstream failure', async (t) => {
  const { sim, gw } = await startStack((url) => `${simulatorUpstreams(url)}${models}`);
  const calls = () => upstreamCalls(sim.url);
  let before = await calls();
  const a = await ask(gw, 'chat', 'cached-chat', 'Sampled', { temperature: null });
  const b = await ask(gw, 'chat', 'cached-chat', 'Sampled', { temperature: null });
  t.same([a.cache, b.cache], [null, null], 'without temperature 0 the cache stays out');
  t.equal(await calls(), before + 2);

  const used = await ask(gw, 'chat', 'cached-chat', 'Sampled but asked for', { temperature: 0.7, header: 'use' });
  const usedAgain = await ask(gw, 'chat', 'cached-chat', 'Sampled but asked for', { temperature: 0.7, header: 'use' });
  t.same([used.cache, usedAgain.cache, usedAgain.text], ['miss', 'hit', used.text], 'x-sluice-cache: use caches a sampled request');

  before = await calls();
  const bypass = await ask(gw, 'chat', 'cached-chat', 'Sampled but asked for', { temperature: 0.7, header: 'bypass' });
  t.same([bypass.status, bypass.cache], [200, 'bypass']);
  t.equal(await calls(), before + 1, 'bypass goes to the upstream');

  const wrong = await ask(gw, 'chat', 'cached-chat', 'x', { header: 'yes please' });
  t.equal(wrong.status, 400);
  t.match(JSON.parse(wrong.raw).error.message, /takes `use`.*or `bypass`/, 'a wrong header value says what it takes');

  before = await calls();
  await ask(gw, 'chat', 'uncached', 'Not opted in');
  const notOpted = await ask(gw, 'chat', 'uncached', 'Not opted in');
  t.equal(notOpted.cache, null);
  t.equal(await calls(), before + 2, 'a model that does not opt in is never cached');

  // n > 1 has no canonical form: the answer could not be replayed whole.
  before = await calls();
  for (let i = 0; i < 2; i++) {
    const res = await fetch(`${gw.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${gw.key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'cached-chat', temperature: 0, n: 2, messages: [{ role: 'user', content: 'Two of them' }] }),
    });
    t.equal(res.headers.get('x-sluice-cache'), null, 'n: 2 is not cached');
    await res.arrayBuffer();
  }
  t.equal(await calls(), before + 2);

  // A failed answer is not stored: the repeat goes upstream again.
  const failed = await ask(gw, 'chat', 'cached-chat', 'Broken [[sim error=503]]');
  t.same([failed.status >= 500, failed.cache], [true, 'miss']);
  before = await calls();
  const retried = await ask(gw, 'chat', 'cached-chat', 'Broken [[sim error=503]]');
  t.equal(retried.cache, 'miss', 'a failure was not stored');
  t.ok((await calls()) > before, 'the repeat reached the upstream');
});

t.test('groups: each reads only its own answers; responseCache.groups opts a group in on every model', async (t) => {
  const sim = await startSimulatorProcess();
  const gw = await startTestGateway((dataDir) => `dataDir: ${dataDir}\nresponseCache: { groups: [analysts] }\n${simulatorUpstreams(sim.url)}${models}`);
  t.teardown(async () => {
    await gw.stop();
    await sim.stop();
  });
  const keyOf = async (group: string) => {
    t.equal((await gw.admin('POST', '/admin/groups', { name: group, models: ['*'], families: ['chat'] })).status, 201);
    return (await gw.admin('POST', '/admin/keys', { group, name: `${group} key` })).body.key as string;
  };
  const red = await keyOf('red');
  const blue = await keyOf('blue');
  const analysts = await keyOf('analysts');
  const first = await ask(gw, 'chat', 'cached-chat', 'Shared question', { key: red });
  const before = await upstreamCalls(sim.url);
  const other = await ask(gw, 'chat', 'cached-chat', 'Shared question', { key: blue });
  t.same([first.cache, other.cache], ['miss', 'miss'], 'another group does not read the first group’s answer');
  t.equal(await upstreamCalls(sim.url), before + 1);
  t.equal((await ask(gw, 'chat', 'cached-chat', 'Shared question', { key: red })).cache, 'hit', 'its own group does');

  t.equal((await ask(gw, 'chat', 'uncached', 'Analysed', { key: red })).cache, null, 'red: the model does not opt in');
  t.equal((await ask(gw, 'chat', 'uncached', 'Analysed', { key: analysts })).cache, 'miss', 'analysts: the group opts in');
  t.equal((await ask(gw, 'chat', 'uncached', 'Analysed', { key: analysts })).cache, 'hit');
});

t.test('a hit is answered before the limits, costs nothing and is recorded as answered by the cache', async (t) => {
  const { sim, gw } = await startStack((url) => `${simulatorUpstreams(url)}${models}`);
  t.equal((await gw.admin('POST', '/admin/groups', { name: 'slow', models: ['*'], families: ['chat'], limits: { rpm: 1 } })).status, 201);
  const key = (await gw.admin('POST', '/admin/keys', { group: 'slow', name: 'slow key' })).body.key as string;
  const first = await ask(gw, 'chat', 'cached-chat', 'Limited question', { key });
  t.same([first.status, first.cache], [200, 'miss']);
  const before = await upstreamCalls(sim.url);
  for (let i = 0; i < 3; i++) t.same((await ask(gw, 'chat', 'cached-chat', 'Limited question', { key })).status, 200, `hit ${i + 1} passes a used-up rpm of 1`);
  t.equal((await ask(gw, 'chat', 'cached-chat', 'Another question', { key })).status, 429, 'a miss meets the limit');
  t.equal(await upstreamCalls(sim.url), before);

  // The admin API settles every record before it reads them.
  const records = ((await gw.admin('GET', '/admin/requests?limit=50&group=slow')).body.data as any[]).filter((r) => r.group === 'slow');
  t.equal(records.length, 5, 'five records of the slow group');
  const hits = records.filter((r) => r.notes === 'answered from the response cache');
  t.equal(hits.length, 3, 'three records say the cache answered');
  for (const r of hits) t.same([r.upstream, r.cost, r.status, r.promptTokens > 0], [null, 0, 200, true], 'no upstream, no cost, the tokens it replayed');
  t.equal(gw.logs.filter((l) => l.msg === 'request' && l.answeredBy === 'response-cache' && l.upstream === undefined).length, 3, 'the access log names the cache for each hit');
  const miss = records.find((r) => r.status === 200 && r.notes !== 'answered from the response cache');
  t.ok(miss?.cost > 0, 'the miss that reached the upstream has its cost');
});

t.test('bounded in bytes: the least recently used answer goes first; metrics count hits, misses, evictions', async (t) => {
  const sim = await startSimulatorProcess();
  // Room for three of these answers (about 1,800 bytes each), not four.
  const gw = await startTestGateway((dataDir) => `dataDir: ${dataDir}\nresponseCache: { maxBytes: 6300 }\n${simulatorUpstreams(sim.url)}${models}`);
  t.teardown(async () => {
    await gw.stop();
    await sim.stop();
  });
  const prompts = ['one [[sim tokens=300]]', 'two [[sim tokens=300]]', 'three [[sim tokens=300]]', 'four [[sim tokens=300]]'];
  for (const p of prompts.slice(0, 3)) t.equal((await ask(gw, 'chat', 'cached-chat', p)).cache, 'miss');
  t.equal((await ask(gw, 'chat', 'cached-chat', prompts[0]!)).cache, 'hit', 'one is used again: now the most recent');
  t.equal((await ask(gw, 'chat', 'cached-chat', prompts[3]!)).cache, 'miss', 'four makes room');
  t.equal((await ask(gw, 'chat', 'cached-chat', prompts[1]!)).cache, 'miss', 'two, the least recently used, went');
  t.equal((await ask(gw, 'chat', 'cached-chat', prompts[0]!)).cache, 'hit', 'one stayed');
  const metrics = await (await fetch(`${gw.url}/metrics`, { headers: { authorization: `Bearer ${gw.adminToken}` } })).text();
  const value = (name: string) => Number(new RegExp(`^${name} (\\S+)$`, 'm').exec(metrics)?.[1]);
  t.equal(value('sluice_response_cache_hits_total'), 2);
  t.equal(value('sluice_response_cache_misses_total'), 5);
  t.ok(value('sluice_response_cache_evictions_total') >= 1, 'evictions counted');
  t.ok(value('sluice_response_cache_bytes') > 0 && value('sluice_response_cache_bytes') <= 6300, `bytes held within the bound (${value('sluice_response_cache_bytes')})`);
});

t.test('store: redis shares answers between instances, bounded there too', async (t) => {
  const redis = await startRedis();
  const sim = await startSimulatorProcess();
  const yaml = (dataDir: string) => `dataDir: ${dataDir}
limiter: { kind: redis, url: "${redis.url}", failMode: open, prefix: rc }
responseCache: { store: redis, maxBytes: 6300 }
${simulatorUpstreams(sim.url)}${models}`;
  const a = await startTestGateway(yaml);
  const b = await startTestGateway(yaml);
  const client = new Redis(redis.url);
  t.teardown(async () => {
    client.disconnect();
    await a.stop();
    await b.stop();
    await sim.stop();
    redis.stop();
  });
  // The keys are each instance's own: a group of the same name on both.
  const keyOn = async (gw: TestGateway) => {
    await gw.admin('POST', '/admin/groups', { name: 'team', models: ['*'], families: ['chat', 'messages'] });
    return (await gw.admin('POST', '/admin/keys', { group: 'team', name: 'k' })).body.key as string;
  };
  const [keyA, keyB] = [await keyOn(a), await keyOn(b)];
  const first = await ask(a, 'chat', 'cached-chat', 'Across instances', { key: keyA });
  t.equal(first.cache, 'miss');
  // The store is written after the answer: wait for it to land.
  await eventually(async () => (await client.zcard('{rc:response-cache}:order')) >= 1, 'the answer stored in Redis');
  const before = await upstreamCalls(sim.url);
  const second = await ask(b, 'messages', 'cached-chat', 'Across instances', { key: keyB, stream: true });
  t.same([second.status, second.cache], [200, 'miss'], 'Messages asks with max_tokens: not the same request');
  const third = await ask(b, 'chat', 'cached-chat', 'Across instances', { key: keyB });
  t.same([third.cache, third.text], ['hit', first.text], 'the other instance replays the answer');
  t.equal(await upstreamCalls(sim.url), before + 1);

  for (const p of ['r1 [[sim tokens=300]]', 'r2 [[sim tokens=300]]', 'r3 [[sim tokens=300]]', 'r4 [[sim tokens=300]]', 'r5 [[sim tokens=300]]']) await ask(a, 'chat', 'cached-chat', p, { key: keyA });
  const bytes = await eventually(async () => {
    const n = Number(await client.get('{rc:response-cache}:bytes'));
    const sizes = (await client.hvals('{rc:response-cache}:sizes')).reduce((s, v) => s + Number(v), 0);
    return n > 0 && n === sizes && (await client.zcard('{rc:response-cache}:order')) <= 3 ? n : undefined;
  }, 'the byte count settled within the bound');
  t.ok(bytes <= 6300, `Redis holds ${bytes} bytes, within 6300, and its count agrees with the entries`);

  // Redis away: lookups are misses and requests are answered by the upstream.
  redis.stop();
  const away = await ask(a, 'chat', 'cached-chat', 'While Redis is away', { key: keyA });
  t.same([away.status, away.cache], [200, 'miss'], 'Redis away: a miss, answered');
});

t.test('a stream that ends without saying why it stopped, and an answer over maxEntryBytes, are not stored', async (t) => {
  // An upstream whose streams end cleanly after two words: no finish_reason, no [DONE].
  let calls = 0;
  const cut = createServer((req, res) => {
    calls++;
    req.resume().on('end', () => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      const chunk = (content: string) => `data: ${JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', created: 1, model: 'cut', choices: [{ index: 0, delta: { content }, finish_reason: null }] })}\n\n`;
      res.end(chunk('Half ') + chunk('an answer'));
    });
  });
  await new Promise<void>((resolve) => cut.listen(0, '127.0.0.1', resolve));
  const sim = await startSimulatorProcess();
  const gw = await startTestGateway(
    (dataDir) => `dataDir: ${dataDir}
responseCache: { maxEntryBytes: 1000 }
${simulatorUpstreams(sim.url)}  cut: { kind: openai-chat, baseUrl: "http://127.0.0.1:${(cut.address() as { port: number }).port}/v1" }
models:
  - { id: cut-short, upstream: cut, responseCache: true }
  - { id: cached-chat, upstream: chat, upstreamModel: sim-chat, responseCache: true }
`,
  );
  t.teardown(async () => {
    await gw.stop();
    await sim.stop();
    cut.close();
  });
  for (const family of ['chat', 'messages'] as const) {
    const before = calls;
    const first = await ask(gw, family, 'cut-short', `Cut short for ${family}`, { stream: true });
    const again = await ask(gw, family, 'cut-short', `Cut short for ${family}`, { stream: true });
    t.same([first.status, first.cache, again.cache], [200, 'miss', 'miss'], `${family}: a cut stream is relayed, not stored`);
    t.equal(calls, before + 2, `${family}: the repeat went upstream`);
  }
  const big = 'Long answer [[sim tokens=400]]';
  const first = await ask(gw, 'chat', 'cached-chat', big, { stream: true });
  t.ok(Buffer.byteLength(first.text) > 1000, `the answer is over maxEntryBytes (${Buffer.byteLength(first.text)} bytes)`);
  t.equal((await ask(gw, 'chat', 'cached-chat', big, { stream: true })).cache, 'miss', 'an answer over maxEntryBytes is not stored');
  const small = 'Short answer [[sim tokens=20]]';
  await ask(gw, 'chat', 'cached-chat', small);
  t.equal((await ask(gw, 'chat', 'cached-chat', small)).cache, 'hit', 'a small one is');
});
