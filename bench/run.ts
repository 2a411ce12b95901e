/** `npm run bench`: micro benchmarks, then the end-to-end harness. `--micro` or `--e2e` for one. */
import { cpus } from 'node:os';
import { runE2e } from './e2e.js';
import { runMicro } from './micro.js';

const only = process.argv[2];
console.log(`node ${process.version}, ${cpus().length} × ${cpus()[0]?.model ?? 'cpu'}`);
if (only !== '--e2e') {
  console.log('\nmicro (tinybench)');
  console.table(await runMicro());
}
if (only !== '--micro') {
  console.log('\nend to end: the same load direct to the simulator and through Sluice');
  console.table(await runE2e());
}
