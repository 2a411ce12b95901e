/**
 * The simulator plays an upstream: a body it cannot read gets the 4xx its real counterpart would
 * send (OpenAI's or Google's error shape), never an exception, and a body it can read is answered
 * with bounded work. Valid requests of each family are mutated at random (fields replaced by odd
 * JSON, removed, or made huge), then specific bodies that used to throw or run away are checked.
 */
import fc from 'fast-check';
import t from 'tap';
import { routeSimulator } from '../plugins/upstreams/simulator/index.js';
import type { SimReply } from '../plugins/upstreams/simulator/reply.js';

type Family = 'openai' | 'gemini';
const route = (path: string, body: string): SimReply | undefined =>
  routeSimulator('POST', path, body, { models: ['sim-chat'], geminiModels: ['sim-gemini'], listing: path.startsWith('/models/') ? 'gemini' : 'openai' });

const CHAT = '/chat/completions';
const RESPONSES = '/responses';
const GEMINI = '/models/sim-gemini:generateContent';
const GEMINI_STREAM = '/models/sim-gemini:streamGenerateContent?alt=sse';
const GEMINI_COUNT = '/models/sim-gemini:countTokens';
const familyOf = (path: string): Family => (path.startsWith('/models/') ? 'gemini' : 'openai');

/** Every reply is a success or a 4xx in the family's error shape. */
function checkReply(reply: SimReply | undefined, family: Family): string | undefined {
  if (!reply) return 'no reply';
  if (reply.status === 200) return undefined;
  if (reply.status < 400 || reply.status >= 500) return `status ${reply.status}`;
  const body = JSON.parse(reply.steps.map((s) => s.bytes).join('')) as { error?: Record<string, unknown> };
  const shaped =
    family === 'openai'
      ? typeof body.error?.message === 'string' && typeof body.error.type === 'string'
      : body.error?.code === reply.status && typeof body.error.message === 'string' && typeof body.error.status === 'string';
  return shaped ? undefined : `a ${reply.status} not in the ${family} error shape: ${JSON.stringify(body)}`;
}

const schema = {
  type: 'object',
  properties: { a: { type: 'array', items: { type: 'string', minLength: 3 }, minItems: 2 }, b: { $ref: '#/$defs/b' } },
  required: ['a'],
  $defs: { b: { anyOf: [{ type: 'integer', minimum: 3 }, { type: 'null' }] } },
};
const bases: [string, object][] = [
  [
    CHAT,
    {
      model: 'sim-chat',
      stream: true,
      stream_options: { include_usage: true },
      n: 2,
      max_tokens: 50,
      stop: ['x'],
      messages: [
        { role: 'system', content: 'Be brief.' },
        { role: 'user', content: [{ type: 'text', text: 'hi' }, { type: 'image_url', image_url: { url: 'data:image/png;base64,AAAA' } }] },
        { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'f', arguments: '{}' } }] },
        { role: 'tool', tool_call_id: 'c1', content: 'ok' },
        { role: 'user', content: 'again' },
      ],
      tools: [{ type: 'function', function: { name: 'f', parameters: schema } }],
      tool_choice: { type: 'function', function: { name: 'f' } },
      response_format: { type: 'json_schema', json_schema: { name: 'x', schema } },
    },
  ],
  [
    RESPONSES,
    {
      model: 'sim-responses',
      stream: true,
      instructions: 'Be brief.',
      max_output_tokens: 40,
      reasoning: { effort: 'low', summary: 'auto' },
      input: [
        { role: 'user', content: [{ type: 'input_text', text: 'search hi' }, { type: 'input_image', image_url: 'data:' }] },
        { type: 'function_call', call_id: 'c1', name: 'f', arguments: '{}' },
        { type: 'function_call_output', call_id: 'c1', output: 'ok' },
        { type: 'message', role: 'assistant', content: [{ type: 'output_text', text: 'yes' }] },
        { role: 'user', content: 'again' },
      ],
      tools: [{ type: 'function', name: 'f', parameters: schema }, { type: 'web_search' }],
      tool_choice: 'auto',
      text: { format: { type: 'json_schema', name: 'n', schema } },
      metadata: { a: 'b' },
    },
  ],
  ...[GEMINI, GEMINI_STREAM, GEMINI_COUNT].map((path): [string, object] => [
    path,
    {
      systemInstruction: { parts: [{ text: 'Be brief.' }] },
      contents: [
        { role: 'user', parts: [{ text: 'hi' }, { inlineData: { mimeType: 'image/png', data: 'AAAA' } }] },
        { role: 'model', parts: [{ functionCall: { name: 'f', args: { a: 1 } } }] },
        { role: 'user', parts: [{ functionResponse: { name: 'f', response: { output: 'ok' } } }] },
        { role: 'user', parts: [{ text: 'again' }] },
      ],
      tools: [{ functionDeclarations: [{ name: 'f', parameters: { type: 'OBJECT', properties: { a: { type: 'ARRAY', items: { type: 'STRING' } } } } }] }],
      toolConfig: { functionCallingConfig: { mode: 'ANY', allowedFunctionNames: ['f'] } },
      generationConfig: {
        candidateCount: 2,
        maxOutputTokens: 30,
        stopSequences: ['x'],
        responseMimeType: 'application/json',
        responseJsonSchema: schema,
        thinkingConfig: { includeThoughts: true, thinkingBudget: 5 },
      },
    },
  ]),
];

