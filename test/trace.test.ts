/**
 * Property-based tests of the W3C `traceparent` reader (src/trace.ts): it never throws, it accepts
 * exactly what a reference reading of the spec accepts, and what it writes it reads back.
 */
import fc from 'fast-check';
import t from 'tap';
import { formatTraceparent, parseTraceparent, traceOf, upstreamTraceparent } from '../src/trace.js';

const HEX = '0123456789abcdef';
const hex = (length: number) => fc.string({ unit: fc.constantFrom(...HEX), minLength: length, maxLength: length });
const notZero = (length: number) => hex(length).filter((s) => /[^0]/.test(s));

/** The spec read plainly, field by field, as a check on the regular expression. */
function reference(value: string): boolean {
  const isHex = (s: string | undefined, length: number) => s !== undefined && s.length === length && [...s].every((c) => HEX.includes(c));
  const [version, traceId, parentId, flags, ...more] = value.split('-');
  if (!isHex(version, 2) || version === 'ff') return false;
  if (!isHex(traceId, 32) || /^0+$/.test(traceId!) || !isHex(parentId, 16) || /^0+$/.test(parentId!) || !isHex(flags, 2)) return false;
  // Version 00 has four fields; a later version may add more after another dash.
  return version !== '00' ? true : more.length === 0;
}

/** Strings near the grammar: valid fields, broken fields, odd versions and flags, trailing parts. */
const nearlyValid = fc
  .tuple(
    fc.oneof(fc.constant('00'), fc.constant('ff'), hex(2), fc.string({ maxLength: 3 })),
    fc.oneof(notZero(32), fc.constant('0'.repeat(32)), hex(31), hex(33), notZero(32).map((s) => s.toUpperCase())),
    fc.oneof(notZero(16), fc.constant('0'.repeat(16)), hex(15), fc.string({ maxLength: 17 })),
    fc.oneof(fc.constantFrom('00', '01', 'ff', '0g', '1'), hex(2)),
    fc.oneof(fc.constant(''), fc.constant('-'), fc.string({ maxLength: 8 }).map((s) => `-${s}`), fc.string({ maxLength: 4 })),
    fc.constantFrom('-', '_', ''),
  )
  .map(([version, traceId, parentId, flags, tail, dash]) => `${version}${dash}${traceId}-${parentId}-${flags}${tail}`);

t.test('never throws, and accepts exactly what the spec accepts', async () => {
  fc.assert(
    fc.property(fc.oneof(nearlyValid, fc.string({ maxLength: 80 }), fc.string({ unit: 'binary', maxLength: 60 })), (value) => {
      const parsed = parseTraceparent(value);
      if ((parsed !== undefined) !== reference(value)) throw new Error(`${JSON.stringify(value)}: parsed ${JSON.stringify(parsed)}`);
    }),
    { numRuns: 5000 },
  );
  for (const value of [undefined, '', 'x'.repeat(10_000), null as unknown as string, 42 as unknown as string]) t.equal(parseTraceparent(value), undefined);
});

t.test('what it writes it reads back, and a version 00 header is written back as it came', async () => {
  fc.assert(
    fc.property(notZero(32), notZero(16), fc.boolean(), (traceId, parentId, sampled) => {
      const header = formatTraceparent(traceId, parentId, sampled);
      const parsed = parseTraceparent(header);
      if (JSON.stringify(parsed) !== JSON.stringify({ traceId, parentId, sampled })) throw new Error(`${header} read as ${JSON.stringify(parsed)}`);
      if (!reference(header)) throw new Error(`${header} is not valid`);
    }),
  );
  fc.assert(
    fc.property(notZero(32), notZero(16), fc.constantFrom('00', '01'), (traceId, parentId, flags) => {
      const header = `00-${traceId}-${parentId}-${flags}`;
      const parsed = parseTraceparent(header)!;
      if (formatTraceparent(parsed.traceId, parsed.parentId, parsed.sampled) !== header) throw new Error(header);
    }),
  );
});

t.test('unknown flags are not passed on; a later version is read as version 00', async (t) => {
  const id = '4bf92f3577b34da6a3ce929d0e0e4736';
  t.same(parseTraceparent(`00-${id}-00f067aa0ba902b7-ff`), { traceId: id, parentId: '00f067aa0ba902b7', sampled: true });
  t.same(parseTraceparent(`cc-${id}-00f067aa0ba902b7-02-what-comes-later`), { traceId: id, parentId: '00f067aa0ba902b7', sampled: false });
  t.equal(parseTraceparent(`00-${id}-00f067aa0ba902b7-01-extra`), undefined, 'version 00 has exactly four fields');
});

t.test("an exchange keeps the client's trace, or starts one; upstream calls carry its span as parent", async () => {
  fc.assert(
    fc.property(fc.option(nearlyValid, { nil: undefined }), fc.option(fc.string({ maxLength: 600 }), { nil: undefined }), (traceparent, tracestate) => {
      const headers: Record<string, string> = {};
      if (traceparent !== undefined) headers.traceparent = traceparent;
      if (tracestate !== undefined) headers.tracestate = tracestate;
      const client = parseTraceparent(traceparent);
      const trace = traceOf(headers);
      const sent = parseTraceparent(upstreamTraceparent(trace));
      if (!sent || sent.traceId !== trace.traceId || sent.parentId !== trace.spanId) throw new Error('the upstream header is not the exchange span');
      if (client) {
        if (trace.traceId !== client.traceId || trace.parentId !== client.parentId || trace.sampled !== client.sampled) throw new Error('the client trace was not kept');
        // Passed on when there is one, up to the spec's recommended 512 characters.
        if (trace.state !== (tracestate && tracestate.length <= 512 ? tracestate : undefined)) throw new Error('tracestate');
      } else if (trace.parentId !== undefined || trace.state !== undefined || trace.sampled) {
        throw new Error('a new trace has no parent, no state and is not sampled');
      }
    }),
    { numRuns: 2000 },
  );
  const ids = new Set(Array.from({ length: 1000 }, () => traceOf({}).traceId));
  t.equal(ids.size, 1000, 'new trace ids differ');
});
