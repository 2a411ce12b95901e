/**
 * Upstream channels: failover before the first byte, circuit breaking, weighted choice and the
 * four timeouts, against two simulator processes (one made to fail with `POST /faults`), a closed
 * port and a port that never accepts a connection.
 */
import { spawn } from 'node:child_process';
import { connect, createServer, type Socket } from 'node:net';
import OpenAI from 'openai';
import t from 'tap';
import { Breaker } from '../src/channels/breaker.js';
import { ChannelTable } from '../src/channels/table.js';
import { loadConfig } from '../src/config/load.js';
import { simulatorUpstream } from '../plugins/upstreams/simulator/index.js';
import { childEnv, eventually, startSimulatorProcess, startTestGateway, watchProcess } from './helpers.js';

// Two simulator processes, a black hole and the timeouts and cool-downs it waits out: more than
// tap's default 60 s on two busy cores.
t.setTimeout(180_000);

/** A port nothing listens on. */
async function closedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  await new Promise((resolve) => server.close(resolve));
  return port;
}

/**
 * A port that never completes a connection: a child process listens with a backlog of one and
 * never accepts (its event loop is blocked), and its accept queue is filled, so further SYNs go
 * unanswered and a connect can only time out.
 */
async function blackHole(): Promise<number> {
  const script = `const s = require('net').createServer();
s.listen({ port: 0, host: '127.0.0.1', backlog: 1 }, () => {
  process.stdout.write(s.address().port + '\\n');
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0);
});`;
  const child = spawn(process.execPath, ['-e', script], { env: childEnv(), stdio: ['ignore', 'pipe', 'pipe'] });
  const port = Number((await watchProcess(child, { echoStderr: true }).waitFor(/^(\d+)\n/, "the black hole's port"))[1]);
  const held: Socket[] = [];
  t.teardown(() => {
    for (const s of held) s.destroy();
    child.kill('SIGKILL');
  });
  for (;;) {
    const socket = connect(port, '127.0.0.1');
    held.push(socket);
    // The kernel completes a connection at once while the queue has room. Its event can wait
    // behind the timer when a busy machine held this event loop up, so the verdict comes after
    // the next poll for I/O (setImmediate), which reports a connection already made.
    const accepted = await new Promise((resolve) => {
      const timer = setTimeout(() => setImmediate(() => resolve(false)), 1000);
      socket.once('connect', () => (clearTimeout(timer), resolve(true)));
    });
    if (!accepted) return port;
  }
}

const good = await startSimulatorProcess();
const bad = await startSimulatorProcess();
const refusedPort = await closedPort();
const holePort = await blackHole();

const pair = (first: string, second = 'good') =>
  `[{ upstream: ${first}, upstreamModel: sim-chat }, { upstream: ${second}, upstreamModel: sim-chat, priority: 1 }]`;
const alone = (upstream: string) => `[{ upstream: ${upstream}, upstreamModel: sim-chat }]`;

