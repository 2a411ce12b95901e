/**
 * `npm run bench -- --memory`: what the gateway's resident memory grows by per idle stream and per
 * idle Responses WebSocket (the target is 64 KB each). One simulator process and, for each
 * scenario, a fresh one-thread gateway process; the clients are raw sockets of this process, so
 * ten thousand of them stay cheap. RSS comes from /proc; the JS heap and Buffer figures from a
 * probe preloaded into the gateway (below), read over its IPC channel. Nothing forces a GC: the
 * figures are what a running gateway holds a few seconds after the connections went idle.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

// The probe: loaded into the gateway with `--import`, it answers 'memory' with process.memoryUsage().
// Only node: imports above, so the probe brings no module of ours into the process it measures.
if (process.env.SLUICE_MEMORY_PROBE && process.send) {
  process.on('message', (m) => m === 'memory' && process.send!(process.memoryUsage()));
  // The gateway's own servers keep it alive; the channel must not.
  (process.channel as unknown as { unref(): void }).unref();
}

const dist = fileURLToPath(new URL('..', import.meta.url));
const probeModule = fileURLToPath(import.meta.url);
const TARGET_KB = 64;
const COUNTS = [1_000, 10_000];
/** Connections being opened at once: below the listen backlogs, so no SYN is dropped and retried. */
const OPENING = 256;
/** Descriptors a gateway or this process keeps for itself besides the connections measured. */
const SPARE_FDS = 200;
const WARM_UP = 100;
const WARM_UP_OPENING = 8;

type Open = (client: Socket, key: string) => Promise<void>;

interface Scenario {
  name: string;
  /** What one idle connection is: its request (the socket is already connected) and when it counts as open. */
  open: Open;
  /**
   * The warm-up: the same paths, on a connection that finishes at once, so nothing of it lingers
   * (a quiet stream would notice its client left only at a heartbeat).
   */
  warm: Open;
  /** Descriptors the gateway holds per connection: the client's, plus the upstream's over HTTP. */
  fdsPerConnection: 1 | 2;
  /** Waits until the simulator has seen every upstream call, for connections the client cannot see reach it. */
  upstreamCalls?: boolean;
  /** How many connections to measure at; COUNTS unless given. */
  counts?: number[];
}

/** A streamed chat request; `context` bytes of system prompt make it as large as a coding agent's. */
const chatRequest = (key: string, model: string, prompt: string, context = 0) => {
  const system = context ? [{ role: 'system', content: 'lorem ipsum dolor sit amet '.repeat(Math.ceil(context / 27)).slice(0, context) }] : [];
  const body = JSON.stringify({ model, stream: true, messages: [...system, { role: 'user', content: prompt }] });
  return (
    `POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${key}\r\n` +
    `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`
  );
};

const upgradeRequest = (key: string) =>
  `GET /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${key}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n` +
  `Sec-WebSocket-Key: ${Buffer.from('sluice-memory-16').toString('base64')}\r\nSec-WebSocket-Version: 13\r\n\r\n`;

/** One masked text frame, as a client must send it (an all-zero mask leaves the payload as it is). */
function textFrame(text: string): Buffer {
  const payload = Buffer.from(text);
  const length = payload.length < 126 ? Buffer.from([0x80 | payload.length]) : Buffer.from([0x80 | 126, payload.length >> 8, payload.length & 0xff]);
  return Buffer.concat([Buffer.from([0x81]), length, Buffer.alloc(4), payload]);
}

/** Writes `request` and resolves once what came back contains `until`; later bytes are dropped unread. */
function exchange(client: Socket, request: string | Buffer, until: string): Promise<void> {
  return new Promise((resolve, reject) => {
    let seen = '';
    const onData = (d: Buffer) => {
      seen += d.toString('latin1');
      if (!seen.includes(until)) return;
      client.off('data', onData);
      client.off('close', onClose);
      resolve();
    };
    const onClose = () => reject(new Error(`closed before "${until}": ${seen.slice(0, 600)}`));
    client.on('data', onData);
    client.once('close', onClose);
    client.write(request);
  });
}

