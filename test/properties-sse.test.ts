/**
 * Property-based test of the SSE splitter: however a byte string is cut into chunks, the frames
 * visited, the bytes written and the remainder are the same as when it arrives in one piece.
 */
import assert from 'node:assert/strict';
import { isDeepStrictEqual } from 'node:util';
import fc from 'fast-check';
import t from 'tap';
import { indexOfQuoted } from '../src/bytes.js';
import { removeNullFields } from '../src/json-splice.js';
import { ObjectKeyNeedle, SseSplitter } from '../src/sse.js';

/** Byte strings rich in what framing looks at: both line endings, blank lines, field names. */
const stream = fc
  .array(
    fc.oneof(
      { weight: 4, arbitrary: fc.constantFrom('\n', '\r\n', '\r', '\n\n', '\r\n\r\n', 'data: ', 'event: x', ':', 'data:{"a":1}', 'data:{"a":{"b":1}}', '"a":{', 'data: {"a": {"b": 1}}', '"a": {') },
      { weight: 2, arbitrary: fc.string({ maxLength: 6 }) },
      { weight: 1, arbitrary: fc.uint8Array({ maxLength: 6 }).map((a) => Buffer.from(a).toString('latin1')) },
    ),
    { maxLength: 60 },
  )
  .map((pieces) => Buffer.from(pieces.join(''), 'latin1'));

/** Cut points, as fractions of the length so that they always fall inside the string. */
const cuts = fc.array(fc.double({ min: 0, max: 1, noNaN: true }), { maxLength: 12 });

interface Outcome {
  visited: string[];
  written: string;
  rest: string | null;
}

/** Splits the chunks; frames whose length is a multiple of 3 are dropped, to test the runs of kept frames. */
function split(chunks: Buffer[]): Outcome {
  const splitter = new SseSplitter();
  const visited: string[] = [];
  const written: Buffer[] = [];
  for (const chunk of chunks) {
    splitter.push(
      chunk,
      (frame) => {
        visited.push(frame.toString('latin1'));
        return frame.length % 3 !== 0;
      },
      // Copies: the splitter may hand out views into chunks the caller reuses.
      (bytes) => written.push(Buffer.from(bytes)),
    );
  }
  return { visited, written: Buffer.concat(written).toString('latin1'), rest: splitter.flush()?.toString('latin1') ?? null };
}

function chunked(bytes: Buffer, fractions: number[]): Buffer[] {
  const points = fractions.map((f) => Math.floor(f * bytes.length)).sort((a, b) => a - b);
  const chunks: Buffer[] = [];
  let from = 0;
  for (const p of [...points, bytes.length]) {
    chunks.push(bytes.subarray(from, p));
    from = p;
  }
  return chunks;
}

t.test('any chunking gives the frames, bytes and remainder of splitting at once', async (t) => {
  fc.assert(
    fc.property(stream, cuts, (bytes, fractions) => {
      assert.deepEqual(split(chunked(bytes, fractions)), split([bytes]));
    }),
    { numRuns: 3000 },
  );
  t.pass('3000 byte strings, each cut at random');
});

t.test('kept frames and the remainder are the input, byte for byte', async (t) => {
  fc.assert(
    fc.property(stream, cuts, (bytes, fractions) => {
      const splitter = new SseSplitter();
      const out: Buffer[] = [];
      for (const chunk of chunked(bytes, fractions)) splitter.push(chunk, () => true, (b) => out.push(Buffer.from(b)));
      const rest = splitter.flush();
      if (rest) out.push(rest);
      assert.equal(Buffer.concat(out).toString('latin1'), bytes.toString('latin1'));
    }),
    { numRuns: 3000 },
  );
  t.pass('3000 byte strings, each cut at random');
});

/** Frames as `push` sees them when every frame is visited: the truth `pushSparse` is checked against. */
function framesOf(bytes: Buffer): string[] {
  const frames: string[] = [];
  const splitter = new SseSplitter();
  splitter.push(bytes, (f) => (frames.push(f.toString('latin1')), true), () => {});
  return frames;
}

for (const lastFrame of [false, true]) {
  t.test(`the sparse scan${lastFrame ? ' with last frames' : ''}: the same bytes out, every frame with a needle visited, none dropped that was kept`, async (t) => {
    const hasKey = (f: string | Buffer) => f.includes('"a":{') || f.includes('"a": {');
    const scan = { key: new ObjectKeyNeedle('a'), lastFrame };
    fc.assert(
      fc.property(stream, cuts, (bytes, fractions) => {
        const splitter = new SseSplitter();
        const out: Buffer[] = [];
        const visited: string[] = [];
        // Drops the needle frames whose length is a multiple of 3, as a usage-chunk filter would.
        const visit = (frame: Buffer) => {
          visited.push(frame.toString('latin1'));
          return !(hasKey(frame) && frame.length % 3 === 0);
        };
        for (const chunk of chunked(bytes, fractions)) splitter.pushSparse(chunk, scan, visit, (b) => out.push(Buffer.from(b)));
        const rest = splitter.flush();
        if (rest) out.push(rest);
        // What frame-by-frame splitting keeps, and the frames it sees that hold the needle.
        const all = framesOf(bytes);
        const kept = split([bytes]);
        const expected = Buffer.concat([Buffer.from(all.filter((f) => !(hasKey(f) && f.length % 3 === 0)).join(''), 'latin1'), Buffer.from(kept.rest ?? '', 'latin1')]);
        assert.equal(Buffer.concat(out).toString('latin1'), expected.toString('latin1'));
        for (const f of all) if (hasKey(f)) assert.ok(visited.includes(f), `the frame ${JSON.stringify(f)}, with the key in either form, is visited`);
        let next = 0;
        for (const v of visited) next = all.indexOf(v, next) + 1 || assert.fail(`${JSON.stringify(v)} is not a frame, or out of order`);
        // What a Messages passthrough reads the end of the stream from.
        if (lastFrame && all.length) assert.equal(visited.at(-1), all.at(-1), 'the last complete frame is visited');
      }),
      { numRuns: 3000 },
    );
    t.pass('3000 byte strings, each cut at random');
  });
}

