/**
 * `npm run soak -- --minutes N [--concurrency C]`: mixed traffic over every family (streamed and
 * not, tools, JSON output, WebSocket turns) with injected upstream faults (5xx, 429, cuts mid-
 * stream, stalls past the first-byte timeout), client aborts and slow readers, against the
 * gateway and the simulator each in its own process. Prints requests, outcomes by kind, p50/p99,
 * the gateway's RSS and open descriptors at start and end, and usage records against requests.
 */
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import WebSocket from 'ws';
import { spawnUntil, SERVE_FLAGS } from './e2e.js';

const { values } = parseArgs({ options: { minutes: { type: 'string', default: '1' }, concurrency: { type: 'string', default: '16' } } });
const minutes = Number(values.minutes);
const concurrency = Number(values.concurrency);
const dist = fileURLToPath(new URL('..', import.meta.url));

interface Shot {
  kind: string;
  run(): Promise<string>;
}

const outcomes = new Map<string, number>();
const latencies: number[] = [];
let sent = 0;

const count = (key: string) => outcomes.set(key, (outcomes.get(key) ?? 0) + 1);
const pick = <T>(items: T[]) => items[Math.floor(Math.random() * items.length)]!;

function processStats(pid: number): { rssMb: number; fds: number } {
  const rss = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1];
  return { rssMb: Math.round(Number(rss) / 1024), fds: readdirSync(`/proc/${pid}/fd`).length };
}

const TIMEOUTS = '{ firstByteMs: 1000, idleMs: 2000 }';
/** The injected faults would open the breakers, and the soak would measure 503s: it is about the gateway's own lifecycle. */
const NEVER_OPEN = '{ failures: 1000000, errorRate: 1 }';