/** A stream of `model` that sends its first token at once and its second after 1000 s: headers and one chunk, then quiet. */
const quietStream =
  (model: string, context = 0): Open =>
  (c, key) =>
    exchange(c, chatRequest(key, model, 'idle [[sim tokens=2 tps=0.001]]', context), 'data: ');
const finishedStream = (model: string): Open => (c, key) => exchange(c, chatRequest(key, model, 'warm [[sim tokens=2]]'), 'data: [DONE]');
const upgraded: Open = (c, key) => exchange(c, upgradeRequest(key), '101 Switching Protocols');
const oneTurn: Open = async (c, key) => {
  await upgraded(c, key);
  await exchange(c, textFrame(JSON.stringify({ type: 'response.create', model: 'sim-responses', input: 'hi [[sim tokens=16]]' })), '"response.completed"');
};

const scenarios: Scenario[] = [
  { name: 'stream, idle mid-answer (HTTP upstream)', open: quietStream('sim-chat'), warm: finishedStream('sim-chat'), fdsPerConnection: 2 },
  // What a coding agent sends: the request is held while its stream is open.
  {
    name: 'stream, idle mid-answer, 100 KB request (HTTP upstream)',
    open: quietStream('sim-chat', 100_000),
    warm: finishedStream('sim-chat'),
    fdsPerConnection: 2,
    counts: [1_000],
  },
  {
    name: 'stream, waiting for first byte (HTTP upstream)',
    open: (c, key) => new Promise((resolve) => c.write(chatRequest(key, 'sim-chat', 'idle [[sim ttft_ms=600000]]'), () => resolve())),
    warm: finishedStream('sim-chat'),
    fdsPerConnection: 2,
    upstreamCalls: true,
  },
  { name: 'stream, idle mid-answer (in-process upstream)', open: quietStream('local-chat'), warm: finishedStream('local-chat'), fdsPerConnection: 1 },
  { name: 'WebSocket, open, nothing sent', open: upgraded, warm: upgraded, fdsPerConnection: 1 },
  { name: 'WebSocket, after one finished turn', open: oneTurn, warm: oneTurn, fdsPerConnection: 1 },
];

interface MemoryUsage {
  rss: number;
  heapTotal: number;
  heapUsed: number;
  external: number;
  arrayBuffers: number;
}

interface Gateway {
  child: ChildProcess;
  port: number;
  key: string;
  memory(): Promise<MemoryUsage & { vmRss: number; fds: number }>;
}

function gatewayConfig(simUrl: string): string {
  const deadlines = 'timeouts: { firstByteMs: 600000, idleMs: 600000 }';
  return `server:
  maxConnections: 25000
  shutdownTimeoutMs: 1000
  websocket: { maxSockets: 12000, idleTimeoutSeconds: 960 }
upstreams:
  chat: { kind: openai-chat, baseUrl: "${simUrl}/v1", connections: 12000, ${deadlines} }
  responses: { kind: openai-responses, baseUrl: "${simUrl}/v1", connections: 12000, ${deadlines} }
  local: { kind: simulator }
models:
  - { id: sim-chat, upstream: chat }
  - { id: sim-responses, upstream: responses }
  - { id: local-chat, upstream: local }
`;
}

