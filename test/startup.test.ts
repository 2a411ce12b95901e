/**
 * Start-up (issue 23): the tokenizer's tables, the largest load at start, wait for the first
 * estimate or for a moment after the gateway serves. Checked in a fresh process, whose module
 * cache shows what the start loaded (no wall-clock time is asserted).
 */
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { childEnv, READY_BOUND_MS } from './helpers.js';

const distRoot = new URL('..', import.meta.url);
const moduleUrl = (path: string) => new URL(path, distRoot).href;

t.test('the tokenizer is not loaded by the start, then loads on its own once the gateway serves', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sluice-startup-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const config = join(dir, 'sluice.yaml');
  writeFileSync(config, `dataDir: ${JSON.stringify(dir)}\nserver: { workers: 1, port: 0 }\n`);
  const script = `
    import { createRequire } from 'node:module';
    const { loadConfig } = await import(${JSON.stringify(moduleUrl('src/config/load.js'))});
    const { startGateway } = await import(${JSON.stringify(moduleUrl('src/gateway.js'))});
    const { createLogger } = await import(${JSON.stringify(moduleUrl('src/log.js'))});
    const { estimateTokens } = await import(${JSON.stringify(moduleUrl('src/tokens.js'))});
    const loaded = () => Object.keys(createRequire(import.meta.url).cache).some((k) => k.includes('gpt-tokenizer'));
    const source = { path: ${JSON.stringify(config)}, env: {} };
    const gateway = await startGateway(loadConfig(source), createLogger('silent'), source);
    const atStart = loaded();
    while (!loaded()) await new Promise((r) => setTimeout(r, 50));
    console.log(JSON.stringify({ atStart, later: loaded(), tokens: estimateTokens('Hello, world!') }));
    await gateway.shutdown(0);`;
  const child = spawn(process.execPath, ['--input-type=module', '-e', script], { env: childEnv(), stdio: ['ignore', 'pipe', 'inherit'] });
  t.teardown(() => void (child.exitCode === null && child.kill('SIGKILL')));
  const killer = setTimeout(() => child.kill('SIGKILL'), READY_BOUND_MS);
  let out = '';
  child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
  const [code] = await once(child, 'exit');
  clearTimeout(killer);
  t.equal(code, 0, `the process ends (output: ${out})`);
  t.same(JSON.parse(out.trim().split('\n').pop()!), { atStart: false, later: true, tokens: 4 }, 'loaded after the start, and counts');
});