t.test('the key search finds what two plain substring searches find', async (t) => {
  const needle = new ObjectKeyNeedle('a');
  const plain = (bytes: Buffer, from: number) => {
    const hits = [bytes.indexOf('"a":{', from), bytes.indexOf('"a": {', from)].filter((at) => at >= 0);
    return hits.length ? Math.min(...hits) : -1;
  };
  // Strings dense with near misses: a key held by null or an array, a key that only ends in a, quotes and braces.
  const dense = fc
    .array(fc.constantFrom('{', '"a":{', '"a": {', '"a":null', '"a":[', '"ba":{', 'a":{', '"', ':{', ' ', 'x'), { maxLength: 400 })
    .map((pieces) => Buffer.from(pieces.join('')));
  fc.assert(
    fc.property(fc.oneof(stream, dense), fc.double({ min: 0, max: 1, noNaN: true }), (bytes, fraction) => {
      const from = Math.floor(fraction * bytes.length);
      assert.equal(needle.find(bytes, from), plain(bytes, from));
    }),
    { numRuns: 5000 },
  );
  t.pass('5000 byte strings, searched from a random point');
});

t.test('indexOfQuoted finds what a plain search for the quoted bytes finds, keys longer than its six-byte head too', async (t) => {
  const keys = ['"a"', '"usage"', '"usageMetadata"', '"usageMeta"'].map((k) => Buffer.from(k));
  const pieces = fc.constantFrom('"', 'usage', 'usageMetadata"', '"usageMeta', 'Metadata', 'a"', '"a', 'x', '{', ':');
  fc.assert(
    fc.property(fc.array(pieces, { maxLength: 200 }), fc.constantFrom(...keys), fc.nat(), (parts, key, start) => {
      const bytes = Buffer.from(parts.join(''));
      const from = bytes.length ? start % (bytes.length + 1) : 0;
      assert.equal(indexOfQuoted(bytes, key, from), bytes.indexOf(key, from));
    }),
    { numRuns: 5000 },
  );
  t.pass('5000 strings dense with quotes and partial keys');
});

/** Every object held by `key` at any depth of a parsed JSON value, the top level's first. */
function objectsUnder(value: unknown, key: string, found: unknown[] = []): unknown[] {
  if (Array.isArray(value)) for (const item of value) objectsUnder(item, key, found);
  else if (value !== null && typeof value === 'object') {
    const held = (value as Record<string, unknown>)[key];
    if (held !== null && typeof held === 'object' && !Array.isArray(held)) found.push(held);
    for (const item of Object.values(value)) objectsUnder(item, key, found);
  }
  return found;
}

t.test("an answer's field read alone (objectIn) is what parsing the whole answer reads", async (t) => {
  const needle = new ObjectKeyNeedle('usage');
  // Keys from a small set, so that "usage" holds objects, arrays, null and numbers at any depth;
  // strings full of what the brace walk must step over: braces, quotes, backslashes, the key itself.
  const text = fc.constantFrom('', 'x', '{', '}', '[', ']', '"', '\\', '\\"', '"usage":{', '"usage": {', 'usage', '\\u007b', 'é');
  const leaf = fc.oneof(fc.array(text, { maxLength: 4 }).map((parts) => parts.join('')), fc.integer(), fc.constant(null), fc.boolean(), fc.double({ noNaN: true, noDefaultInfinity: true }));
  const { value } = fc.letrec((tie) => ({
    value: fc.oneof({ depthSize: 'small', withCrossShrink: true }, leaf, fc.array(tie('value'), { maxLength: 3 }), fc.dictionary(fc.constantFrom('usage', 'id', 'choices', 'a', 'usage_'), tie('value'), { maxKeys: 4 })),
  }));
  const answer = fc.dictionary(fc.constantFrom('usage', 'id', 'choices', 'model', 'a'), value, { maxKeys: 5 });
  fc.assert(
    fc.property(answer, fc.constantFrom<'compact' | 'python' | 'indented'>('compact', 'python', 'indented'), (generated, layout) => {
      // As JSON.parse gives it back (fast-check's dictionaries have no prototype).
      const parsed = JSON.parse(JSON.stringify(generated));
      const body = Buffer.from(layout === 'compact' ? JSON.stringify(parsed) : layout === 'python' ? pythonJson(parsed) : JSON.stringify(parsed, null, 2));
      const held = objectsUnder(parsed, 'usage');
      let hits = 0;
      for (let at = needle.find(body, 0); at >= 0; at = needle.find(body, at + 1)) hits++;
      // Only a key holding an object is found: never a piece of a string.
      assert.equal(hits, held.length);
      // One: that object (the top level's, or the sole nested one); more: the whole parse's top-level field; none: nothing.
      const expected = held.length === 1 ? held[0] : held.length > 1 ? parsed.usage : undefined;
      assert.deepEqual(needle.objectIn(body), expected);
    }),
    { numRuns: 5000 },
  );
  t.pass('5000 answers, compact, spaced and indented');
});