async function startGateway(dataDir: string, config: string): Promise<Gateway> {
  const child = spawn(process.execPath, ['--import', probeModule, join(dist, 'src/main.js'), 'serve', '--config', config], {
    env: { ...process.env, SLUICE_PORT: '0', SLUICE_DATA_DIR: dataDir, SLUICE_LOG_LEVEL: 'warn', SLUICE_WORKERS: '1', SLUICE_MEMORY_PROBE: '1' },
    stdio: ['ignore', 'pipe', 'pipe', 'ipc'],
  });
  let output = '';
  const banner = await new Promise<RegExpExecArray>((resolve, reject) => {
    const onData = (d: Buffer) => {
      if (output.length < 100_000) output += d.toString();
      const match = /listening on http:\/\/127\.0\.0\.1:(\d+)[\s\S]*demo key[^:]*: (sk-\S+)/.exec(output);
      if (match) resolve(match);
    };
    child.stdout!.on('data', onData);
    child.stderr!.on('data', onData);
    child.once('exit', (code) => reject(new Error(`gateway exited (${code}):\n${output}`)));
  });
  // Keep draining its log, as a deployment's log shipper would.
  child.stdout!.removeAllListeners('data').resume();
  child.stderr!.removeAllListeners('data').resume();
  const pid = child.pid!;
  const memory = () =>
    new Promise<MemoryUsage & { vmRss: number; fds: number }>((resolve, reject) => {
      const silent = setTimeout(() => reject(new Error('the gateway did not report its memory within 5 s')), 5000);
      child.once('message', (usage) => {
        clearTimeout(silent);
        const vmRss = Number(/VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))![1]) * 1024;
        resolve({ ...(usage as MemoryUsage), vmRss, fds: readdirSync(`/proc/${pid}/fd`).length });
      });
      child.send('memory');
    });
  return { child, port: Number(banner[1]), key: banner[2]!, memory };
}

/** Opens `count` more connections, `opening` at a time. */
async function openMany(open: Open, gateway: Gateway, clients: Socket[], count: number, opening = OPENING): Promise<void> {
  let next = 0;
  const opener = async () => {
    while (next < count) {
      next++;
      const client = connect(gateway.port, '127.0.0.1');
      client.setNoDelay(true);
      client.on('error', () => {});
      clients.push(client);
      await new Promise<void>((resolve, reject) => client.once('connect', resolve).once('close', () => reject(new Error('connection refused'))));
      await open(client, gateway.key);
      // Idle from here on: whatever else arrives (a heartbeat every 5 s) is read and dropped.
      client.resume();
    }
  };
  await Promise.all(Array.from({ length: opening }, opener));
}

async function upstreamCalls(simUrl: string): Promise<number> {
  return ((await (await fetch(`${simUrl}/stats`)).json()) as { requests: number }).requests;
}

/** Waits for the simulator to have seen `expected` calls in all, for at most 30 s. */
async function awaitUpstreamCalls(simUrl: string, expected: number): Promise<void> {
  for (const deadline = Date.now() + 30_000; Date.now() < deadline; await new Promise((r) => setTimeout(r, 100))) {
    if ((await upstreamCalls(simUrl)) >= expected) return;
  }
  throw new Error(`the simulator saw ${await upstreamCalls(simUrl)} calls, not ${expected}`);
}

/** The memory figures a few seconds after the last connection opened, once RSS has stopped moving. */
async function settled(gateway: Gateway): Promise<Awaited<ReturnType<Gateway['memory']>>> {
  await new Promise((r) => setTimeout(r, 2000));
  let last = await gateway.memory();
  for (let i = 0; i < 8; i++) {
    await new Promise((r) => setTimeout(r, 500));
    const now = await gateway.memory();
    const still = Math.abs(now.vmRss - last.vmRss) < 256 * 1024;
    last = now;
    if (still) break;
  }
  return last;
}

/** Waits, for at most 15 s, until the gateway holds no more descriptors than `fds` (and a few). */
async function released(gateway: Gateway, fds: number): Promise<void> {
  for (const deadline = Date.now() + 15_000; Date.now() < deadline; await new Promise((r) => setTimeout(r, 250))) {
    if ((await gateway.memory()).fds <= fds + 4) return;
  }
  throw new Error(`the gateway still holds ${(await gateway.memory()).fds} descriptors, not ${fds}, 15 s after its clients left`);
}

/** Connections one process may hold: its soft descriptor limit, less what it keeps for itself. */
function connectionsAllowed(pid: number | 'self', fdsPerConnection: number): number {
  const limit = Number(/Max open files\s+(\d+)/.exec(readFileSync(`/proc/${pid}/limits`, 'utf8'))![1]);
  return Math.floor((limit - SPARE_FDS) / fdsPerConnection);
}

const kb = (bytes: number) => (bytes / 1024).toFixed(1);
const mb = (bytes: number) => (bytes / 1024 / 1024).toFixed(1);