const gw = await startTestGateway(
  (dataDir) => `
dataDir: ${dataDir}
log: { level: info }
server: { shutdownTimeoutMs: 2000 }
upstreams:
  good: { kind: openai-chat, baseUrl: "${good.url}/v1" }
  alt: { kind: openai-chat, baseUrl: "${good.url}/v1" }
  bad:
    kind: openai-chat
    baseUrl: "${bad.url}/v1"
    timeouts: { firstByteMs: 400 }
    retry: { backoffMs: 10 }
    breaker: { failures: 3, coolDownSeconds: 1 }
  patient: { kind: openai-chat, baseUrl: "${bad.url}/v1", retry: { backoffMs: 1000 } }
  refused: { kind: openai-chat, baseUrl: "http://127.0.0.1:${refusedPort}/v1", retry: { backoffMs: 10 } }
  hole: { kind: openai-chat, baseUrl: "http://127.0.0.1:${holePort}/v1", timeouts: { connectMs: 200 }, retry: { backoffMs: 10 } }
  slow-start: { kind: openai-chat, baseUrl: "${good.url}/v1", timeouts: { firstByteMs: 300 } }
  idle: { kind: openai-chat, baseUrl: "${good.url}/v1", timeouts: { idleMs: 300 } }
  short: { kind: openai-chat, baseUrl: "${good.url}/v1", timeouts: { totalMs: 500 } }
models:
  - { id: m-5xx, channels: ${pair('bad')} }
  - { id: m-reset, channels: ${pair('bad')} }
  - { id: m-429, channels: ${pair('bad')} }
  - { id: m-slow, channels: ${pair('bad')} }
  - { id: m-refused, channels: ${pair('refused')} }
  - { id: m-hole, channels: ${pair('hole')} }
  - { id: m-breaker, channels: ${pair('bad')} }
  - { id: m-alone, channels: ${alone('bad')} }
  - { id: m-wait, channels: ${alone('bad')} }
  - { id: m-backoff, channels: ${pair('patient')} }
  - { id: m-midstream, channels: ${pair('idle', 'alt')} }
  - { id: m-client-error, channels: ${pair('good', 'alt')} }
  - id: m-weighted
    channels: [{ upstream: good, upstreamModel: sim-chat, weight: 3 }, { upstream: alt, upstreamModel: sim-chat, weight: 1 }]
  - { id: t-connect, channels: ${alone('hole')} }
  - { id: t-first-byte, channels: ${alone('slow-start')} }
  - { id: t-idle, channels: ${alone('idle')} }
  - { id: t-total, channels: ${alone('short')} }
`,
);
t.teardown(async () => {
  await gw.stop();
  await Promise.all([good.stop(), bad.stop()]);
});

const openai = new OpenAI({ apiKey: gw.key, baseURL: `${gw.url}/v1`, maxRetries: 0 });

async function setFaults(faults: Record<string, unknown>): Promise<void> {
  const res = await fetch(`${bad.url}/faults`, { method: 'POST', body: JSON.stringify(faults) });
  if (res.status !== 200) throw new Error(`faults refused: ${await res.text()}`);
}

const requestsSeen = async (sim: { url: string }) => ((await (await fetch(`${sim.url}/stats`)).json()) as { requests: number }).requests;

/** One chat call over plain HTTP: status, request id and body text. */
async function chat(model: string, content = 'hello', stream = false, signal?: AbortSignal) {
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${gw.key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model, stream, messages: [{ role: 'user', content }] }),
    signal,
  });
  return { status: res.status, id: res.headers.get('x-request-id'), retryAfter: res.headers.get('retry-after'), text: await res.text() };
}

async function records(model: string): Promise<any[]> {
  return (await gw.admin('GET', `/admin/requests?model=${model}&limit=1000`)).body.data;
}

const recordOf = (id: string | null) => eventually(async () => (await gw.admin('GET', '/admin/requests?limit=1000')).body.data.find((r: any) => r.requestId === id), `usage record ${id}`);

async function channelState(upstream: string, model: string): Promise<any> {
  const { status, body } = await gw.admin('GET', '/admin/upstreams');
  if (status !== 200) throw new Error(`GET /admin/upstreams: ${status}`);
  return body.data.find((u: any) => u.name === upstream).channels.find((c: any) => c.model === model);
}

