/**
 * End-to-end harness: the same load sent straight to the simulator and through Sluice, in one
 * run, each in its own process, so the figures that matter are the ratios Sluice/direct.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Pool } from 'undici';
import { scaleRows } from './scale.js';
import { readStartScript } from './start-script.js';

const dist = fileURLToPath(new URL('..', import.meta.url));

/** Node's flags for a gateway: those `npm start` passes, so that the benches run what users run. */
export const SERVE_FLAGS = readStartScript(join(dist, '..')).flags;

interface Spawned {
  child: ChildProcess;
  output: string;
}

/** Starts a process and resolves once its output matches `ready`. */
export function spawnUntil(args: string[], env: NodeJS.ProcessEnv, ready: RegExp): Promise<Spawned & { match: RegExpExecArray }> {
  const child = spawn(process.execPath, args, { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  const spawned = { child, output: '' };
  return new Promise((resolve, reject) => {
    const onData = (d: Buffer) => {
      if (spawned.output.length < 100_000) spawned.output += d.toString();
      const match = ready.exec(spawned.output);
      if (match) resolve({ ...spawned, match });
    };
    child.stdout!.on('data', onData);
    child.stderr!.on('data', onData);
    child.once('exit', (code) => reject(new Error(`${args[0]} exited (${code}):\n${spawned.output}`)));
  });
}

export interface LoadResult {
  requests: number;
  seconds: number;
  reqPerSec: number;
  p50Ms: number;
  p99Ms: number;
  ttfbMs: number;
  framesPerSec: number;
  mbPerSec: number;
}

export interface Load {
  url: string;
  headers: Record<string, string>;
  body: string;
  requests: number;
  concurrency: number;
}

const LF_LF = Buffer.from('\n\n');

export async function runLoad({ url, headers, body, requests, concurrency }: Load): Promise<LoadResult> {
  const { origin, pathname, search } = new URL(url);
  const pool = new Pool(origin, { connections: concurrency, keepAliveTimeout: 10_000 });
  const latencies: number[] = [];
  const ttfbs: number[] = [];
  let frames = 0;
  let bytes = 0;
  let next = 0;
  const started = performance.now();
  const worker = async () => {
    while (next < requests) {
      next++;
      const t0 = performance.now();
      const res = await pool.request({ method: 'POST', path: pathname + search, headers: { 'content-type': 'application/json', ...headers }, body });
      if (res.statusCode !== 200) throw new Error(`${url} answered ${res.statusCode}: ${await res.body.text()}`);
      let first = true;
      for await (const chunk of res.body as AsyncIterable<Buffer>) {
        if (first) (ttfbs.push(performance.now() - t0), (first = false));
        bytes += chunk.length;
        for (let at = chunk.indexOf(LF_LF); at >= 0; at = chunk.indexOf(LF_LF, at + 2)) frames++;
      }
      latencies.push(performance.now() - t0);
    }
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
  const seconds = (performance.now() - started) / 1000;
  await pool.close();
  latencies.sort((a, b) => a - b);
  ttfbs.sort((a, b) => a - b);
  const pct = (xs: number[], p: number) => xs[Math.min(xs.length - 1, Math.floor(xs.length * p))]!;
  return {
    requests,
    seconds,
    reqPerSec: requests / seconds,
    p50Ms: pct(latencies, 0.5),
    p99Ms: pct(latencies, 0.99),
    ttfbMs: pct(ttfbs, 0.5),
    framesPerSec: frames / seconds,
    mbPerSec: bytes / seconds / 1e6,
  };
}

export type Family = 'chat' | 'responses' | 'gemini';

export interface Scenario {
  name: string;
  /** The client's wire family: the same request goes straight to the simulator and through Sluice. */
  family: Family;
  /** The model Sluice routes; each sits behind an upstream of the family its name says. */
  model: 'sim-chat' | 'sim-responses' | 'sim-gemini';
  prompt: string;
  stream: boolean;
  requests: number;
  concurrency: number;
}

const long = 'long [[sim tokens=4000]]';
export const scenarios: Scenario[] = [
  { name: 'chat, non-stream, 16 tokens', family: 'chat', model: 'sim-chat', prompt: 'hi [[sim tokens=16]]', stream: false, requests: 4000, concurrency: 32 },
  { name: 'chat, stream, 16 tokens', family: 'chat', model: 'sim-chat', prompt: 'hi [[sim tokens=16]]', stream: true, requests: 4000, concurrency: 32 },
  { name: 'chat passthrough, 4000 tokens', family: 'chat', model: 'sim-chat', prompt: long, stream: true, requests: 300, concurrency: 8 },
  { name: 'chat on gemini upstream, 4000 tokens', family: 'chat', model: 'sim-gemini', prompt: long, stream: true, requests: 100, concurrency: 8 },
  { name: 'responses passthrough, 4000 tokens', family: 'responses', model: 'sim-responses', prompt: long, stream: true, requests: 200, concurrency: 8 },
  { name: 'responses bridged to chat, 4000 tokens', family: 'responses', model: 'sim-chat', prompt: long, stream: true, requests: 200, concurrency: 8 },
  { name: 'gemini passthrough, 4000 tokens', family: 'gemini', model: 'sim-gemini', prompt: long, stream: true, requests: 100, concurrency: 8 },
  { name: 'gemini on chat upstream, 4000 tokens', family: 'gemini', model: 'sim-chat', prompt: long, stream: true, requests: 100, concurrency: 8 },
];

/** The simulator's own model for each family: the direct baseline. */
export const nativeModel: Record<Family, string> = { chat: 'sim-chat', responses: 'sim-responses', gemini: 'sim-gemini' };

export function requestFor(family: Family, model: string, s: Scenario): { path: string; body: string } {
  if (family === 'gemini') {
    const path = `/v1beta/models/${model}:${s.stream ? 'streamGenerateContent?alt=sse' : 'generateContent'}`;
    return { path, body: JSON.stringify({ contents: [{ role: 'user', parts: [{ text: s.prompt }] }] }) };
  }
  if (family === 'responses') return { path: '/v1/responses', body: JSON.stringify({ model, input: s.prompt, stream: s.stream }) };
  return { path: '/v1/chat/completions', body: JSON.stringify({ model, messages: [{ role: 'user', content: s.prompt }], stream: s.stream }) };
}

export const authFor = (family: Family, key: string): Record<string, string> => (family === 'gemini' ? { 'x-goog-api-key': key } : { authorization: `Bearer ${key}` });

/** Every scenario's model, each behind an upstream of its family on the simulator at `simUrl`. */
export function sluiceConfig(simUrl: string): string {
  return [
    'upstreams:',
    `  chat: { kind: openai-chat, baseUrl: "${simUrl}/v1" }`,
    `  responses: { kind: openai-responses, baseUrl: "${simUrl}/v1" }`,
    `  gemini: { kind: gemini, baseUrl: "${simUrl}/v1beta" }`,
    'models:',
    // Priced, so a budget's reservation and reconciliation do their real work in the limits row.
    '  - { id: sim-chat, upstream: chat, prices: { input: 2.5, cachedInput: 1.25, output: 10 } }',
    '  - { id: sim-responses, upstream: responses }',
    '  - { id: sim-gemini, upstream: gemini }',
  ].join('\n');
}

export async function runE2e(): Promise<Record<string, string>[]> {
  const dataDir = mkdtempSync(join(tmpdir(), 'sluice-bench-'));
  const procs: ChildProcess[] = [];
  try {
    const sim = await spawnUntil([join(dist, 'plugins/upstreams/simulator/server.js'), '--port', '0'], {}, /listening on (http:\/\/127\.0\.0\.1:\d+)/);
    procs.push(sim.child);
    const simUrl = sim.match[1]!;
    const config = join(dataDir, 'sluice.yaml');
    writeFileSync(config, sluiceConfig(simUrl));
    const gw = await spawnUntil(
      [...SERVE_FLAGS, join(dist, 'src/main.js'), 'serve', '--config', config],
      // One thread, as the ratios have always been measured; the scale rows compare thread counts.
      { SLUICE_PORT: '0', SLUICE_DATA_DIR: dataDir, SLUICE_LOG_LEVEL: 'info', SLUICE_WORKERS: '1' },
      /demo key[^:]*: (sk-\S+)[\s\S]*"url":"(http:\/\/127\.0\.0\.1:\d+)"/,
    );
    procs.push(gw.child);
    // Keep draining the gateway's access log, as a deployment's log shipper would.
    gw.child.stdout!.resume();
    const [, key, gatewayUrl] = gw.match;

    const rows: Record<string, string>[] = [];
    const passthrough = new Map<Family, LoadResult>();
    for (const s of scenarios) {
      const straight = requestFor(s.family, nativeModel[s.family], s);
      const through = requestFor(s.family, s.model, s);
      const direct: Load = { url: simUrl + straight.path, headers: {}, body: straight.body, requests: s.requests, concurrency: s.concurrency };
      const viaSluice: Load = { url: gatewayUrl + through.path, headers: authFor(s.family, key!), body: through.body, requests: s.requests, concurrency: s.concurrency };
      await runLoad({ ...direct, requests: 200 });
      await runLoad({ ...viaSluice, requests: 200 });
      const d = await runLoad(direct);
      const g = await runLoad(viaSluice);
      const row = (path: string, r: LoadResult, ratio?: LoadResult) => ({
        scenario: s.name,
        path,
        'req/s': r.reqPerSec.toFixed(0),
        'p50 ms': r.p50Ms.toFixed(2),
        'p99 ms': r.p99Ms.toFixed(2),
        'ttfb ms': r.ttfbMs.toFixed(2),
        'frames/s': s.stream ? r.framesPerSec.toFixed(0) : '-',
        'MB/s': r.mbPerSec.toFixed(1),
        'sluice/direct': ratio ? `req/s ${(r.reqPerSec / ratio.reqPerSec).toFixed(2)}, p50 ${(r.p50Ms / ratio.p50Ms).toFixed(2)}` : '',
      });
      rows.push(row('direct', d), row('sluice', g, d));
      if (s.model === nativeModel[s.family]) passthrough.set(s.family, g);
      else if (passthrough.has(s.family)) {
        rows.at(-1)!['sluice/direct'] += `; vs passthrough ${(g.reqPerSec / passthrough.get(s.family)!.reqPerSec).toFixed(2)}`;
      }
    }
    rows.push(...(await limiterCost(gatewayUrl!, dataDir, key!)));
    rows.push(...(await scaleRows({ url: simUrl, pid: sim.child.pid! })));
    return rows;
  } finally {
    for (const p of procs) p.kill('SIGTERM');
    rmSync(dataDir, { recursive: true, force: true });
  }
}

/** A key in a new group `bench-limited` with every kind of limit, none of them reached by a benchmark. */
export async function limitedKeyOf(gatewayUrl: string, dataDir: string): Promise<string> {
  const admin = (path: string, body: unknown) =>
    fetch(gatewayUrl + path, {
      method: 'POST',
      headers: { authorization: `Bearer ${readFileSync(join(dataDir, 'admin-token'), 'utf8').trim()}`, 'content-type': 'application/json' },
      body: JSON.stringify(body),
    }).then((r) => r.json() as Promise<Record<string, any>>);
  const limits = { rpm: 10_000_000, tpm: 1_000_000_000, concurrency: 100_000 };
  await admin('/admin/groups', { name: 'bench-limited', models: ['*'], families: ['chat'], limits, budget: { amount: 1e9, period: 'month' } });
  return (await admin('/admin/keys', { group: 'bench-limited' })).key as string;
}

/**
 * What the limiter costs on the hot path: the short chat request with a key whose group has every
 * kind of limit (rpm, tpm with its tokenizer estimate, concurrency, a budget with its priced
 * reservation), against the unlimited demo key, in alternating rounds.
 */
async function limiterCost(gatewayUrl: string, dataDir: string, demoKey: string): Promise<Record<string, string>[]> {
  const limitedKey = await limitedKeyOf(gatewayUrl, dataDir);
  const s = scenarios[0]!;
  const { path, body } = requestFor('chat', 'sim-chat', s);
  const load = (key: string): Load => ({ url: gatewayUrl + path, headers: authFor('chat', key), body, requests: s.requests, concurrency: s.concurrency });
  const rounds: Record<'off' | 'on', LoadResult[]> = { off: [], on: [] };
  for (let round = 0; round < 3; round++) {
    rounds.off.push(await runLoad(load(demoKey)));
    rounds.on.push(await runLoad(load(limitedKey)));
  }
  const best = (rs: LoadResult[]) => rs.reduce((a, b) => (b.reqPerSec > a.reqPerSec ? b : a));
  const [off, on] = [best(rounds.off), best(rounds.on)];
  const row = (name: string, r: LoadResult, ratio = '') => ({
    scenario: `${s.name}, limits ${name}`,
    path: 'sluice',
    'req/s': r.reqPerSec.toFixed(0),
    'p50 ms': r.p50Ms.toFixed(2),
    'p99 ms': r.p99Ms.toFixed(2),
    'ttfb ms': r.ttfbMs.toFixed(2),
    'frames/s': '-',
    'MB/s': r.mbPerSec.toFixed(1),
    'sluice/direct': ratio,
  });
  return [row('off', off), row('on (rpm, tpm, concurrency, budget)', on, `limits on/off req/s ${(on.reqPerSec / off.reqPerSec).toFixed(2)}`)];
}
