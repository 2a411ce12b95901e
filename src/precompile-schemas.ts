/**
 * A build step (`npm run build`): loads every module that compiles a schema when loaded (the
 * config, the admin API, every in-tree plugin), then writes what they compiled as ajv standalone
 * code beside src/schema-compiler.ts, which every start then loads instead of compiling.
 */
import { readdirSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { collectSchemas, PRECOMPILED_MODULE, precompiledSource } from './schema-compiler.js';

const here = dirname(fileURLToPath(import.meta.url));

/** Every plugin's entry module under the built plugins folder (the console's browser app is apart). */
function pluginEntries(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? pluginEntries(join(dir, e.name)) : e.name === 'index.js' ? [join(dir, e.name)] : [],
  );
}

collectSchemas();
for (const file of [join(here, 'config', 'schema.js'), join(here, 'admin', 'service.js'), ...pluginEntries(join(here, '..', 'plugins'))]) {
  await import(pathToFileURL(file).href);
}
writeFileSync(join(here, PRECOMPILED_MODULE), await precompiledSource());