t.test('a failing channel is passed over before the first byte: every request succeeds on the healthy one', async (t) => {
  const cases: [string, string, Record<string, unknown>][] = [
    ['a 5xx', 'm-5xx', { status: 500 }],
    ['a connection reset', 'm-reset', { reset: true }],
    // Without Retry-After: with one, the channel would also cool down for every request (test/cool-down.test.ts).
    ['a 429', 'm-429', { status: 429 }],
    ['a first-byte timeout', 'm-slow', { delayMs: 1500 }],
    ['a refused connection', 'm-refused', {}],
    ['a connect timeout', 'm-hole', {}],
  ];
  for (const [what, model, faults] of cases) {
    await setFaults(faults);
    const badBefore = await requestsSeen(bad);
    for (const stream of [false, true]) {
      let id: string | null;
      if (stream) {
        const { data, response } = await openai.chat.completions.create({ model, stream: true, messages: [{ role: 'user', content: 'hello' }] }).withResponse();
        let text = '';
        for await (const chunk of data) text += chunk.choices[0]?.delta.content ?? '';
        t.ok(text.length > 0, `${what}, streamed: an answer`);
        id = response.headers.get('x-request-id');
      } else {
        const { data, response } = await openai.chat.completions.create({ model, messages: [{ role: 'user', content: 'hello' }] }).withResponse();
        t.ok(data.choices[0]!.message.content, `${what}: an answer`);
        id = response.headers.get('x-request-id');
      }
      const record = await recordOf(id);
      t.match(record, { attempts: 2, channel: 'good', upstream: 'good', status: 200, outcome: 'finished' }, `${what}${stream ? ', streamed' : ''}: served by the second call`);
    }
    if (Object.keys(faults).length) t.equal((await requestsSeen(bad)) - badBefore, 2, `${what}: the failing simulator saw each request once`);
  }
  await setFaults({});
});

t.test('a client error is not retried: the other channel never sees it', async (t) => {
  const before = await requestsSeen(good);
  const res = await chat('m-client-error', 'hi [[sim error=400]]');
  t.equal(res.status, 400);
  t.match(await recordOf(res.id), { attempts: 1, status: 400 });
  t.equal((await requestsSeen(good)) - before, 1);
});

t.test('the breaker opens after its threshold, probes after the cool-down, reopens on failure and closes when the channel heals', async (t) => {
  await setFaults({ status: 503 });
  for (let i = 0; i < 3; i++) {
    const res = await chat('m-breaker');
    t.equal(res.status, 200);
    t.match(await recordOf(res.id), { attempts: 2, channel: 'good' });
  }
  const open = await channelState('bad', 'm-breaker');
  t.match(open, { model: 'm-breaker', channel: 'bad', priority: 0, weight: 1, state: 'open', consecutiveFailures: 3, recentRequests: 3, recentErrors: 3, lastError: /answered 503/ });
  t.ok(Date.parse(open.openedAt) <= Date.parse(open.nextProbeAt), 'openedAt and nextProbeAt are times');

  const before = await requestsSeen(bad);
  const skipped = await chat('m-breaker');
  t.match(await recordOf(skipped.id), { attempts: 1, channel: 'good' }, 'an open channel is not called');
  t.equal(await requestsSeen(bad), before);

  await eventually(async () => (await channelState('bad', 'm-breaker')).state === 'half-open', 'half-open after the cool-down', 5000);
  const probe = await chat('m-breaker');
  t.match(await recordOf(probe.id), { attempts: 2, channel: 'good' }, 'the probe failed, the request still succeeded');
  t.equal((await channelState('bad', 'm-breaker')).state, 'open', 'a failed probe opens it again');

  await eventually(async () => (await channelState('bad', 'm-breaker')).state === 'half-open', 'half-open again', 5000);
  await setFaults({});
  const healed = await chat('m-breaker');
  t.match(await recordOf(healed.id), { attempts: 1, channel: 'bad' }, 'the probe succeeded on the healed channel');
  t.match(await channelState('bad', 'm-breaker'), { state: 'closed', consecutiveFailures: 0, openedAt: null, nextProbeAt: null });
});

t.test('when every channel is open the answer is a 503 with Retry-After, at once', async (t) => {
  await setFaults({ status: 500 });
  for (let i = 0; i < 3; i++) t.equal((await chat('m-alone')).status, 502, 'a single channel has no other to try');
  const before = await requestsSeen(bad);
  const res = await chat('m-alone');
  t.equal(res.status, 503);
  t.match(JSON.parse(res.text).error, { code: 'upstream_unavailable', message: /circuit open/ });
  t.ok(Number(res.retryAfter) >= 1, 'Retry-After says when the probe goes');
  t.equal(await requestsSeen(bad), before, 'the upstream was not called');
  t.match(await recordOf(res.id), { attempts: 0, upstream: null, status: 503 });
  await setFaults({});
});

