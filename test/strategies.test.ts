/**
 * A model's `strategy` among the channels of one priority, against simulator processes:
 * `least-latency` sends the traffic to the channel that answers sooner once both are measured,
 * `least-busy` to the one with fewer calls under way; GET /admin/upstreams shows both numbers.
 */
import t from 'tap';
import { eventually, startSimulatorProcess, startTestGateway } from './helpers.js';

const fast = await startSimulatorProcess();
const slow = await startSimulatorProcess();
t.teardown(() => Promise.all([fast.stop(), slow.stop()]));
// Every answer of `slow` waits 300 ms before its first byte.
await fetch(`${slow.url}/faults`, { method: 'POST', body: JSON.stringify({ delayMs: 300 }) });

const gw = await startTestGateway(
  (dataDir) => `dataDir: ${dataDir}
upstreams:
  fast: { kind: openai-chat, baseUrl: "${fast.url}/v1" }
  fast-too: { kind: openai-chat, baseUrl: "${fast.url}/v1" }
  slow: { kind: openai-chat, baseUrl: "${slow.url}/v1" }
models:
  # Warms both upstreams' connections first: a cold first call would measure the connection, not the upstream.
  - id: warm
    channels: [{ upstream: slow, upstreamModel: sim-chat }, { upstream: fast, upstreamModel: sim-chat }]
  - id: quickest
    strategy: least-latency
    channels: [{ upstream: slow, upstreamModel: sim-chat }, { upstream: fast, upstreamModel: sim-chat }]
  - id: spread
    strategy: least-busy
    channels: [{ upstream: fast, upstreamModel: sim-chat }, { upstream: fast-too, upstreamModel: sim-chat }]
`,
);
t.teardown(() => gw.stop());

const chat = (model: string, content: string, stream = false) =>
  fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${gw.key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model, stream, messages: [{ role: 'user', content }] }),
  }).then(async (r) => ({ status: r.status, id: r.headers.get('x-request-id')!, text: await r.text() }));

/** The channel that served each of `ids`, from the usage records. */
async function servedBy(model: string, ids: string[]): Promise<string[]> {
  const records = await eventually(async () => {
    const data = (await gw.admin('GET', `/admin/requests?model=${model}&limit=1000`)).body.data as { requestId: string; channel: string }[];
    return ids.every((id) => data.some((r) => r.requestId === id)) && data;
  }, `the records of ${model}`);
  return ids.map((id) => records.find((r) => r.requestId === id)!.channel);
}

type Report = { data: { name: string; channels: { model: string; latencyMs: number | null; inFlight: number }[] }[] };

t.test('least-latency: once both channels are measured, the faster one serves', async (t) => {
  for (let i = 0; i < 6; i++) t.equal((await chat('warm', `Warm-up ${i} [[sim tokens=3]]`)).status, 200);
  const ids: string[] = [];
  // Each request its own conversation: affinity would otherwise keep one on its first channel.
  for (let i = 0; i < 20; i++) {
    const res = await chat('quickest', `Question ${i} [[sim tokens=3]]`);
    t.equal(res.status, 200);
    ids.push(res.id);
  }
  const channels = await servedBy('quickest', ids);
  // A channel not yet measured is tried first, so the slow one serves once; a latency spike of the
  // fast one on a busy machine may hand it one or two more.
  const onSlow = channels.filter((c) => c === 'slow').length;
  t.ok(onSlow >= 1 && onSlow <= 3, `the slow channel served ${onSlow} of 20, to be measured (${channels.join(' ')})`);
  const report = ((await gw.admin('GET', '/admin/upstreams')).body as Report).data;
  const latency = (name: string) => report.find((u) => u.name === name)!.channels.find((c) => c.model === 'quickest')!.latencyMs!;
  t.ok(latency('slow') >= 300, `the slow channel's average: ${latency('slow')} ms`);
  t.ok(latency('fast') < latency('slow'), `the fast one's: ${latency('fast')} ms`);
});

t.test('least-busy: simultaneous streams alternate between the channels', async (t) => {
  // 10 streams of half a second each, all under way together.
  const all = await Promise.all(Array.from({ length: 10 }, (_, i) => chat('spread', `Stream ${i} [[sim tokens=20 tps=40]]`, true)));
  t.ok(all.every((r) => r.status === 200));
  const channels = await servedBy('spread', all.map((r) => r.id));
  t.equal(channels.filter((c) => c === 'fast').length, 5, `five each (${channels.join(' ')})`);
  const report = ((await gw.admin('GET', '/admin/upstreams')).body as Report).data;
  t.ok(report.every((u) => u.channels.every((c) => c.inFlight === 0)), 'nothing left in flight');
});
