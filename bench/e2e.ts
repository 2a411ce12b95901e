/**
 * End-to-end harness: the same load sent straight to the simulator and through Sluice, in one
 * run, each in its own process, so the figures that matter are the ratios Sluice/direct.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Pool } from 'undici';

const dist = fileURLToPath(new URL('..', import.meta.url));

interface Spawned {
  child: ChildProcess;
  output: string;
}

/** Starts a process and resolves once its output matches `ready`. */
function spawnUntil(args: string[], env: NodeJS.ProcessEnv, ready: RegExp): Promise<Spawned & { match: RegExpExecArray }> {
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

interface Load {
  url: string;
  headers: Record<string, string>;
  body: string;
  requests: number;
  concurrency: number;
}

const LF_LF = Buffer.from('\n\n');

export async function runLoad({ url, headers, body, requests, concurrency }: Load): Promise<LoadResult> {
  const { origin, pathname } = new URL(url);
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
      const res = await pool.request({ method: 'POST', path: pathname, headers: { 'content-type': 'application/json', ...headers }, body });
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

export interface Scenario {
  name: string;
  /** Path on both servers: the simulator answers it directly, Sluice forwards it. */
  path: '/v1/chat/completions' | '/v1/responses';
  /** The model Sluice routes: `sim-chat` sits behind a chat upstream, `sim-responses` behind a native one. */
  model: 'sim-chat' | 'sim-responses';
  prompt: string;
  stream: boolean;
  requests: number;
  concurrency: number;
}

export const scenarios: Scenario[] = [
  { name: 'chat, non-stream, 16 tokens', path: '/v1/chat/completions', model: 'sim-chat', prompt: 'hi [[sim tokens=16]]', stream: false, requests: 4000, concurrency: 32 },
  { name: 'chat, stream, 16 tokens', path: '/v1/chat/completions', model: 'sim-chat', prompt: 'hi [[sim tokens=16]]', stream: true, requests: 4000, concurrency: 32 },
  { name: 'chat, stream, 4000 tokens', path: '/v1/chat/completions', model: 'sim-chat', prompt: 'long [[sim tokens=4000]]', stream: true, requests: 300, concurrency: 8 },
  { name: 'responses native, stream, 4000 tokens', path: '/v1/responses', model: 'sim-responses', prompt: 'long [[sim tokens=4000]]', stream: true, requests: 200, concurrency: 8 },
  { name: 'responses bridged, stream, 4000 tokens', path: '/v1/responses', model: 'sim-chat', prompt: 'long [[sim tokens=4000]]', stream: true, requests: 200, concurrency: 8 },
];

function requestBody(s: Scenario): string {
  if (s.path === '/v1/responses') return JSON.stringify({ model: s.model, input: s.prompt, stream: s.stream });
  return JSON.stringify({ model: s.model, messages: [{ role: 'user', content: s.prompt }], stream: s.stream });
}

export async function runE2e(): Promise<Record<string, string>[]> {
  const dataDir = mkdtempSync(join(tmpdir(), 'sluice-bench-'));
  const procs: ChildProcess[] = [];
  try {
    const sim = await spawnUntil([join(dist, 'plugins/upstreams/simulator/server.js'), '--port', '0'], {}, /listening on (http:\/\/127\.0\.0\.1:\d+)/);
    procs.push(sim.child);
    const simUrl = sim.match[1]!;
    const config = join(dataDir, 'sluice.yaml');
    writeFileSync(
      config,
      [
        'upstreams:',
        `  chat: { kind: openai-chat, baseUrl: "${simUrl}/v1" }`,
        `  responses: { kind: openai-responses, baseUrl: "${simUrl}/v1" }`,
        'models:',
        '  - { id: sim-chat, upstream: chat }',
        '  - { id: sim-responses, upstream: responses }',
      ].join('\n'),
    );
    const gw = await spawnUntil(
      [join(dist, 'src/main.js'), 'serve', '--config', config],
      { SLUICE_PORT: '0', SLUICE_DATA_DIR: dataDir, SLUICE_LOG_LEVEL: 'info' },
      /demo key[^:]*: (sk-\S+)[\s\S]*"url":"(http:\/\/127\.0\.0\.1:\d+)"/,
    );
    procs.push(gw.child);
    // Keep draining the gateway's access log, as a deployment's log shipper would.
    gw.child.stdout!.resume();
    const [, key, gatewayUrl] = gw.match;

    const rows: Record<string, string>[] = [];
    for (const s of scenarios) {
      const body = requestBody(s);
      const direct: Load = { url: simUrl + s.path, headers: {}, body, requests: s.requests, concurrency: s.concurrency };
      const viaSluice: Load = { ...direct, url: gatewayUrl + s.path, headers: { authorization: `Bearer ${key}` } };
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
    }
    return rows;
  } finally {
    for (const p of procs) p.kill('SIGTERM');
    rmSync(dataDir, { recursive: true, force: true });
  }
}
