/**
 * Property tests of the Messages family. Its request parser through the real server, on native
 * and translated upstreams: each field removed, any value replaced, random JSON and bytes; every
 * case gets a 200 or a 4xx in Anthropic's error shape, never a 5xx. Its stream reader: a recorded
 * Anthropic stream split at random chunk boundaries reads the same. Its stream writer: random
 * canonical events become a stream the official SDK accumulates into the same answer, which the
 * reader reads back.
 */
import { readFileSync } from 'node:fs';
import { Readable } from 'node:stream';
import Anthropic from '@anthropic-ai/sdk';
import { MessageStream } from '@anthropic-ai/sdk/lib/MessageStream';
import fc from 'fast-check';
import t, { type Test } from 'tap';
import { collect, type Event } from '../src/canonical.js';
import { Exchange } from '../src/exchange.js';
import { defaultRequestCaps } from '../src/request-caps.js';
import { SseSplitter, frameData } from '../src/sse.js';
import { messagesFamily } from '../plugins/codecs/messages/family.js';
import { messagesPassthrough, messagesStreamReader, messagesStreamWriter } from '../plugins/codecs/messages/stream.js';
import { safeToolId, thinkingFromSignature } from '../plugins/codecs/messages/wire.js';
import { splitToolId } from '../src/tool-call-ids.js';
import { edited, pathsIn, simulatorUpstreams, startStack } from './helpers.js';

// Property runs by the thousand, CPU-bound: more than tap's default 60 s on two busy cores.
t.setTimeout(180_000);

const { sim, gw } = await startStack(
  (simUrl) => `
${simulatorUpstreams(simUrl)}  anthropic: { kind: anthropic, baseUrl: "${simUrl}/v1", apiKey: k }
models:
  - { id: up-chat, upstream: chat, upstreamModel: sim-chat }
  - { id: up-responses, upstream: responses, upstreamModel: sim-responses }
  - { id: up-gemini, upstream: gemini, upstreamModel: sim-gemini }
  - { id: up-messages, upstream: anthropic, upstreamModel: sim-messages }
`,
);

type Json = Record<string, any>;
const models = ['up-chat', 'up-responses', 'up-gemini', 'up-messages'];
const paths = ['/v1/messages', '/v1/messages/count_tokens'];

async function post(path: string, body: Buffer): Promise<{ status: number; text: string }> {
  const res = await fetch(gw.url + path, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-api-key': gw.key, 'anthropic-version': '2023-06-01' },
    body,
  });
  return { status: res.status, text: await res.text() };
}

/** Throws unless the answer is a 200 or a 4xx in Anthropic's error shape. */
async function accepted(path: string, body: Buffer): Promise<void> {
  const { status, text } = await post(path, body);
  if (status === 200) return;
  let parsed: Json | undefined;
  try {
    parsed = JSON.parse(text);
  } catch {
    throw new Error(`a ${status} whose body is not JSON: ${text.slice(0, 300)}`);
  }
  if (status < 400 || status >= 500) throw new Error(`status ${status}: ${text.slice(0, 300)}`);
  const e = parsed?.error;
  if (parsed?.type !== 'error' || typeof e?.type !== 'string' || typeof e.message !== 'string') throw new Error(`a ${status} not in Anthropic's shape: ${text.slice(0, 300)}`);
}

async function healthy(t: Test) {
  t.equal((await fetch(`${gw.url}/healthz`)).status, 200, 'the gateway still serves');
  t.equal((await fetch(`${sim.url}/healthz`)).status, 200, 'the simulator still serves');
}

const png = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==';
const weather = { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] };

