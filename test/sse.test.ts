import t from 'tap';
import { SseSplitter, frameData } from '../src/sse.js';

const frames = [
  'data: {"id":"1","choices":[{"delta":{"content":"Hel"}}]}\n\n',
  'event: response.output_text.delta\ndata: {"delta":"lo"}\n\n',
  ': keep-alive comment\n\n',
  'data: {"multi":\ndata: "line"}\n\n',
  'data: [DONE]\n\n',
];
const stream = Buffer.from(frames.join(''));

/** Feeds the stream in the given pieces; returns the frames seen and the bytes written. */
function relay(pieces: Buffer[], keep: (f: Buffer) => boolean = () => true) {
  const splitter = new SseSplitter();
  const seen: string[] = [];
  const written: Buffer[] = [];
  for (const piece of pieces) {
    splitter.push(piece, (f) => (seen.push(f.toString()), keep(f)), (b) => written.push(Buffer.from(b)));
  }
  return { seen, written: Buffer.concat(written).toString(), rest: splitter.flush() };
}

t.test('whole stream in one chunk: every frame seen, bytes unchanged, one write', (t) => {
  const splitter = new SseSplitter();
  const writes: Buffer[] = [];
  const seen: string[] = [];
  splitter.push(stream, (f) => (seen.push(f.toString()), true), (b) => writes.push(b));
  t.same(seen, frames);
  t.equal(writes.length, 1, 'consecutive kept frames leave as one write');
  t.equal(writes[0]!.buffer, stream.buffer, 'the write is a view into the upstream chunk, not a copy');
  t.end();
});

t.test('split at every byte boundary into two pieces', (t) => {
  for (let cut = 0; cut <= stream.length; cut++) {
    const { seen, written, rest } = relay([stream.subarray(0, cut), stream.subarray(cut)]);
    if (seen.join('') !== frames.join('') || written !== stream.toString() || rest !== null) {
      t.fail(`cut at ${cut} broke framing`);
      return t.end();
    }
  }
  t.pass('all cuts reassemble exactly');
  t.end();
});

t.test('one byte at a time', (t) => {
  const pieces = Array.from(stream, (_, i) => stream.subarray(i, i + 1));
  const { seen, written } = relay(pieces);
  t.same(seen, frames);
  t.equal(written, stream.toString());
  t.end();
});

t.test('CRLF framing at every boundary', (t) => {
  const crlf = Buffer.from(frames.join('').replace(/\n/g, '\r\n'));
  for (let cut = 0; cut <= crlf.length; cut++) {
    const { seen, written } = relay([crlf.subarray(0, cut), crlf.subarray(cut)]);
    if (seen.length !== frames.length || written !== crlf.toString()) {
      t.fail(`CRLF cut at ${cut}: ${seen.length} frames`);
      return t.end();
    }
  }
  t.pass('CRLF frames reassemble exactly');
  t.end();
});

t.test('dropped frames are cut out of the written bytes, at every boundary', (t) => {
  const dropDone = (f: Buffer) => !f.toString().includes('[DONE]') && !f.toString().startsWith(':');
  const expected = frames.filter((f) => !f.includes('[DONE]') && !f.startsWith(':')).join('');
  for (let cut = 0; cut <= stream.length; cut++) {
    const { written } = relay([stream.subarray(0, cut), stream.subarray(cut)], dropDone);
    if (written !== expected) {
      t.fail(`cut at ${cut}: wrote ${JSON.stringify(written)}`);
      return t.end();
    }
  }
  t.pass('kept frames only');
  t.end();
});

t.test('an unterminated last frame is returned by flush', (t) => {
  const { seen, rest } = relay([Buffer.from('data: a\n\ndata: b')]);
  t.same(seen, ['data: a\n\n']);
  t.equal(rest?.toString(), 'data: b');
  t.end();
});

t.test('frameData joins data lines and ignores other fields', (t) => {
  t.equal(frameData(Buffer.from(frames[0]!)), '{"id":"1","choices":[{"delta":{"content":"Hel"}}]}');
  t.equal(frameData(Buffer.from(frames[1]!)), '{"delta":"lo"}');
  t.equal(frameData(Buffer.from(frames[2]!)), null);
  t.equal(frameData(Buffer.from(frames[3]!)), '{"multi":\n"line"}');
  t.equal(frameData(Buffer.from('data:no-space\r\n\r\n')), 'no-space');
  t.equal(frameData(Buffer.from('data: {"text":"é ✓"}\n\n')), '{"text":"é ✓"}');
  t.end();
});