/** JSON as Python's json.dumps writes it: ", " between items, ": " after keys. */
const pythonJson = (v: unknown): string =>
  Array.isArray(v)
    ? `[${v.map(pythonJson).join(', ')}]`
    : v !== null && typeof v === 'object'
      ? `{${Object.entries(v).map(([k, x]) => `${JSON.stringify(k)}: ${pythonJson(x)}`).join(', ')}}`
      : JSON.stringify(v);

t.test('removing "usage": null: every null usage field on a line goes, with no trace, nothing else changes', async (t) => {
  const quotedKey = Buffer.from('"usage"');
  // Events as OpenAI writes them (compact) and as Python servers do (", " and ": "), the usage field
  // anywhere; on one line, with spaces after it, or split over two data lines.
  const event = fc.record({
    fields: fc.dictionary(fc.constantFrom('id', 'model', 'choices', 'x', 'usage_', 'a"usage'), fc.jsonValue({ maxDepth: 2 }), { maxKeys: 4 }),
    usage: fc.constantFrom<'absent' | 'null' | 'object'>('absent', 'null', 'object'),
    at: fc.nat(),
    spaced: fc.boolean(),
    crlf: fc.boolean(),
    layout: fc.constantFrom<'line' | 'trailing' | 'split'>('line', 'trailing', 'split'),
  });
  const extra = fc.constantFrom(': keep-alive\n\n', 'event: ping\ndata: {"type":"ping"}\n\n', 'data: [DONE]\n\n');
  fc.assert(
    fc.property(fc.array(fc.oneof(event, extra), { maxLength: 12 }), (items) => {
      let input = '';
      /** Each event's data as it may come out: without its null usage, or (split over lines) also as it was. */
      const expected: unknown[][] = [];
      const untouched: string[] = [];
      for (const item of items) {
        if (typeof item === 'string') {
          input += item;
          untouched.push(item);
          if (item.includes('ping')) expected.push([{ type: 'ping' }]);
          continue;
        }
        const entries = Object.entries(item.fields);
        if (item.usage !== 'absent') entries.splice(item.at % (entries.length + 1), 0, ['usage', item.usage === 'null' ? null : { total_tokens: 3 }]);
        const text = (item.spaced ? pythonJson : JSON.stringify)(Object.fromEntries(entries));
        const eol = item.crlf ? '\r\n' : '\n';
        // Split right before the usage field (after its comma or brace), else after the brace.
        const cut = Math.max(0, text.search(/[{,] ?"usage":/)) + 1;
        const data = item.layout === 'split' ? `${text.slice(0, cut)}${eol}data: ${text.slice(cut)}` : item.layout === 'trailing' ? `${text}  ` : text;
        const frame = `data: ${data}${eol}${eol}`;
        input += frame;
        const without = Object.fromEntries(entries.filter(([k]) => k !== 'usage'));
        if (item.usage !== 'null') (expected.push([JSON.parse(text)]), untouched.push(frame));
        else expected.push(item.layout === 'split' ? [without, JSON.parse(text)] : [without]);
      }
      const bytes = Buffer.from(input);
      const out = bytes.subarray(0, removeNullFields(bytes, quotedKey)).toString();
      // Nothing is left where a field was (blanking left a run of spaces).
      if (!/ {3}/.test(input)) assert.ok(!/ {3}/.test(out), `no run of spaces: ${out}`);
      // Each frame's data lines, joined as an SSE client joins them.
      const events = out
        .split(/\r?\n\r?\n/)
        .map((frame) => frame.split(/\r?\n/).filter((l) => l.startsWith('data: ')).map((l) => l.slice(6)).join('\n'))
        .filter((d) => d && d !== '[DONE]');
      assert.equal(events.length, expected.length);
      // (Through JSON, as the events were: -0 becomes 0.)
      events.forEach((d, i) => assert.ok(expected[i]!.some((e) => isDeepStrictEqual(JSON.parse(d), JSON.parse(JSON.stringify(e)))), `event ${i}: ${d}`));
      for (const frame of untouched) assert.ok(out.includes(frame), 'a frame without a null usage passes unchanged');
    }),
    { numRuns: 3000 },
  );
  t.pass('3000 event streams');
});
