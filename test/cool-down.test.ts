/**
 * An upstream's 429 with Retry-After: passed on to the client in its family's terms (the header
 * in every family, Google's RetryInfo in a Gemini body), streamed or not, on native and translated
 * upstreams; and the channel cools down for that long, for every exchange, every worker thread and
 * every instance sharing a Redis limiter: the upstream is not called again meanwhile, another
 * channel serves, or the client gets 429 with the Retry-After at once.
 *
 * The rate-limited upstream is a small node:http server on 127.0.0.1 that counts what each of its
 * upstreams (the first path segment) is sent; healthy channels are a simulator process.
 */
import { createServer, request as httpRequest, type IncomingMessage, type ServerResponse } from 'node:http';
import t, { type Test } from 'tap';
import WebSocket from 'ws';
import { eventually, startSimulatorProcess, startTestGateway, type TestGateway } from './helpers.js';
import { startRedis } from './servers.js';

t.setTimeout(180_000);

const RETRY_AFTER = 30;

/** Requests each limited upstream was sent, by name. */
const seen = new Map<string, number>();
/** Upstreams that say how long to wait only in the body (Google's RetryInfo), not in a header. */
const bodyOnly = new Set<string>();

/** Each family's 429, as the providers send it. */
function limited(name: string, path: string, res: ServerResponse): void {
  let body: unknown;
  if (path.includes('/models/')) {
    body = {
      error: {
        code: 429,
        message: 'Resource has been exhausted (e.g. check quota).',
        status: 'RESOURCE_EXHAUSTED',
        details: [{ '@type': 'type.googleapis.com/google.rpc.RetryInfo', retryDelay: `${RETRY_AFTER}s` }],
      },
    };
  } else if (path.endsWith('/messages')) {
    body = { type: 'error', error: { type: 'rate_limit_error', message: 'This request would exceed your rate limit.' } };
  } else {
    body = { error: { message: `Rate limit reached. Please try again in ${RETRY_AFTER}s.`, type: 'requests', param: null, code: 'rate_limit_exceeded' } };
  }
  const headers: Record<string, string> = { 'content-type': 'application/json' };
  if (!bodyOnly.has(name)) headers['retry-after'] = String(RETRY_AFTER);
  res.writeHead(429, headers).end(JSON.stringify(body));
}

const upstream = createServer((req: IncomingMessage, res: ServerResponse) => {
  req.resume();
  req.on('end', () => {
    const path = req.url ?? '/';
    const name = path.split('/')[1] ?? '';
    seen.set(name, (seen.get(name) ?? 0) + 1);
    limited(name, path, res);
  });
});
await new Promise<void>((resolve) => upstream.listen(0, '127.0.0.1', resolve));
const limitedUrl = `http://127.0.0.1:${(upstream.address() as { port: number }).port}`;
const sim = await startSimulatorProcess();
t.teardown(async () => {
  await sim.stop();
  upstream.closeAllConnections();
  await new Promise((resolve) => upstream.close(resolve));
});

type Family = 'chat' | 'responses' | 'gemini' | 'messages';
const families: Family[] = ['chat', 'responses', 'gemini', 'messages'];
const kinds: Record<Family, { kind: string; version: string }> = {
  chat: { kind: 'openai-chat', version: 'v1' },
  responses: { kind: 'openai-responses', version: 'v1' },
  gemini: { kind: 'gemini', version: 'v1beta' },
  messages: { kind: 'anthropic', version: 'v1' },
};

/** An upstream `name` of `family` on the rate-limited server, as a YAML line under `upstreams:`. */
const limitedUpstream = (name: string, family: Family, retry = '') =>
  `  ${name}: { kind: ${kinds[family].kind}, baseUrl: "${limitedUrl}/${name}/${kinds[family].version}", apiKey: k${retry && `, retry: ${retry}`} }`;

interface Answer {
  status: number;
  retryAfter: string | null;
  body: any;
  text: string;
}