/** Every path to a value inside `value` (the root included). */
function paths(value: unknown, prefix: (string | number)[] = []): (string | number)[][] {
  const out = [prefix];
  if (value && typeof value === 'object') for (const [k, v] of Object.entries(value)) out.push(...paths(v, [...prefix, Array.isArray(value) ? Number(k) : k]));
  return out;
}

/** `value` with the field at `path` replaced by `next`, or removed when `next` is undefined. */
function edited(value: unknown, path: (string | number)[], next: unknown): unknown {
  if (path.length === 0) return next;
  const [key, ...rest] = path;
  const copy: any = Array.isArray(value) ? [...value] : { ...(value as object) };
  if (rest.length === 0 && next === undefined) {
    if (Array.isArray(copy)) copy.splice(key as number, 1);
    else delete copy[key];
  } else copy[key] = edited(copy[key], rest, next);
  return copy;
}

const odd = fc.oneof(
  fc.jsonValue({ maxDepth: 3 }),
  fc.constantFrom<unknown>(
    undefined,
    null,
    -1,
    0,
    1e308,
    0.5,
    '',
    '[[sim tokens=100000]]',
    '__proto__',
    [],
    {},
    { type: 'function' },
    { $ref: '#/%E0%A4%A' },
    { type: 'array', minItems: 1e9 },
    { type: 'string', minLength: 1e9 },
    Array.from({ length: 300 }, () => 'x'),
    Array.from({ length: 300 }, () => ({})),
  ),
);

for (const [path, base] of bases) {
  t.test(`${path}: mutated requests get a success or a clean 4xx`, async (t) => {
    t.equal(route(path, JSON.stringify(base))?.status, 200, 'the unmutated request succeeds');
    const where = paths(base);
    fc.assert(
      fc.property(fc.array(fc.tuple(fc.nat(where.length - 1), odd), { minLength: 1, maxLength: 3 }), (edits) => {
        let body: unknown = base;
        for (const [i, value] of edits) body = edited(body, where[i], value);
        const problem = checkReply(route(path, JSON.stringify(body) ?? 'null'), familyOf(path));
        if (problem) throw new Error(problem);
      }),
      { numRuns: 400 },
    );
  });
}

const deep = (depth: number, leaf = '1') => '{"a":'.repeat(depth) + leaf + '}'.repeat(depth);
const many = <T>(count: number, item: (i: number) => T) => Array.from({ length: count }, (_, i) => item(i));
const user = (content: unknown) => ({ role: 'user', content });

