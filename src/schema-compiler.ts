/**
 * ajv validators compiled at build time. Compiling every request, config and admin schema took
 * about half a second of CPU in each thread at start (more on a busy machine), most of start-up;
 * `npm run build` now writes them once as ajv's standalone code (src/precompile-schemas.ts), and a
 * start only loads that module. A schema the build did not see (edited since, or run from source)
 * is compiled here as before, so a stale build is slower, never wrong.
 */
import { createHash } from 'node:crypto';
import { createRequire } from 'node:module';
import type { Ajv as AjvInstance, Options, ValidateFunction } from 'ajv';

/** Written by `npm run build` beside this module. */
export const PRECOMPILED_MODULE = 'schemas.generated.cjs';

const require = createRequire(import.meta.url);
let precompiled: Record<string, ValidateFunction> = {};
try {
  precompiled = require(`./${PRECOMPILED_MODULE}`);
} catch {
  // Not built yet: every schema is compiled where it is used.
}

export interface SchemaCompiler {
  compile(schema: object): ValidateFunction;
}

/** The build's collection: every compiler's ajv, which keeps the source of what it compiled. */
const collected: { ajv: AjvInstance; ids: string[] }[] = [];
let collecting = false;
let compiledHere = 0;

/**
 * A compiler for schemas that share ajv `options`; `name` tells its validators apart from other
 * compilers' in the precompiled module (the same schema under other options validates otherwise).
 */
export function schemaCompiler(name: string, options: Options): SchemaCompiler {
  let ajv: AjvInstance | undefined;
  let ids: string[] = [];
  return {
    compile(schema) {
      const id = `${name}_${createHash('sha256').update(JSON.stringify([options, schema])).digest('hex').slice(0, 24)}`;
      if (!collecting && precompiled[id]) return precompiled[id];
      if (!ajv) {
        // ajv itself is loaded only here: a start from a current build never needs it.
        const { Ajv } = require('ajv') as typeof import('ajv');
        ajv = new Ajv({ ...options, code: { ...options.code, source: collecting } });
        if (collecting) collected.push({ ajv, ids });
      }
      compiledHere++;
      if (!collecting) return ajv.compile(schema);
      if (!ids.includes(id)) {
        ajv.addSchema(schema, id);
        ids.push(id);
      }
      return ajv.getSchema(id)!;
    },
  };
}

/** How many schemas were compiled at run time rather than loaded from the build (for tests). */
export const schemasCompiledHere = () => compiledHere;

/** For the build: from now on every compiler keeps what it compiles, for `precompiledSource`. */
export function collectSchemas(): void {
  collecting = true;
}

/** The collected validators as one CommonJS module of ajv standalone code, per compiler. */
export async function precompiledSource(): Promise<string> {
  // A CommonJS module whose export is the function itself (its types say `.default`).
  const standaloneCode = (await import('ajv/dist/standalone/index.js')).default as unknown as (ajv: AjvInstance, refs: Record<string, string>) => string;
  const parts = collected.map(({ ajv, ids }) => standaloneCode(ajv, Object.fromEntries(ids.map((id) => [id, id]))));
  // Each part is a module of its own ("use strict", its own helpers): wrap each in a scope.
  return `"use strict";\n${parts.map((code) => `(function (exports) {\n${code.replace(/^"use strict";/, '')}\n})(module.exports);`).join('\n')}\n`;
}
