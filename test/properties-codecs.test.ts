/**
 * Property-based tests of every family's request parser through the real HTTP server, on native
 * and translated upstreams (the simulator as its own process): random JSON, random bytes, mutated
 * valid requests, each field removed in turn, invalid UTF-8, deep nesting and huge arrays. Every
 * case gets a 200 or a 4xx in the family's error shape, and both processes keep serving.
 * fast-check prints the seed and the shrunk case of a failure.
 */
import fc from 'fast-check';
import t, { type Test } from 'tap';
import { edited, pathsIn, simulatorUpstreams, startStack } from './helpers.js';

// Property runs by the hundred, CPU-bound: more than tap's default 60 s on two busy cores.
t.setTimeout(180_000);

const { sim, gw } = await startStack(
  (simUrl) => `
${simulatorUpstreams(simUrl)}models:
  - { id: up-chat, upstream: chat, upstreamModel: sim-chat }
  - { id: up-responses, upstream: responses, upstreamModel: sim-responses }
  - { id: up-gemini, upstream: gemini, upstreamModel: sim-gemini }
`,
);

type Json = Record<string, any>;
type Family = 'chat' | 'responses' | 'gemini';

/** One request: chat and Responses carry the model in the body, Gemini in the path. */
interface Case {
  family: Family;
  model: string;
  stream: boolean;
  body: Buffer;
}

const models = ['up-chat', 'up-responses', 'up-gemini'];

function pathOf(c: Case): string {
  if (c.family === 'chat') return '/v1/chat/completions';
  if (c.family === 'responses') return '/v1/responses';
  return `/v1beta/models/${c.model}:${c.stream ? 'streamGenerateContent?alt=sse' : 'generateContent'}`;
}

