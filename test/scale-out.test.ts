/**
 * Three instances on three ports sharing one PostgreSQL and one Redis, each its own `sluice serve`
 * process with its own data dir, as docs/operations.md ("Three instances behind a load balancer")
 * runs them: limits exact across instances, one usage record per request, a disabled key refused
 * everywhere within a second, a killed instance's slots back within the lease, Redis stopped and
 * back, and the admin token made by the first instance accepted by all.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { childEnv, distRoot, eventually, startSimulatorProcess, startTestGateway, watchProcess } from './helpers.js';
import { call, exactnessTests, keyIn, PATIENCE_MS, type Cluster } from './scale.js';
import { postgresDatabase, startRedis } from './servers.js';

t.setTimeout(180_000);

const main = join(distRoot, 'src/main.js');
const [sim, database, redis] = await Promise.all([startSimulatorProcess(), postgresDatabase(), startRedis()]);
t.teardown(() => sim.stop());

const LEASE_MS = 2000;
const config = (dataDir: string, failMode = 'closed') => `dataDir: ${dataDir}
log: { level: warn }
server: { workers: 1, shutdownTimeoutMs: 2000 }
store: { kind: postgres, url: "${database}" }
limiter: { kind: redis, url: "${redis.url}", failMode: ${failMode}, leaseMs: ${LEASE_MS}, timeoutMs: 1000 }
upstreams:
  sim: { kind: openai-chat, baseUrl: "${sim.url}/v1" }
models:
  - { id: sim-chat, upstream: sim, maxOutputTokens: { default: 64, max: 4096 }, prices: { input: 1000000, output: 1000000 } }
`;

interface Instance {
  dataDir: string;
  child: ChildProcess;
  url: string;
  out: () => string;
  exited: Promise<unknown>;
}

/** `sluice serve --config FILE`, exactly as docs/operations.md runs each instance; resolves once it listens. */
async function serve(dataDir: string): Promise<Instance> {
  const file = join(dataDir, 'sluice.yaml');
  const child = spawn(process.execPath, [main, 'serve', '--config', file], { stdio: ['ignore', 'pipe', 'pipe'], env: childEnv({ SLUICE_PORT: '0' }) });
  const watched = watchProcess(child);
  const url = (await watched.waitFor(/Sluice listening on (http:\/\/127\.0\.0\.1:\d+)/, 'an instance to listen'))[1]!;
  return { dataDir, child, url, out: () => watched.stdout() + watched.stderr(), exited: watched.exited };
}

const dirs = Array.from({ length: 3 }, () => mkdtempSync(join(tmpdir(), 'sluice-scale-')));
for (const dir of dirs) writeFileSync(join(dir, 'sluice.yaml'), config(dir));
// The first instance makes the admin token; the others find its digest in the shared store.
const instances: Instance[] = [await serve(dirs[0]!)];
instances.push(...(await Promise.all(dirs.slice(1).map((d) => serve(d)))));
const adminToken = readFileSync(join(dirs[0]!, 'admin-token'), 'utf8').trim();
t.teardown(async () => {
  for (const i of instances) if (i.child.exitCode === null) i.child.kill('SIGTERM');
  await Promise.all(instances.map((i) => i.exited));
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

const cluster: Cluster = {
  get urls() {
    return instances.map((i) => i.url);
  },
  async admin(method, path, body, at = 0) {
    const res = await fetch(`${instances[at]!.url}${path}`, {
      method,
      headers: { authorization: `Bearer ${adminToken}`, 'content-type': 'application/json' },
      ...(body !== undefined && { body: JSON.stringify(body) }),
    });
    return { status: res.status, body: await res.json() };
  },
};

t.test('the admin token made by the first instance works on all three; only the first shows it', async (t) => {
  for (let at = 0; at < 3; at++) t.equal((await cluster.admin('GET', '/admin/groups', undefined, at)).status, 200, `instance ${at}`);
  t.match(instances[0]!.out(), /demo key/);
  t.notMatch(instances[1]!.out() + instances[2]!.out(), /demo key|sluice-admin-/, 'the others show neither the demo key nor the token');
  t.match(instances[1]!.out(), /admin token: the one made by the first instance/);
});

t.test('an instance whose data dir holds another admin token refuses to start, naming the fix', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sluice-scale-other-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  writeFileSync(join(dir, 'sluice.yaml'), config(dir));
  writeFileSync(join(dir, 'admin-token'), 'sluice-admin-a-different-token-from-elsewhere\n', { mode: 0o600 });
  const err = (await serve(dir).catch((e: Error) => e)) as Error;
  t.match(err.message, /not the one the shared store knows[\s\S]*remove the file to use the shared token, or set adminToken/);
});

exactnessTests(t, () => cluster);

const long = (url: string, key: string) =>
  fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'sim-chat', stream: true, messages: [{ role: 'user', content: 'long [[sim tokens=2000 tps=50]]' }] }),
  });