export async function runMemory(): Promise<{ table: Record<string, string>[]; notes: string[] }> {
  const [{ spawnUntil }, { exited }] = await Promise.all([import('./e2e.js'), import('./scale.js')]);
  const dataRoot = mkdtempSync(join(tmpdir(), 'sluice-bench-memory-'));
  const table: Record<string, string>[] = [];
  const notes: string[] = [];
  const sim = await spawnUntil([join(dist, 'plugins/upstreams/simulator/server.js'), '--port', '0'], {}, /listening on (http:\/\/127\.0\.0\.1:\d+)/);
  const simUrl = sim.match[1]!;
  try {
    const simAllows = connectionsAllowed(sim.child.pid!, 1);
    for (const [i, scenario] of scenarios.entries()) {
      const dataDir = join(dataRoot, String(i));
      mkdirSync(dataDir);
      const config = join(dataRoot, `sluice-${i}.yaml`);
      writeFileSync(config, gatewayConfig(simUrl));
      const gateway = await startGateway(dataDir, config);
      const clients: Socket[] = [];
      try {
        const allowed = Math.min(connectionsAllowed(gateway.child.pid!, scenario.fdsPerConnection), connectionsAllowed('self', 1), scenario.fdsPerConnection === 2 ? simAllows : Infinity);
        const wanted = scenario.counts ?? COUNTS;
        const counts = wanted.map((n) => Math.min(n, allowed));
        if (counts.at(-1)! < wanted.at(-1)!) {
          notes.push(`${scenario.name}: ${counts.at(-1)} connections, not ${wanted.at(-1)}: the descriptor limit (ulimit -n) allows no more for the gateway, the simulator or this process`);
        }
        // Warm up, a few at a time: the upstream pool keeps no more connections than that.
        const idleFds = (await gateway.memory()).fds;
        const warm: Socket[] = [];
        await openMany(scenario.warm, gateway, warm, WARM_UP, WARM_UP_OPENING);
        for (const c of warm) c.destroy();
        await released(gateway, idleFds + WARM_UP_OPENING);
        const calls = scenario.upstreamCalls ? await upstreamCalls(simUrl) : 0;
        const before = await settled(gateway);
        for (const n of counts) {
          await openMany(scenario.open, gateway, clients, n - clients.length);
          if (scenario.upstreamCalls) await awaitUpstreamCalls(simUrl, calls + n);
          const after = await settled(gateway);
          const closed = clients.filter((c) => c.closed).length;
          if (closed) notes.push(`${scenario.name}: ${closed} of ${n} connections closed before the measurement`);
          const per = (field: keyof MemoryUsage | 'vmRss') => (after[field] - before[field]) / n;
          table.push({
            scenario: scenario.name,
            connections: String(n),
            'RSS before MB': mb(before.vmRss),
            'RSS after MB': mb(after.vmRss),
            'KB/conn RSS': kb(per('vmRss')),
            'KB/conn JS heap used': kb(per('heapUsed')),
            'KB/conn JS heap committed': kb(per('heapTotal')),
            'KB/conn external': kb(per('external')),
            'gateway fds': String(after.fds),
            [`≤ ${TARGET_KB} KB`]: per('vmRss') <= TARGET_KB * 1024 ? 'yes' : 'NO',
          });
        }
      } finally {
        for (const c of clients) c.destroy();
        await exited(gateway.child, 10_000).catch((err: Error) => notes.push(err.message));
      }
    }
  } finally {
    sim.child.kill('SIGTERM');
    rmSync(dataRoot, { recursive: true, force: true });
  }
  notes.push(
    'KB/conn = (gateway after − before) / connections, a few seconds after the last opened, no forced GC. "JS heap used" counts ' +
      'garbage not yet collected, "committed" the heap\'s pages, "external" Buffers and other memory V8 tracks outside its heap. ' +
      'A fresh gateway\'s heap holds some 25 MB of garbage from its start; it is collected while the connections open and its ' +
      'pages are reused, so figures at 1,000 connections read low (even below zero); those at 10,000 are closer.',
  );
  return { table, notes };
}
