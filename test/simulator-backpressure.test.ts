/**
 * The in-process simulator honours backpressure like a real upstream (issue 21, item 4): a client
 * that never reads a long stream holds the gateway's memory to a bounded amount per stream, not the
 * whole reply. The reply's frames are made as the consumer takes them, a bounded step at a time;
 * nothing more is made while the consumer is paused; an abort stops it.
 *
 * The unit part drives the simulator upstream with a sink that reports a full buffer. The
 * end-to-end part runs the gateway on its embedded default as its own process (the start script's
 * command line, one worker), holds N streaming requests whose clients never read, and reads the
 * process's resident memory from /proc while they are held.
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import type { ResponseSink } from '../src/contracts.js';
import { simulatorUpstream } from '../plugins/upstreams/simulator/index.js';
import { startedGateway } from './helpers.js';

t.setTimeout(300_000);

/** Streams held open by clients that never read. */
const STREAMS = 200;
/** The length of each reply: the most the embedded default's sim-chat allows (maxOutputTokens.max). */
const TOKENS = 8192;
/** The length of the reply the unit part plays. */
const LONG_TOKENS = 50_000;
/**
 * Peak growth of the gateway's resident memory per held stream (an answer of 8192 tokens is about
 * 2.3 MB of events). Measured with 200 such streams opened at once, one worker and the start
 * script's flags: before this change about 4.1 MB per stream (5.7 MB with 100: the whole answer
 * rendered up front as one string, then its bytes as a Buffer, held until the client reads);
 * after it about 0.6 MB, most of that a young generation of up to 2 x 64 MB not yet collected.
 * What the client does not take waits in the kernel's socket buffers, which RSS does not count.
 */
const MAX_GROWTH_PER_STREAM = 2 * 1024 * 1024;
/** The largest step the in-process simulator hands over at once. */
const MAX_STEP_BYTES = 64 * 1024;

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

t.test('the in-process stream makes no frames while the consumer is paused', async (t) => {
  const upstream = simulatorUpstream('sim', {});
  let chunks = 0;
  let bytes = 0;
  let largest = 0;
  let ended = false;
  let full = true;
  const sink: ResponseSink = {
    start: () => {},
    data: (chunk) => {
      chunks++;
      bytes += chunk.length;
      largest = Math.max(largest, chunk.length);
      return !full;
    },
    end: () => (ended = true),
    error: () => (ended = true),
  };
  const body = JSON.stringify({ model: 'sim-chat', stream: true, messages: [{ role: 'user', content: `[[sim tokens=${LONG_TOKENS}]] go` }] });
  const call = upstream.send({ method: 'POST', path: '/chat/completions', headers: {}, body: Buffer.from(body) }, sink);
  await t.resolveMatch(waitFor(() => chunks > 0), true, 'the first step arrives');
  t.ok(largest <= MAX_STEP_BYTES, `a step is at most ${MAX_STEP_BYTES} bytes (the first was ${largest})`);
  await sleep(200);
  t.equal(chunks, 1, 'nothing more while the sink is full');

  full = false;
  call.resume();
  await t.resolveMatch(waitFor(() => ended, 60_000), true, 'resumed, the stream runs to its end');
  t.ok(chunks > 10, `in many bounded steps (${chunks})`);
  t.ok(largest <= MAX_STEP_BYTES, `none over ${MAX_STEP_BYTES} bytes (largest ${largest})`);
  t.ok(bytes > LONG_TOKENS * 100, 'the whole reply went out');

  // Paused midway, then aborted: nothing more, not even the end.
  chunks = 0;
  ended = false;
  full = false;
  let seen = 0;
  const paused = upstream.send({ method: 'POST', path: '/chat/completions', headers: {}, body: Buffer.from(body) }, {
    ...sink,
    data: (chunk) => {
      seen++;
      bytes += chunk.length;
      return seen < 3;
    },
  });
  await waitFor(() => seen >= 3);
  await sleep(100);
  t.equal(seen, 3, 'held after the sink said full');
  paused.abort();
  paused.resume();
  await sleep(100);
  t.equal(seen, 3, 'an aborted stream makes nothing more, resumed or not');
  t.notOk(ended, 'nor ends');
});

