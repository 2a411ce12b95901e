/**
 * One owner for each exchange: every accepted exchange ends in exactly one done, whatever happens
 * and wherever it happens, and an abort anywhere stops the upstream. A fault-injecting plugin
 * (fixtures/fault-plugin.ts) drives each stage's failures against a real gateway and the
 * simulator as its own process.
 */
import { connect } from 'node:net';
import { fileURLToPath } from 'node:url';
import t from 'tap';
import { ended, reached } from './fixtures/fault-plugin.js';
import { eventually, startStack } from './helpers.js';

const faultModule = fileURLToPath(new URL('./fixtures/fault-plugin.js', import.meta.url));

const { sim, gw } = await startStack(
  (url) => `
plugins: [auth, grant, codecs/chat, codecs/responses, codecs/gemini, upstreams/openai-chat, usage, access-log, { name: fault, module: ${faultModule} }]
upstreams:
  sim: { kind: openai-chat, baseUrl: ${url}/v1 }
  single: { kind: openai-chat, baseUrl: ${url}/v1, connections: 1 }
models:
  - { id: sim-chat, upstream: sim }
  - { id: sim-single, upstream: single, upstreamModel: sim-chat }
`,
  { shutdownTimeoutMs: 300 },
);

const headers = (fault?: string) => ({ authorization: `Bearer ${gw.key}`, 'content-type': 'application/json', ...(fault && { 'x-fault': fault }) });
const body = (content: string, stream = false, model = 'sim-chat') => JSON.stringify({ model, stream, messages: [{ role: 'user', content }] });
const chat = (fault: string | undefined, content = 'hi', stream = false, signal?: AbortSignal) =>
  fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: headers(fault), body: body(content, stream), signal });
const simStats = async () => (await (await fetch(`${sim.url}/stats`)).json()) as { requests: number; aborted: number };
/** The done records of exchanges that carried this fault. */
const endedWith = (fault: string) => ended.filter((e) => e.fault === fault);

t.afterEach(async () => {
  // Exactly one done per exchange, ever.
  const ids = ended.map((e) => e.id);
  t.equal(new Set(ids).size, ids.length, 'no exchange ended twice');
});

t.test('an exception in a plugin phase becomes the family error, logged with its stack and request id', async (t) => {
  for (const fault of ['request:throw', 'request:reject', 'admit:throw', 'admit:reject', 'route:throw', 'route:reject']) {
    const res = await chat(fault);
    t.equal(res.status, 500, fault);
    const answer = (await res.json()) as { error: { code: string; type: string } };
    t.equal(answer.error.code, 'internal_error');
    const id = res.headers.get('x-request-id');
    const line = gw.logs.find((l) => l.req === id && l.msg === 'exchange failed') as { err?: { stack?: string } } | undefined;
    t.match(line?.err?.stack, /injected (async )?fault/, `${fault}: logged with the stack`);
    t.equal(endedWith(fault).length, 1, `${fault}: one done`);
    t.equal(endedWith(fault)[0]!.outcome, 'error');
  }
  t.equal((await chat(undefined)).status, 200, 'and the gateway serves on');
});

t.test('an exception inside the upstream stream ends the stream with its failure event', async (t) => {
  const res = await chat('frame:throw', 'hello [[sim tokens=20]]', true);
  t.equal(res.status, 200);
  const text = await res.text();
  t.match(text, /"error":\{[^}]*"code":"internal_error"/, 'the chat stream failure frame');
  t.equal(endedWith('frame:throw')[0]?.outcome, 'error');
  t.ok(gw.logs.some((l) => l.msg === 'exchange failed' && (l.err as { stack?: string })?.stack?.includes('injected fault in frame')));
});

t.test('a throwing done plugin does not stop the others', async (t) => {
  const res = await chat('done:throw');
  t.equal(res.status, 200);
  await res.text();
  const id = res.headers.get('x-request-id');
  await eventually(() => gw.logs.some((l) => l.req === id && l.msg === 'request'), 'the access log line');
  t.ok(gw.logs.some((l) => l.req === id && l.msg === 'done phase failed'));
});