/** Valid requests that use most of what the family can say; each gets a 200 on every upstream. */
const bases = (model: string): Json[] => [
  {
    model,
    max_tokens: 64,
    system: [{ type: 'text', text: 'Be brief.', cache_control: { type: 'ephemeral' } }],
    temperature: 0.5,
    top_p: 0.9,
    metadata: { user_id: 'u-1' },
    messages: [
      { role: 'user', content: [{ type: 'text', text: 'Weather?' }, { type: 'image', source: { type: 'base64', media_type: 'image/png', data: png } }] },
      { role: 'assistant', content: [{ type: 'text', text: 'Checking.' }, { type: 'tool_use', id: 'toolu_01', name: 'get_weather', input: { city: 'Oslo' } }] },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_01', content: [{ type: 'text', text: 'Sunny' }] }, { type: 'text', text: 'And tomorrow?' }] },
    ],
    tools: [{ name: 'get_weather', description: 'Weather', input_schema: weather }],
    tool_choice: { type: 'auto', disable_parallel_tool_use: true },
  },
  {
    model,
    max_tokens: 2048,
    stream: true,
    thinking: { type: 'enabled', budget_tokens: 1024 },
    messages: [
      { role: 'user', content: 'A book, as JSON' },
      { role: 'system', content: 'Answer in JSON.' },
    ],
    output_config: { effort: 'medium', format: { type: 'json_schema', schema: { type: 'object', properties: { title: { type: 'string' } }, required: ['title'] } } },
  },
];
const baseCases = models.flatMap((model) => bases(model));
const encode = (body: unknown) => Buffer.from(JSON.stringify(body));

t.test('the valid requests get a 200 on every upstream', async (t) => {
  for (const body of baseCases) {
    for (const path of paths) {
      const { status, text } = await post(path, encode(body));
      t.equal(status, 200, `${body.model} ${path}: ${text.slice(0, 200)}`);
    }
  }
});

t.test('each field of a valid request removed in turn', async (t) => {
  for (const body of baseCases) {
    for (const path of pathsIn(body)) {
      await accepted('/v1/messages', encode(edited(body, path))).catch((err) => t.fail(`${body.model} without ${path.join('.')}: ${err.message}`));
    }
  }
  t.pass('every removal got a 200 or a 4xx in Anthropic shape');
  await healthy(t);
});

const oddValue = fc.oneof(
  fc.constantFrom(null, 0, -1, 1.5, 1e308, '', 'x', true, [], {}, [null], { type: 'text' }, { type: 'tool_use' }, { type: 'image', source: {} }, '\u0000'),
  fc.jsonValue({ maxDepth: 3 }),
);

t.test('a valid request with one value replaced by anything', async (t) => {
  await fc.assert(
    fc.asyncProperty(fc.constantFrom(...baseCases), fc.constantFrom(...paths), fc.nat(), oddValue, async (body, path, at, value) => {
      const all = pathsIn(body);
      await accepted(path, encode(edited(body, all[at % all.length]!, value)));
    }),
    { numRuns: 300 },
  );
  await healthy(t);
});

t.test('a value whose string conversion throws (found by the property above) is refused in Anthropic shape', async (t) => {
  const where = ['messages', 0, 'content', 1, 'source', 'type'];
  const cases = baseCases.filter((b) => pathsIn(b).some((p) => JSON.stringify(p) === JSON.stringify(where)));
  t.ok(cases.length > 0, 'some valid request has an image source there');
  for (const body of cases) {
    await accepted('/v1/messages', encode(edited(body, where, { toString: '' }))).then(
      () => t.pass(`${body.model}: a 200 or a 4xx in Anthropic's shape`),
      (err: Error) => t.fail(`${body.model}: ${err.message}`),
    );
  }
});

t.test('random JSON and random bytes as the body', async (t) => {
  const body = fc.oneof(
    fc.json().map((s) => Buffer.from(s)),
    fc.uint8Array({ maxLength: 200 }).map((a) => Buffer.from(a)),
    fc.record({ model: fc.constantFrom(...models), max_tokens: fc.integer(), messages: fc.jsonValue({ maxDepth: 4 }) }).map(encode),
  );
  await fc.assert(fc.asyncProperty(fc.constantFrom(...paths), body, async (path, b) => accepted(path, b)), { numRuns: 200 });
  await healthy(t);
});

// Streams, without a server: the codec's reader and writer on their own.

const fixture = readFileSync(new URL('../../test/fixtures/messages-thinking-tools.sse', import.meta.url));

/** Feeds bytes in the given pieces through the SSE splitter into `visit`. */
function feed(pieces: Buffer[], visit: (frame: Buffer) => void): void {
  const splitter = new SseSplitter();
  for (const piece of pieces) splitter.push(piece, (frame) => (visit(frame), true), () => {});
}

function read(pieces: Buffer[]): Event[] {
  const reader = messagesStreamReader(undefined);
  const events: Event[] = [];
  feed(pieces, (frame) => {
    const data = frameData(frame);
    if (data !== null) events.push(...reader.frame(data));
  });
  return [...events, ...reader.end()];
}

