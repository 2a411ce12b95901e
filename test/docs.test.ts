/**
 * The README and docs/*.md against the tree they describe: the README stays a front door (at most
 * 250 lines, the Quick start's commands that .ci/run follows), every relative link and anchor
 * resolves (anchors by GitHub's heading slugs), the config examples load, the file map in
 * docs/source.md lists every file in src/ and nothing that is not there, and the out-of-tree
 * plugin walkthrough installs what the project builds with.
 */
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, relative } from 'node:path';
import t from 'tap';
import { loadConfig } from '../src/config/load.js';
import { distRoot } from './helpers.js';

const root = join(distRoot, '..');
const read = (file: string) => readFileSync(join(root, file), 'utf8');
const docs = readdirSync(join(root, 'docs'))
  .filter((f) => f.endsWith('.md'))
  .sort()
  .map((f) => `docs/${f}`);
const markdownFiles = ['README.md', ...docs];

/** Lines outside fenced code blocks, with their line numbers. */
function prose(text: string): { line: number; text: string }[] {
  const out: { line: number; text: string }[] = [];
  let fence = false;
  text.split('\n').forEach((line, i) => {
    if (/^\s*```/.test(line)) fence = !fence;
    else if (!fence) out.push({ line: i + 1, text: line });
  });
  return out;
}

/** GitHub's anchor for a heading: lowercase, punctuation removed, spaces to hyphens. */
function slug(heading: string): string {
  return heading
    .replace(/\[([^\]]*)\]\([^)]*\)/g, '$1')
    .trim()
    .toLowerCase()
    .replace(/[^\p{L}\p{M}\p{N}\p{Pc} -]/gu, '')
    .replace(/ /g, '-');
}

/** Every anchor a Markdown file has; a repeated heading gets -1, -2, … as on GitHub. */
function anchors(text: string): Set<string> {
  const seen = new Map<string, number>();
  const out = new Set<string>();
  for (const { text: line } of prose(text)) {
    const m = /^#{1,6}\s+(.*?)\s*#*\s*$/.exec(line);
    if (!m) continue;
    const base = slug(m[1]!);
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    out.add(n === 0 ? base : `${base}-${n}`);
  }
  return out;
}

t.test('slugs follow GitHub', async (t) => {
  t.equal(slug('Scale: worker threads and many instances'), 'scale-worker-threads-and-many-instances');
  t.equal(slug('Content generation (Gemini shape)'), 'content-generation-gemini-shape');
  t.equal(slug('Where the time goes, thread by thread and function by function'), 'where-the-time-goes-thread-by-thread-and-function-by-function');
  t.equal(slug('Node 20 and Node 24'), 'node-20-and-node-24');
  t.equal(slug('`sluice_in_flight` and snake_case'), 'sluice_in_flight-and-snake_case');
  t.same([...anchors('# A\n## A\n```\n# not a heading\n```\n## A')], ['a', 'a-1', 'a-2']);
});

t.test('the README is a front door', async (t) => {
  const readme = read('README.md');
  const lines = readme.split('\n').length - (readme.endsWith('\n') ? 1 : 0);
  t.ok(lines <= 250, `README.md has ${lines} lines (at most 250; the rest belongs in docs/)`);
  // .ci/run runs the README's install and test commands, and its Quick start (`npm start`, then a
  // request per family): the commands stay as printed.
  t.match(readme, /\n## Quick start\n/);
  t.match(readme, /\nnpm ci +# install and build\nnpm start +# start the gateway/);
  t.match(readme, /\nnpm test +# build again, then run the whole test suite\n/);
  t.match(readme, /\n## Tests\n\nRun `npm test`\./);
  for (const doc of docs) t.ok(readme.includes(`](${doc})`), `the README links to ${doc}`);
});

t.test('every relative link and anchor resolves', async (t) => {
  const anchorsOf = new Map<string, Set<string>>();
  const anchorsIn = (file: string) => {
    if (!anchorsOf.has(file)) anchorsOf.set(file, anchors(read(file)));
    return anchorsOf.get(file)!;
  };
  let checked = 0;
  for (const file of markdownFiles) {
    for (const { line, text } of prose(read(file))) {
      // Code spans hold no links (and may hold brackets that look like one).
      const bare = text.replace(/`[^`]*`/g, '``');
      for (const m of bare.matchAll(/!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)/g)) {
        const target = m[1]!;
        if (/^[a-z][a-z0-9+.-]*:/i.test(target)) continue; // https:, mailto:
        checked++;
        const where = `${file}:${line}: ${target}`;
        if (target.startsWith('/')) {
          t.fail(`${where}: use a path relative to the file`);
          continue;
        }
        const [path, anchor] = target.split('#', 2) as [string, string | undefined];
        const resolved = path ? relative(root, join(root, dirname(file), decodeURIComponent(path))) : file;
        let exists = false;
        try {
          statSync(join(root, resolved));
          exists = !resolved.startsWith('..');
        } catch {}
        if (!exists) {
          t.fail(`${where}: no such file (${resolved})`);
          continue;
        }
        if (anchor !== undefined) {
          if (!resolved.endsWith('.md')) t.fail(`${where}: an anchor into a file that is not Markdown`);
          else if (!anchorsIn(resolved).has(decodeURIComponent(anchor))) t.fail(`${where}: ${resolved} has no heading #${anchor}`);
        }
      }
    }
  }
  t.ok(checked > 50, `${checked} relative links checked`);
});

t.test('the config examples load', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sluice-docs-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const env = { OPENAI_API_KEY: 'sk-test', ANTHROPIC_API_KEY: 'sk-test', GEMINI_API_KEY: 'k', AZURE_OPENAI_KEY: 'k', AZURE_EAST_KEY: 'k', AZURE_WEST_KEY: 'k' };
  // The README's short example and the reference's full one (the first block of each).
  for (const file of ['README.md', 'docs/configuration.md']) {
    const block = /^```yaml\n([\s\S]*?)\n```/m.exec(read(file))?.[1];
    t.ok(block, `${file} has a config example`);
    const path = join(dir, `${file.replace(/\W/g, '-')}.yaml`);
    writeFileSync(path, block ?? '');
    t.doesNotThrow(() => loadConfig({ path, env }), `${file}'s config example is valid`);
  }
});

t.test('the file map in docs/source.md lists every file in src/', async (t) => {
  const source = read('docs/source.md');
  const block = /^```\n(src\/[\s\S]*?)\n```/m.exec(source)?.[1];
  if (!t.ok(block, 'docs/source.md has the file map (a code block that starts with src/)')) return;
  // Each line is `NAME  description`, indented under its folder; a name ending in / is a folder.
  const mapped: string[] = [];
  const folders: { indent: number; path: string }[] = [];
  for (const line of block!.split('\n')) {
    const m = /^( *)(\S+)/.exec(line);
    if (!m) continue;
    const indent = m[1]!.length;
    while (folders.length && folders[folders.length - 1]!.indent >= indent) folders.pop();
    const path = (folders[folders.length - 1]?.path ?? '') + m[2]!;
    if (path.endsWith('/')) folders.push({ indent, path });
    mapped.push(path);
  }
  for (const path of mapped) {
    let exists = false;
    try {
      exists = statSync(join(root, path)).isDirectory() === path.endsWith('/');
    } catch {}
    t.ok(exists, `the map's ${path} exists`);
  }
  const files = (dir: string): string[] =>
    readdirSync(join(root, dir), { withFileTypes: true }).flatMap((e) => (e.isDirectory() ? files(`${dir}${e.name}/`) : [`${dir}${e.name}`]));
  const missing = files('src/').filter((f) => !mapped.includes(f));
  t.same(missing, [], 'every file in src/ has its line in the map (a one-line description, from its top comment)');
});

t.test("the out-of-tree plugin walkthrough installs without scripts, and the TypeScript the project builds with", async (t) => {
  const installs = read('docs/plugins.md').split('\n').filter((line) => /^npm install\b/.test(line));
  t.ok(installs.length >= 2, 'the walkthrough installs the package and TypeScript');
  for (const line of installs) t.match(line, /--ignore-scripts/, line);
  // A newer major (7) refuses to compile the walkthrough's files beside a tsconfig.json (TS5112).
  const pinned = JSON.parse(read('package.json')).devDependencies.typescript;
  t.ok(installs.some((line) => line.includes(`typescript@${pinned}`)), `TypeScript is pinned to ${pinned}`);
});
