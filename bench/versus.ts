/**
 * Versus: Sluice against nginx as a plain reverse proxy, both in front of the same simulator, and
 * the simulator direct, each in its own process and measured in alternating rounds of one run, so
 * the figures that matter are the ratios. nginx and Sluice get one thread each (one nginx worker
 * process, `workers: 1`); Sluice with two workers is measured alongside, and so is the floor
 * (bench/floor.ts): a bare proxy on the libraries Sluice sits on, the least Node pays on them. Writes
 * bench/results/<date>.json (every row, the targets and the machine) and <date>.svg (the ratios to
 * nginx as a bar chart, for docs/benchmarks.md).
 */
import { type ChildProcess } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { availableParallelism, cpus, release, tmpdir, totalmem, type } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Pool } from 'undici';
import { authFor, nativeModel, requestFor, runLoad, sluiceConfig, spawnUntil, type Load, SERVE_FLAGS, type LoadResult, type Scenario } from './e2e.js';
import { nginxBinary, startNginx, type Nginx } from './nginx.js';
import { cpuSeconds, exited, findScenario } from './scale.js';

const dist = fileURLToPath(new URL('..', import.meta.url));
/** The source tree's bench/results, where docs/benchmarks.md links to. */
const resultsDir = fileURLToPath(new URL('../../bench/results/', import.meta.url));
const cores = availableParallelism();
const ROUNDS = 3;
/** The issue's setting, for every workload. */
const CONCURRENCY = 50;
const PACED_SECONDS = 2;
const PACED_WARMUP_SECONDS = 1;
const LONG_REQUESTS = 150;

type PathName = 'direct' | 'nginx' | 'floor (uWS + undici)' | 'sluice, 1 worker' | 'sluice, 2 workers';
const FLOOR = 'floor (uWS + undici)';
const PATHS: PathName[] = ['direct', 'nginx', FLOOR, 'sluice, 1 worker', 'sluice, 2 workers'];

/** Where a path's requests go. */
interface Endpoint {
  load(s: Scenario): Load;
  /** Its processes besides the simulator, for the CPU they use. */
  pids(): number[];
}

interface Workload {
  scenario: Scenario;
  /** What the ratios compare: req/s, or MB/s for streams of the same wire family. */
  unit: 'req/s' | 'MB/s';
  paths: PathName[];
  /** A translated stream's target: at least `atLeast` times the rate of `scenario` on `path`. */
  baseline?: { scenario: string; path: PathName; label: string; atLeast: number };
}

interface Cpu {
  proxy: number;
  loadGenerator: number;
  simulator: number;
  machine: number;
}

interface Measured {
  load: LoadResult;
  cpu?: Cpu;
}

const rateOf = (w: Workload, r: LoadResult) => (w.unit === 'req/s' ? r.reqPerSec : r.mbPerSec);

async function measure<T extends { seconds: number }>(endpoint: Endpoint, simulatorPid: number, run: () => Promise<T>): Promise<{ result: T; cpu?: Cpu }> {
  const proxy = endpoint.pids();
  const pids = [...proxy, process.pid, simulatorPid];
  const before = cpuSeconds(pids);
  const result = await run();
  const after = cpuSeconds(pids);
  if (!before || !after) return { result };
  const used = after.map((t, i) => (t - before[i]!) / result.seconds);
  const proxyCores = used.slice(0, proxy.length).reduce((a, b) => a + b, 0);
  const [loadGenerator, simulator, machine] = used.slice(proxy.length) as [number, number, number];
  return { result, cpu: { proxy: proxyCores, loadGenerator, simulator, machine } };
}

const ours = (cpu: Cpu) => cpu.proxy + cpu.loadGenerator + cpu.simulator;
/** Processes outside the benchmark: on a shared machine they take cores from it. */
const others = (cpu: Cpu) => Math.max(0, cpu.machine - ours(cpu));

const cpuNote = (cpu?: Cpu) =>
  cpu
    ? `${cpu.proxy ? `proxy ${cpu.proxy.toFixed(2)}, ` : ''}load gen ${cpu.loadGenerator.toFixed(2)}, sim ${cpu.simulator.toFixed(2)}, other ${others(cpu).toFixed(2)}, idle ${Math.max(0, cores - cpu.machine).toFixed(2)}`
    : '';

