/**
 * The scale rows: what worker threads buy on one machine (1 vs N workers), and what sharing
 * limits and usage costs (one instance on SQLite and the memory limiter vs one on PostgreSQL and
 * Redis, both private servers started here). Each gateway runs in its own process, as in the rest
 * of the harness, and all of them are measured in alternating rounds in the same run, so the
 * figures that matter are the ratios. The load generator, the simulator and the gateway share the
 * machine's cores: each row notes the CPU each used, and says when the load generator or the
 * machine is what limits the figure.
 */
import { execFileSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { availableParallelism, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { startPostgres, startRedis, type PostgresServer, type RedisServer } from '../test/servers.js';
import { authFor, limitedKeyOf, requestFor, runLoad, scenarios, spawnUntil, SERVE_FLAGS, type LoadResult, type Scenario } from './e2e.js';

const dist = fileURLToPath(new URL('..', import.meta.url));
const cores = availableParallelism();
const manyWorkers = Math.max(2, cores);
const ROUNDS = 3;

interface Instance {
  label: string;
  /** The servers it uses besides the simulator, whose CPU shows among the other processes'. */
  servers?: string;
  url: string;
  pid: number;
  demoKey: string;
  /** A key whose group has every kind of limit, so each request makes a limiter decision and a budget reservation. */
  limitedKey: string;
  /** SIGTERM: the gateway's shutdown() drains and closes (worker threads included) before the process exits. */
  stop(): Promise<void>;
}

async function startInstance(label: string, simUrl: string, workers: number, backing: string[], servers?: string): Promise<Instance> {
  const dataDir = mkdtempSync(join(tmpdir(), 'sluice-bench-scale-'));
  const config = join(dataDir, 'sluice.yaml');
  writeFileSync(
    config,
    [
      'upstreams:',
      `  chat: { kind: openai-chat, baseUrl: "${simUrl}/v1" }`,
      'models:',
      '  - { id: sim-chat, upstream: chat, prices: { input: 2.5, cachedInput: 1.25, output: 10 } }',
      ...backing,
    ].join('\n'),
  );
  let gw: Awaited<ReturnType<typeof spawnUntil>>;
  try {
    gw = await spawnUntil(
      [...SERVE_FLAGS, join(dist, 'src/main.js'), 'serve', '--config', config],
      { SLUICE_PORT: '0', SLUICE_DATA_DIR: dataDir, SLUICE_LOG_LEVEL: 'info', SLUICE_WORKERS: String(workers) },
      /demo key[^:]*: (sk-\S+)[\s\S]*"url":"(http:\/\/127\.0\.0\.1:\d+)"/,
    );
  } catch (err) {
    rmSync(dataDir, { recursive: true, force: true });
    throw err;
  }
  // Keep draining the access log, as a deployment's log shipper would.
  gw.child.stdout!.resume();
  const [, demoKey, url] = gw.match;
  const stop = async () => {
    await exited(gw.child);
    rmSync(dataDir, { recursive: true, force: true });
  };
  try {
    const limitedKey = await limitedKeyOf(url!, dataDir);
    if (!limitedKey) throw new Error(`${label}: could not create the limited key`);
    return { label, ...(servers && { servers }), url: url!, pid: gw.child.pid!, demoKey: demoKey!, limitedKey, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

/** Asks the gateway to shut down and waits for its process to end; kills it if it hangs. */
export function exited(child: ChildProcess, ms = 15_000): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`gateway ${child.pid} did not shut down within ${ms} ms`));
    }, ms);
    child.once('exit', (code) => {
      clearTimeout(timer);
      if (code === 0) resolve();
      else reject(new Error(`gateway ${child.pid} exited with ${code} on shutdown`));
    });
    child.kill('SIGTERM');
  });
}

let ticksPerSecond: number | undefined;

/**
 * CPU seconds used so far by each of `pids` (all their threads) and, last, by the whole machine
 * (every process, ours and others'); undefined where /proc is not.
 */
