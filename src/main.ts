#!/usr/bin/env node
/**
 * The entry point of `sluice` and `npm start`. From Node 22 on, compiled module code is cached
 * between starts (in the OS temp directory, or NODE_COMPILE_CACHE): the start then skips compiling
 * its modules again. It must be switched on before they load, hence this module in front of the
 * command line (cli.ts). Node 20 has no such cache and starts as before.
 */
import module from 'node:module';

const cache = (module as { enableCompileCache?: () => { directory?: string } }).enableCompileCache?.();
// Worker threads read the variable when they start, so they use the same cache.
if (cache?.directory) process.env.NODE_COMPILE_CACHE ??= cache.directory;
await import('./cli.js');