const WORKERS_FLOOR = 1.6;

/**
 * Why this machine leaves no room for two workers to reach WORKERS_FLOOR times one worker, if it
 * does not: that rate needs as many times the CPU the one-worker run used, from the gateway, the
 * load generator and the simulator alike, and the latter two are one thread each.
 */
function noRoom(one?: Cpu): string | undefined {
  if (!one) return 'no /proc to tell the CPU each process used';
  const need = (cores: number) => (cores * WORKERS_FLOOR).toFixed(2);
  if (one.loadGenerator * WORKERS_FLOOR > 1) return `the load generator (one thread) would need ${need(one.loadGenerator)} cores`;
  if (one.simulator * WORKERS_FLOOR > 1) return `the simulator (one thread) would need ${need(one.simulator)} cores`;
  const free = cores - others(one);
  if (ours(one) * WORKERS_FLOOR > free) return `gateway, load generator and simulator would need ${need(ours(one))} cores, ${free.toFixed(2)} of ${cores} are free of other processes`;
  return undefined;
}

interface Paced {
  url: string;
  headers: Record<string, string>;
  body: string;
  /** Requests started per second, on a schedule, whatever the answers' latency. */
  rate: number;
  seconds: number;
  /** At most this many in flight: a start beyond it waits, and counts as late. */
  concurrency: number;
}

export interface PacedResult {
  rate: number;
  seconds: number;
  reqPerSec: number;
  p50Ms: number;
  p99Ms: number;
  /** Share of the scheduled requests started more than LATE_MS after their time, or not before the end: the pace was not kept. */
  lateShare: number;
}

/** Later than timer slack. */
const LATE_MS = 5;

/**
 * A paced load: requests start on a fixed schedule (open loop, bounded by `concurrency`), so
 * latency is measured at a given rate rather than at whatever rate the path sustains. A request's
 * latency runs from its actual start; `lateShare` tells when that was not its scheduled time.
 */
export async function runPaced({ url, headers, body, rate, seconds, concurrency }: Paced): Promise<PacedResult> {
  const { origin, pathname, search } = new URL(url);
  const pool = new Pool(origin, { connections: concurrency, keepAliveTimeout: 10_000 });
  const total = Math.round(rate * seconds);
  const latencies: number[] = [];
  const pending = new Set<Promise<void>>();
  let failure: unknown;
  let started = 0;
  let late = 0;
  const send = async () => {
    const t0 = performance.now();
    const res = await pool.request({ method: 'POST', path: pathname + search, headers: { 'content-type': 'application/json', ...headers }, body });
    if (res.statusCode !== 200) throw new Error(`${url} answered ${res.statusCode}: ${await res.body.text()}`);
    await res.body.dump({ limit: Infinity });
    latencies.push(performance.now() - t0);
  };
  const t0 = performance.now();
  await new Promise<void>((resolve) => {
    const tick = () => {
      const now = performance.now();
      const due = Math.min(total, Math.floor(((now - t0) / 1000) * rate) + 1);
      while (started < due && pending.size < concurrency) {
        if (now - t0 - (started / rate) * 1000 > LATE_MS) late++;
        started++;
        const p: Promise<void> = send()
          .catch((err: unknown) => void (failure ??= err))
          .finally(() => pending.delete(p));
        pending.add(p);
      }
      // A path slower than the pace does not stretch the run: what was not started by the end is late.
      if (started < total && failure === undefined && now - t0 < seconds * 1000) setTimeout(tick, 1);
      else {
        late += total - started;
        resolve();
      }
    };
    tick();
  });
  await Promise.all(pending);
  const elapsed = (performance.now() - t0) / 1000;
  await pool.close();
  if (failure !== undefined) throw failure;
  latencies.sort((a, b) => a - b);
  const pct = (p: number) => latencies[Math.min(latencies.length - 1, Math.floor(latencies.length * p))]!;
  return { rate, seconds: elapsed, reqPerSec: latencies.length / elapsed, p50Ms: pct(0.5), p99Ms: pct(0.99), lateShare: late / total };
}

interface Gateway extends Endpoint {
  stop(): Promise<void>;
}

