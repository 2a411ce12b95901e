/**
 * `server.overheadHeader`: every answer says how long it spent in the gateway, the upstream's time
 * left out. The upstream here waits 1.5 s before answering: counted in, the header could not be
 * below that; left out, it is the gateway's own few milliseconds.
 */
import t from 'tap';
import { startTestGateway, type TestGateway } from './helpers.js';

const WAIT_MS = 1500;
const yaml = (server: string) => (dataDir: string) => `dataDir: ${dataDir}
${server}
upstreams:
  sim: { kind: simulator }
  sim-messages: { kind: simulator, family: messages }
models:
  - { id: m, upstream: sim, upstreamModel: sim-chat }
  - { id: claude, upstream: sim-messages, upstreamModel: sim-messages }
`;

const chat = (gw: TestGateway, stream: boolean, key = gw.key) =>
  fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'm', stream, messages: [{ role: 'user', content: `Hi [[sim ttft_ms=${WAIT_MS} tokens=5]]` }] }),
  });

t.test('with server.overheadHeader, every answer carries the gateway time without the upstream wait', async (t) => {
  const gw = await startTestGateway(yaml('server: { overheadHeader: true }'));
  t.teardown(() => gw.stop());
  const [whole, streamed, messages] = await Promise.all([
    chat(gw, false),
    chat(gw, true),
    fetch(`${gw.url}/v1/messages`, {
      method: 'POST',
      headers: { 'x-api-key': gw.key, 'anthropic-version': '2023-06-01', 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'claude', max_tokens: 16, messages: [{ role: 'user', content: `Hi [[sim ttft_ms=${WAIT_MS}]]` }] }),
    }),
  ]);
  for (const [what, res] of [['a whole answer', whole], ['a stream', streamed], ['Messages', messages]] as const) {
    t.equal(res.status, 200, what);
    const header = res.headers.get('x-sluice-overhead-ms');
    t.match(header, /^\d+\.\d\d$/, `${what}: milliseconds with two decimals`);
    t.ok(Number(header) < WAIT_MS, `${what}: ${header} ms, the upstream's ${WAIT_MS} ms wait left out`);
    await res.arrayBuffer();
  }
  const local = await chat(gw, false, 'sk-not-a-key');
  t.equal(local.status, 401);
  t.ok(local.headers.has('x-sluice-overhead-ms'), 'a local answer carries it too (all of it the gateway’s)');
});

t.test('off by default', async (t) => {
  const gw = await startTestGateway(yaml(''));
  t.teardown(() => gw.stop());
  const res = await chat(gw, false);
  t.equal(res.status, 200);
  t.equal(res.headers.get('x-sluice-overhead-ms'), null);
});
