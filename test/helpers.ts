/** Real parts for end-to-end tests: the simulator as its own process, a gateway on port 0. */
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import t from 'tap';
import { loadConfig } from '../src/config/load.js';
import type { Config } from '../src/config/types.js';
import type { ResponseSink } from '../src/contracts.js';
import type { GatewayError } from '../src/errors.js';
import type { Gateway } from '../src/boot.js';
import { startGateway } from '../src/gateway.js';
import { createLogger } from '../src/log.js';
import { readStartScript } from '../bench/start-script.js';

export const distRoot = fileURLToPath(new URL('..', import.meta.url));

export interface SimulatorProcess {
  port: number;
  url: string;
  child: ChildProcess;
  stop(): Promise<void>;
}

/**
 * How long a test waits for a process or server to become ready before it gives up. Only a safety
 * net against a hang: every wait returns as soon as its readiness signal (a listening line, a log
 * line, a stored record) arrives, and on two busy cores a start can take tens of seconds.
 */
export const READY_BOUND_MS = 120_000;

/**
 * The environment for a node process a test starts: this one's, plus `extra`, without tap's
 * process-info hook in NODE_OPTIONS while coverage is off (then it records nothing a test reads,
 * and it doubles the CPU a short-lived process such as a CLI command takes to start).
 */
export function childEnv(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env, ...extra };
  if (process.env._TAPJS_PROCESSINFO_COVERAGE_ === '1' || !env.NODE_OPTIONS) return env;
  const options = env.NODE_OPTIONS.replace(/"?--import=[^"\s]*@tapjs\/processinfo[^"\s]*"?/g, '').trim();
  if (options) env.NODE_OPTIONS = options;
  else delete env.NODE_OPTIONS;
  return env;
}

const execFileAsync = promisify(execFile);

/**
 * Runs a command to its end, as `promisify(execFile)` does (a failure rejects with its `code`,
 * `stdout` and `stderr`), but kills it after `READY_BOUND_MS`: a command that hangs fails its test
 * with its own name instead of running into the file's timeout.
 */
export function runCommand(file: string, args: string[], options: { env?: NodeJS.ProcessEnv } = {}): Promise<{ stdout: string; stderr: string }> {
  return execFileAsync(file, args, { ...options, encoding: 'utf8', timeout: READY_BOUND_MS, killSignal: 'SIGKILL' });
}

/** The last `chars` characters of a process's output, for a failure message. */
const tail = (text: string, chars = 4000) => (text.length > chars ? `…${text.slice(-chars)}` : text);

export interface WatchedProcess {
  child: ChildProcess;
  /** All it printed on stdout so far. */
  stdout(): string;
  /** All it printed on stderr so far ('' when its stderr is not a pipe). */
  stderr(): string;
  /** Settles with its exit code (null after a signal) once it exited and its output is read. */
  exited: Promise<number | null>;
  /**
   * The first match of `pattern` in its stdout, as soon as it is printed. Rejects, with the tail
   * of its output, when the process ends without printing it or after `ms` (a safety net; the
   * process is then killed).
   */
  waitFor(pattern: RegExp, what: string, ms?: number): Promise<RegExpExecArray>;
}

/**
 * Collects a spawned process's output (its stdout and stderr must be pipes, or stderr inherited)
 * so a test can wait on what it prints. With `echoStderr` its stderr is also copied to this
 * process's stderr, as `stdio: 'inherit'` would show it.
 */
export function watchProcess(child: ChildProcess, options: { echoStderr?: boolean } = {}): WatchedProcess {
  let out = '';
  let err = '';
  let closed = false;
  const listeners = new Set<() => void>();
  const changed = () => {
    for (const listener of listeners) listener();
  };
  child.stdout!.on('data', (d: Buffer) => {
    out += d.toString();
    changed();
  });
  child.stderr?.on('data', (d: Buffer) => {
    err += d.toString();
    if (options.echoStderr) process.stderr.write(d);
  });
  // Should this test process end first (a timeout), the process does not outlive it.
  const orphaned = () => void child.kill('SIGKILL');
  process.once('exit', orphaned);
  // 'close', not 'exit': by then everything the process printed has been read.
  const exited = new Promise<number | null>((resolve) =>
    child.once('close', (code: number | null) => {
      closed = true;
      process.off('exit', orphaned);
      resolve(code);
      changed();
    }),
  );
  const describe = () => `stdout: ${tail(out) || '(nothing)'}\nstderr: ${child.stderr ? tail(err) || '(nothing)' : '(not captured)'}`;
  return {
    child,
    stdout: () => out,
    stderr: () => err,
    exited,
    waitFor(pattern, what, ms = READY_BOUND_MS) {
      return new Promise((resolve, reject) => {
        const started = Date.now();
        const settle = (fn: () => void) => {
          clearTimeout(timer);
          listeners.delete(check);
          fn();
        };
        const check = () => {
          const match = pattern.exec(out);
          if (match) settle(() => resolve(match));
          else if (closed) settle(() => reject(new Error(`${what}: the process exited (code ${child.exitCode}, signal ${child.signalCode}) without printing it\n${describe()}`)));
        };
        const timer = setTimeout(() => {
          settle(() => reject(new Error(`${what}: not printed after ${Date.now() - started} ms (a bound for a hang; the process is killed)\n${describe()}`)));
          if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
        }, ms);
        listeners.add(check);
        check();
      });
    },
  };
}