async function startSluice(simUrl: string, workers: number): Promise<Gateway> {
  const dataDir = mkdtempSync(join(tmpdir(), 'sluice-bench-versus-'));
  const config = join(dataDir, 'sluice.yaml');
  writeFileSync(config, sluiceConfig(simUrl));
  let child: ChildProcess;
  let key: string;
  let url: string;
  try {
    const gw = await spawnUntil(
      [...SERVE_FLAGS, join(dist, 'src/main.js'), 'serve', '--config', config],
      { SLUICE_PORT: '0', SLUICE_DATA_DIR: dataDir, SLUICE_LOG_LEVEL: 'info', SLUICE_WORKERS: String(workers) },
      /demo key[^:]*: (sk-\S+)[\s\S]*"url":"(http:\/\/127\.0\.0\.1:\d+)"/,
    );
    child = gw.child;
    key = gw.match[1]!;
    url = gw.match[2]!;
  } catch (err) {
    rmSync(dataDir, { recursive: true, force: true });
    throw err;
  }
  // Keep draining the access log, as a deployment's log shipper would.
  child.stdout!.resume();
  return {
    load: (s) => {
      const { path, body } = requestFor(s.family, s.model, s);
      return { url: url + path, headers: authFor(s.family, key), body, requests: s.requests, concurrency: s.concurrency };
    },
    pids: () => [child.pid!],
    stop: async () => {
      try {
        await exited(child);
      } finally {
        rmSync(dataDir, { recursive: true, force: true });
      }
    },
  };
}

/** The runtime's floor in front of the simulator, with Sluice's Node flags so the GC works alike. */
async function startFloor(simUrl: string): Promise<Gateway> {
  const { child, match } = await spawnUntil([...SERVE_FLAGS, join(dist, 'bench/floor.js'), '--upstream', simUrl], {}, /floor listening on (http:\/\/127\.0\.0\.1:\d+)/);
  const pids = () => [child.pid!];
  return { ...plain(match[1]!, pids), stop: () => exited(child) };
}

/** The same request as through Sluice, in the client's family, sent to `origin` for the simulator's own model. */
function plain(origin: string, pids: () => number[]): Endpoint {
  return {
    load: (s) => {
      const { path, body } = requestFor(s.family, nativeModel[s.family], s);
      return { url: origin + path, headers: {}, body, requests: s.requests, concurrency: s.concurrency };
    },
    pids,
  };
}

function workloads(): Workload[] {
  const at = (name: string, requests: number, change: Partial<Scenario> = {}): Scenario => ({ ...findScenario(name), concurrency: CONCURRENCY, requests, ...change });
  // Translated streams are compared by req/s: their wire bytes differ from the baseline's.
  const long = (name: string, baseline?: Workload['baseline'], paths: PathName[] = ['sluice, 1 worker']): Workload => ({ scenario: at(name, LONG_REQUESTS), unit: 'req/s', paths, ...(baseline && { baseline }) });
  return [
    // Counts that keep the fastest path (direct) busy for about half a second.
    { scenario: at('chat, non-stream, 16 tokens', 12_000), unit: 'req/s', paths: PATHS },
    // One chunk per token: 100 content chunks, plus the opening and the finishing one.
    { scenario: at('chat, stream, 16 tokens', 4000, { name: 'chat, stream, 100 tokens', prompt: 'hi [[sim tokens=100]]' }), unit: 'MB/s', paths: PATHS },
    { scenario: at('chat passthrough, 4000 tokens', LONG_REQUESTS), unit: 'MB/s', paths: PATHS },
    long('responses passthrough, 4000 tokens'),
    long('responses bridged to chat, 4000 tokens', { scenario: 'responses passthrough, 4000 tokens', path: 'sluice, 1 worker', label: 'Responses passthrough', atLeast: 0.5 }),
    long('gemini passthrough, 4000 tokens'),
    long('gemini on chat upstream, 4000 tokens', { scenario: 'gemini passthrough, 4000 tokens', path: 'sluice, 1 worker', label: 'Gemini passthrough', atLeast: 0.5 }),
    // Judged as users run it too: `npm start` serves with one worker per core (two here).
    long('chat on gemini upstream, 4000 tokens', { scenario: 'chat passthrough, 4000 tokens', path: 'direct', label: 'direct chat', atLeast: 0.4 }, ['sluice, 1 worker', 'sluice, 2 workers']),
  ];
}

