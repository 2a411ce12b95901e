/**
 * Limits and budgets through the real gateway, against the simulator as its own process: exact
 * 429s under concurrency, slots freed on every ending, request and token windows with
 * reconciliation, budgets on every route, and the same tokens and cost streamed or not.
 */
import t from 'tap';
import WebSocket from 'ws';
import { estimateTokens } from '../src/tokens.js';
import { eventually, simulatorUpstreams, startStack } from './helpers.js';

t.setTimeout(120_000);

// One token of any kind costs one unit at these prices (cached input a tenth, cache writes one and a
// half, reasoning double): costs are easy to check by hand.
const prices = '{ input: 1000000, cachedInput: 100000, cacheWrite: 1500000, output: 1000000, reasoning: 2000000 }';
const routing = (simUrl: string) => `${simulatorUpstreams(simUrl)}
models:
  - { id: sim-chat, upstream: chat, maxOutputTokens: { default: 64, max: 4096 }, prices: ${prices} }
  - { id: sim-responses, upstream: responses, maxOutputTokens: { default: 64, max: 4096 }, prices: ${prices} }
  - { id: sim-gemini, upstream: gemini, maxOutputTokens: { default: 64, max: 4096 }, prices: ${prices} }
  - { id: sim-messages, upstream: messages, maxOutputTokens: { default: 64, max: 4096 }, prices: ${prices} }
  - { id: sim-guarded, upstream: chat, upstreamModel: sim-chat, maxOutputTokens: { max: 4096 }, limits: { concurrency: 1 } }
`;
const { gw } = await startStack(routing);

/** A new group with `fields`, and a key in it. */
async function keyIn(fields: Record<string, unknown>, keyFields: Record<string, unknown> = {}): Promise<{ key: string; id: string; group: string }> {
  const group = `g${Math.random().toString(36).slice(2, 10)}`;
  const created = await gw.admin('POST', '/admin/groups', { name: group, models: ['*'], families: ['chat', 'responses', 'gemini', 'messages'], ...fields });
  if (created.status !== 201) throw new Error(JSON.stringify(created.body));
  const key = await gw.admin('POST', '/admin/keys', { group, ...keyFields });
  return { key: key.body.key, id: key.body.id, group };
}

const chat = (key: string, content: string, extra: Record<string, unknown> = {}, signal?: AbortSignal) =>
  fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'sim-chat', messages: [{ role: 'user', content }], ...extra }),
    signal,
  });

/** Status and body text of a call, read to the end. */
const settle = async (res: Promise<Response>) => {
  const r = await res;
  return { status: r.status, headers: r.headers, text: await r.text() };
};

const records = async (filter: string) => (await gw.admin('GET', `/admin/requests?${filter}&limit=1000`)).body.data as any[];

t.test('concurrency 3: of 8 simultaneous streams exactly 5 get a 429 with Retry-After; then the slots are free', async (t) => {
  const { key } = await keyIn({ limits: { concurrency: 3 } });
  const all = await Promise.all(Array.from({ length: 8 }, () => settle(chat(key, 'Hello [[sim tokens=20 tps=40]]', { stream: true }))));
  const refused = all.filter((r) => r.status === 429);
  t.equal(refused.length, 5, 'exactly N − M refused');
  t.equal(all.filter((r) => r.status === 200).length, 3);
  for (const r of refused) {
    t.ok(Number(r.headers.get('retry-after')) >= 1, 'Retry-After');
    t.match(JSON.parse(r.text), { error: { type: 'rate_limit_exceeded', code: 'rate_limit_exceeded', message: /Concurrency limit/ } });
  }
  const again = await Promise.all(Array.from({ length: 3 }, () => settle(chat(key, 'Again [[sim tokens=5 tps=50]]', { stream: true }))));
  t.same(again.map((r) => r.status), [200, 200, 200], 'every slot came back');
});