/**
 * One generation request of `family` on a connection of its own (so, with worker threads, the
 * kernel spreads them), in the family's own shape and auth header.
 */
function send(baseUrl: string, key: string, family: Family, model: string, stream: boolean): Promise<Answer> {
  const headers: Record<string, string> = { 'content-type': 'application/json' };
  let path: string;
  let body: unknown;
  if (family === 'gemini') {
    path = `/v1beta/models/${model}:${stream ? 'streamGenerateContent?alt=sse' : 'generateContent'}`;
    body = { contents: [{ role: 'user', parts: [{ text: 'hi' }] }] };
    headers['x-goog-api-key'] = key;
  } else if (family === 'messages') {
    path = '/v1/messages';
    body = { model, max_tokens: 64, stream, messages: [{ role: 'user', content: 'hi' }] };
    headers['x-api-key'] = key;
    headers['anthropic-version'] = '2023-06-01';
  } else {
    path = family === 'chat' ? '/v1/chat/completions' : '/v1/responses';
    body = family === 'chat' ? { model, stream, messages: [{ role: 'user', content: 'hi' }] } : { model, stream, input: 'hi' };
    headers.authorization = `Bearer ${key}`;
  }
  const url = new URL(path, baseUrl);
  return new Promise((resolve, reject) => {
    const req = httpRequest(url, { method: 'POST', headers, agent: false }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString();
        let parsed: unknown;
        try {
          parsed = JSON.parse(text);
        } catch {
          parsed = undefined;
        }
        const retryAfter = res.headers['retry-after'];
        resolve({ status: res.statusCode!, retryAfter: typeof retryAfter === 'string' ? retryAfter : null, body: parsed, text });
      });
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(JSON.stringify(body));
  });
}

/** The family's body says it is a rate limit, and (Gemini) for how long: `seconds`. */
function checkFamilyBody(t: Test, family: Family, answer: Answer, seconds: string, what: string): void {
  if (family === 'gemini') {
    t.match(answer.body, { error: { code: 429, status: 'RESOURCE_EXHAUSTED' } }, `${what}: Google's error shape`);
    const details: any[] = answer.body?.error?.details ?? [];
    t.same(
      details.filter((d) => d['@type'] === 'type.googleapis.com/google.rpc.RetryInfo').map((d) => d.retryDelay),
      [`${seconds}s`],
      `${what}: the body's RetryInfo says ${seconds}s`,
    );
  } else if (family === 'messages') {
    t.match(answer.body, { type: 'error', error: { type: 'rate_limit_error' } }, `${what}: Anthropic's error shape`);
  } else {
    const error = answer.body?.error;
    t.ok(error?.type === 'rate_limit_exceeded' || error?.code === 'rate_limit_exceeded', `${what}: OpenAI's rate-limit error (${JSON.stringify(error)})`);
  }
}

const cases = families.flatMap((family) =>
  [false, true].flatMap((stream) =>
    // Native (the upstream's bytes pass through) and translated (a chat upstream; a Gemini one for chat clients).
    [family, family === 'chat' ? 'gemini' : 'chat'].map((upstreamFamily) => ({
      family,
      stream,
      upstreamFamily: upstreamFamily as Family,
      name: `f-${family}-${stream ? 'stream' : 'plain'}-${upstreamFamily === family ? 'native' : upstreamFamily}`,
    })),
  ),
);

const redis = await startRedis();
const shared = (dataDir: string) => `
dataDir: ${dataDir}
log: { level: info }
server: { shutdownTimeoutMs: 2000 }
limiter: { kind: redis, url: "${redis.url}", failMode: open, prefix: cool-down-test }
upstreams:
${limitedUpstream('shared', 'chat')}
models:
  - { id: m-shared, upstream: shared, upstreamModel: gpt-x }
`;