const cuts = (bytes: Buffer) =>
  fc.uniqueArray(fc.integer({ min: 1, max: bytes.length - 1 }), { maxLength: 40 }).map((at) => {
    const points = [0, ...at.sort((a, b) => a - b), bytes.length];
    return points.slice(1).map((end, i) => bytes.subarray(points[i], end));
  });

t.test('a recorded Anthropic stream reads the same whole and split at any chunk boundaries', async (t) => {
  const whole = read([fixture]);
  const answer = collect(whole);
  t.equal(answer.text, 'Let me check the weather in Oslo — ☀️ or ❄️?');
  t.equal(answer.reasoning, 'The user wants the weather in Oslo. I should call get_weather with city "Oslo".');
  t.same(
    answer.toolCalls.map((c) => [c.id, c.name, JSON.parse(c.arguments)]),
    [
      ['toolu_01T1x1fJ34qAmk2tNTrN7Up6', 'get_weather', { city: 'Oslo', unit: 'celsius' }],
      ['toolu_01Ax9qSkWeDWzPKHNP2rXgWy', 'get_time', {}],
    ],
    'the server-tool blocks are not client calls; a call without arguments has {}',
  );
  t.same(thinkingFromSignature(answer.toolCalls[0]!.signature), [
    {
      type: 'thinking',
      thinking: answer.reasoning,
      signature: 'EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds+bQ/8dRyh8Q2bsk3UhgiA4FaW4GCYhuq5vAZR4eCJDe3ZVfyrg/xmqd5rEdnWcCIBsJ+o1WT3XCcJvdRZxmU+yDLyrHpQOPg8hrfHUlEv2fK5m1E+Cg==',
    },
  ], 'the first call carries the signed thinking, intact');
  t.equal(answer.finishReason, 'tool_calls');
  t.same(answer.usage, { inputTokens: 472 + 1024 + 2048, outputTokens: 189, cachedTokens: 2048, cacheWriteTokens: 1024, reasoningTokens: 41 });

  await fc.assert(fc.property(cuts(fixture), (pieces) => void t.same(read(pieces), whole)), { numRuns: 300 });

  const passthroughUsage = (pieces: Buffer[]) => {
    const stream = messagesPassthrough(exchange());
    feed(pieces, (frame) => stream.frame(frame));
    return stream.usage();
  };
  t.same(passthroughUsage([fixture]), answer.usage, 'passthrough finds the same usage by scanning');
  fc.assert(fc.property(cuts(fixture), (pieces) => void t.same(passthroughUsage(pieces), answer.usage)), { numRuns: 100 });
});

t.test('a stream cut before its end is an error, not an answer', async (t) => {
  const cut = fixture.subarray(0, fixture.indexOf('event: message_delta'));
  t.match(read([cut]).at(-1), { type: 'error' }, 'read for another family');
  const ends = (bytes: Buffer) => {
    const stream = messagesPassthrough(exchange());
    feed([bytes], (frame) => stream.frame(frame));
    return stream.end();
  };
  const cutStream = messagesPassthrough(exchange());
  feed([cut], (frame) => cutStream.frame(frame));
  t.match(
    cutStream.usage(),
    { inputTokens: 472 + 1024 + 2048, cachedTokens: 2048, cacheWriteTokens: 1024, estimated: true },
    "cut before message_delta: message_start's real input, the output counted here and marked estimated",
  );
  t.equal(ends(fixture), '', 'passed through whole: nothing added');
  // The relay then ends the stream with the family's failure (an error event) and records it failed.
  t.throws(() => ends(cut), { code: 'upstream_error', message: /before message_stop/ }, 'passed through cut: the stream fails');
});

/** An exchange of the Messages family, as the server makes one. */
function exchange(): Exchange {
  const family = messagesFamily(defaultRequestCaps);
  const ex = new Exchange(family, family.endpoints[0]!, 'POST', '/v1/messages', '', {}, []);
  ex.request = { model: 'client-model', max_tokens: 100, messages: [{ role: 'user', content: 'Hello' }] };
  ex.modelId = 'client-model';
  return ex;
}