/** `npm start` without npm: the start script's arguments, with `nodeFlags` after its own (a later flag wins) and before the script. */
function startScript(nodeFlags: string[] = []): string[] {
  const { flags, script } = readStartScript(join(distRoot, '..'));
  return [...flags, ...nodeFlags, ...script];
}

/**
 * The gateway as its own process, as `npm start` runs it (plus `nodeFlags`), in `cwd`: the
 * environment has none of Sluice's variables but `env` and a free port (SLUICE_PORT=0). Not yet waited for: see
 * `startedGateway`, or read `exited` and `stderr()` for a start that must fail.
 */
export function spawnGateway(env: Record<string, string> = {}, cwd = tmpdir(), nodeFlags: string[] = []): WatchedProcess {
  const base = Object.fromEntries(Object.entries(childEnv()).filter(([k]) => !k.startsWith('SLUICE_')));
  const child = spawn(process.execPath, startScript(nodeFlags), { cwd, env: { ...base, SLUICE_PORT: '0', ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  return watchProcess(child);
}

export interface GatewayProcess extends WatchedProcess {
  url: string;
  port: number;
  /** Printed on a first start only. */
  demoKey?: string;
  /** SIGTERM (a drain), SIGKILL if it has not exited in 10 s. */
  stop(): Promise<void>;
}

/**
 * A data dir as an operator's first start leaves it (its database, the default group and demo
 * key): the CLI refuses to work on one the gateway never started on. In process, on port 0.
 */
export async function firstStart(dataDir: string): Promise<void> {
  const gateway = await startGateway(loadConfig({ env: { SLUICE_DATA_DIR: dataDir, SLUICE_PORT: '0' } }), createLogger('silent'));
  await gateway.shutdown(0);
}

/** `spawnGateway`, resolved once its banner is printed (the demo key too, on a first start). */
export async function startedGateway(env: Record<string, string> = {}, cwd = tmpdir()): Promise<GatewayProcess> {
  const gateway = spawnGateway(env, cwd);
  // The banner is one write of well under PIPE_BUF bytes: it arrives whole.
  const [, url] = await gateway.waitFor(/Sluice listening on (http:\/\/\S+)/, 'the banner');
  const demoKey = /demo key \(group "default", shown only now\): (\S+)/.exec(gateway.stdout())?.[1];
  const { child } = gateway;
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGTERM');
      setTimeout(() => child.kill('SIGKILL'), 10_000).unref();
    }
    await gateway.exited;
  };
  return { ...gateway, url: url!, port: Number(new URL(url!).port), ...(demoKey && { demoKey }), stop };
}

/** Starts `node dist/plugins/upstreams/simulator/server.js --port 0` and reads its port. */
export async function startSimulatorProcess(): Promise<SimulatorProcess> {
  const child = spawn(process.execPath, [join(distRoot, 'plugins/upstreams/simulator/server.js'), '--port', '0'], {
    env: childEnv(),
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const watched = watchProcess(child, { echoStderr: true });
  const port = Number((await watched.waitFor(/listening on http:\/\/127\.0\.0\.1:(\d+)/, 'the simulator\'s listening line'))[1]);
  return {
    port,
    url: `http://127.0.0.1:${port}`,
    child,
    stop: () =>
      new Promise<void>((done) => {
        if (child.exitCode !== null || child.signalCode !== null) return done();
        child.once('exit', () => done());
        child.kill('SIGTERM');
      }),
  };
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

/**
 * Waits until `check` holds, polling; returns as soon as it does. `ms` bounds a wait that never
 * ends, so a test fails instead of hanging: by default a safety net sized for a loaded machine,
 * not an expectation. A test that asserts how soon something happens passes its own bound.
 */
export async function eventually<T>(check: () => T | undefined | false | Promise<T | undefined | false>, what: string, ms = 30_000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what} (${ms} ms)`);
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

/** A chat completion's JSON as a fixed upstream answers it: one word, 3 prompt and 1 completion tokens. */
export function fixedCompletion(id: string, model: string): string {
  return JSON.stringify({
    id,
    object: 'chat.completion',
    created: 1,
    model,
    choices: [{ index: 0, message: { role: 'assistant', content: 'ok' }, finish_reason: 'stop' }],
    usage: { prompt_tokens: 3, completion_tokens: 1, total_tokens: 4 },
  });
}
