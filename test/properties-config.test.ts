/**
 * Property-based test of the config loader: any file (random YAML documents, mutated valid
 * configs, raw text, deep nesting, `${ENV}` references) gives either a Config or a ConfigError,
 * never another exception; a value that is one `${NAME}` is a number or a boolean where the schema
 * wants one and its text reads as one, and text everywhere else.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import fc from 'fast-check';
import t from 'tap';
import { stringify } from 'yaml';
import { ConfigError, loadConfig } from '../src/config/load.js';
import type { Config } from '../src/config/types.js';
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

/** The config `yaml` loads to with `env`, or the ConfigError it is refused with; any other exception fails. */
function loaded(yaml: string, env: NodeJS.ProcessEnv): Config | ConfigError {
  writeFileSync(file, yaml);
  try {
    return loadConfig({ path: file, env });
  } catch (err) {
    if (err instanceof ConfigError) return err;
    throw err;
  }
}

/** Texts an environment variable may hold: numbers in YAML's spellings and not, words, anything. */
const envText = fc.oneof(
  fc.integer({ min: 0, max: 65535 }).map(String),
  fc.constantFrom('0x1F', '0o17', '+80', '1e3', '080', '8080.0', '1.5', '-1', '70000', '0b101', 'Infinity', '.inf', '.nan', '1_000', ' 8080', '8080 # c', '[8080]', '{a: 1}', '"8080"', '&a 1', '!!int 5', '*a', '-', '---', '${SET}'),
  fc.constantFrom('true', 'false', 'True', 'FALSE', 'yes', 'on', 'null', '~'),
  fc.string({ minLength: 1, maxLength: 12 }),
);

t.test('a value that is one ${NAME} takes the number the schema wants, when its text reads as one', async (t) => {
  const forms = ['server:\n  port: ${P}\n', 'server: { port: "${P}" }\n', "server: { port: '${P}' }\n", 'server:\n  port: ${UNSET:-${P}}\n'];
  fc.assert(
    fc.property(envText, fc.constantFrom(...forms), (text, form) => {
      const config = loaded(form.replace('${UNSET:-${P}}', `\${UNSET:-${text.replace(/}/g, '')}}`), { P: text, SET: 'value' });
      const given = form.includes('UNSET') ? text.replace(/}/g, '') : text;
      if (config instanceof ConfigError) {
        // A plain port number is never refused.
        if (/^\d+$/.test(given) && Number(given) <= 65535) throw new Error(`${JSON.stringify(given)} refused: ${config.message}`);
        return;
      }
      if (config.server.port !== Number(given)) throw new Error(`${JSON.stringify(given)} read as ${config.server.port}`);
    }),
    { numRuns: 1000 },
  );
  t.pass('a port placeholder gave the port its text reads as, or a ConfigError');
});

t.test('a value that is one ${NAME} takes the boolean the schema wants', async (t) => {
  for (const [text, value] of [['true', true], ['false', false], ['True', true], ['FALSE', false]] as const) {
    const config = loaded('allowAnonymous: ${B}\n', { B: text });
    t.equal((config as Config).allowAnonymous, value, text);
  }
  for (const text of ['yes', 'on', '1', 'truthy']) t.type(loaded('allowAnonymous: "${B}"\n', { B: text }), ConfigError, `${text} is no boolean`);
});

t.test('where the schema wants text, a placeholder stays the text it was given, whatever it reads as', async (t) => {
  fc.assert(
    fc.property(envText, fc.boolean(), (text, quoted) => {
      const value = quoted ? '"${S}"' : '${S}';
      const config = loaded(`dataDir: ${value}\nupstreams:\n  oa: { kind: openai-chat, baseUrl: "http://127.0.0.1:1/v1", apiKey: "\${S}" }\nmodels: [{ id: m, upstream: oa }]\n`, { S: text, SET: 'value' });
      if (config instanceof ConfigError) throw new Error(`${JSON.stringify(text)} refused: ${config.message}`);
      if (config.dataDir !== text || config.upstreams.oa!.apiKey !== text) throw new Error(`${JSON.stringify(text)} became ${JSON.stringify([config.dataDir, config.upstreams.oa!.apiKey])}`);
    }),
    { numRuns: 1000 },
  );
  t.pass('text stayed text, and a ${…} inside a value was not expanded again');
});

t.test('a placeholder among other text stays text', async (t) => {
  t.type(loaded('server:\n  port: ${P}0\n', { P: '80' }), ConfigError, '"800" written around a placeholder is text, not a port');
});