/** Random canonical streams as a reader of another family would give them: parts in order, calls whole one after another. */
const canonicalStream = fc
  .array(
    fc.oneof(
      fc.record({ kind: fc.constant('text' as const), deltas: fc.array(fc.string({ minLength: 1 }), { minLength: 1, maxLength: 4 }) }),
      fc.record({ kind: fc.constant('reasoning' as const), deltas: fc.array(fc.string({ minLength: 1 }), { minLength: 1, maxLength: 4 }) }),
      fc.record({
        kind: fc.constant('call' as const),
        id: fc.stringMatching(/^[A-Za-z0-9_.:|-]{1,30}$/),
        name: fc.stringMatching(/^[A-Za-z0-9_-]{1,20}$/),
        signature: fc.option(fc.base64String({ minLength: 4, maxLength: 64 }), { nil: undefined }),
        input: fc.dictionary(fc.string({ maxLength: 8 }), fc.jsonValue({ maxDepth: 2 }), { maxKeys: 3 }),
        pieces: fc.integer({ min: 1, max: 4 }),
      }),
    ),
    { maxLength: 6 },
  )
  .map((parts) => {
    const events: Event[] = [{ type: 'start', id: 'up-1' }];
    let calls = 0;
    for (const p of parts) {
      if (p.kind !== 'call') for (const delta of p.deltas) events.push({ type: p.kind, delta });
      else {
        const index = calls++;
        events.push({ type: 'tool_call', index, id: p.id, name: p.name, ...(p.signature && { signature: p.signature }) });
        const json = JSON.stringify(p.input);
        const size = Math.ceil(json.length / p.pieces);
        for (let at = 0; at < json.length; at += size) events.push({ type: 'tool_arguments', index, delta: json.slice(at, at + size) });
      }
    }
    events.push({ type: 'finish', reason: calls ? 'tool_calls' : 'stop' }, { type: 'usage', usage: { inputTokens: 30, outputTokens: 7, cachedTokens: 10 } });
    return events;
  });

/** The official SDK's accumulator over a written stream (it takes the events as JSON lines). */
async function sdkMessage(sse: string): Promise<Anthropic.Message> {
  const lines = sse
    .split('\n\n')
    .filter((frame) => frame.startsWith('event: '))
    .map((frame) => frame.slice(frame.indexOf('data: ') + 6))
    .filter((data) => JSON.parse(data).type !== 'ping')
    .join('\n');
  return MessageStream.fromReadableStream(Readable.toWeb(Readable.from([Buffer.from(lines + '\n')])) as ReadableStream).finalMessage();
}

t.test('written streams: the SDK accumulates the same answer, and the reader reads it back', async (t) => {
  await fc.assert(
    fc.asyncProperty(canonicalStream, async (events) => {
      const writer = messagesStreamWriter(exchange());
      const sse = events.map((e) => writer.event(e)).join('') + writer.end();
      const expected = collect(events);
      const message = await sdkMessage(sse);
      const text = message.content.filter((b) => b.type === 'text').map((b) => (b as Anthropic.TextBlock).text).join('');
      const thinking = message.content.filter((b) => b.type === 'thinking').map((b) => (b as Anthropic.ThinkingBlock).thinking).join('');
      const calls = message.content.filter((b) => b.type === 'tool_use') as Anthropic.ToolUseBlock[];
      t.equal(text, expected.text);
      t.equal(thinking, expected.reasoning ?? '');
      t.same(
        calls.map((c) => ({ ...splitToolId(c.id), name: c.name, input: c.input })),
        // Ids outside Anthropic's pattern are made to fit it; signatures ride along.
        expected.toolCalls.map((c) => ({ id: safeToolId(c.id), ...(c.signature && { signature: c.signature }), name: c.name, input: JSON.parse(c.arguments) })),
      );
      t.equal(message.stop_reason, calls.length ? 'tool_use' : 'end_turn');
      t.same(message.usage, { input_tokens: 20, output_tokens: 7, cache_creation_input_tokens: 0, cache_read_input_tokens: 10 });
      const back = collect(read([Buffer.from(sse)]));
      t.equal(back.text, expected.text);
      t.same(back.toolCalls.map((c) => JSON.parse(c.arguments)), expected.toolCalls.map((c) => JSON.parse(c.arguments)));
    }),
    { numRuns: 150 },
  );
});