const gw = await startTestGateway(
  (dataDir) => `
dataDir: ${dataDir}
log: { level: info }
server: { shutdownTimeoutMs: 2000 }
upstreams:
${cases.map((c) => limitedUpstream(c.name, c.upstreamFamily)).join('\n')}
${limitedUpstream('gemini-body', 'gemini')}
${limitedUpstream('single', 'chat')}
${limitedUpstream('socket', 'responses')}
${limitedUpstream('first', 'chat')}
${limitedUpstream('capped', 'chat', '{ maxCoolDownSeconds: 1 }')}
${limitedUpstream('uncapped', 'chat', '{ maxCoolDownSeconds: 0 }')}
  sim: { kind: openai-chat, baseUrl: "${sim.url}/v1" }
models:
${cases.map((c) => `  - { id: ${c.name}, upstream: ${c.name}, upstreamModel: ${c.upstreamFamily === 'gemini' ? 'gemini-x' : 'gpt-x'} }`).join('\n')}
  - { id: m-gemini-body, upstream: gemini-body, upstreamModel: gemini-x }
  - { id: m-single, upstream: single, upstreamModel: gpt-x }
  - { id: m-socket, upstream: socket, upstreamModel: gpt-x }
  - id: m-pair
    channels: [{ upstream: first, upstreamModel: gpt-x }, { upstream: sim, upstreamModel: sim-chat, priority: 1 }]
  - { id: m-also-first, upstream: first, upstreamModel: gpt-x }
  - { id: m-capped, upstream: capped, upstreamModel: gpt-x }
  - { id: m-uncapped, upstream: uncapped, upstreamModel: gpt-x }
`,
);
t.teardown(() => gw.stop());

t.test("an upstream's 429 reaches the client with its Retry-After, in every family, streamed or not; then the gateway answers for the cooling channel", async (t) => {
  for (const c of cases) {
    const what = `${c.family}${c.stream ? ', streamed' : ''}, ${c.upstreamFamily === c.family ? 'native' : `on a ${c.upstreamFamily} upstream`}`;
    const first = await send(gw.url, gw.key, c.family, c.name, c.stream);
    t.equal(first.status, 429, `${what}: 429`);
    t.equal(first.retryAfter, String(RETRY_AFTER), `${what}: the upstream's Retry-After`);
    checkFamilyBody(t, c.family, first, String(RETRY_AFTER), what);

    const again = await send(gw.url, gw.key, c.family, c.name, c.stream);
    t.equal(again.status, 429, `${what}, cooling: 429 at once`);
    const seconds = Number(again.retryAfter);
    t.ok(seconds >= 1 && seconds <= RETRY_AFTER, `${what}, cooling: Retry-After ${again.retryAfter} is at most the upstream's ${RETRY_AFTER}`);
    checkFamilyBody(t, c.family, again, String(again.retryAfter), `${what}, cooling`);
    t.match(again.body, { error: { message: /try again in \d+s/ } }, `${what}, cooling: the message says when (as OpenAI words it, which Codex reads)`);
    t.equal(seen.get(c.name), 1, `${what}: the upstream was called once`);
  }
});

t.test("a Gemini upstream that says how long only in its body (RetryInfo) is honoured the same way", async (t) => {
  bodyOnly.add('gemini-body');
  for (const family of ['chat', 'gemini'] as const) {
    const answer = await send(gw.url, gw.key, family, 'm-gemini-body', false);
    t.equal(answer.status, 429);
    t.ok(Number(answer.retryAfter) >= 1 && Number(answer.retryAfter) <= RETRY_AFTER, `${family}: Retry-After ${answer.retryAfter} from the body's retryDelay`);
  }
  t.equal(seen.get('gemini-body'), 1, 'the second request found the channel cooling');
});