interface Target {
  target: string;
  measured: string;
  met: string;
}

export interface VersusReport {
  table: Record<string, string>[];
  targets: Target[];
  notes: string[];
  files: string[];
}

export async function runVersus(): Promise<VersusReport> {
  const binary = nginxBinary();
  const notes = [
    'Portkey and the other gateway peers: skipped; Portkey breaks on Node 20 (issue 14).',
    `Throughput rows: the best of ${ROUNDS} alternating rounds (the round least disturbed by the other processes). Paced rows: the median p99 of ${ROUNDS} rounds, each after ${PACED_WARMUP_SECONDS} s at the same pace.`,
    `${FLOOR}: bench/floor.ts, a reverse proxy with no gateway logic on uWebSockets.js and an undici pool (Sluice's pool settings, Node flags ${SERVE_FLAGS.join(' ')}); what any Node proxy on these libraries pays, so "Sluice vs floor" is Sluice's own cost.`,
    `${CONCURRENCY} connections everywhere. The load generator (undici, one thread), the simulator, nginx and Sluice share the machine's ${cores} cores; the cpu column is in cores, "other" being processes outside the benchmark.`,
  ];
  if ('skip' in binary) notes.push(`nginx rows skipped: ${binary.skip}.`);
  const stoppers: (() => Promise<void>)[] = [];
  let failed = false;
  try {
    const sim = await spawnUntil([join(dist, 'plugins/upstreams/simulator/server.js'), '--port', '0'], {}, /listening on (http:\/\/127\.0\.0\.1:\d+)/);
    stoppers.push(() => exited(sim.child));
    const simUrl = sim.match[1]!;
    const simPid = sim.child.pid!;
    const endpoints = new Map<PathName, Endpoint>([['direct', plain(simUrl, () => [])]]);
    let nginx: Nginx | undefined;
    if (!('skip' in binary)) {
      nginx = await startNginx(binary, simUrl);
      stoppers.push(nginx.stop);
      endpoints.set('nginx', plain(nginx.url, nginx.pids));
    }
    const gateways = await Promise.allSettled([startFloor(simUrl), startSluice(simUrl, 1), startSluice(simUrl, 2)]);
    for (const g of gateways) if (g.status === 'fulfilled') stoppers.push(g.value.stop);
    for (const g of gateways) if (g.status === 'rejected') throw g.reason;
    const [floor, one, two] = gateways.map((g) => (g as PromiseFulfilledResult<Gateway>).value) as [Gateway, Gateway, Gateway];
    endpoints.set(FLOOR, floor);
    endpoints.set('sluice, 1 worker', one);
    endpoints.set('sluice, 2 workers', two);

    const all = workloads();
    const runsOf = (w: Workload) => w.paths.filter((p) => endpoints.has(p));
    // Warm-up: enough for the JIT and the connections, a single wave for the long streams.
    for (const w of all) for (const p of runsOf(w)) await runLoad({ ...endpoints.get(p)!.load(w.scenario), requests: Math.min(200, Math.ceil(w.scenario.requests / 3)) });
    const results = new Map<string, Measured[]>();
    for (let round = 0; round < ROUNDS; round++) {
      for (const w of all) {
        for (const p of runsOf(w)) {
          const e = endpoints.get(p)!;
          const { result, cpu } = await measure(e, simPid, () => runLoad(e.load(w.scenario)));
          results.set(`${w.scenario.name}|${p}`, [...(results.get(`${w.scenario.name}|${p}`) ?? []), { load: result, ...(cpu && { cpu }) }]);
        }
      }
    }
    const best = (w: Workload, p: PathName) => results.get(`${w.scenario.name}|${p}`)?.reduce((a, b) => (rateOf(w, b.load) > rateOf(w, a.load) ? b : a));
    const baselineOf = (w: Workload) => w.baseline && best(all.find((x) => x.scenario.name === w.baseline!.scenario)!, w.baseline.path);
    const [short, chunks, long] = all as [Workload, Workload, Workload];

    // Added latency at half of nginx's maximum rate (of Sluice's, without nginx).
    const nginxMax = best(short, 'nginx')?.load.reqPerSec;
    const sluiceMax = best(short, 'sluice, 1 worker')!.load.reqPerSec;
    if (!nginx) notes.push("Paced rows at half of Sluice's (1 worker) maximum rate, nginx being skipped.");
    const paces = [{ rate: Math.round((nginxMax ?? sluiceMax) / 2), of: nginxMax ? 'nginx' : 'Sluice (1 worker)' }];
    // At a rate near or beyond its own maximum Sluice's latency is mostly queueing; half of its own
    // maximum tells what it adds at a load it carries.
    if (nginxMax && sluiceMax < nginxMax) paces.push({ rate: Math.round(sluiceMax / 2), of: 'Sluice (1 worker)' });
    const pacedPaths = (['direct', 'nginx', 'sluice, 1 worker'] as PathName[]).filter((p) => endpoints.has(p));
    const paced = new Map<string, { result: PacedResult; cpu?: Cpu }[]>();
    for (let round = 0; round < ROUNDS; round++) {
      for (const { rate } of paces) {
        for (const p of pacedPaths) {
          const e = endpoints.get(p)!;
          const pace = { ...e.load(short.scenario), rate, concurrency: CONCURRENCY };
          // A second at the pace first: the round before left a backlog and garbage behind, and a
          // steady state is what a latency figure should describe.
          await runPaced({ ...pace, seconds: PACED_WARMUP_SECONDS });
          const m = await measure(e, simPid, () => runPaced({ ...pace, seconds: PACED_SECONDS }));
          paced.set(`${rate}|${p}`, [...(paced.get(`${rate}|${p}`) ?? []), m]);
        }
      }
    }
    const medianP99 = (rate: number, p: PathName) => {
      const rs = [...(paced.get(`${rate}|${p}`) ?? [])].sort((a, b) => a.result.p99Ms - b.result.p99Ms);
      return rs[Math.floor(rs.length / 2)];
    };

    // The table and the JSON rows.
    const table: Record<string, string>[] = [];
    const rows: object[] = [];
    const ratioText = (w: Workload, p: PathName, m: Measured): string => {
      const r = (other: Measured | undefined, what: string) => (other ? `${(rateOf(w, m.load) / rateOf(w, other.load)).toFixed(2)}× ${what} ${w.unit}` : '');
      if (w.baseline) return r(baselineOf(w), w.baseline.label);
      const vsNginx = p === 'nginx' ? '' : r(best(w, 'nginx'), 'nginx');
      return p === 'sluice, 1 worker' && w.paths.includes(FLOOR) ? [vsNginx, r(best(w, FLOOR), 'floor')].filter(Boolean).join(', ') : vsNginx;
    };
    for (const w of all) {
      for (const p of runsOf(w)) {
        const m = best(w, p)!;
        const { load } = m;
        table.push({
          workload: w.scenario.name,
          path: p,
          'req/s': load.reqPerSec.toFixed(0),
          'p50 ms': load.p50Ms.toFixed(2),
          'p99 ms': load.p99Ms.toFixed(2),
          'MB/s': load.mbPerSec.toFixed(1),
          'frames/s': w.scenario.stream ? load.framesPerSec.toFixed(0) : '-',
          ratio: ratioText(w, p, m),
          cpu: cpuNote(m.cpu),
        });
        rows.push({
          workload: w.scenario.name,
          path: p,
          concurrency: w.scenario.concurrency,
          unit: w.unit,
          ...load,
          bytesPerAnswer: Math.round((load.mbPerSec * 1e6 * load.seconds) / load.requests),
          rounds: results.get(`${w.scenario.name}|${p}`)!.map((x) => rateOf(w, x.load)),
          ...(m.cpu && { cpuCores: m.cpu }),
        });
      }
    }
    for (const { rate, of } of paces) {
      const pacedName = `${short.scenario.name}, paced at ${rate} req/s (half of ${of}'s max)`;
      const direct = medianP99(rate, 'direct')!.result;
      const viaNginx = medianP99(rate, 'nginx')?.result;
      for (const p of pacedPaths) {
        const { result, cpu } = medianP99(rate, p)!;
        const vsNginx = p !== 'nginx' && viaNginx ? `, ${signed(result.p99Ms - viaNginx.p99Ms)} ms vs nginx` : '';
        const added = p === 'direct' ? '' : `p99 ${signed(result.p99Ms - direct.p99Ms)} ms vs direct${vsNginx}`;
        const late = result.lateShare > 0.01 ? `${(result.lateShare * 100).toFixed(1)}% started late or not at all` : '';
        table.push({
          workload: pacedName,
          path: p,
          'req/s': result.reqPerSec.toFixed(0),
          'p50 ms': result.p50Ms.toFixed(2),
          'p99 ms': result.p99Ms.toFixed(2),
          'MB/s': '-',
          'frames/s': '-',
          ratio: [added, late].filter(Boolean).join('; '),
          cpu: cpuNote(cpu),
        });
        rows.push({ workload: pacedName, path: p, ...result, roundsP99Ms: paced.get(`${rate}|${p}`)!.map((x) => x.result.p99Ms), ...(cpu && { cpuCores: cpu }) });
      }
    }
    const { mbPerSec, seconds, requests } = best(short, 'direct')!.load;
    notes.push(`The non-stream answer's body is ${Math.round((mbPerSec * 1e6 * seconds) / requests)} bytes: the simulator's chat completion of 16 tokens, with usage.`);

    // The targets of issue 14.
    const targets: Target[] = [];
    const compared = (num: Measured, den: Measured, unit: 'req/s' | 'MB/s') => {
      const rateIn = (m: Measured) => (unit === 'req/s' ? m.load.reqPerSec : m.load.mbPerSec);
      const ratio = rateIn(num) / rateIn(den);
      return { ratio, text: `${ratio.toFixed(2)}× (${rateIn(num).toFixed(unit === 'MB/s' ? 1 : 0)} vs ${rateIn(den).toFixed(unit === 'MB/s' ? 1 : 0)} ${unit})` };
    };
    const versus = (what: string, num: Measured | undefined, den: Measured | undefined, unit: 'req/s' | 'MB/s', atLeast: number) => {
      if (!num || !den) return targets.push({ target: `${what} ≥ ${atLeast}×`, measured: '-', met: 'n/a: nginx skipped' });
      const { ratio, text } = compared(num, den, unit);
      targets.push({ target: `${what} ≥ ${atLeast}×`, measured: text, met: ratio >= atLeast ? 'met' : 'not met' });
    };
    versus('non-stream req/s, Sluice (1 worker) vs nginx (1 worker)', best(short, 'sluice, 1 worker'), best(short, 'nginx'), 'req/s', 0.8);
    {
      const { rate, of } = paces[0]!;
      const [direct, sluice] = [medianP99(rate, 'direct')!.result, medianP99(rate, 'sluice, 1 worker')!.result];
      const late = sluice.lateShare > 0.01 ? `; Sluice kept ${sluice.reqPerSec.toFixed(0)} req/s, ${(sluice.lateShare * 100).toFixed(0)}% started late or not at all` : '';
      targets.push({
        target: `added p99 at ${rate} req/s (half of ${of}'s max), Sluice (1 worker) vs direct ≤ 1 ms`,
        measured: `${signed(sluice.p99Ms - direct.p99Ms)} ms (p99 ${direct.p99Ms.toFixed(2)} → ${sluice.p99Ms.toFixed(2)} ms${late})`,
        met: sluice.p99Ms - direct.p99Ms <= 1 ? 'met' : 'not met',
      });
    }
    versus('stream passthrough MB/s, 100 chunks, Sluice vs nginx', best(chunks, 'sluice, 1 worker'), best(chunks, 'nginx'), 'MB/s', 0.9);
    versus('stream passthrough MB/s, 4000 tokens, Sluice vs nginx', best(long, 'sluice, 1 worker'), best(long, 'nginx'), 'MB/s', 0.9);
    // No targets: they tell how much of the gap to nginx is the runtime's and how much Sluice's.
    for (const w of [short, chunks, long]) {
      const [viaFloor, viaNginx] = [best(w, FLOOR)!, best(w, 'nginx')];
      targets.push({ target: `floor vs nginx, ${w.scenario.name} ${w.unit}`, measured: viaNginx ? compared(viaFloor, viaNginx, w.unit).text : '-', met: viaNginx ? 'reference' : 'n/a: nginx skipped' });
      targets.push({ target: `Sluice (1 worker) vs floor, ${w.scenario.name} ${w.unit}`, measured: compared(best(w, 'sluice, 1 worker')!, viaFloor, w.unit).text, met: 'reference' });
    }
    for (const w of all.filter((x) => x.baseline)) {
      for (const p of runsOf(w)) {
        const who = w.paths.length > 1 ? `, Sluice (${p.slice('sluice, '.length)})` : '';
        versus(`${w.scenario.name} vs ${w.baseline!.label}${who}, req/s`, best(w, p), baselineOf(w), 'req/s', w.baseline!.atLeast);
      }
    }
    for (const w of [short, chunks, long]) {
      const [a, b] = [best(w, 'sluice, 1 worker')!, best(w, 'sluice, 2 workers')!];
      const ratio = rateOf(w, b.load) / rateOf(w, a.load);
      const why = noRoom(a.cpu);
      targets.push({
        target: `workers 2 vs 1, ${w.scenario.name} ${w.unit} ≥ ${WORKERS_FLOOR}× where the load generator leaves room`,
        measured: `${ratio.toFixed(2)}× (${rateOf(w, b.load).toFixed(w.unit === 'MB/s' ? 1 : 0)} vs ${rateOf(w, a.load).toFixed(w.unit === 'MB/s' ? 1 : 0)} ${w.unit})`,
        met: why ? `not measurable here: ${why}` : ratio >= WORKERS_FLOOR ? 'met' : 'not met',
      });
    }

    const machine = {
      cpu: cpus()[0]?.model ?? 'unknown',
      cores,
      memoryGb: Math.round(totalmem() / 2 ** 30),
      os: `${type()} ${release()}`,
      node: process.version,
      nginx: 'skip' in binary ? null : binary.version,
    };
    const date = new Date().toISOString().slice(0, 10);
    mkdirSync(resultsDir, { recursive: true });
    const json = join(resultsDir, `${date}.json`);
    const method = { concurrency: CONCURRENCY, rounds: ROUNDS, throughput: 'best round', paced: 'median p99', pacedSeconds: PACED_SECONDS, pacedRates: paces };
    writeFileSync(json, JSON.stringify({ date, machine, method, rows, targets, notes }, null, 2) + '\n');
    const files = [json];
    if (nginx) {
      const svg = join(resultsDir, `${date}.svg`);
      const groups = [
        { label: 'chat, non-stream (req/s)', target: 0.8, w: short },
        { label: 'stream, 100 chunks (MB/s)', target: 0.9, w: chunks },
        { label: 'stream, 4000 tokens (MB/s)', target: 0.9, w: long },
      ].map(({ label, target, w }) => ({ label, target, bars: PATHS.map((p) => ({ path: p, ratio: rateOf(w, best(w, p)!.load) / rateOf(w, best(w, 'nginx')!.load) })) }));
      writeFileSync(svg, chart(groups, `${date} · ${cores} × ${machine.cpu} · Node ${process.version.slice(1)} · ${machine.nginx} · ${CONCURRENCY} connections, best of ${ROUNDS} rounds`));
      files.push(svg);
    } else notes.push('No chart: its ratios are to nginx.');
    return { table, targets, notes, files };
  } catch (err) {
    failed = true;
    throw err;
  } finally {
    // Gateways and nginx first, the simulator they talk to last.
    const stopped = await Promise.allSettled(stoppers.reverse().map((stop) => stop()));
    const problem = stopped.find((s): s is PromiseRejectedResult => s.status === 'rejected');
    if (problem && !failed) throw problem.reason;
    if (problem) console.error('versus: stopping a process failed:', problem.reason);
  }
}

