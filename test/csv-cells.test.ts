/** Usage CSV cells: nothing a spreadsheet could run as a formula, and every cell reads back as written. */
import fc from 'fast-check';
import t from 'tap';
import { csvCell } from '../src/admin/service.js';

const dangerous = ['=', '+', '-', '@', '\t', '\r', '\n', '\0', ' ', '\uFF1D', '\uFF0B', '\uFF0D', '\uFF20'];

/** The one field of a CSV line, as a spreadsheet reads it (RFC 4180 quoting). */
function readBack(cell: string): string {
  return cell.startsWith('"') ? cell.slice(1, -1).replace(/""/g, '"') : cell;
}

t.test('text that could start a formula gets a leading quote', async (t) => {
  for (const first of dangerous) {
    const cell = readBack(csvCell(`${first}HYPERLINK("http://x")`));
    t.ok(cell.startsWith("'"), `${JSON.stringify(first)} first`);
  }
  t.equal(csvCell('upstream timeout'), 'upstream timeout', 'ordinary text is as written');
  t.equal(csvCell(-3), '-3', "numbers are Sluice's own and stay numbers");
  t.equal(csvCell(null), '');
});

t.test('property: every string reads back as written, neutralised only where it could be a formula', async () => {
  fc.assert(
    fc.property(fc.oneof(fc.string(), fc.string({ unit: 'binary' }), fc.constantFrom(...dangerous).chain((d) => fc.string().map((s) => d + s))), (text) => {
      const cell = readBack(csvCell(text));
      const risky = text.length > 0 && dangerous.includes(text[0]!);
      return risky ? cell === `'${text}` : cell === text;
    }),
    { numRuns: 2000 },
  );
});
