/**
 * Property-based test of the config loader: any file (random YAML documents, mutated valid
 * configs, raw text, deep nesting, `${ENV}` references) gives either a Config or a ConfigError,
 * never another exception.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import fc from 'fast-check';
import t from 'tap';
import { stringify } from 'yaml';
import { ConfigError, loadConfig } from '../src/config/load.js';
import { pathsIn } from './helpers.js';

// Property runs by the thousand, CPU-bound: near tap's default 60 s on two busy cores.
t.setTimeout(180_000);

const dir = mkdtempSync(join(tmpdir(), 'sluice-config-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const file = join(dir, 'sluice.yaml');

/** Loads `text` as the config file; throws anything that is not a ConfigError. */
function load(text: string): void {
  writeFileSync(file, text);
  try {
    const config = loadConfig({ path: file, env: { SET: 'value', PORT: '8080' } });
    if (!config.models.length) throw new Error('a Config without models');
    const stray = config.models.find((m) => !Object.hasOwn(config.upstreams, m.upstream));
    if (stray) throw new Error(`model ${stray.id} uses upstream "${stray.upstream}", which is not configured`);
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err;
  }
}

const valid = {
  server: { host: '127.0.0.1', port: 8080, maxBodyBytes: 65536, requestCaps: { messages: 10, depth: 16 } },
  dataDir: './data',
  log: { level: 'info' },
  plugins: ['auth', { name: 'grant', options: { a: 1 } }],
  upstreams: { sim: { kind: 'simulator' }, other: { kind: 'openai-chat', baseUrl: '${SET}', apiKey: '${UNSET:-fallback}' } },
  models: [
    { id: 'm', upstream: 'sim', maxOutputTokens: { default: 8, max: 16 }, features: { tools: false, serverTools: ['web_search'] }, families: ['chat'] },
    { id: 'n', upstream: 'other', upstreamModel: 'x', ignoreParameters: ['topK'], contextTokens: 1000 },
  ],
};

const paths = pathsIn(valid);
const odd = fc.oneof(
  fc.constantFrom(null, 0, -1, 1.5, 70000, '', 'x', '${UNSET}', '${SET}', '${', 'toString', '__proto__', 'constructor', true, [], {}, [null], { kind: 'simulator' }),
  fc.jsonValue({ maxDepth: 3 }),
);

t.test('the valid config loads', async (t) => {
  writeFileSync(file, stringify(valid));
  const config = loadConfig({ path: file, env: { SET: 'value' } });
  t.equal(config.models.length, 2);
  t.same(config.server.requestCaps, { messages: 10, tools: 128, contentParts: 10_000, depth: 16, modelIdLength: 256 }, 'caps not set keep their defaults');
});

t.test('a valid config with one value replaced, removed or renamed', async (t) => {
  fc.assert(
    fc.property(fc.nat(), fc.constantFrom('replace', 'remove', 'rename'), odd, fc.string({ maxLength: 8 }), (at, how, value, name) => {
      const copy = structuredClone(valid) as any;
      const path = paths[at % paths.length]!;
      let parent = copy;
      for (const key of path.slice(0, -1)) parent = parent[key];
      const last = path.at(-1)!;
      if (how === 'replace') parent[last] = value;
      else if (Array.isArray(parent)) parent.splice(last as number, 1);
      else {
        if (how === 'rename') parent[name] = parent[last];
        delete parent[last];
      }
      load(stringify(copy));
    }),
    { numRuns: 1000 },
  );
  t.pass('every variant gave a Config or a ConfigError');
});

t.test('random YAML documents and raw text', async (t) => {
  const text = fc.oneof(
    fc.jsonValue({ maxDepth: 4 }).map((v) => stringify(v)),
    fc.dictionary(fc.constantFrom('server', 'models', 'upstreams', 'plugins', 'log', 'dataDir', 'adminToken', 'x'), fc.jsonValue({ maxDepth: 3 })).map((v) => stringify(v)),
    fc.string({ maxLength: 200 }),
    fc.array(fc.constantFrom('a: ', '- ', '  ', '\n', '{', '}', '[', ']', '&x ', '*x', '!!str ', '!!binary ', '? ', ': ', '"', "'", '${SET}', '${UNSET}', '#', '%YAML 1.2\n', '---\n', '...\n'), { maxLength: 40 }).map((p) => p.join('')),
  );
  fc.assert(fc.property(text, load), { numRuns: 1000 });
  t.pass('every document gave a Config or a ConfigError');
});

t.test('deep nesting and alias bombs', async (t) => {
  fc.assert(
    fc.property(fc.integer({ min: 1, max: 5000 }), fc.constantFrom('flow', 'block', 'server'), (depth, style) => {
      if (style === 'flow') load(`upstreams: ${'['.repeat(depth)}${']'.repeat(depth)}`);
      else if (style === 'server') load(`server: { requestCaps: ${'{a: '.repeat(depth)}1${'}'.repeat(depth)} }`);
      else load(Array.from({ length: Math.min(depth, 2000) }, (_, i) => `${' '.repeat(i)}k${i}:`).join('\n') + ' 1');
    }),
    { numRuns: 40 },
  );
  const bomb = ['a: &a [x, x, x, x, x, x, x, x, x]', ...Array.from({ length: 8 }, (_, i) => `${String.fromCharCode(98 + i)}: &${String.fromCharCode(98 + i)} [${Array(9).fill(`*${String.fromCharCode(97 + i)}`).join(', ')}]`)].join('\n');
  load(bomb);
  t.pass('deep documents gave a Config or a ConfigError');
});