async function main(): Promise<void> {
  const dataDir = mkdtempSync(join(tmpdir(), 'sluice-soak-'));
  const sim = await spawnUntil([join(dist, 'plugins/upstreams/simulator/server.js'), '--port', '0'], {}, /listening on (http:\/\/127\.0\.0\.1:\d+)/);
  const simUrl = sim.match[1]!;
  const config = join(dataDir, 'soak.yaml');
  writeFileSync(
    config,
    `server: { writeStallMs: 5000, shutdownTimeoutMs: 2000 }
log: { level: warn }
upstreams:
  chat: { kind: openai-chat, baseUrl: "${simUrl}/v1", timeouts: ${TIMEOUTS}, breaker: ${NEVER_OPEN} }
  responses: { kind: openai-responses, baseUrl: "${simUrl}/v1", timeouts: ${TIMEOUTS}, breaker: ${NEVER_OPEN} }
  gemini: { kind: gemini, baseUrl: "${simUrl}/v1beta", apiKey: k, timeouts: ${TIMEOUTS}, breaker: ${NEVER_OPEN} }
models:
  - { id: sim-chat, upstream: chat }
  - { id: sim-responses, upstream: responses }
  - { id: sim-gemini, upstream: gemini }
`,
  );
  const gw = await spawnUntil(
    [...SERVE_FLAGS, join(dist, 'src/main.js'), 'serve', '--config', config],
    { SLUICE_PORT: '0', SLUICE_DATA_DIR: dataDir, SLUICE_LOG_LEVEL: 'info' },
    /demo key[^:]*: (sk-\S+)[\s\S]*"url":"(http:\/\/127\.0\.0\.1:\d+)"/,
  );
  gw.child.stdout!.resume();
  gw.child.stderr!.resume();
  const [, key, url] = gw.match as unknown as [string, string, string];
  const adminToken = readFileSync(join(dataDir, 'admin-token'), 'utf8').trim();
  const startedAt = Date.now();

  const prompts = ['hello [[sim tokens=40]]', 'a longer one [[sim tokens=400]]', 'short', 'fail [[sim error=500]]', 'busy [[sim error=429]]', 'cut [[sim tokens=200 cut_after=20]]', 'stall [[sim ttft_ms=1500]]'];
  const tools = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];

  /** Sends one request and reads the answer the way `mode` says; the outcome is its status and how the body ended. */
  const http = async (path: string, headers: Record<string, string>, body: unknown, mode: 'read' | 'abort' | 'slow'): Promise<string> => {
    const controller = new AbortController();
    sent++;
    const res = await fetch(url + path, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body), signal: controller.signal });
    const reader = res.body!.getReader();
    let tail = '';
    for (let n = 0; ; n++) {
      if (mode === 'abort' && n === 1) {
        controller.abort();
        return `${res.status} aborted by client`;
      }
      if (mode === 'slow') await new Promise((r) => setTimeout(r, 20));
      const { value, done } = await reader.read().catch(() => ({ value: undefined, done: true }));
      if (done) break;
      tail = (tail + Buffer.from(value!).toString()).slice(-4000);
    }
    const failed = /"error":\s*\{|response\.failed/.test(tail);
    return `${res.status}${res.status === 200 && failed ? ' stream failed' : ''}`;
  };

  const bearer = { authorization: `Bearer ${key}` };
  const shots: Shot[] = [
    { kind: 'chat', run: () => http('/v1/chat/completions', bearer, { model: 'sim-chat', messages: [{ role: 'user', content: pick(prompts) }] }, 'read') },
    { kind: 'chat stream', run: () => http('/v1/chat/completions', bearer, { model: 'sim-chat', stream: true, messages: [{ role: 'user', content: pick(prompts) }] }, pick(['read', 'abort', 'slow'])) },
    { kind: 'chat tools', run: () => http('/v1/chat/completions', bearer, { model: 'sim-chat', stream: true, tools, messages: [{ role: 'user', content: 'weather?' }] }, 'read') },
    {
      kind: 'chat json',
      run: () =>
        http('/v1/chat/completions', bearer, { model: 'sim-gemini', response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', properties: { a: { type: 'string' } } } } }, messages: [{ role: 'user', content: 'json' }] }, 'read'),
    },
    { kind: 'responses', run: () => http('/v1/responses', bearer, { model: pick(['sim-responses', 'sim-chat']), input: pick(prompts) }, 'read') },
    { kind: 'responses stream', run: () => http('/v1/responses', bearer, { model: pick(['sim-responses', 'sim-chat', 'sim-gemini']), stream: true, input: pick(prompts) }, pick(['read', 'abort', 'slow'])) },
    { kind: 'gemini', run: () => http('/v1beta/models/sim-gemini:generateContent', { 'x-goog-api-key': key }, { contents: [{ role: 'user', parts: [{ text: pick(prompts) }] }] }, 'read') },
    {
      kind: 'gemini stream',
      run: () => http(`/v1beta/models/${pick(['sim-gemini', 'sim-chat'])}:streamGenerateContent?alt=sse`, { 'x-goog-api-key': key }, { contents: [{ role: 'user', parts: [{ text: pick(prompts) }] }] }, pick(['read', 'abort'])),
    },
    { kind: 'websocket turns', run: () => websocketTurns(url, key) },
  ];

  const deadline = startedAt + minutes * 60_000;
  let start: { rssMb: number; fds: number } | undefined;
  const worker = async () => {
    while (Date.now() < deadline) {
      const shot = pick(shots);
      const began = performance.now();
      const outcome = await shot.run().catch((err: Error) => `client error: ${err.message.slice(0, 60)}`);
      latencies.push(performance.now() - began);
      count(`${shot.kind}: ${outcome}`);
      // Warm up for ten seconds before taking the starting figures.
      if (!start && Date.now() - startedAt > 10_000) start = processStats(gw.child.pid!);
    }
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
  await new Promise((r) => setTimeout(r, 2500));
  const end = processStats(gw.child.pid!);

  // The last exchanges may end after their clients did: a client that left a stream it was behind
  // on is noticed at the gateway's next probe.
  const usageRecords = async () =>
    ((await (await fetch(`${url}/admin/usage?limit=1`, { headers: { authorization: `Bearer ${adminToken}` } })).json()) as { totals: { requests: number } }).totals.requests;
  let records = await usageRecords();
  for (const until = Date.now() + 10_000; records < sent && Date.now() < until; records = await usageRecords()) await new Promise((r) => setTimeout(r, 250));
  latencies.sort((a, b) => a - b);
  const at = (q: number) => Math.round(latencies[Math.min(latencies.length - 1, Math.floor(q * latencies.length))]!);
  console.log(`soak: ${minutes} min, ${concurrency} clients`);
  console.log(`requests sent (WebSocket turns counted one by one): ${sent}; usage records: ${records}`);
  console.log(`latency p50 ${at(0.5)} ms, p99 ${at(0.99)} ms (whole exchange, slow readers and stalls included)`);
  console.log(`gateway RSS ${start?.rssMb} MB → ${end.rssMb} MB; open descriptors ${start?.fds} → ${end.fds}`);
  console.table([...outcomes].sort().map(([outcome, n]) => ({ outcome, n })));
  gw.child.kill('SIGTERM');
  sim.child.kill('SIGTERM');
  await new Promise((r) => setTimeout(r, 500));
  rmSync(dataDir, { recursive: true, force: true });
  if (records !== sent) process.exitCode = 1;
}

/** Two chained turns on one Responses WebSocket. */
function websocketTurns(url: string, key: string): Promise<string> {
  return new Promise((resolve) => {
    const ws = new WebSocket(`${url.replace('http', 'ws')}/v1/responses`, { headers: { authorization: `Bearer ${key}` } });
    const results: string[] = [];
    let previous: string | undefined;
    // Counted when sent: a socket that fails to open sends none.
    const turn = () => (sent++, ws.send(JSON.stringify({ type: 'response.create', model: pick(['sim-responses', 'sim-chat']), input: pick(['hi [[sim tokens=30]]', 'fail [[sim error=500]]']), ...(previous && { previous_response_id: previous }) })));
    ws.on('open', turn);
    ws.on('message', (data) => {
      const event = JSON.parse(data.toString());
      if (!['response.completed', 'response.failed', 'error'].includes(event.type)) return;
      results.push(event.type);
      previous = event.type === 'response.completed' ? event.response.id : undefined;
      if (results.length === 2) ws.close();
      else turn();
    });
    ws.on('close', () => resolve(results.join(' + ') || 'closed'));
    ws.on('error', () => resolve('socket error'));
  });
}

await main();