t.test('a slot is free again after every kind of ending', async (t) => {
  const { key, id } = await keyIn({ limits: { concurrency: 1 } });
  const next = async (what: string) => t.equal((await settle(chat(key, 'Next'))).status, 200, `a request passes after ${what}`);

  t.equal((await settle(chat(key, 'Hi'))).status, 200);
  await next('a success');
  t.equal((await settle(chat(key, 'Fail [[sim error=500]]'))).status, 502);
  await next('an upstream error');
  const cut = await settle(chat(key, 'Cut [[sim tokens=50 cut_after=5]]', { stream: true }));
  t.equal(cut.status, 200, 'the cut stream had begun');
  await next('a stream cut by the upstream');
  t.equal((await settle(chat(key, 'Too long', { max_tokens: 999_999 }))).status, 400, 'refused by the model rules after admission');
  await next('a refusal after admission');

  const abort = new AbortController();
  const res = await chat(key, 'Long [[sim tokens=400 tps=50]]', { stream: true }, abort.signal);
  const reader = res.body!.getReader();
  await reader.read();
  abort.abort();
  await eventually(async () => (await records(`key=${id}`)).some((r) => r.outcome === 'aborted'), 'the aborted record');
  await next('a client abort');
});

t.test('rpm 5: the 6th request in a minute gets a 429; a burst of 8 lets exactly 5 through', async (t) => {
  const { key } = await keyIn({ limits: { rpm: 5 } });
  const remaining: string[] = [];
  for (let i = 0; i < 5; i++) {
    const r = await settle(chat(key, `One ${i}`));
    t.equal(r.status, 200);
    remaining.push(r.headers.get('x-ratelimit-remaining-requests')!);
    t.equal(r.headers.get('x-ratelimit-limit-requests'), '5');
    t.match(r.headers.get('x-ratelimit-reset-requests'), /^\d+(\.\d+)?(ms|s)$|^\dm/);
  }
  t.same(remaining, ['4', '3', '2', '1', '0']);
  const sixth = await settle(chat(key, 'Six'));
  t.equal(sixth.status, 429);
  t.ok(Number(sixth.headers.get('retry-after')) >= 50, 'wait until the oldest request leaves the window');
  t.match(JSON.parse(sixth.text).error, { code: 'rate_limit_exceeded', message: /5 requests per minute/ });

  const burst = await keyIn({}, { limits: { rpm: 5 } });
  const all = await Promise.all(Array.from({ length: 8 }, (_, i) => settle(chat(burst.key, `Burst ${i}`))));
  t.equal(all.filter((r) => r.status === 200).length, 5, 'a key-level limit, exactly R pass');
});

t.test('tpm: the reservation is prompt plus output ceiling, reconciled with the real usage at the end', async (t) => {
  const { key } = await keyIn({ limits: { tpm: 1000 } });
  const first = chat(key, 'Slow [[sim tokens=10 tps=20]]', { max_tokens: 600, stream: true });
  const firstRes = await first;
  const reserved = 1000 - Number(firstRes.headers.get('x-ratelimit-remaining-tokens'));
  t.ok(reserved > 600 && reserved < 700, `the first reserved its prompt and 600 output tokens (${reserved})`);
  const second = await settle(chat(key, 'Meanwhile', { max_tokens: 600 }));
  t.equal(second.status, 429, 'a second reservation does not fit beside it');
  t.match(JSON.parse(second.text).error.message, /1000 tokens per minute/);
  await firstRes.text();
  // Reconciled: the first used ~20 tokens, so 600 more fit now.
  const third = await eventually(async () => {
    const r = await settle(chat(key, 'After', { max_tokens: 600 }));
    return r.status === 200 ? r : undefined;
  }, 'the reconciled window');
  const left = Number(third.headers.get('x-ratelimit-remaining-tokens'));
  t.ok(left > 300, `after reconciling, the window holds the first's real tokens, not its reservation (${left} left)`);
  const huge = await settle(chat(key, 'Huge', { max_tokens: 2000 }));
  t.equal(huge.status, 429);
  t.match(JSON.parse(huge.text).error.message, /Request too large/);
});