t.test('a Responses WebSocket turn gets the wait in its error event (error.headers)', async (t) => {
  const ws = new WebSocket(`${gw.url.replace('http', 'ws')}/v1/responses`, { headers: { authorization: `Bearer ${gw.key}` } });
  const messages: any[] = [];
  ws.on('message', (data) => messages.push(JSON.parse(data.toString())));
  await new Promise((resolve, reject) => (ws.once('open', resolve), ws.once('error', reject)));
  t.teardown(() => ws.close());
  for (const [turn, what] of [[1, "the upstream's 429"], [2, "the gateway's own, while the channel cools down"]] as const) {
    ws.send(JSON.stringify({ type: 'response.create', model: 'm-socket', input: 'hi' }));
    const error = await eventually(() => messages.filter((m) => m.type === 'error')[turn - 1], `turn ${turn}'s error event`);
    t.equal(error.status, 429, `${what}: 429`);
    const seconds = Number(error.error?.headers?.['retry-after']);
    t.ok(seconds >= 1 && seconds <= RETRY_AFTER, `${what}: error.headers has retry-after ${error.error?.headers?.['retry-after']}`);
  }
  t.equal(seen.get('socket'), 1);
});

t.test('a channel that answered 429 with Retry-After: 30 gets no request within those 30 s', async (t) => {
  const first = await send(gw.url, gw.key, 'chat', 'm-single', false);
  t.equal(first.status, 429);
  t.equal(first.retryAfter, '30');
  // Seven more: four at once, three one after another, streamed and not, in two families.
  const burst = await Promise.all(Array.from({ length: 4 }, (_, i) => send(gw.url, gw.key, i % 2 ? 'chat' : 'messages', 'm-single', i > 1)));
  const serial: Answer[] = [];
  for (const family of ['responses', 'gemini', 'chat'] as const) serial.push(await send(gw.url, gw.key, family, 'm-single', true));
  for (const [i, answer] of [...burst, ...serial].entries()) {
    t.equal(answer.status, 429, `request ${i + 2}: 429`);
    const seconds = Number(answer.retryAfter);
    t.ok(seconds >= 1 && seconds <= 30, `request ${i + 2}: Retry-After ${answer.retryAfter}`);
  }
  t.equal(seen.get('single'), 1, 'the upstream saw exactly 1 request');
  const channel = (await gw.admin('GET', '/admin/upstreams')).body.data.find((u: any) => u.name === 'single').channels[0];
  t.ok(Date.parse(channel.coolingUntil) > Date.now(), 'GET /admin/upstreams shows until when it cools down');
});

t.test('with two channels, the second serves while the first cools down; a model sharing the cooling upstream model rests too', async (t) => {
  const first = await send(gw.url, gw.key, 'chat', 'm-pair', false);
  t.equal(first.status, 200, 'the 429 failed over to the simulator');
  for (let i = 0; i < 7; i++) {
    const answer = await send(gw.url, gw.key, i % 2 ? 'chat' : 'responses', 'm-pair', i % 3 === 0);
    t.equal(answer.status, 200, `request ${i + 2}: served`);
  }
  t.equal(seen.get('first'), 1, 'the cooling channel was called once');
  const records = await eventually(async () => {
    const found = (await gw.admin('GET', '/admin/requests?model=m-pair&limit=100')).body.data as any[];
    return found.length === 8 && found;
  }, 'the 8 usage records');
  t.equal(records.filter((r) => r.attempts === 1 && r.channel === 'sim').length, 7, 'each later request went straight to the second channel');

  const other = await send(gw.url, gw.key, 'chat', 'm-also-first', false);
  t.equal(other.status, 429, 'another model on the same upstream and upstream model is answered at once');
  t.equal(seen.get('first'), 1);
});

t.test('the cool-down is bounded by retry.maxCoolDownSeconds; 0 turns it off', async (t) => {
  t.equal((await send(gw.url, gw.key, 'chat', 'm-capped', false)).status, 429);
  const cooling = await send(gw.url, gw.key, 'chat', 'm-capped', false);
  t.equal(cooling.status, 429);
  t.equal(cooling.retryAfter, '1', 'the rest is capped at 1 s');
  t.equal(seen.get('capped'), 1);
  // Once the cap has passed the upstream is called again (and rests it again).
  await eventually(async () => (await send(gw.url, gw.key, 'chat', 'm-capped', false), (seen.get('capped') ?? 0) >= 2), 'the capped cool-down to end', 10_000);

  for (let i = 0; i < 3; i++) t.equal((await send(gw.url, gw.key, 'chat', 'm-uncapped', false)).retryAfter, '30', 'the upstream\'s own answer each time');
  t.equal(seen.get('uncapped'), 3, 'maxCoolDownSeconds: 0 calls the upstream every time');
});