const COLORS: Record<PathName, string> = { direct: '#9aa0a6', nginx: '#2e7d32', [FLOOR]: '#f29900', 'sluice, 1 worker': '#1a73e8', 'sluice, 2 workers': '#8ab4f8' };

const signed = (ms: number) => `${ms >= 0 ? '+' : ''}${ms.toFixed(2)}`;

const escapeXml = (s: string) => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');

/** Grouped bars of each path's rate as a ratio to nginx's, with each group's target as a dashed line. */
function chart(groups: { label: string; target: number; bars: { path: PathName; ratio: number }[] }[], subtitle: string): string {
  const [width, height] = [900, 420];
  const [left, right, top, bottom] = [52, 40, 96, 48];
  const plotWidth = width - left - right;
  const plotHeight = height - top - bottom;
  const highest = Math.max(1.2, ...groups.flatMap((g) => g.bars.map((b) => b.ratio)));
  // Room above the highest bar for its label.
  const max = Math.ceil((highest + 0.1) / 0.2) * 0.2;
  const y = (v: number) => top + plotHeight * (1 - v / max);
  const out: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="system-ui, -apple-system, Segoe UI, Helvetica, Arial, sans-serif" font-size="13">`,
    `<rect width="${width}" height="${height}" fill="#fff"/>`,
    `<text x="${left}" y="24" font-size="16" font-weight="600" fill="#202124">Rate as a ratio to nginx in front of the same upstream (higher is better)</text>`,
    `<text x="${left}" y="44" font-size="12" fill="#5f6368">${escapeXml(subtitle)}</text>`,
  ];
  // Legend.
  let x = left;
  for (const path of PATHS) {
    out.push(`<rect x="${x}" y="58" width="12" height="12" fill="${COLORS[path]}"/>`, `<text x="${x + 17}" y="69" fill="#202124">${path}</text>`);
    x += 34 + path.length * 7;
  }
  out.push(`<line x1="${x}" y1="64" x2="${x + 24}" y2="64" stroke="#d93025" stroke-width="2" stroke-dasharray="5 3"/>`, `<text x="${x + 29}" y="69" fill="#202124">target</text>`);
  // Grid and axis.
  for (let v = 0; v <= max + 1e-9; v += 0.2) {
    const gy = y(v).toFixed(1);
    out.push(`<line x1="${left}" y1="${gy}" x2="${width - right}" y2="${gy}" stroke="${v === 0 ? '#5f6368' : '#e8eaed'}"/>`);
    out.push(`<text x="${left - 6}" y="${(y(v) + 4).toFixed(1)}" text-anchor="end" fill="#5f6368">${v.toFixed(1)}×</text>`);
  }
  const groupWidth = plotWidth / groups.length;
  const barWidth = 36;
  const gap = 6;
  groups.forEach((g, i) => {
    const span = g.bars.length * barWidth + (g.bars.length - 1) * gap;
    const start = left + i * groupWidth + (groupWidth - span) / 2;
    const bars = g.bars.map((b, j) => ({ ...b, x: start + j * (barWidth + gap), top: y(b.ratio) }));
    for (const b of bars) {
      out.push(`<rect x="${b.x.toFixed(1)}" y="${b.top.toFixed(1)}" width="${barWidth}" height="${(y(0) - b.top).toFixed(1)}" fill="${COLORS[b.path]}"><title>${b.path}: ${b.ratio.toFixed(2)}× nginx</title></rect>`);
    }
    const ty = y(g.target).toFixed(1);
    out.push(`<line x1="${(start - 8).toFixed(1)}" y1="${ty}" x2="${(start + span + 8).toFixed(1)}" y2="${ty}" stroke="#d93025" stroke-width="2" stroke-dasharray="5 3"/>`);
    out.push(`<text x="${(start + span + 11).toFixed(1)}" y="${(y(g.target) + 4).toFixed(1)}" font-size="11" fill="#d93025">${g.target}×</text>`);
    // Values last, with a halo, so a target line never hides one.
    for (const b of bars) {
      out.push(`<text x="${(b.x + barWidth / 2).toFixed(1)}" y="${(b.top - 5).toFixed(1)}" text-anchor="middle" font-size="12" fill="#202124" stroke="#fff" stroke-width="3" paint-order="stroke">${b.ratio.toFixed(2)}</text>`);
    }
    out.push(`<text x="${(start + span / 2).toFixed(1)}" y="${height - bottom + 20}" text-anchor="middle" fill="#202124">${escapeXml(g.label)}</text>`);
  });
  out.push('</svg>');
  return out.join('\n') + '\n';
}