t.test('a prompt shaped around the estimate\'s windows is still counted: cheap text where fixed windows fall, dear text elsewhere', async (t) => {
  // Rare CJK (at least a token a character) everywhere but where the fixed windows of src/tokens.ts
  // sample the text past its first 2 KB: there, spaces (a run of them is a token or two).
  const rest = 60_000;
  const chars = new Array<string>(rest).fill('龘');
  const GOLDEN = 0.6180339887498949;
  for (let k = 0; k < 16; k++) {
    const at = Math.floor(((k + ((k * GOLDEN) % 1)) * rest) / 16);
    for (let i = Math.max(0, at - 64); i < Math.min(rest, at + 256); i++) chars[i] = ' ';
  }
  const prompt = ' '.repeat(2048) + chars.join('');
  const dear = chars.filter((c) => c === '龘').length;
  // The floor is below the real count: a run of one character ("-----", 312 tokens for 20,000) is
  // not raised to a fifth of a token a character (it was, at 3,622).
  t.ok(estimateTokens('-'.repeat(20_000)) < 700, `a separator line: ${estimateTokens('-'.repeat(20_000))} tokens`);
  // Fixed windows alone saw 1/30 of it; the floor counted from every character holds them too.
  t.ok(estimateTokens(prompt) >= dear / 4, `fixed windows: ${estimateTokens(prompt)} tokens of at least ${dear}`);
  t.ok(estimateTokens(prompt, { sampling: 'random' }) > dear / 2, 'drawn windows see the dear text');
  const { key } = await keyIn({ limits: { tpm: 20_000 } });
  const refused = await settle(chat(key, prompt, { max_tokens: 16 }));
  t.equal(refused.status, 429, 'the limit refuses it before the upstream is called (it passed before)');
  t.match(JSON.parse(refused.text).error.message, /Request too large/);

  // A stream the client cuts before the upstream's usage is billed on an estimate made with fixed
  // windows (deterministic records): that estimate must not be the steerable one either. Before, it
  // billed 1,687 prompt tokens for this prompt and let a budget be spent 200 times over.
  const { key: open, id } = await keyIn({});
  const cut = new AbortController();
  const streamed = await chat(open, `${prompt} [[sim tokens=400 tps=20]]`, { stream: true, max_tokens: 400 }, cut.signal);
  const reader = streamed.body!.getReader();
  await reader.read();
  cut.abort();
  await reader.read().catch(() => undefined);
  const billed = await eventually(async () => (await records(`key=${id}`)).find((r) => r.outcome === 'aborted'), 'the aborted record');
  t.ok(billed.estimated, 'its usage is estimated');
  t.ok(billed.promptTokens >= dear / 4, `the cut stream is billed ${billed.promptTokens} prompt tokens, within 4× of the ${dear} it holds`);

  // Drawn windows may miss one dense block in a sea of spaces, and a client may resend until they
  // do: such a cheap-reading prompt is held to a floor counted from every character.
  const block = '龘'.repeat(8_000);
  const hidden = ' '.repeat(46_000) + block + ' '.repeat(46_000);
  const draws = Array.from({ length: 50 }, () => estimateTokens(hidden, { sampling: 'random' }));
  t.ok(Math.min(...draws) >= block.length / 2, `50 draws: the least, ${Math.min(...draws)}, is within 4× of the block's ${2 * block.length} tokens`);
  const { key: small } = await keyIn({ limits: { tpm: 3000 } });
  const tries = await Promise.all(Array.from({ length: 10 }, () => settle(chat(small, hidden, { max_tokens: 16 }))));
  t.same(tries.map((r) => r.status), Array(10).fill(429), 'ten tries, ten refusals: resending does not find a lucky draw');
});

