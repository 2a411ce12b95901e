/** Key expiry dates: a day of the calendar is taken as written; a day past its month's end is refused, not rolled over. */
import fc from 'fast-check';
import t from 'tap';
import { AdminError, parseExpiry } from '../src/admin/service.js';

const leap = (y: number) => (y % 4 === 0 && y % 100 !== 0) || y % 400 === 0;
const daysIn = (y: number, m: number) => [31, leap(y) ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][m - 1]!;
/** Midnight UTC of a day; Date.UTC would read years below 100 as 19xx. */
const midnight = (y: number, m: number, d: number) => new Date(0).setUTCFullYear(y, m - 1, d);

t.test('property: a date is taken when the calendar has it, and refused otherwise', async () => {
  const day = fc.tuple(fc.integer({ min: 0, max: 9999 }), fc.integer({ min: 1, max: 12 }), fc.integer({ min: 1, max: 31 }));
  fc.assert(
    fc.property(day, fc.constantFrom('', 'T00:00Z', 'T23:59:59.5+14:00', 'T12:00:00-12:00'), ([y, m, d], time) => {
      const text = `${String(y).padStart(4, '0')}-${String(m).padStart(2, '0')}-${String(d).padStart(2, '0')}${time}`;
      if (d > daysIn(y, m)) {
        try {
          parseExpiry(text);
          return false;
        } catch (err) {
          return err instanceof AdminError && err.status === 400 && /is not a day of the calendar/.test(err.message);
        }
      }
      const ms = parseExpiry(text)!;
      return time === '' ? ms === midnight(y, m, d) : Number.isFinite(ms);
    }),
    { numRuns: 3000 },
  );
});

t.test('the dates the audit found', async (t) => {
  t.throws(() => parseExpiry('2026-02-31'), { message: 'expiresAt: 2026-02-31 is not a day of the calendar' }, 'not 3 March');
  t.throws(() => parseExpiry('2026-02-29T10:00:00Z'), { message: /not a day of the calendar/ }, '2026 is no leap year');
  t.equal(parseExpiry('2028-02-29'), Date.UTC(2028, 1, 29), '2028 is');
  t.equal(parseExpiry('2026-12-31T23:00:00-05:00'), Date.UTC(2027, 0, 1, 4), 'the day as written, in its own zone');
  t.equal(parseExpiry(null), null);
});