t.test('a client that leaves while a phase is waiting ends the exchange at once, and the upstream is never called', async (t) => {
  for (const [fault, stage] of [
    ['request:hang', 'headers'],
    ['admit:hang', 'decoded'],
    ['route:hang', 'admitted'],
  ] as const) {
    const before = await simStats();
    const controller = new AbortController();
    const pending = chat(fault, 'hi', false, controller.signal).catch((err: Error) => err);
    // The client leaves once the exchange waits in the hanging phase.
    const phase = fault.split(':')[0];
    await eventually(() => reached.some((r) => r.fault === fault && r.phase === phase), `${fault}: the ${phase} phase entered`);
    controller.abort();
    t.type(await pending, Error);
    const record = await eventually(() => endedWith(fault)[0], `${fault}: done`);
    t.equal(record.outcome, 'aborted', fault);
    t.equal(record.stage, stage, `${fault}: ended in ${stage}`);
    t.equal((await simStats()).requests, before.requests, `${fault}: nothing reached the upstream`);
  }
});

t.test('a client that leaves during the body upload ends the exchange', async (t) => {
  const socket = connect(Number(new URL(gw.url).port), '127.0.0.1');
  const half = body('x'.repeat(2000)).slice(0, 1000);
  socket.write(
    `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${gw.key}\r\nX-Fault: upload\r\nContent-Type: application/json\r\nContent-Length: 4000\r\n\r\n${half}`,
  );
  // The client leaves once the gateway reads the body: right after the request phase, which the
  // exchange enters with its headers.
  await eventually(() => reached.some((r) => r.fault === 'upload' && r.phase === 'request'), 'the request phase of the upload');
  socket.destroy();
  const record = await eventually(() => endedWith('upload')[0], 'done after the upload was abandoned');
  t.equal(record.outcome, 'aborted');
  t.equal(record.stage, 'body');
});

t.test('a client that leaves before the first byte or mid-stream aborts the upstream call', async (t) => {
  for (const [fault, content, stage] of [
    ['wait', 'slow start [[sim ttft_ms=3000]]', 'upstream'],
    ['midway', 'long [[sim tokens=400 tps=40]]', 'streaming'],
  ] as const) {
    const before = await simStats();
    const controller = new AbortController();
    const res = fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: headers(fault), body: body(content, true), signal: controller.signal });
    if (stage === 'streaming') {
      const reader = (await res).body!.getReader();
      await reader.read();
    } else {
      await eventually(async () => (await simStats()).requests > before.requests, 'the upstream call started');
    }
    const abortedAt = Date.now();
    controller.abort();
    await res.catch(() => undefined);
    await eventually(async () => (await simStats()).aborted > before.aborted, `${fault}: the simulator saw the abort`);
    t.comment(`${fault}: upstream aborted ${Date.now() - abortedAt} ms after the client left`);
    const record = await eventually(() => endedWith(fault)[0], `${fault}: done`);
    t.equal(record.outcome, 'aborted', fault);
    t.equal(record.stage, stage, `${fault}: ended in ${stage}`);
  }
});

t.test('an aborted stream gives its upstream connection back: a one-connection pool keeps serving', async (t) => {
  for (let i = 0; i < 3; i++) {
    const controller = new AbortController();
    const res = await fetch(`${gw.url}/v1/chat/completions`, {
      method: 'POST',
      headers: headers(),
      body: body('long [[sim tokens=400 tps=40]]', true, 'sim-single'),
      signal: controller.signal,
    });
    await res.body!.getReader().read();
    controller.abort();
  }
  const res = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: headers(), body: body('after', false, 'sim-single') });
  t.equal(res.status, 200);
});

t.test('shutdown ends a stream still running at the deadline with its failure event, recorded as shutdown', async (t) => {
  const res = await chat('shutdown', 'long [[sim tokens=400 tps=20]]', true);
  const reader = res.body!.getReader();
  await reader.read();
  const stopping = gw.gateway.shutdown();
  let text = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    text += Buffer.from(value).toString();
  }
  await stopping;
  t.match(text, /"code":"shutting_down"/, 'the stream ends with the family failure frame');
  const record = await eventually(() => endedWith('shutdown')[0], 'done');
  t.equal(record.outcome, 'shutdown');
  t.equal(record.stage, 'streaming');
});