t.test("a chat request's structured-output schema and legacy functions count against the token limit", async (t) => {
  const { key } = await keyIn({ limits: { tpm: 2000 } });
  const properties = Object.fromEntries(Array.from({ length: 400 }, (_, i) => [`field_number_${i}`, { type: 'string', description: `The value of field ${i}` }]));
  const schema = { type: 'object', properties };
  const format = await settle(chat(key, 'Hi', { max_tokens: 16, response_format: { type: 'json_schema', json_schema: { name: 'big', schema } } }));
  t.equal(format.status, 429, 'a schema of thousands of tokens (it passed before)');
  const legacy = await settle(chat(key, 'Hi', { max_tokens: 16, functions: [{ name: 'big', parameters: schema }] }));
  t.equal(legacy.status, 429, 'the same as legacy functions');
  t.equal((await settle(chat(key, 'Hi', { max_tokens: 16 }))).status, 200, 'a short request still fits');
});

t.test('the token window reserves the output ceiling once per candidate (n)', async (t) => {
  const { key } = await keyIn({ limits: { tpm: 1000 } });
  // 20 candidates of up to 100 tokens each: 2,000 output tokens at most. Before, 100 were reserved.
  const many = await settle(chat(key, 'Hi', { max_tokens: 100, n: 20 }));
  t.equal(many.status, 429, 'more than the window holds');
  t.match(JSON.parse(many.text).error.message, /Request too large/);
  t.equal((await settle(chat(key, 'Hi', { max_tokens: 100, n: 2 }))).status, 200, 'two candidates fit');
});

