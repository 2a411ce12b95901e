/** Real parts for end-to-end tests: the simulator as its own process, a gateway on port 0. */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import t from 'tap';
import { loadConfig, type Config } from '../src/config.js';
import type { ResponseSink } from '../src/contracts.js';
import type { GatewayError } from '../src/errors.js';
import { startGateway, type Gateway } from '../src/gateway.js';
import { createLogger } from '../src/log.js';

export const distRoot = fileURLToPath(new URL('..', import.meta.url));

export interface SimulatorProcess {
  port: number;
  url: string;
  child: ChildProcess;
  stop(): Promise<void>;
}

/** Starts `node dist/plugins/upstreams/simulator/server.js --port 0` and reads its port. */
export function startSimulatorProcess(): Promise<SimulatorProcess> {
  const child = spawn(process.execPath, [join(distRoot, 'plugins/upstreams/simulator/server.js'), '--port', '0'], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  return new Promise((resolve, reject) => {
    let out = '';
    child.once('exit', (code) => reject(new Error(`simulator exited early (${code}): ${out}`)));
    child.stdout!.on('data', (d: Buffer) => {
      out += d.toString();
      const m = /listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(out);
      if (!m) return;
      child.removeAllListeners('exit');
      const port = Number(m[1]);
      resolve({
        port,
        url: `http://127.0.0.1:${port}`,
        child,
        stop: () =>
          new Promise<void>((done) => {
            if (child.exitCode !== null) return done();
            child.once('exit', () => done());
            child.kill('SIGTERM');
          }),
      });
    });
  });
}

export interface TestGateway {
  gateway: Gateway;
  url: string;
  adminToken: string;
  /** The demo key of the default group. */
  key: string;
  dataDir: string;
  logs: Record<string, unknown>[];
  /** Admin API call. */
  admin(method: string, path: string, body?: unknown): Promise<{ status: number; body: any }>;
  stop(): Promise<void>;
}

/** A config file's worth of YAML, written to a fresh data dir and loaded as the CLI would. */
export async function startTestGateway(yaml: (dataDir: string) => string, options: { port?: number; dataDir?: string } = {}): Promise<TestGateway> {
  const dataDir = options.dataDir ?? mkdtempSync(join(tmpdir(), 'sluice-test-'));
  const file = join(dataDir, 'sluice.yaml');
  const { writeFileSync } = await import('node:fs');
  writeFileSync(file, yaml(dataDir));
  // One thread unless a test asks for workers: tests look inside the gateway (its store, its logs).
  const source = { path: file, env: { SLUICE_PORT: String(options.port ?? 0), SLUICE_DATA_DIR: dataDir, ...(!/\bworkers"?\s*:/.test(yaml(dataDir)) && { SLUICE_WORKERS: '1' }) } };
  const config: Config = loadConfig(source);
  const logs: Record<string, unknown>[] = [];
  const sink = new Writable({
    write(chunk, _enc, cb) {
      for (const line of chunk.toString().split('\n')) if (line) logs.push(JSON.parse(line));
      cb();
    },
  });
  const gateway = await startGateway(config, createLogger('info', sink), source);
  const url = `http://127.0.0.1:${gateway.port}`;
  return {
    gateway,
    url,
    adminToken: gateway.adminToken!,
    // Undefined when the store was not new (a shared store another instance started).
    key: gateway.firstStart?.demoKey as string,
    dataDir,
    logs,
    async admin(method, path, body) {
      const res = await fetch(url + path, {
        method,
        headers: { authorization: `Bearer ${gateway.adminToken!}`, 'content-type': 'application/json' },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
      const text = await res.text();
      return { status: res.status, body: text ? JSON.parse(text) : undefined };
    },
    async stop() {
      await gateway.shutdown();
      rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

/** A gateway whose models sit behind an openai-chat upstream pointing at a simulator process. */
export function chatGatewayYaml(simulatorUrl: string, extra = ''): (dataDir: string) => string {
  return (dataDir) => `
dataDir: ${dataDir}
log: { level: info }
server: { maxBodyBytes: 65536, shutdownTimeoutMs: 2000 }
upstreams:
  sim:
    kind: openai-chat
    baseUrl: ${simulatorUrl}/v1
    apiKey: upstream-secret-123
    timeouts: { connectMs: 2000, firstByteMs: 5000, idleMs: 5000 }
  impatient:
    kind: openai-chat
    baseUrl: ${simulatorUrl}/v1
    timeouts: { firstByteMs: 300 }
  unreachable:
    kind: openai-chat
    baseUrl: http://127.0.0.1:9/v1
models:
  - id: sim-chat
    upstream: sim
    maxOutputTokens: { default: 512, max: 4096 }
  - id: sim-basic
    upstream: sim
    upstreamModel: sim-chat-basic
    features: { tools: false, jsonSchema: false, vision: false, temperature: false }
  - { id: sim-impatient, upstream: impatient, upstreamModel: sim-chat }
  - { id: sim-unreachable, upstream: unreachable, upstreamModel: sim-chat }
${extra}`;
}

/** Waits until `check` holds, polling; fails after the deadline instead of hanging. */
export async function eventually<T>(check: () => T | undefined | false | Promise<T | undefined | false>, what: string, ms = 5000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** A sink that records every call; `done` resolves on end or error. */
export function recordingSink(dataResult: (call: number) => boolean = () => true) {
  const events: string[] = [];
  const chunks: Buffer[] = [];
  let status = 0;
  let headers: Record<string, unknown> = {};
  let error: GatewayError | undefined;
  let settle!: () => void;
  const done = new Promise<void>((resolve) => (settle = resolve));
  const sink: ResponseSink = {
    start(s, h) {
      events.push('start');
      status = s;
      headers = h;
    },
    data(chunk) {
      events.push('data');
      chunks.push(chunk);
      return dataResult(chunks.length);
    },
    end() {
      events.push('end');
      settle();
    },
    error(err) {
      events.push('error');
      error = err;
      settle();
    },
  };
  return {
    sink,
    events,
    done,
    status: () => status,
    headers: () => headers,
    error: () => error,
    text: () => Buffer.concat(chunks).toString('utf8'),
  };
}

/**
 * The simulator as its own process and a gateway in front of it, both stopped when the test file
 * ends. `routing` is the YAML of the upstreams and models, given the simulator's URL; `server`
 * adds to the gateway's `server` section.
 */
export async function startStack(routing: (simulatorUrl: string) => string, server: Record<string, unknown> = {}): Promise<{ sim: SimulatorProcess; gw: TestGateway }> {
  const sim = await startSimulatorProcess();
  const serverYaml = JSON.stringify({ shutdownTimeoutMs: 2000, ...server });
  const gw = await startTestGateway((dataDir) => `dataDir: ${dataDir}\nserver: ${serverYaml}\n${routing(sim.url)}`).catch(async (err) => {
    await sim.stop();
    throw err;
  });
  t.teardown(async () => {
    await gw.stop();
    await sim.stop();
  });
  return { sim, gw };
}

/** The YAML `upstreams` of a simulator process reached in each of its four wire families: `chat`, `responses`, `gemini`, `messages`. */
export function simulatorUpstreams(simUrl: string): string {
  return `upstreams:
  chat: { kind: openai-chat, baseUrl: "${simUrl}/v1" }
  responses: { kind: openai-responses, baseUrl: "${simUrl}/v1" }
  gemini: { kind: gemini, baseUrl: "${simUrl}/v1beta", apiKey: gemini-upstream-key }
  messages: { kind: anthropic, baseUrl: "${simUrl}/v1", apiKey: messages-upstream-key }
`;
}

/** The error a promise rejects with; undefined when it resolves (so matching on it fails). */
export async function rejection(promise: Promise<unknown>): Promise<unknown> {
  try {
    await promise;
    return undefined;
  } catch (err) {
    return err;
  }
}

export type Path = (string | number)[];

/** Every path to a value inside `root`, found without recursion. */
export function pathsIn(root: unknown): Path[] {
  const out: Path[] = [];
  const stack: [unknown, Path][] = [[root, []]];
  while (stack.length) {
    const [value, path] = stack.pop()!;
    if (path.length) out.push(path);
    if (value && typeof value === 'object') {
      for (const [k, v] of Object.entries(value)) stack.push([v, [...path, Array.isArray(value) ? Number(k) : k]]);
    }
  }
  return out;
}

/** A copy of `root` with the value at `path` removed (`undefined`) or replaced. */
export function edited(root: unknown, path: Path, replacement?: unknown): unknown {
  const copy = structuredClone(root) as any;
  let parent = copy;
  for (const key of path.slice(0, -1)) parent = parent[key];
  const last = path.at(-1)!;
  if (replacement !== undefined) parent[last] = replacement;
  else if (Array.isArray(parent)) parent.splice(last as number, 1);
  else delete parent[last];
  return copy;
}