export function cpuSeconds(pids: number[]): number[] | undefined {
  try {
    ticksPerSecond ??= Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }));
    const perProcess = pids.map((pid) => {
      // Fields after "pid (comm) ": utime and stime are the 12th and 13th.
      const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
      return Number(fields[11]) + Number(fields[12]);
    });
    // "cpu user nice system idle iowait irq softirq steal ...": busy is all but idle and iowait.
    const [user, nice, system, , , irq, softirq, steal] = readFileSync('/proc/stat', 'utf8').split('\n')[0]!.split(/\s+/).slice(1).map(Number);
    return [...perProcess, user! + nice! + system! + irq! + softirq! + steal!].map((ticks) => ticks / ticksPerSecond!);
  } catch {
    return undefined;
  }
}

interface Measured {
  load: LoadResult;
  /** The gateway's `servers`. */
  servers?: string;
  /** Cores used while it ran; absent without /proc. */
  cpu?: { gateway: number; loadGenerator: number; simulator: number; machine: number };
}

async function measure(run: () => Promise<LoadResult>, gateway: Instance, simulatorPid: number): Promise<Measured> {
  const pids = [gateway.pid, process.pid, simulatorPid];
  const before = cpuSeconds(pids);
  const load = await run();
  const after = cpuSeconds(pids);
  const servers = gateway.servers;
  if (!before || !after) return { load, servers };
  const used = after.map((t, i) => (t - before[i]!) / load.seconds);
  return { load, servers, cpu: { gateway: used[0]!, loadGenerator: used[1]!, simulator: used[2]!, machine: used[3]! } };
}

/** The CPU each process used, and what most likely limits the figure. */
function note({ cpu, servers }: Measured): string {
  if (!cpu) return '';
  const { gateway, loadGenerator, simulator, machine } = cpu;
  const others = Math.max(0, machine - gateway - loadGenerator - simulator);
  const idle = Math.max(0, cores - machine);
  const shares = `cores: gateway ${gateway.toFixed(2)}, load gen ${loadGenerator.toFixed(2)}, simulator ${simulator.toFixed(2)}, other${servers ? ` (${servers} among them)` : ''} ${others.toFixed(2)}, idle ${idle.toFixed(2)} of ${cores}`;
  // The load generator and the simulator are one thread each.
  if (loadGenerator >= 0.9) return `${shares}: the load generator is saturated and likely limits this`;
  if (simulator >= 0.9) return `${shares}: the simulator is saturated and likely limits this`;
  if (idle < 0.15 * cores) return `${shares}: cores nearly all busy, the machine likely limits this`;
  return shares;
}

interface Workload {
  name: string;
  scenario: Scenario;
  key: 'limitedKey' | 'demoKey';
  /** What the ratios compare: req/s, or MB/s for streams. */
  rate: (r: LoadResult) => number;
  unit: string;
}

export function findScenario(name: string): Scenario {
  const s = scenarios.find((x) => x.name === name);
  if (!s) throw new Error(`no bench scenario "${name}"`);
  return s;
}