t.test('a model limit holds across keys', async (t) => {
  const a = await keyIn({});
  const b = await keyIn({});
  const call = (key: string) =>
    settle(
      fetch(`${gw.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'sim-guarded', stream: true, messages: [{ role: 'user', content: 'Hi [[sim tokens=10 tps=20]]' }] }),
      }),
    );
  const [ra, rb] = await Promise.all([call(a.key), call(b.key)]);
  t.same([ra.status, rb.status].sort(), [200, 429]);
  t.match(JSON.parse((ra.status === 429 ? ra : rb).text).error.message, /model:sim-guarded/);
});

/** Every route a client can take, each as a call returning status and body. */
function routes(key: string) {
  const post = (path: string, body: unknown, headers: Record<string, string> = {}) =>
    settle(fetch(gw.url + path, { method: 'POST', headers: { 'content-type': 'application/json', ...headers, authorization: `Bearer ${key}` }, body: JSON.stringify(body) }));
  const gemini = (model: string) =>
    settle(
      fetch(`${gw.url}/v1beta/models/${model}:generateContent`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-goog-api-key': key },
        body: JSON.stringify({ contents: [{ role: 'user', parts: [{ text: 'Hi' }] }] }),
      }),
    );
  return {
    'chat passthrough': () => post('/v1/chat/completions', { model: 'sim-chat', messages: [{ role: 'user', content: 'Hi' }] }),
    'chat translated': () => post('/v1/chat/completions', { model: 'sim-gemini', messages: [{ role: 'user', content: 'Hi' }] }),
    'responses passthrough': () => post('/v1/responses', { model: 'sim-responses', input: 'Hi' }),
    'responses bridged': () => post('/v1/responses', { model: 'sim-chat', input: 'Hi', stream: true }),
    'gemini passthrough': () => gemini('sim-gemini'),
    'gemini translated': () => gemini('sim-chat'),
    'responses websocket': () => socketTurn(key, { model: 'sim-responses', input: 'Hi' }),
    'messages passthrough': () => post('/v1/messages', { model: 'sim-messages', max_tokens: 64, messages: [{ role: 'user', content: 'Hi' }] }, { 'anthropic-version': '2023-06-01' }),
    'messages translated': () => post('/v1/messages', { model: 'sim-chat', max_tokens: 64, stream: true, messages: [{ role: 'user', content: 'Hi' }] }, { 'anthropic-version': '2023-06-01' }),
  };
}

/** One Responses WebSocket turn: its terminal event, with status 200 for a response and 0 for an error event. */
async function socketTurn(key: string, body: Record<string, unknown>): Promise<{ status: number; text: string }> {
  const ws = new WebSocket(`${gw.url.replace('http', 'ws')}/v1/responses`, { headers: { authorization: `Bearer ${key}` } });
  await new Promise((resolve, reject) => (ws.once('open', resolve), ws.once('error', reject)));
  const end = new Promise<any>((resolve) =>
    ws.on('message', (m) => {
      const e = JSON.parse(m.toString());
      if (/^(response\.(completed|incomplete|failed)|error)$/.test(e.type)) resolve(e);
    }),
  );
  ws.send(JSON.stringify({ type: 'response.create', ...body }));
  const e = await end;
  ws.close();
  return { status: e.type === 'error' ? 0 : 200, text: JSON.stringify(e) };
}

t.test('a group budget used up stops the next request on every route of every family, passthrough and translated, HTTP and WebSocket', async (t) => {
  // The first request may cost up to about 170 units (its prompt's upper bound at the dearest input
  // price, 60 output tokens at the reasoning price) and costs about 75: what is left is less than
  // the worst case of any next request (64 output tokens by default, about 160 units).
  const { key, group } = await keyIn({ budget: { amount: 200, period: 'day' } });
  t.equal((await settle(chat(key, 'Spend it [[sim tokens=60]]', { max_tokens: 60 }))).status, 200, 'within budget');
  const listed = (await gw.admin('GET', '/admin/groups')).body.data.find((g: any) => g.name === group);
  t.match(listed.spend, { period: 'day' });
  t.ok(listed.spend.spent > 60 && listed.spend.spent <= 200, `the spend is shown, within the budget (${listed.spend.spent})`);
  for (const [name, call] of Object.entries(routes(key))) {
    const r = await call();
    const body = JSON.parse(r.text);
    t.equal(r.status, name === 'responses websocket' ? 0 : 429, `${name}: refused`);
    if (name.startsWith('gemini')) t.match(body.error, { code: 429, status: 'RESOURCE_EXHAUSTED' }, name);
    else if (name === 'responses websocket') t.match(body, { type: 'error', error: { code: 'insufficient_quota' } }, name);
    else if (name.startsWith('messages')) t.match(body, { type: 'error', error: { type: 'rate_limit_error', message: /budget/ } }, name);
    else t.match(body.error, { type: 'insufficient_quota', code: 'insufficient_quota' }, name);
  }
});

t.test('a key budget stops that key only; an unlimited key of the same group goes on', async (t) => {
  const { key, group } = await keyIn({}, { budget: { amount: 200, period: 'month' } });
  const other = (await gw.admin('POST', '/admin/keys', { group })).body.key;
  t.equal((await settle(chat(key, 'Spend [[sim tokens=60]]', { max_tokens: 60 }))).status, 200);
  const refused = await settle(chat(key, 'More'));
  t.equal(refused.status, 429);
  t.ok(Number(refused.headers.get('retry-after')) > 0, 'Retry-After: until the month ends');
  t.equal((await settle(chat(other, 'Mine'))).status, 200);
  // Raised budget: the key works again at once (admin writes clear the cache).
  const id = (await gw.admin('GET', '/admin/keys')).body.data.find((k: any) => k.spend && k.group === group).id;
  await gw.admin('PATCH', `/admin/keys/${id}`, { budget: { amount: 1000, period: 'month' } });
  t.equal((await settle(chat(key, 'Again'))).status, 200);
});

t.test('a WebSocket turn holds its slot while it generates, not while the socket idles; a refused turn leaves the socket open', async (t) => {
  const { key } = await keyIn({ limits: { concurrency: 1 } });
  const ws = new WebSocket(`${gw.url.replace('http', 'ws')}/v1/responses`, { headers: { authorization: `Bearer ${key}` } });
  const events: any[] = [];
  ws.on('message', (m) => events.push(JSON.parse(m.toString())));
  await new Promise((resolve, reject) => (ws.once('open', resolve), ws.once('error', reject)));
  const send = (lane: string, input: string) => ws.send(JSON.stringify({ type: 'response.create', model: 'sim-responses', stream_id: lane, input }));
  const ended = (lane: string) =>
    eventually(() => events.find((e) => (e.stream_id ?? '') === lane && /^(response\.completed|error)$/.test(e.type)), `lane ${lane}`);
  send('a', 'Long [[sim tokens=20 tps=40]]');
  await eventually(() => events.some((e) => e.stream_id === 'a'), 'lane a started');
  send('b', 'Meanwhile');
  t.match(await ended('b'), { type: 'error', error: { code: 'rate_limit_exceeded' } }, 'the second lane is refused while the first generates');
  t.match(await ended('a'), { type: 'response.completed' });
  // An idle open socket holds nothing: an HTTP request of the same key passes.
  t.equal((await settle(chat(key, 'HTTP meanwhile'))).status, 200);
  send('c', 'Later');
  t.match(await ended('c'), { type: 'response.completed' }, 'the socket stayed open and serves the next turn');
  ws.close();
});

t.test('streamed and not, every family on every upstream kind: the same tokens and the same cost', async (t) => {
  const { key, id } = await keyIn({});
  const prompt = 'Count the costs. [[sim tokens=12 cached=4 cache_write=2]]';
  const calls: Record<string, (stream: boolean) => Promise<unknown>> = {};
  const models = ['sim-chat', 'sim-responses', 'sim-gemini', 'sim-messages'];
  for (const model of models) {
    const headers = { authorization: `Bearer ${key}`, 'x-goog-api-key': key, 'content-type': 'application/json', 'anthropic-version': '2023-06-01' };
    calls[`messages on ${model}`] = (stream) =>
      settle(
        fetch(`${gw.url}/v1/messages`, {
          method: 'POST',
          headers,
          body: JSON.stringify({ model, stream, max_tokens: 64, messages: [{ role: 'user', content: prompt }] }),
        }),
      );
    calls[`chat on ${model}`] = (stream) =>
      settle(fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers, body: JSON.stringify({ model, stream, messages: [{ role: 'user', content: prompt }] }) }));
    calls[`responses on ${model}`] = (stream) =>
      settle(fetch(`${gw.url}/v1/responses`, { method: 'POST', headers, body: JSON.stringify({ model, stream, input: prompt }) }));
    calls[`gemini on ${model}`] = (stream) =>
      settle(
        fetch(`${gw.url}/v1beta/models/${model}:${stream ? 'streamGenerateContent?alt=sse' : 'generateContent'}`, {
          method: 'POST',
          headers,
          body: JSON.stringify({ contents: [{ role: 'user', parts: [{ text: prompt }] }] }),
        }),
      );
  }
  for (const call of Object.values(calls)) {
    await call(false);
    await call(true);
  }
  const stored = await eventually(async () => {
    const r = await records(`key=${id}`);
    return r.length === 32 ? r : undefined;
  }, '32 records');
  for (const family of ['chat', 'responses', 'gemini', 'messages']) {
    for (const model of models) {
      const pair = stored.filter((r) => r.family === family && r.model === model);
      const [plain, streamed] = [pair.find((r) => !r.streamed), pair.find((r) => r.streamed)];
      const name = `${family} on ${model}`;
      t.ok(plain && streamed, `${name}: both records`);
      const fields = ({ promptTokens, completionTokens, cachedInputTokens, cacheWriteTokens, reasoningTokens, cost, estimated }: any) => ({
        promptTokens, completionTokens, cachedInputTokens, cacheWriteTokens, reasoningTokens, cost, estimated,
      });
      t.same(fields(streamed), fields(plain), `${name}: same tokens and cost`);
      t.equal(plain.cachedInputTokens, 4, `${name}: cached tokens reported`);
      t.equal(plain.estimated, false);
      // Only Anthropic reports cache writes; elsewhere they are part of the plain input.
      const written = plain.cacheWriteTokens ?? 0;
      t.equal(written, model === 'sim-messages' ? 2 : 0, `${name}: cache writes reported where the upstream has them`);
      const reasoning = plain.reasoningTokens ?? 0;
      const expected = (plain.promptTokens - 4 - written) * 1 + 4 * 0.1 + written * 1.5 + (plain.completionTokens - reasoning) * 1 + reasoning * 2;
      t.equal(plain.cost, Math.round(expected * 1e9) / 1e9, `${name}: cost by the formula`);
    }
  }
});

t.test("each family's clients get the rate-limit headers they read: Anthropic's names on Messages", async (t) => {
  const { key } = await keyIn({ limits: { rpm: 5, tpm: 100000 } });
  const { default: Anthropic } = await import('@anthropic-ai/sdk');
  const client = new Anthropic({ apiKey: key, baseURL: gw.url, maxRetries: 0 });
  const before = Date.now();
  const { data, response } = await client.messages
    .create({ model: 'sim-messages', max_tokens: 32, messages: [{ role: 'user', content: 'Hi' }] })
    .withResponse();
  t.equal(data.type, 'message', 'the SDK read the answer');
  const h = response.headers;
  t.equal(h.get('anthropic-ratelimit-requests-limit'), '5');
  t.equal(h.get('anthropic-ratelimit-requests-remaining'), '4');
  t.equal(h.get('anthropic-ratelimit-tokens-limit'), '100000');
  t.ok(Number(h.get('anthropic-ratelimit-tokens-remaining')) < 100000, 'the reservation is counted');
  for (const name of ['requests', 'tokens']) {
    const reset = h.get(`anthropic-ratelimit-${name}-reset`)!;
    t.match(reset, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/, `${name}-reset is an RFC 3339 time`);
    const at = Date.parse(reset);
    t.ok(at >= before && at <= Date.now() + 61_000, `${name}-reset is within the minute's window (${reset})`);
  }
  t.notOk([...h.keys()].some((k) => k.startsWith('x-ratelimit-')), "no OpenAI names on Anthropic's wire");

  // The refusal carries them too, with no requests left, and the SDK sees a RateLimitError.
  for (let i = 0; i < 4; i++) await client.messages.create({ model: 'sim-messages', max_tokens: 8, messages: [{ role: 'user', content: `Hi ${i}` }] });
  const refused = await client.messages.create({ model: 'sim-messages', max_tokens: 8, messages: [{ role: 'user', content: 'Over' }] }).catch((e: unknown) => e);
  t.ok(refused instanceof Anthropic.RateLimitError, 'a 429 the SDK knows');
  t.equal((refused as InstanceType<typeof Anthropic.RateLimitError>).headers?.get('anthropic-ratelimit-requests-remaining'), '0');

  // The other families keep OpenAI's names.
  const other = await keyIn({ limits: { rpm: 5 } });
  const gemini = await fetch(`${gw.url}/v1beta/models/sim-gemini:generateContent`, {
    method: 'POST',
    headers: { 'x-goog-api-key': other.key, 'content-type': 'application/json' },
    body: JSON.stringify({ contents: [{ role: 'user', parts: [{ text: 'Hi' }] }] }),
  });
  t.equal(gemini.status, 200);
  t.equal(gemini.headers.get('x-ratelimit-limit-requests'), '5');
  t.notOk(gemini.headers.get('anthropic-ratelimit-requests-limit'));
});