t.test("the upstream's Retry-After is waited for up to the cap; beyond it the channel is not called again", async (t) => {
  await setFaults({ status: 503, retryAfter: 60 });
  let before = await requestsSeen(bad);
  let res = await chat('m-wait');
  t.equal(res.status, 503);
  t.match(await recordOf(res.id), { attempts: 1 }, 'Retry-After 60 s is over the 5 s cap');
  t.equal((await requestsSeen(bad)) - before, 1);

  await setFaults({ status: 503, retryAfter: 1 });
  before = await requestsSeen(bad);
  res = await chat('m-wait');
  t.equal(res.status, 503);
  t.match(await recordOf(res.id), { attempts: 2, channel: 'bad' }, 'Retry-After 1 s: the same channel again');
  t.equal((await requestsSeen(bad)) - before, 2);
  await setFaults({});
});

t.test('a client that leaves during the backoff leaves nothing running', async (t) => {
  await setFaults({ status: 503 });
  const goodBefore = await requestsSeen(good);
  const controller = new AbortController();
  const pending = chat('m-backoff', 'hello', false, controller.signal).catch((err: Error) => err);
  await eventually(() => gw.logs.some((l) => l.model === 'm-backoff' && l.delayMs !== undefined), 'the backoff began');
  controller.abort();
  t.type(await pending, Error);
  const [record] = await eventually(async () => {
    const found = await records('m-backoff');
    return found.length > 0 && found;
  }, 'the usage record');
  t.match(record, { outcome: 'aborted', attempts: 1, channel: 'patient' });
  t.match(record, { promptTokens: 0, completionTokens: 0, estimated: false }, 'the failed call used nothing: no estimate is billed');
  // Longer than the longest backoff (1000 ms · 1.5): a call it had scheduled would have reached the simulator.
  await new Promise((r) => setTimeout(r, 1800));
  t.equal(await requestsSeen(good), goodBefore, 'no call after the client left');
  t.equal((await records('m-backoff')).length, 1, 'exactly one usage record');
  await setFaults({});
});

t.test('a failure after the first byte ends the stream with its failure event, without another call', async (t) => {
  const before = await requestsSeen(good);
  const res = await chat('m-midstream', 'hello [[sim tokens=5 tps=1]]', true);
  t.equal(res.status, 200);
  t.match(res.text, /"error":\{[^}]*"code":"upstream_timeout"/, 'the chat stream failure event');
  t.match(await recordOf(res.id), { attempts: 1, channel: 'idle', outcome: 'error' });
  t.equal((await requestsSeen(good)) - before, 1, 'one upstream call');
});

t.test('weights split the traffic within a priority', async (t) => {
  const served: Record<string, number> = { good: 0, alt: 0 };
  // 300 conversations: affinity keeps one conversation on one channel, and spreads many by weight.
  for (let i = 0; i < 30; i++) await Promise.all(Array.from({ length: 10 }, (_, j) => chat('m-weighted', `hi ${i}.${j} [[sim tokens=1]]`)));
  const all = await records('m-weighted');
  for (const r of all) served[r.channel]!++;
  t.equal(all.length, 300);
  const share = served.good! / 300;
  t.comment(`weights 3:1 → good ${served.good}, alt ${served.alt}`);
  t.ok(share > 0.62 && share < 0.88, `about three quarters on the weight-3 channel (${share})`);
});