async function post(c: Case): Promise<{ status: number; text: string }> {
  const res = await fetch(gw.url + pathOf(c), {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${gw.key}`, 'x-goog-api-key': gw.key },
    body: c.body,
  });
  return { status: res.status, text: await res.text() };
}

/** Sends a case; returns a problem description, or undefined when the answer is acceptable. */
async function check(c: Case): Promise<string | undefined> {
  const res = await post(c);
  const text = res.text;
  if (res.status === 200) return undefined;
  let error: Json | undefined;
  try {
    error = JSON.parse(text).error;
  } catch {
    return `a ${res.status} whose body is not JSON: ${text.slice(0, 300)}`;
  }
  if (res.status < 400 || res.status >= 500) return `status ${res.status}: ${text.slice(0, 300)}`;
  const shaped =
    c.family === 'gemini'
      ? error?.code === res.status && typeof error.message === 'string' && typeof error.status === 'string'
      : typeof error?.message === 'string' && typeof error.type === 'string' && typeof error.code === 'string';
  return shaped ? undefined : `a ${res.status} not in the ${c.family} error shape: ${text.slice(0, 300)}`;
}

/** Throws the problem, so that fast-check reports it with the counterexample. */
async function accepted(c: Case): Promise<void> {
  const problem = await check(c);
  if (problem) throw new Error(problem);
}

async function healthy(t: Test) {
  t.equal((await fetch(`${gw.url}/healthz`)).status, 200, 'the gateway still serves /healthz');
  t.equal((await fetch(`${sim.url}/healthz`)).status, 200, 'the simulator still serves');
}

const image = 'data:image/png;base64,iVBORw0KGgo=';
const weather = { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] };

/** Valid requests that use most of what each family can say; each gets a 200 on every upstream. */
const bases: Record<Family, (model: string) => Json[]> = {
  chat: (model) => [
    {
      model,
      max_tokens: 8,
      temperature: 0.5,
      top_p: 0.9,
      seed: 1,
      user: 'u',
      metadata: { a: 'b' },
      messages: [
        { role: 'system', content: 'Be brief' },
        { role: 'user', content: [{ type: 'text', text: 'Weather?' }, { type: 'image_url', image_url: { url: image, detail: 'low' } }] },
        { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Oslo"}' } }] },
        { role: 'tool', tool_call_id: 'call_1', content: [{ type: 'text', text: 'Sunny' }] },
      ],
      tools: [{ type: 'function', function: { name: 'get_weather', description: 'Weather', parameters: weather } }],
      tool_choice: { type: 'function', function: { name: 'get_weather' } },
      parallel_tool_calls: false,
    },
    {
      model,
      stream: true,
      stream_options: { include_usage: true },
      max_completion_tokens: 8,
      messages: [{ role: 'developer', content: [{ type: 'text', text: 'JSON only' }] }, { role: 'user', content: 'A book?' }],
      response_format: { type: 'json_schema', json_schema: { name: 'book', schema: { type: 'object', properties: { title: { type: 'string' } } }, strict: false } },
    },
  ],
  responses: (model) => [
    {
      model,
      instructions: 'Be brief',
      max_output_tokens: 16,
      temperature: 0.5,
      metadata: { a: 'b' },
      input: [
        { role: 'user', content: [{ type: 'input_text', text: 'Weather?' }, { type: 'input_image', image_url: image, detail: 'low' }] },
        { type: 'function_call', call_id: 'call_1', name: 'get_weather', arguments: '{"city":"Oslo"}' },
        { type: 'function_call_output', call_id: 'call_1', output: 'Sunny' },
        { role: 'assistant', content: [{ type: 'output_text', text: 'It is sunny.' }] },
        { role: 'user', content: 'Thanks' },
      ],
      tools: [{ type: 'function', name: 'get_weather', description: 'Weather', parameters: weather, strict: false }],
      tool_choice: { type: 'allowed_tools', mode: 'auto', tools: [{ type: 'function', name: 'get_weather' }] },
      reasoning: { effort: 'low' },
    },
    {
      model,
      stream: true,
      max_output_tokens: 16,
      input: 'A book?',
      text: { format: { type: 'json_schema', name: 'book', schema: { type: 'object', properties: { title: { type: 'string' } } } } },
    },
  ],
  gemini: () => [
    {
      systemInstruction: { parts: [{ text: 'Be brief' }] },
      contents: [
        { role: 'user', parts: [{ text: 'Weather?' }, { inlineData: { mimeType: 'image/png', data: 'iVBORw0KGgo=' } }] },
        { role: 'model', parts: [{ functionCall: { name: 'get_weather', args: { city: 'Oslo' } } }] },
        { role: 'user', parts: [{ functionResponse: { name: 'get_weather', response: { sky: 'sunny' } } }] },
      ],
      tools: [{ functionDeclarations: [{ name: 'get_weather', description: 'Weather', parameters: { type: 'OBJECT', properties: { city: { type: 'STRING' } }, required: ['city'] } }] }],
      toolConfig: { functionCallingConfig: { mode: 'ANY', allowedFunctionNames: ['get_weather'] } },
      generationConfig: { temperature: 0.5, topP: 0.9, maxOutputTokens: 8, seed: 1, thinkingConfig: { includeThoughts: true, thinkingBudget: 0 } },
    },
    {
      contents: [{ parts: [{ text: 'A book?' }] }],
      generationConfig: { maxOutputTokens: 8, responseMimeType: 'application/json', responseSchema: { type: 'OBJECT', properties: { title: { type: 'STRING', nullable: true } } } },
    },
  ],
};

const families: Family[] = ['chat', 'responses', 'gemini'];
const baseCases = families.flatMap((family) => models.flatMap((model) => bases[family](model).map((body) => ({ family, model, body }))));
const toCase = (b: { family: Family; model: string; body: unknown }, raw?: Buffer): Case => ({
  family: b.family,
  model: b.model,
  stream: (b.body as Json)?.stream === true,
  body: raw ?? Buffer.from(JSON.stringify(b.body)),
});

const baseArb = fc.constantFrom(...baseCases);

t.test('the valid requests get a 200 on every upstream', async (t) => {
  for (const b of baseCases) {
    const res = await post(toCase(b));
    t.equal(res.status, 200, `${b.family} on ${b.model}: ${res.text.slice(0, 200)}`);
  }
});

t.test('each field of a valid request removed in turn', async (t) => {
  for (const b of baseCases) {
    for (const path of pathsIn(b.body)) {
      const problem = await check(toCase({ ...b, body: edited(b.body, path) }));
      if (problem) t.fail(`${b.family} on ${b.model} without ${path.join('.')}: ${problem}`);
    }
  }
  t.pass('every removal got a 200 or a 4xx in its family shape');
  await healthy(t);
});

/** Values of the wrong type (or out of range) for almost any field. */
const oddValue = fc.oneof(
  fc.constantFrom(null, 0, -1, 1.5, 1e308, -1e308, '', 'x', true, false, [], {}, [null], { '': null }, [[]], '\u0000', 'é'.repeat(3)),
  fc.jsonValue({ maxDepth: 3 }),
);

t.test('a valid request with one value replaced by anything', async (t) => {
  await fc.assert(
    fc.asyncProperty(baseArb, fc.nat(), oddValue, async (b, at, value) => {
      const paths = pathsIn(b.body);
      const path = paths[at % paths.length]!;
      await accepted(toCase({ ...b, body: edited(b.body, path, value) }));
    }),
    { numRuns: 400 },
  );
  await healthy(t);
});

t.test('random JSON and random bytes as the body', async (t) => {
  const target = fc.record({ family: fc.constantFrom(...families), model: fc.constantFrom(...models) });
  await fc.assert(
    fc.asyncProperty(target, fc.oneof(fc.json().map((s) => Buffer.from(s)), fc.uint8Array({ maxLength: 200 }).map((a) => Buffer.from(a))), async (c, body) => {
      await accepted({ ...c, stream: false, body });
    }),
    { numRuns: 200 },
  );
  await healthy(t);
});

t.test('invalid UTF-8 bytes spliced into a valid body', async (t) => {
  const bad = fc.uint8Array({ minLength: 1, maxLength: 6, min: 0x80, max: 0xff });
  await fc.assert(
    fc.asyncProperty(baseArb, fc.nat(), bad, async (b, at, bytes) => {
      const json = Buffer.from(JSON.stringify(b.body));
      const i = at % json.length;
      await accepted(toCase(b, Buffer.concat([json.subarray(0, i), bytes, json.subarray(i)])));
    }),
    { numRuns: 150 },
  );
  await healthy(t);
});

t.test('deep nesting: refused past the depth cap, passed on below it', async (t) => {
  const opener = fc.constantFrom('[', '{"k":');
  await fc.assert(
    fc.asyncProperty(baseArb, fc.array(opener, { minLength: 1, maxLength: 300, size: 'max' }), async (b, openers) => {
      // An unknown top-level field: the body itself is one level, the value adds one per opener.
      const nested = openers.join('') + '0' + openers.map((o) => (o === '[' ? ']' : '}')).reverse().join('');
      const json = JSON.stringify(b.body);
      const { status, text } = await post(toCase(b, Buffer.from(`${json.slice(0, -1)},"x_nested":${nested}}`)));
      // Below the cap the gateway passes the unknown field on; the upstream may refuse it.
      const refused = status === 400 && text.includes('(server.requestCaps.depth)');
      if (1 + openers.length > 64 ? !refused : refused || status >= 500) throw new Error(`depth ${1 + openers.length}: ${status} ${text.slice(0, 300)}`);
    }),
    { numRuns: 60 },
  );
  await healthy(t);
});

/** A minimal request of a family whose messages, tools or content parts are `n` long. */
function sized(family: Family, model: string, what: 'messages' | 'tools' | 'parts', n: number): Json {
  const many = <T>(f: (i: number) => T) => Array.from({ length: n }, (_, i) => f(i));
  const text = 'hi ';
  if (family === 'chat') {
    const messages = what === 'messages' ? many(() => ({ role: 'user', content: text })) : [{ role: 'user', content: what === 'parts' ? many(() => ({ type: 'text', text })) : text }];
    const tools = what === 'tools' ? many((i) => ({ type: 'function', function: { name: `f${i}` } })) : undefined;
    return { model, max_tokens: 2, messages, tools };
  }
  if (family === 'responses') {
    const input = what === 'messages' ? many(() => ({ role: 'user', content: text })) : [{ role: 'user', content: what === 'parts' ? many(() => ({ type: 'input_text', text })) : text }];
    const tools = what === 'tools' ? many((i) => ({ type: 'function', name: `f${i}` })) : undefined;
    return { model, max_output_tokens: 2, input, tools };
  }
  const contents = what === 'messages' ? many(() => ({ role: 'user', parts: [{ text }] })) : [{ role: 'user', parts: what === 'parts' ? many(() => ({ text })) : [{ text }] }];
  const tools = what === 'tools' ? [{ functionDeclarations: many((i) => ({ name: `f${i}` })) }] : undefined;
  return { contents, tools, generationConfig: { maxOutputTokens: 2 } };
}

t.test('huge arrays: refused past their caps, served below them', async (t) => {
  const caps = { messages: 2048, tools: 128, parts: 10_000 };
  const sizes = fc.record({
    family: fc.constantFrom(...families),
    model: fc.constantFrom(...models),
    what: fc.constantFrom('messages' as const, 'tools' as const, 'parts' as const),
    // Around each cap, and well past it.
    scale: fc.double({ min: 0.01, max: 1.5, noNaN: true }),
  });
  await fc.assert(
    fc.asyncProperty(sizes, async ({ family, model, what, scale }) => {
      const cap = caps[what];
      const n = Math.max(1, Math.round(cap * scale));
      const { status, text } = await post(toCase({ family, model, body: sized(family, model, what, n) }));
      const refused = status === 400 && text.includes(`; the limit is ${cap} (server.requestCaps.`);
      if (n > cap ? !refused : status !== 200) throw new Error(`${n} ${what}: ${status} ${text.slice(0, 300)}`);
    }),
    { numRuns: 24 },
  );
  await healthy(t);
});