async function waitFor(check: () => boolean, ms = 30_000): Promise<boolean> {
  const until = Date.now() + ms;
  while (!check()) {
    if (Date.now() > until) return false;
    await sleep(10);
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// End to end: the gateway as its own process.

const scratch = mkdtempSync(join(tmpdir(), 'sluice-backpressure-'));
t.teardown(() => rmSync(scratch, { recursive: true, force: true }));
const ADMIN_TOKEN = 'backpressure-admin-token-0123456789abcdef';
const start = () => startedGateway({ SLUICE_WORKERS: '1', SLUICE_ADMIN_TOKEN: ADMIN_TOKEN, SLUICE_DATA_DIR: join(scratch, 'data') }, scratch);

/** The process's resident set size in bytes, from /proc. */
function rss(pid: number): number {
  const kb = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1];
  return Number(kb) * 1024;
}

/** RSS once it has settled: two samples 500 ms apart within 2 MB of each other (or the bound passed). */
async function settledRss(pid: number, boundMs = 30_000): Promise<number> {
  const until = Date.now() + boundMs;
  let last = rss(pid);
  for (;;) {
    await sleep(500);
    const now = rss(pid);
    if (Math.abs(now - last) < 2 * 1024 * 1024 || Date.now() > until) return now;
    last = now;
  }
}

/** A streaming chat request for the longest answer sim-chat gives. */
function streamBody(): string {
  return JSON.stringify({
    model: 'sim-chat',
    stream: true,
    max_completion_tokens: TOKENS,
    messages: [{ role: 'user', content: `[[sim tokens=${TOKENS}]] tell me everything` }],
  });
}

/** A streaming chat request on a raw socket whose reader never reads past the status line. */
function attacker(port: number, demoKey: string): Promise<Socket> {
  const body = streamBody();
  return new Promise((resolve, reject) => {
    const socket = connect({ host: '127.0.0.1', port });
    let head = '';
    const onData = (d: Buffer) => {
      head += d.toString('latin1');
      if (!head.includes('\r\n')) return;
      // Seen the status line: stop reading for good.
      socket.off('data', onData);
      socket.pause();
      if (head.startsWith('HTTP/1.1 200')) resolve(socket);
      else reject(new Error(`the stream was refused: ${head.slice(0, 200)}`));
    };
    socket.on('data', onData);
    socket.on('error', reject);
    socket.write(
      `POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer ${demoKey}\r\ncontent-type: application/json\r\n` +
        `content-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
    );
  });
}

async function inFlight(url: string): Promise<number> {
  const res = await fetch(`${url}/metrics`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } });
  const text = await res.text();
  const line = /^sluice_in_flight(?:\{[^}]*\})? (\d+)/m.exec(text);
  if (!line) throw new Error(`no sluice_in_flight in /metrics (${res.status}): ${text.slice(0, 300)}`);
  return Number(line[1]);
}

t.test('clients that never read hold a bounded amount of memory per stream', async (t) => {
  const gw = await start();
  t.teardown(() => gw.stop());
  const pid = gw.child.pid!;
  const demoKey = gw.demoKey!;
  const auth = { authorization: `Bearer ${demoKey}`, 'content-type': 'application/json' };

  // Warm up the paths the attack takes, so their one-time costs are not counted per stream.
  const warm = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: auth, body: streamBody() });
  t.equal(warm.status, 200, 'a stream read to its end');
  t.ok((await warm.text()).length > TOKENS * 100, 'the whole long answer');
  const before = await settledRss(pid);

  // Resident memory is sampled throughout: the peak while the streams are opened and held.
  let peak = before;
  const sampler = setInterval(() => {
    try {
      peak = Math.max(peak, rss(pid));
    } catch {
      // Gone: the test fails on what follows.
    }
  }, 100);
  t.teardown(() => clearInterval(sampler));
  const sockets: Socket[] = [];
  t.teardown(() => sockets.forEach((s) => s.destroy()));
  // All at once, as an attack comes.
  const opened = await Promise.allSettled(Array.from({ length: STREAMS }, () => attacker(gw.port, demoKey)));
  for (const o of opened) if (o.status === 'fulfilled') sockets.push(o.value);
  const refused = opened.find((o) => o.status === 'rejected');
  if (refused) t.fail(String(refused.reason));
  t.equal(sockets.length, STREAMS, `${STREAMS} streams answered and left unread`);
  const held = await settledRss(pid);
  await sleep(1000);
  clearInterval(sampler);
  peak = Math.max(peak, held, rss(pid));
  const perStream = (peak - before) / STREAMS;
  const mb = (bytes: number) => (bytes / 2 ** 20).toFixed(0);
  t.comment(`RSS ${mb(before)} MB before, ${mb(held)} MB settled and ${mb(peak)} MB at most with ${STREAMS} unread streams: ${(perStream / 1024).toFixed(0)} KB per stream`);
  t.ok(perStream < MAX_GROWTH_PER_STREAM, `peak growth per held stream under ${MAX_GROWTH_PER_STREAM / 2 ** 20} MB (${(perStream / 1024).toFixed(0)} KB)`);

  // The gateway still answers others while they are held.
  const healthStarted = Date.now();
  const health = await fetch(`${gw.url}/healthz`);
  t.equal(health.status, 200, `/healthz answers (in ${Date.now() - healthStarted} ms)`);
  const chat = await fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: auth,
    body: JSON.stringify({ model: 'sim-chat', messages: [{ role: 'user', content: 'Hello!' }] }),
  });
  t.equal(chat.status, 200, 'a normal chat answers');
  t.match(((await chat.json()) as any).choices?.[0]?.message?.content, /\S/);

  // The attackers leave: every stream is ended and accounted for.
  for (const s of sockets) s.destroy();
  let left = -1;
  const until = Date.now() + 30_000;
  while (Date.now() < until && (left = await inFlight(gw.url)) !== 0) await sleep(200);
  t.equal(left, 0, 'no exchange left in flight after the clients go');
});
