/**
 * The module graph of src/ and plugins/ has no cycle: no module reaches itself through its imports,
 * type-only imports and re-exports included (`import … from`, `import type … from`, `export … from`,
 * `import '…'`, and `import('…')`). A cycle is printed as the path that closes it.
 *
 * Why types count: a type-only cycle is still two modules that cannot be read, changed or moved
 * one without the other. Shared types live in leaf modules (usage.ts, state-key.ts, config/types.ts)
 * and the side that is called defines the small interface it needs (relay.ts's RelayOwner).
 */
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import t from 'tap';

const root = fileURLToPath(new URL('../..', import.meta.url));

function sources(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const path = join(dir, e.name);
    if (e.isDirectory()) return sources(path);
    return e.name.endsWith('.ts') && !e.name.endsWith('.d.ts') ? [path] : [];
  });
}

/**
 * Relative module specifiers of a source: statements that start a line (so a doc comment's example
 * is not one), and dynamic imports anywhere.
 */
function importsOf(text: string): string[] {
  const found: string[] = [];
  for (const m of text.matchAll(/^\s*(?:import|export)\b[^'";]*?\bfrom\s*['"](\.[^'"]+)['"]/gm)) found.push(m[1]!);
  for (const m of text.matchAll(/^\s*import\s*['"](\.[^'"]+)['"]/gm)) found.push(m[1]!);
  for (const m of text.matchAll(/\bimport\s*\(\s*['"](\.[^'"]+)['"]\s*\)/g)) found.push(m[1]!);
  return found;
}

/**
 * Every strongly connected set of modules (Tarjan), each as one path that closes a cycle in it;
 * a set larger than its path has its other modules after a `+`.
 */
function cycles(graph: Map<string, string[]>): string[][] {
  let next = 0;
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const sets: string[][] = [];
  const visit = (v: string) => {
    index.set(v, next);
    low.set(v, next++);
    stack.push(v);
    onStack.add(v);
    for (const w of graph.get(v) ?? []) {
      if (!graph.has(w)) continue;
      if (!index.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v)!, low.get(w)!));
      } else if (onStack.has(w)) low.set(v, Math.min(low.get(v)!, index.get(w)!));
    }
    if (low.get(v) !== index.get(v)) return;
    const set: string[] = [];
    let w: string;
    do {
      w = stack.pop()!;
      onStack.delete(w);
      set.push(w);
    } while (w !== v);
    if (set.length > 1 || graph.get(v)!.includes(v)) sets.push(set);
  };
  for (const v of [...graph.keys()].sort()) if (!index.has(v)) visit(v);
  // One path per set: breadth first from its first module back to it, within the set.
  return sets.map((set) => {
    const start = [...set].sort()[0]!;
    const from = new Map<string, string>();
    const queue = [start];
    while (queue.length) {
      const v = queue.shift()!;
      for (const w of graph.get(v)!) {
        if (!set.includes(w)) continue;
        if (w === start) {
          const path = [start];
          for (let at = v; at !== start; at = from.get(at)!) path.splice(1, 0, at);
          const rest = set.filter((m) => !path.includes(m)).sort();
          return [...path, start, ...(rest.length ? ['+', ...rest] : [])];
        }
        if (!from.has(w)) {
          from.set(w, v);
          queue.push(w);
        }
      }
    }
    return [...set, set[0]!];
  });
}

t.test('the cycle finder finds a planted cycle and passes a graph without one', async (t) => {
  const g = (edges: Record<string, string[]>) => new Map(Object.entries(edges));
  t.same(cycles(g({ a: ['b'], b: ['c'], c: [] })), []);
  t.same(cycles(g({ a: ['b'], b: ['c'], c: ['a'], d: ['a'] })), [['a', 'b', 'c', 'a']]);
  t.same(cycles(g({ a: ['b'], b: ['a', 'c'], c: ['b'] })), [['a', 'b', 'a', '+', 'c']]);
  t.same(cycles(g({ a: ['a'] })), [['a', 'a']]);
  t.same(
    importsOf(
      [
        "import type { A } from './a.js';",
        'import {\n  b,\n  c,\n} from "../b.js";',
        "export * as d from './d.js';",
        "export type { E } from './e.js';",
        "import './f.js';",
        "const g = await import('./g.js');",
        " * import { h } from './h.js' (in a comment)",
        "import { readFileSync } from 'node:fs';",
      ].join('\n'),
    ),
    ['./a.js', '../b.js', './d.js', './e.js', './f.js', './g.js'],
  );
});

t.test('no module in src/ or plugins/ imports itself through others, types included', async (t) => {
  const files = [...sources(join(root, 'src')), ...sources(join(root, 'plugins'))];
  t.ok(files.length > 100, `${files.length} sources read`);
  const graph = new Map<string, string[]>();
  let edges = 0;
  for (const file of files) {
    const targets = importsOf(readFileSync(file, 'utf8')).map((s) => relative(root, join(dirname(file), s)).replace(/\.js$/, '.ts'));
    graph.set(relative(root, file), [...new Set(targets)]);
    edges += targets.length;
  }
  t.ok(edges > 300, `${edges} imports read`);
  const found = cycles(graph).map((c) => {
    const plus = c.indexOf('+');
    return plus < 0 ? c.join(' → ') : `${c.slice(0, plus).join(' → ')} (tangled with ${c.slice(plus + 1).join(', ')})`;
  });
  for (const cycle of found) t.comment(`import cycle: ${cycle}`);
  t.same(found, [], 'no import cycle');
});
