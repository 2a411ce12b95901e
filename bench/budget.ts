/**
 * The cost budget (`npm run bench -- --budget`): Sluice as `npm start` runs it (the default plugin
 * list, the SQLite store, one thread) in front of the simulator, then again with each default
 * plugin left out in turn, and the bare floor proxy (bench/floor.ts) for the runtime's share. For
 * each: the gateway's CPU per exchange (from /proc, so it holds on a shared machine), what its
 * young generation collected per exchange (from --trace-gc), its mark-compacts, and the rate.
 * A plugin's cost is the default's CPU less the CPU without it. docs/architecture.md keeps the
 * table ("Cost budget").
 */
import { type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { defaultPlugins } from '../src/config/defaults.js';
import { requestFor, runLoad, SERVE_FLAGS, spawnUntil, type Load, type Scenario } from './e2e.js';
import { cpuSeconds } from './scale.js';

const dist = fileURLToPath(new URL('..', import.meta.url));
const CONCURRENCY = 50;
const WARMUP = 3_000;
const MEASURED = 15_000;
const ROUNDS = 2;

/** A plain chat answer (16 tokens) and a 100-chunk stream: the reference harness's two workloads. */
const workloads: Scenario[] = [
  { name: 'plain', family: 'chat', model: 'sim-chat', prompt: 'hi [[sim tokens=16]]', stream: false, requests: MEASURED, concurrency: CONCURRENCY },
  { name: '100-chunk stream', family: 'chat', model: 'sim-chat', prompt: 'hi [[sim tokens=100]]', stream: true, requests: MEASURED, concurrency: CONCURRENCY },
];

/** What is measured: the default list, each plugin of it left out, and the floor. */
type Variant = { name: string; plugins?: readonly string[]; floor?: true };
const leftOut = ['auth', 'grant', 'limits', 'usage', 'access-log', 'metrics', 'console'];
const variants: Variant[] = [
  { name: 'npm start (default plugins)' },
  ...leftOut.map((plugin) => ({ name: `without ${plugin}`, plugins: defaultPlugins.filter((p) => p !== plugin) })),
  { name: 'floor (uWS + undici, no gateway)', floor: true },
];

interface Gateway {
  child: ChildProcess;
  url: string;
  key: string;
  /** Young-generation bytes collected and mark-compacts counted from --trace-gc so far. */
  gc: { scavengedMb: number; markCompacts: number };
}

function watchGc(child: ChildProcess): Gateway['gc'] {
  const gc = { scavengedMb: 0, markCompacts: 0 };
  let rest = '';
  // --trace-gc lines: "[pid:addr] 1234 ms: Scavenge 40.1 (60.2) -> 3.2 (61.0) MB, ..."
  child.stdout!.on('data', (d: Buffer) => {
    const lines = (rest + d.toString('latin1')).split('\n');
    rest = lines.pop()!;
    for (const line of lines) {
      const scavenge = / Scavenge(?: \(interleaved\))? ([\d.]+) \([\d.]+\) -> ([\d.]+)/.exec(line);
      if (scavenge) gc.scavengedMb += Number(scavenge[1]) - Number(scavenge[2]);
      else if (line.includes(' Mark-Compact ')) gc.markCompacts++;
    }
  });
  return gc;
}

async function startGateway(simUrl: string, variant: Variant, dataDir: string): Promise<Gateway> {
  if (variant.floor) {
    const floor = await spawnUntil([...SERVE_FLAGS, '--trace-gc', join(dist, 'bench/floor.js'), '--upstream', simUrl], {}, /listening on (http:\/\/127\.0\.0\.1:\d+)/);
    return { child: floor.child, url: floor.match[1]!, key: 'none', gc: watchGc(floor.child) };
  }
  const config = join(dataDir, 'sluice.yaml');
  const lines = [
    'server: { workers: 1 }',
    'upstreams:',
    `  chat: { kind: openai-chat, baseUrl: "${simUrl}/v1" }`,
    'models:',
    '  - { id: sim-chat, upstream: chat }',
  ];
  if (variant.plugins) lines.push(`plugins: [${variant.plugins.join(', ')}]`);
  if (variant.plugins && !variant.plugins.includes('auth')) lines.push('allowAnonymous: true');
  writeFileSync(config, lines.join('\n'));
  const gw = await spawnUntil(
    [...SERVE_FLAGS, '--trace-gc', join(dist, 'src/main.js'), 'serve', '--config', config],
    { SLUICE_PORT: '0', SLUICE_DATA_DIR: dataDir },
    /Sluice listening on (http:\/\/127\.0\.0\.1:\d+)[\s\S]*demo key[^:]*: (sk-\S+)/,
  );
  return { child: gw.child, url: gw.match[1]!, key: gw.match[2]!, gc: watchGc(gw.child) };
}

/** SIGTERM (the gateway drains; the floor just ends), SIGKILL if it is still there 10 s later. */
async function stop(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const gone = once(child, 'exit');
  child.kill('SIGTERM');
  const timer = setTimeout(() => child.kill('SIGKILL'), 10_000);
  await gone;
  clearTimeout(timer);
}

export interface BudgetRow {
  variant: string;
  workload: string;
  'CPU µs / exchange': number;
  'young GC KB / exchange': number;
  'mark-compacts': number;
  'req/s': number;
}

export async function runBudget(): Promise<{ table: Record<string, string>[]; rows: BudgetRow[] }> {
  const procs: ChildProcess[] = [];
  const dirs: string[] = [];
  const best = new Map<string, BudgetRow>();
  try {
    const sim = await spawnUntil([join(dist, 'plugins/upstreams/simulator/server.js'), '--port', '0'], {}, /listening on (http:\/\/127\.0\.0\.1:\d+)/);
    procs.push(sim.child);
    const simUrl = sim.match[1]!;
    for (let round = 0; round < ROUNDS; round++) {
      for (const variant of variants) {
        const dataDir = mkdtempSync(join(tmpdir(), 'sluice-budget-'));
        dirs.push(dataDir);
        const gw = await startGateway(simUrl, variant, dataDir);
        procs.push(gw.child);
        gw.child.stderr!.resume();
        try {
          for (const workload of workloads) {
            const { path, body } = requestFor('chat', 'sim-chat', workload);
            const load = (requests: number): Load => ({
              url: gw.url + path,
              headers: variant.floor ? {} : { authorization: `Bearer ${gw.key}` },
              body,
              requests,
              concurrency: CONCURRENCY,
            });
            await runLoad(load(WARMUP));
            const before = cpuSeconds([gw.child.pid!]);
            const gcBefore = { ...gw.gc };
            const result = await runLoad(load(MEASURED));
            const after = cpuSeconds([gw.child.pid!]);
            if (!before || !after) throw new Error('the budget needs /proc to read CPU time');
            const row: BudgetRow = {
              variant: variant.name,
              workload: workload.name,
              'CPU µs / exchange': ((after[0]! - before[0]!) * 1e6) / MEASURED,
              'young GC KB / exchange': ((gw.gc.scavengedMb - gcBefore.scavengedMb) * 1024) / MEASURED,
              'mark-compacts': gw.gc.markCompacts - gcBefore.markCompacts,
              'req/s': result.reqPerSec,
            };
            const key = `${variant.name}\n${workload.name}`;
            const previous = best.get(key);
            // The least CPU of the rounds: what the work costs, with the machine's noise left out.
            if (!previous || row['CPU µs / exchange'] < previous['CPU µs / exchange']) best.set(key, row);
            console.log(`  round ${round + 1}, ${variant.name}, ${workload.name}: ${row['CPU µs / exchange'].toFixed(1)} µs, ${row['young GC KB / exchange'].toFixed(1)} KB, ${Math.round(row['req/s'])} req/s`);
          }
        } finally {
          await stop(gw.child);
        }
      }
    }
  } finally {
    for (const child of procs) if (child.exitCode === null) child.kill('SIGKILL');
    for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
  }
  const rows = [...best.values()];
  const base = (workload: string) => rows.find((r) => r.workload === workload && r.variant === variants[0]!.name)!['CPU µs / exchange'];
  const table = rows.map((r) => ({
    variant: r.variant,
    workload: r.workload,
    'CPU µs / exchange': r['CPU µs / exchange'].toFixed(1),
    // What leaving the plugin out saved: its cost per exchange (the floor: what the runtime pays).
    'Δ vs default': r.variant === variants[0]!.name ? '' : (base(r.workload) - r['CPU µs / exchange']).toFixed(1),
    'young GC KB / exchange': r['young GC KB / exchange'].toFixed(1),
    'mark-compacts': String(r['mark-compacts']),
    'req/s': Math.round(r['req/s']).toLocaleString('en'),
  }));
  return { table, rows };
}
