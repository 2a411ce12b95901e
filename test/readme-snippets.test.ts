/**
 * The snippets of the README and of every docs/*.md, run exactly as printed. A fenced block right
 * after `<!-- test: node -->` or `<!-- test: sh -->` runs against a gateway on the embedded default
 * (the in-process simulator) on a free port; each is reported by its file and line. Only two
 * things are replaced: `http://127.0.0.1:8080` by that gateway's URL and the `sk-...` placeholder
 * by its demo key, which every block also gets as SLUICE_KEY. Blocks run in a folder laid out like
 * the project's, whose `data` is the gateway's data directory, so `cat data/admin-token` and the
 * CLI (`node dist/src/main.js`) work as printed. Each block must exit 0 within a deadline and print
 * no error.
 */
import { execFile, execFileSync } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import t from 'tap';
import { loadConfig } from '../src/config/load.js';
import { startGateway } from '../src/gateway.js';
import { createLogger } from '../src/log.js';
import { distRoot } from './helpers.js';

const run = promisify(execFile);
// Readiness, not a deadline: each block is bounded on its own below.
t.setTimeout(600_000);
const root = join(distRoot, '..');
/** The README first, then docs/*.md in name order: paths from the project folder. */
const files = ['README.md', ...readdirSync(join(root, 'docs')).filter((f) => f.endsWith('.md')).sort().map((f) => `docs/${f}`)];
const texts = new Map(files.map((file) => [file, readFileSync(join(root, file), 'utf8')]));

interface Snippet {
  kind: 'node' | 'sh';
  file: string;
  line: number;
  code: string;
}

const snippets: Snippet[] = files.flatMap((file) => {
  const text = texts.get(file)!;
  return [...text.matchAll(/<!-- test: (node|sh) -->\n```\w*\n([\s\S]*?)\n```/g)].map((m) => ({
    kind: m[1] as Snippet['kind'],
    file,
    line: text.slice(0, m.index).split('\n').length + 2,
    code: m[2]!,
  }));
});

t.test('every JavaScript block is marked to run, and some shell blocks are', async (t) => {
  let jsBlocks = 0;
  for (const [file, text] of texts) {
    const js = [...text.matchAll(/^```js$/gm)].length;
    jsBlocks += js;
    t.equal(snippets.filter((s) => s.file === file && s.kind === 'node').length, js, `each js block of ${file} is preceded by <!-- test: node -->`);
  }
  t.ok(jsBlocks > 0, 'the README and docs have JavaScript blocks');
  t.ok(snippets.some((s) => s.file === 'README.md' && s.kind === 'sh'), "the Quick start's curl examples are marked <!-- test: sh -->");
  // 12 marked blocks when the README was split into docs/ (6 node, 6 sh): none may be lost.
  t.ok(snippets.filter((s) => s.kind === 'node').length >= 6 && snippets.filter((s) => s.kind === 'sh').length >= 6, `${snippets.length} marked blocks`);
});

const hasCurl = (() => {
  try {
    execFileSync('sh', ['-c', 'command -v curl'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
})();

t.test('the snippets run against a gateway on the embedded default', async (t) => {
  const dataDir = mkdtempSync(join(tmpdir(), 'sluice-readme-'));
  // A reload (POST /admin/reload) reads the same source again.
  const source = { env: { SLUICE_PORT: '0', SLUICE_DATA_DIR: dataDir } };
  const gateway = await startGateway(loadConfig(source), createLogger('silent'), source);
  // A project folder as a reader has one: `node_modules` (so `openai`, `ws` and `@google/genai`
  // resolve), `dist` (so `node dist/src/main.js` runs the CLI) and `data`, the running gateway's.
  const workDir = mkdtempSync(join(tmpdir(), 'sluice-readme-work-'));
  for (const entry of ['node_modules', 'dist']) symlinkSync(join(distRoot, '..', entry), join(workDir, entry));
  symlinkSync(dataDir, join(workDir, 'data'));
  t.teardown(async () => {
    await gateway.shutdown();
    rmSync(dataDir, { recursive: true, force: true });
    rmSync(workDir, { recursive: true, force: true });
  });
  const url = `http://127.0.0.1:${gateway.port}`;
  const key = gateway.firstStart!.demoKey;

  for (const snippet of snippets) {
    const name = `${snippet.file} line ${snippet.line} (${snippet.kind})`;
    t.test(name, { skip: snippet.kind === 'sh' && !hasCurl && 'curl is not installed' }, async (t) => {
      const code = snippet.code.replaceAll('http://127.0.0.1:8080', url).replaceAll('sk-...', key);
      const viaCli = snippet.code.includes('node dist/src/main.js');
      t.ok(viaCli || code !== snippet.code, 'the snippet addresses the gateway at its documented URL, or through the CLI');
      const file = join(workDir, `${snippet.file.replace(/\W/g, '-')}-line-${snippet.line}.${snippet.kind === 'node' ? 'mjs' : 'sh'}`);
      writeFileSync(file, code);
      const [command, args] = snippet.kind === 'node' ? [process.execPath, [file]] : ['sh', ['-e', file]];
      const result: { code?: number | null; signal?: string | null; stdout?: string; stderr?: string } = await run(command, args, {
        cwd: workDir,
        env: { ...process.env, SLUICE_KEY: key },
        // A bound for a hang: the CLI block starts the CLI fifteen times, each loading the gateway's modules.
        timeout: 150_000,
        killSignal: 'SIGKILL',
      }).catch((err) => err);
      t.same({ code: result.code ?? 0, signal: result.signal ?? null }, { code: 0, signal: null }, `exits 0 in time${result.stderr ? `; stderr: ${result.stderr}` : ''}`);
      t.ok(result.stdout?.trim(), 'prints an answer');
      t.notMatch(result.stdout ?? '', /"error"\s*:\s*\{/, 'the answer is not an error body');
    });
  }

  // docs/operations.md makes a "ci-bot" in team-a through the admin API, then one in team-b with
  // the CLI and changes "$id": the CLI block's, not team-a's.
  t.test('the CLI block changes the key it created, not the one of the same name before it', async (t) => {
    const keys: { name: string; group: string; disabled: boolean }[] = JSON.parse((await run(process.execPath, [join(distRoot, 'src/main.js'), 'keys', 'list'], { env: { ...process.env, SLUICE_DATA_DIR: dataDir } })).stdout);
    const bots = keys.filter((k) => k.name === 'ci-bot').map((k) => ({ group: k.group, disabled: k.disabled }));
    t.same(bots.sort((a, b) => a.group.localeCompare(b.group)), [
      { group: 'team-a', disabled: false },
      { group: 'team-b', disabled: true },
    ]);
  });
});