t.test('each timeout fires and is named', async (t) => {
  const connectTimeout = await chat('t-connect');
  t.equal(connectTimeout.status, 504);
  t.match(JSON.parse(connectTimeout.text).error, { code: 'upstream_timeout', param: 'timeouts.connectMs', message: /did not accept a connection within 200 ms/ });

  const firstByte = await chat('t-first-byte', 'hi [[sim ttft_ms=1500]]');
  t.equal(firstByte.status, 504);
  t.match(JSON.parse(firstByte.text).error, { code: 'upstream_timeout', param: 'timeouts.firstByteMs', message: /sent no first byte within 300 ms/ });

  const idle = await chat('t-idle', 'hi [[sim tokens=5 tps=1]]', true);
  t.equal(idle.status, 200, 'the stream had started');
  t.match(idle.text, /sent nothing more within 300 ms \(timeouts\.idleMs\)/);

  const total = await chat('t-total', 'hi [[sim tokens=40 tps=20]]', true);
  t.equal(total.status, 200);
  t.match(total.text, /did not finish its answer within 500 ms \(timeouts\.totalMs\)/);
  t.match(await recordOf(total.id), { outcome: 'error', error: /timeouts\.totalMs/ });
});

t.test('the breaker also opens on its error rate over the window', async (t) => {
  const breaker = new Breaker({ failures: 100, errorRate: 0.5, windowSeconds: 60, minRequests: 4, coolDownSeconds: 30 });
  const now = Date.now();
  breaker.succeeded(now, false);
  breaker.failed(now, false, 'x');
  breaker.succeeded(now, false);
  t.equal(breaker.state(now), 'closed', 'fewer calls than minRequests');
  breaker.failed(now, false, 'y');
  t.equal(breaker.state(now), 'open', '2 of 4 failed');
  t.equal(breaker.admit(now + 29_000), undefined, 'refused while cooling down');
  t.same(breaker.admit(now + 30_000), { probe: true }, 'one probe after the cool-down');
  t.equal(breaker.admit(now + 30_000), undefined, 'and only one');
  breaker.released(true);
  t.same(breaker.admit(now + 30_000), { probe: true }, 'a probe whose client left frees the slot');
  breaker.succeeded(now + 30_000, true);
  t.match(breaker.snapshot(now + 30_000), { state: 'closed', recentRequests: 0 }, 'closed, the old calls forgotten');
  breaker.failed(now + 200_000, false, 'z');
  t.match(breaker.snapshot(now + 200_000), { state: 'closed', recentRequests: 1, recentErrors: 1 }, 'the window moved on');
});

t.test('a rebuilt channel table keeps the breakers of channels that did not change', async (t) => {
  const yaml = (retries: number) => `
upstreams:
  a: { kind: simulator }
  b: { kind: simulator, retry: { attempts: ${retries} } }
models:
  - { id: m, channels: [{ upstream: a }, { upstream: b }] }
`;
  const { writeFileSync, mkdtempSync } = await import('node:fs');
  const { join } = await import('node:path');
  const { tmpdir } = await import('node:os');
  const dir = mkdtempSync(join(tmpdir(), 'sluice-channels-'));
  const load = (retries: number) => {
    writeFileSync(join(dir, 'c.yaml'), yaml(retries));
    return loadConfig({ path: join(dir, 'c.yaml'), env: {} });
  };
  const config = load(2);
  const upstreams = new Map(Object.keys(config.upstreams).map((n) => [n, simulatorUpstream(n, {})]));
  const first = new ChannelTable(config.models, config.upstreams, upstreams);
  for (const c of first.of('m')) c.breaker.failed(Date.now(), false, 'boom');
  const same = new ChannelTable(load(2).models, load(2).upstreams, upstreams, first);
  t.equal(same.of('m')[0]!.breaker, first.of('m')[0]!.breaker, 'unchanged: the same breaker');
  t.equal(same.of('m')[1]!.breaker, first.of('m')[1]!.breaker);
  const changed = new ChannelTable(load(3).models, load(3).upstreams, upstreams, first);
  t.same(changed.of('m').map((c) => c.breaker.snapshot(Date.now()).consecutiveFailures), [1, 0], 'a changed upstream starts afresh');
  t.equal(changed.of('m')[1]!.retry.attempts, 3);
});