t.test('bodies that used to throw or run away', async (t) => {
  const cases: [string, string, string, number, RegExp?][] = [
    ['JSON nested 100k deep (Gemini call args)', GEMINI, `{"contents":[{"parts":[{"text":"a"}]},{"role":"model","parts":[{"functionCall":{"name":"f","args":${deep(100_000)}}}]},{"parts":[{"functionResponse":{"name":"f","response":{}}}]}]}`, 400, /deeper than 100/],
    ['JSON nested 100k deep (Gemini tool result)', GEMINI_STREAM, `{"contents":[{"parts":[{"text":"a"}]},{"role":"model","parts":[{"functionCall":{"name":"f","args":{}}}]},{"parts":[{"functionResponse":{"name":"f","response":${deep(100_000)}}}]}]}`, 400, /deeper than 100/],
    ['JSON nested 100k deep (Responses metadata)', RESPONSES, `{"model":"m","input":"hi","metadata":${deep(100_000)}}`, 400, /deeper than 100/],
    ['JSON nested 100k deep (Responses tool)', RESPONSES, `{"model":"m","input":"hi","tools":[{"type":"mcp","x":${deep(100_000)}}]}`, 400, /deeper than 100/],
    ['JSON nested 100k deep (chat)', CHAT, `{"model":"m","messages":[{"role":"user","content":"a"}],"x":${deep(100_000)}}`, 400, /deeper than 100/],
    ['150k chat messages', CHAT, JSON.stringify({ model: 'm', messages: many(150_000, () => user('x')) }), 400, /maximum length 2048, but got an array with length 150000/],
    ['129 chat tools', CHAT, JSON.stringify({ model: 'm', messages: [user('x')], tools: many(129, (i) => ({ type: 'function', function: { name: `f${i}` } })) }), 400, /'tools': array too long/],
    ['5 chat stop sequences', CHAT, JSON.stringify({ model: 'm', messages: [user('x')], stop: ['a', 'b', 'c', 'd', 'e'] }), 400, /'stop': array too long/],
    ['129 Responses tools', RESPONSES, JSON.stringify({ model: 'm', input: 'x', tools: many(129, (i) => ({ type: 'function', name: `f${i}` })) }), 400, /'tools': array too long/],
    ['6 Gemini stop sequences', GEMINI, JSON.stringify({ contents: [{ parts: [{ text: 'x' }] }], generationConfig: { stopSequences: many(6, String) } }), 400, /at most 5 stop sequences/],
    ['150k Responses input items', RESPONSES, JSON.stringify({ model: 'm', input: many(150_000, () => user('x')) }), 200],
    ['150k Gemini parts in one turn', GEMINI, JSON.stringify({ contents: [{ parts: many(150_000, () => ({ text: 'x' })) }] }), 200],
    ['150k Gemini calls and results', GEMINI, JSON.stringify({ contents: [{ parts: [{ text: 'x' }] }, { role: 'model', parts: many(150_000, () => ({ functionCall: { name: 'f', args: {} } })) }, { parts: many(150_000, () => ({ functionResponse: { name: 'f', response: {} } })) }] }), 200],
    ['a schema whose subschemas are not schemas', CHAT, JSON.stringify({ model: 'm', messages: [user('x')], response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', properties: { a: -1, b: 'text', c: null }, items: 3 } } } }), 200],
    ['a $ref with broken %-encoding', CHAT, JSON.stringify({ model: 'm', messages: [user('x')], response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { properties: { a: { $ref: '#/%E0%A4%A' } } } } } }), 200],
  ];
  for (const [name, path, body, status, message] of cases) {
    const reply = route(path, body);
    t.equal(reply?.status, status, name);
    t.notOk(checkReply(reply, familyOf(path)), `${name}: the family's shape`);
    if (message) t.match(reply?.steps[0]?.bytes, message, `${name}: says why`);
  }
});

/** The text a non-streamed chat answer carries, and its completion tokens. */
function chatAnswer(body: object): { contents: string[]; finishes: string[]; completionTokens: number } {
  const reply = route(CHAT, JSON.stringify({ model: 'm', messages: [user('x')], ...body }))!;
  const parsed = JSON.parse(reply.steps[0]!.bytes);
  return {
    contents: parsed.choices.map((c: any) => c.message.content ?? c.message.tool_calls[0].function.arguments),
    finishes: parsed.choices.map((c: any) => c.finish_reason),
    completionTokens: parsed.usage.completion_tokens,
  };
}

t.test('answers stay bounded, whatever the request asks for', async (t) => {
  const json = (schema: object) => ({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema } } });
  const nested = chatAnswer(json({ type: 'array', minItems: 1e9, items: { type: 'array', minItems: 1e9, items: { type: 'string', minLength: 1e9 } } }));
  t.ok(nested.contents[0]!.length < 1_000_000, `a billion items of a billion items: ${nested.contents[0]!.length} characters`);
  const bomb = chatAnswer(json({ properties: { a: { $ref: '#' }, b: { $ref: '#' }, c: { $ref: '#' } }, required: ['a', 'b', 'c'] }));
  t.ok(bomb.contents[0]!.length < 1_000_000, `a $ref fanning out three ways per level: ${bomb.contents[0]!.length} characters`);
  const named = JSON.parse('{"type":"object","properties":{"__proto__":{"type":"integer"},"toString":{"type":"boolean"}},"required":["__proto__","toString"]}');
  t.equal(chatAnswer(json(named)).contents[0], '{"__proto__":1,"toString":true}', 'property names are data, `__proto__` included');
  const wide = chatAnswer({ n: 128, messages: [user('[[sim tokens=100000]]')] });
  t.ok(wide.completionTokens <= 100_000, `128 choices share the output ceiling: ${wide.completionTokens} tokens`);
  t.same(new Set(wide.finishes), new Set(['length']), 'each choice stops at its share');
  const directives = chatAnswer({ messages: [user('[[sim '.repeat(200_000) + '[[sim tokens=3]]')] });
  t.equal(directives.completionTokens, 3, 'a prompt full of unclosed directives is read in one pass');
});
