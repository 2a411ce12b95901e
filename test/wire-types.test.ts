/**
 * The codecs' wire formats are typed (issue 24): request types derived from the schemas ajv checks,
 * precise shapes for what the gateway writes, and `any` only where a comment says why it is needed.
 */
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { promisify } from 'node:util';
import t from 'tap';
import { distRoot } from './helpers.js';

const root = join(distRoot, '..');

/** An `any` in the codecs must say why on its line (`// any: …`); none is needed now. */
const MAX_ANY = 0;

function sources(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const path = join(dir, e.name);
    if (e.isDirectory()) return sources(path);
    return e.name.endsWith('.ts') ? [path] : [];
  });
}

t.test('the codecs use `any` only where a comment says why', async (t) => {
  const files = sources(join(root, 'plugins', 'codecs'));
  t.ok(files.length > 20, `${files.length} codec sources read`);
  const uses: string[] = [];
  const unexplained: string[] = [];
  for (const file of files) {
    readFileSync(file, 'utf8')
      .split('\n')
      .forEach((line, i) => {
        // The type `any` (`: any`, `as any`, `<any>`, `any[]`, `, any>`); the word in comments and strings is not a type.
        const code = line.replace(/\/\/.*$/, '').replace(/'[^']*'|"[^"]*"|`[^`]*`/g, "''");
        if (!/(?::\s*|\bas\s+|<\s*|,\s*|\|\s*)any\b(?!\s*:)|\bany\s*\[\]/.test(code)) return;
        const where = `${relative(root, file)}:${i + 1}`;
        uses.push(where);
        if (!/\/\/ any: \S/.test(line)) unexplained.push(`${where}: ${line.trim()}`);
      });
  }
  t.same(unexplained, [], 'every `any` says why on its line');
  t.ok(uses.length <= MAX_ANY, `${uses.length} uses of any, at most ${MAX_ANY}: ${uses.join(', ')}`);
});

t.test('a misspelt field of a request type derived from its schema, or of a hand-written block or item, does not compile', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sluice-wire-types-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const codecs = join(distRoot, 'plugins', 'codecs');
  writeFileSync(
    join(dir, 'tsconfig.json'),
    JSON.stringify({
      compilerOptions: { module: 'NodeNext', moduleResolution: 'NodeNext', target: 'ES2022', strict: true, skipLibCheck: true, noEmit: true, typeRoots: [join(root, 'node_modules', '@types')], types: ['node'] },
      files: ['requests.ts'],
    }),
  );
  const schema = (family: string) => JSON.stringify(join(codecs, family, 'schema.js'));
  const wire = (family: string) => JSON.stringify(join(codecs, family, 'wire.js'));
  writeFileSync(
    join(dir, 'requests.ts'),
    `import type { ChatRequest } from ${schema('chat')};
import type { GeminiRequest } from ${schema('gemini')};
import type { MessagesRequest } from ${schema('messages')};
import type { ResponsesRequest } from ${schema('responses')};
declare const chat: ChatRequest;
declare const gemini: GeminiRequest;
declare const messages: MessagesRequest;
declare const responses: ResponsesRequest;
// Fields the schemas name, with their types.
export const fine: [string, number | null | undefined, number | undefined, number | null | undefined] = [
  chat.model, chat.max_tokens, messages.max_tokens, responses.max_output_tokens,
];
export const config: number | undefined = gemini.generationConfig?.maxOutputTokens;
// Misspelt: none of these compiles.
export const a = chat.max_tokenz;
export const b = gemini.generationConfig?.maxOutputToken;
export const c = messages.stop_sequence;
export const d = responses.max_output_token;
export const e: ChatRequest = { model: 'm', messages: [{ role: 'user', content: 'hi' }], temprature: 1 };
export const f: import(${wire('messages')}).MessagesBlock = { type: 'tool_use', id: 'a', name: 'b', input: {}, inputs: {} };
export const g: import(${wire('responses')}).InputItem = { type: 'function_call', call_id: 'c', name: 'n', arguments: '{}', argument: '{}' };
`,
  );
  const tsc = join(root, 'node_modules', 'typescript', 'bin', 'tsc');
  const out = await promisify(execFile)(process.execPath, [tsc, '-p', join(dir, 'tsconfig.json')]).then(
    () => '',
    (err: { stdout?: string; message: string }) => err.stdout || err.message,
  );
  const errors = out.split('\n').filter((l) => /error TS/.test(l));
  t.same(
    errors.map((l) => /requests\.ts\((\d+),/.exec(l)?.[1]),
    ['15', '16', '17', '18', '19', '20', '21'],
    `only the misspelt lines fail:\n${out}`,
  );
  t.match(out, /Property 'max_tokenz' does not exist/);
  t.match(out, /Property 'maxOutputToken' does not exist/);
  t.match(out, /Property 'stop_sequence' does not exist/);
  t.match(out, /Property 'max_output_token' does not exist/);
  t.match(out, /'temprature' does not exist in type/);
  // The hand-written unions (blocks, input items) are as closed as the derived types.
  t.match(out, /'inputs' does not exist in type 'ToolUseBlock'/);
  t.match(out, /'argument' does not exist in type 'FunctionCallItem'/);
});
