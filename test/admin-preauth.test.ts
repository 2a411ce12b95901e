/**
 * The admin routes hold no memory for a caller they have not authenticated: the token is checked
 * on the headers before any body byte is read, bodies are capped small, and they count in the
 * in-flight body budget. The attack run's shape, scaled to a test: many connections each trickling
 * a chunked `POST /admin/groups` with no token (or a wrong one), while the gateway's RSS is sampled.
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { distRoot } from './helpers.js';

t.setTimeout(240_000);

const ATTACKERS = 150;
const CHUNK = Buffer.alloc(32 * 1024, 'x');
/** What each attacker would send at most: past the old 1 MB cap, so the old code read a full megabyte each. */
const ATTACK_BYTES = 1.5 * 1024 * 1024;

const dataDir = mkdtempSync(join(tmpdir(), 'sluice-preauth-'));
const child = spawn(process.execPath, [join(distRoot, 'src/main.js'), 'serve'], {
  env: { ...process.env, SLUICE_DATA_DIR: dataDir, SLUICE_PORT: '0', SLUICE_WORKERS: '1', SLUICE_LOG_LEVEL: 'warn' },
  stdio: ['ignore', 'pipe', 'pipe'],
});
const exited = new Promise((resolve) => child.once('exit', resolve));
t.teardown(async () => {
  child.kill('SIGKILL');
  await exited;
  rmSync(dataDir, { recursive: true, force: true });
});
/** Its banner's port, once printed (readiness; the bound only stops a hang). */
const port = await new Promise<number>((resolve, reject) => {
  let out = '';
  const bound = setTimeout(() => reject(new Error(`no listening line after 120 s: ${out}`)), 120_000);
  child.stdout.on('data', (d) => {
    out += d;
    const m = /Sluice listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(out);
    if (m) (clearTimeout(bound), resolve(Number(m[1])));
  });
  child.once('exit', (code) => (clearTimeout(bound), reject(new Error(`the gateway exited ${code}: ${out}`))));
});
const adminToken = readFileSync(join(dataDir, 'admin-token'), 'utf8').trim();
const url = `http://127.0.0.1:${port}`;

const rssMb = () => Number(/VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${child.pid}/status`, 'utf8'))![1]) / 1024;

/** One attacker: a chunked upload trickled until the gateway answers or closes; its status line. */
function attack(headers: string[]): Promise<number> {
  return new Promise((resolve) => {
    const socket = connect(port, '127.0.0.1');
    let sent = 0;
    let answer = '';
    let timer: NodeJS.Timeout | undefined;
    const done = () => {
      clearInterval(timer);
      socket.destroy();
      resolve(Number(/^HTTP\/1\.1 (\d{3})/.exec(answer)?.[1] ?? 0));
    };
    socket.on('data', (d) => {
      answer += d.toString('latin1');
      if (answer.includes('\r\n\r\n')) done();
    });
    socket.on('close', done);
    socket.on('error', () => {});
    socket.write(['POST /admin/groups HTTP/1.1', 'Host: x', 'Content-Type: application/json', 'Transfer-Encoding: chunked', ...headers, '', ''].join('\r\n'));
    // The trickle starts a moment after the headers, so a gateway that answers on the headers is
    // read before any body byte meets its closed connection (which would reset it).
    const start = () => setInterval(() => {
      if (sent >= ATTACK_BYTES) return;
      socket.write(`${CHUNK.length.toString(16)}\r\n`);
      socket.write(CHUNK);
      socket.write('\r\n');
      sent += CHUNK.length;
    }, 20);
    setTimeout(() => {
      if (!answer) timer = start();
    }, 200);
  });
}

const attackers = () =>
  Promise.all([
    ...Array.from({ length: ATTACKERS }, () => attack([])),
    ...Array.from({ length: 10 }, () => attack(['Authorization: Bearer wrong-token-wrong-token'])),
  ]);

t.test('unauthenticated uploads to /admin are refused on their headers, holding no memory', async (t) => {
  await fetch(`${url}/healthz`);
  const before = rssMb();
  let peak = before;
  const sampler = setInterval(() => (peak = Math.max(peak, rssMb())), 100);
  const health: number[] = [];
  const probe = () => fetch(`${url}/healthz`).then((r) => health.push(r.status), () => health.push(0));
  const prober = setInterval(probe, 250);
  const [statuses] = await Promise.all([
    attackers(),
    probe(),
  ]);
  clearInterval(sampler);
  clearInterval(prober);
  const anonymous = statuses.slice(0, ATTACKERS);
  t.same([...new Set(anonymous)], [401], 'every keyless upload gets its 401');
  t.ok(statuses.slice(ATTACKERS).every((s) => s === 401 || s === 429), 'wrong tokens get 401, then 429');
  // The old code read up to 1 MB of each body first: ~150 MB for these attackers.
  t.ok(peak - before < 40, `RSS grew ${(peak - before).toFixed(1)} MB for ${statuses.length} attackers (from ${before.toFixed(0)} MB)`);
  t.ok(health.length > 0 && health.every((s) => s === 200), `/healthz answered throughout (${health.length} probes)`);
});

t.test('the admin still works: small bodies are read, large ones refused', async (t) => {
  const post = (body: string) =>
    fetch(`${url}/admin/groups`, { method: 'POST', headers: { authorization: `Bearer ${adminToken}`, 'content-type': 'application/json' }, body });
  t.equal((await post(JSON.stringify({ name: 'after-the-attack', models: ['*'], families: ['chat'] }))).status, 201);
  const big = await post(JSON.stringify({ name: 'big', models: ['*'], families: ['chat'], padding: 'x'.repeat(100_000) }));
  t.equal(big.status, 413, 'an admin body over 64 KB is refused');
});
