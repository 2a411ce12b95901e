/**
 * Usage CSV cells: nothing a spreadsheet could run as a formula, however it splits the line (`,`,
 * `;` or tab), no control character a terminal acts on, and every cell reads back as written
 * apart from the neutralising `'`.
 */
import fc from 'fast-check';
import t from 'tap';
import { csvCell } from '../src/admin/service.js';

const formulaChars = ['=', '+', '-', '@', '\uFF1D', '\uFF0B', '\uFF0D', '\uFF20'];
const dangerous = [...formulaChars, '\t', '\r', '\n', ' '];
const controls = /[\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/;
/** A piece a spreadsheet would take for a formula: one of its characters first, spaces aside. */
const formula = new RegExp(`^\\s*[${formulaChars.join('').replace('-', '\\-')}]`);

/** A CSV line's fields, as RFC 4180 reads them; null when the line is not well formed. */
function parseLine(line: string): string[] | null {
  const fields: string[] = [];
  let i = 0;
  for (;;) {
    let field = '';
    if (line[i] === '"') {
      for (i++; ; i++) {
        if (i >= line.length) return null;
        if (line[i] === '"' && line[i + 1] === '"') field += line[i++];
        else if (line[i] === '"') break;
        else field += line[i];
      }
      i++;
    } else {
      while (i < line.length && line[i] !== ',') {
        if (line[i] === '"') return null;
        field += line[i++];
      }
    }
    fields.push(field);
    if (i === line.length) return fields;
    if (line[i] !== ',') return null;
    i++;
  }
}

t.test('text that could start a formula gets a leading quote; every text cell is quoted', async (t) => {
  for (const first of dangerous) {
    const [cell] = parseLine(csvCell(`${first}HYPERLINK("http://x")`))!;
    t.ok(cell!.startsWith("'"), `${JSON.stringify(first)} first`);
  }
  t.equal(csvCell('upstream timeout'), '"upstream timeout"', 'ordinary text is as written, quoted');
  t.equal(csvCell(-3), '-3', "numbers are Sluice's own and stay numbers");
  t.equal(csvCell(false), 'false');
  t.equal(csvCell(null), '');
});

t.test('a formula after a semicolon, and terminal escapes, are neutralised', async (t) => {
  // Unquoted, Excel with `;` as its list separator read `=cmd|…` as a cell of its own.
  t.equal(csvCell("x;=cmd|' /C calc'!A0"), `"x;'=cmd|' /C calc'!A0"`);
  t.equal(csvCell('a, b; c'), '"a, b; c"', 'a separator before ordinary text is left alone');
  t.equal(csvCell('a; -1'), `"a;' -1"`, 'spaces between the separator and the formula character too');
  t.equal(csvCell('m\u001b]0;owned\u0007\u009b31m\u202eevil'), '"m]0;owned31mevil"', 'ESC, BEL, CSI and a bidi override are dropped');
  t.equal(csvCell('line one\r\nline two'), '"line one  line two"', 'line breaks become spaces');
});

t.test('property: a cell reads back, with no control character and no formula however the line is split', async () => {
  const text = fc.oneof(
    fc.string(),
    fc.string({ unit: 'binary' }),
    fc.array(fc.oneof(fc.constantFrom(...dangerous, ',', ';', '"', "'", '\u001b', '\u0085', '\u202e'), fc.string({ maxLength: 3 }))).map((parts) => parts.join('')),
  );
  fc.assert(
    fc.property(fc.array(text, { minLength: 1, maxLength: 4 }), (texts) => {
      const line = texts.map(csvCell).join(',');
      const fields = parseLine(line);
      if (!fields || fields.length !== texts.length) return false;
      return fields.every((field, i) => {
        if (controls.test(field)) return false;
        // The `'`s and the dropped controls aside, the text as written.
        const written = texts[i]!.replace(/[\t\n\v\f\r]/g, ' ').replace(new RegExp(controls, 'g'), '');
        if (field.replace(/'/g, '') !== written.replace(/'/g, '')) return false;
        // However a spreadsheet splits the cell, or the raw line, no piece starts a formula.
        return [field, line].every((s) => [',', ';', '\t'].every((sep) => s.split(sep).every((piece) => !formula.test(piece))));
      });
    }),
    { numRuns: 3000 },
  );
});