t.test('worker threads: a 429 seen by one thread cools the channel in every thread', async (t) => {
  const workers = await startTestGateway(
    (dataDir) => `
dataDir: ${dataDir}
log: { level: warn }
server: { workers: 2, shutdownTimeoutMs: 2000 }
upstreams:
${limitedUpstream('threads', 'chat')}
models:
  - { id: m-threads, upstream: threads, upstreamModel: gpt-x }
`,
  );
  t.teardown(() => workers.stop());
  t.equal((await send(workers.url, workers.key, 'chat', 'm-threads', false)).status, 429);
  // Ready when every thread holds it: with threads, the gauge is the shortest any thread holds.
  await eventually(async () => {
    const res = await fetch(`${workers.url}/metrics`, { headers: { authorization: `Bearer ${workers.adminToken}` } });
    const line = (await res.text()).split('\n').find((l) => l.startsWith('sluice_channel_cooldown_seconds{') && l.includes('gen_ai_request_model="m-threads"'));
    return line !== undefined && Number(line.split(' ').at(-1)) > 0;
  }, 'every thread to hold the cool-down');
  const answers = await Promise.all(Array.from({ length: 7 }, () => send(workers.url, workers.key, 'chat', 'm-threads', false)));
  t.same(new Set(answers.map((a) => a.status)), new Set([429]));
  t.equal(seen.get('threads'), 1, 'whichever thread took them, the upstream saw 1 request');
});

t.test('instances sharing a Redis limiter: a 429 seen by one cools the channel for the others, and for one started later', async (t) => {
  const a = await startTestGateway(shared);
  t.teardown(() => a.stop());
  const b = await startTestGateway(shared);
  t.teardown(() => b.stop());
  const coolingIn = async (gateway: TestGateway) =>
    (await gateway.admin('GET', '/admin/upstreams')).body.data.find((u: any) => u.name === 'shared').channels[0].coolingUntil !== null;

  t.equal((await send(a.url, a.key, 'chat', 'm-shared', false)).status, 429);
  t.equal(seen.get('shared'), 1);
  await eventually(() => coolingIn(b), 'instance B to hear of the cool-down');
  for (let i = 0; i < 7; i++) {
    const answer = await send(b.url, b.key, i % 2 ? 'chat' : 'gemini', 'm-shared', i % 3 === 0);
    t.equal(answer.status, 429, `B, request ${i + 1}: 429 at once`);
    t.ok(Number(answer.retryAfter) >= 1 && Number(answer.retryAfter) <= RETRY_AFTER, `B, request ${i + 1}: Retry-After ${answer.retryAfter}`);
  }
  t.equal(seen.get('shared'), 1, 'the upstream saw only the first request');

  const c = await startTestGateway(shared);
  t.teardown(() => c.stop());
  await eventually(() => coolingIn(c), 'an instance started later to read the cool-down from Redis');
  t.equal((await send(c.url, c.key, 'chat', 'm-shared', false)).status, 429);
  t.equal(seen.get('shared'), 1);

  // The control: an instance without the shared limiter knows nothing of it.
  const alone = await startTestGateway((dataDir) => shared(dataDir).replace(/limiter: .*\n/, ''));
  t.teardown(() => alone.stop());
  t.equal((await send(alone.url, alone.key, 'chat', 'm-shared', false)).retryAfter, '30', "the upstream's own 429");
  t.equal(seen.get('shared'), 2, 'a memory limiter shares nothing between instances');
});