t.test('kill -9 of an instance holding slots: they return within the lease; its exchanges are recorded when it starts again', async (t) => {
  const { key, id } = await keyIn(cluster, { limits: { concurrency: 3 } });
  const victim = instances[2]!;
  const held = await Promise.all([0, 1, 2].map(() => long(victim.url, key)));
  t.same(
    held.map((r) => r.status),
    [200, 200, 200],
  );
  // The streams have begun: their first bytes are here.
  await Promise.all(held.map((r) => r.body!.getReader().read()));
  t.equal((await call(instances[0]!.url, key, { messages: [{ role: 'user', content: 'room?' }] })).status, 429, 'the three slots are held');
  victim.child.kill('SIGKILL');
  await victim.exited;
  // Nothing settles the dead instance's leases: they expire, renewed no more.
  await eventually(async () => (await call(instances[0]!.url, key, { messages: [{ role: 'user', content: 'room now? [[sim tokens=2]]' }] })).status === 200, 'a slot to come back', LEASE_MS + 3000);
  t.pass('a slot returned within the lease time (plus polling)');

  // Started again on its data dir, the instance records the three exchanges it held as interrupted.
  instances[2] = await serve(victim.dataDir);
  const records = await eventually(async () => {
    const got = (await cluster.admin('GET', `/admin/requests?key=${id}&limit=100`)).body.data as any[];
    return got.filter((r) => r.outcome === 'interrupted').length === 3 && got;
  }, 'three interrupted records', PATIENCE_MS);
  t.equal(records.filter((r: any) => r.outcome === 'interrupted').length, 3);
});

t.test('Redis stopped mid-run: failMode closed answers 503, failMode open serves without limits; both recover', async (t) => {
  // One more instance, in this process, with the other fail mode.
  const openDir = mkdtempSync(join(tmpdir(), 'sluice-scale-open-'));
  const open = await startTestGateway(() => config(openDir, 'open'), { dataDir: openDir });
  t.teardown(() => open.stop());
  const { key } = await keyIn(cluster, { limits: { rpm: 1000 } });
  const ask = (url: string) => call(url, key, { messages: [{ role: 'user', content: 'hi [[sim tokens=2]]' }] });
  t.equal((await ask(instances[0]!.url)).status, 200);
  t.equal((await ask(open.url)).status, 200);

  redis.stop();
  const refused = await eventually(async () => {
    const r = await ask(instances[1]!.url);
    return r.status === 503 && r;
  }, 'the closed instance to answer 503', PATIENCE_MS);
  t.match(JSON.parse(refused.text), { error: { message: /limit/i } }, 'in the family shape, saying why');
  t.equal((await ask(open.url)).status, 200, 'the open instance serves');

  redis.start();
  await eventually(async () => (await ask(instances[1]!.url)).status === 200, 'the closed instance to recover', PATIENCE_MS);
  t.equal((await ask(open.url)).status, 200);
  t.match(open.logs.map((l) => l.msg).join('\n'), /redis/i, 'the outage is logged');
});