export async function scaleRows(simulator: { url: string; pid: number }): Promise<Record<string, string>[]> {
  const short = findScenario('chat, non-stream, 16 tokens');
  // Half the main rows' streams: each round measures it on three instances.
  const long = { ...findScenario('chat passthrough, 4000 tokens'), requests: 150 };
  const reqs = (r: LoadResult) => r.reqPerSec;
  const mbs = (r: LoadResult) => r.mbPerSec;
  const workloads: Workload[] = [
    { name: `${short.name}, limited key`, scenario: short, key: 'limitedKey', rate: reqs, unit: 'req/s' },
    { name: `${short.name}, demo key (no limits)`, scenario: short, key: 'demoKey', rate: reqs, unit: 'req/s' },
    { name: `${long.name}, limited key`, scenario: long, key: 'limitedKey', rate: mbs, unit: 'MB/s' },
  ];

  const instances: Instance[] = [];
  let postgres: PostgresServer | undefined;
  let redis: RedisServer | undefined;
  try {
    postgres = await startPostgres();
    redis = await startRedis();
    const local = ['store: { kind: sqlite }', 'limiter: { kind: memory }'];
    const shared = [
      `store: { kind: postgres, url: "${postgres.url}/postgres" }`,
      // Closed: a limiter that could not decide shows up as failed requests, not as free ones.
      `limiter: { kind: redis, url: "${redis.url}", failMode: closed }`,
    ];
    const started = await Promise.allSettled([
      startInstance('1 worker', simulator.url, 1, local),
      startInstance(`${manyWorkers} workers`, simulator.url, manyWorkers, local),
      startInstance('1 worker, postgres + redis', simulator.url, 1, shared, 'PostgreSQL, Redis'),
    ]);
    for (const s of started) if (s.status === 'fulfilled') instances.push(s.value);
    const failed = started.find((s): s is PromiseRejectedResult => s.status === 'rejected');
    if (failed) throw failed.reason;
    const [one, many, sharing] = instances as [Instance, Instance, Instance];

    // Which instances run which workload: the demo key row only matters for the workers.
    const runs = (w: Workload) => (w.key === 'limitedKey' ? instances : [one, many]);
    const loadOf = (w: Workload, i: Instance) => {
      const { path, body } = requestFor('chat', 'sim-chat', w.scenario);
      return { url: i.url + path, headers: authFor('chat', i[w.key]), body, requests: w.scenario.requests, concurrency: w.scenario.concurrency };
    };
    for (const w of workloads) for (const i of runs(w)) await runLoad({ ...loadOf(w, i), requests: Math.min(200, w.scenario.requests) });
    const results = new Map<string, Measured[]>();
    for (let round = 0; round < ROUNDS; round++) {
      for (const w of workloads) {
        for (const i of runs(w)) {
          const m = await measure(() => runLoad(loadOf(w, i)), i, simulator.pid);
          results.set(`${w.name}|${i.label}`, [...(results.get(`${w.name}|${i.label}`) ?? []), m]);
        }
      }
    }
    const best = (w: Workload, i: Instance) => results.get(`${w.name}|${i.label}`)!.reduce((a, b) => (w.rate(b.load) > w.rate(a.load) ? b : a));

    const row = (scenario: string, path: string, w: Workload, m: Measured, ratio = '') => ({
      scenario,
      path,
      'req/s': m.load.reqPerSec.toFixed(0),
      'p50 ms': m.load.p50Ms.toFixed(2),
      'p99 ms': m.load.p99Ms.toFixed(2),
      'ttfb ms': m.load.ttfbMs.toFixed(2),
      'frames/s': w.scenario.stream ? m.load.framesPerSec.toFixed(0) : '-',
      'MB/s': m.load.mbPerSec.toFixed(1),
      'sluice/direct': ratio,
      note: note(m),
    });
    const rows: Record<string, string>[] = [];
    for (const w of workloads) {
      const [a, b] = [best(w, one), best(w, many)];
      const ratio = `workers ${manyWorkers}/1 ${w.unit} ${(w.rate(b.load) / w.rate(a.load)).toFixed(2)}`;
      rows.push(row(`workers: ${w.name}`, 'sluice, 1 worker', w, a), row(`workers: ${w.name}`, `sluice, ${manyWorkers} workers`, w, b, ratio));
    }
    for (const w of workloads.filter((x) => x.key === 'limitedKey')) {
      const [a, b] = [best(w, one), best(w, sharing)];
      const ratio = `postgres+redis / sqlite+memory ${w.unit} ${(w.rate(b.load) / w.rate(a.load)).toFixed(2)}`;
      rows.push(row(`sharing: ${w.name}`, 'sluice, sqlite + memory limiter', w, a), row(`sharing: ${w.name}`, 'sluice, postgres + redis', w, b, ratio));
    }
    return rows;
  } finally {
    // Gateways first: they close their store and limiter connections while the servers still answer.
    const stopped = await Promise.allSettled(instances.map((i) => i.stop()));
    redis?.stop();
    postgres?.stop();
    const failed = stopped.find((s): s is PromiseRejectedResult => s.status === 'rejected');
    if (failed) throw failed.reason;
  }
}
