/**
 * `npm run bench`: micro benchmarks, the end-to-end harness, then Sluice against nginx.
 * `--micro`, `--e2e` or `--versus` for one part; `--memory` (only when asked: it holds ten
 * thousand connections) for the gateway's memory per idle stream and WebSocket; `--budget` (only
 * when asked) for the cost per exchange of `npm start` and of each default plugin.
 */
import { cpus } from 'node:os';
import { runBudget } from './budget.js';
import { runE2e } from './e2e.js';
import { runMemory } from './memory.js';
import { runMicro } from './micro.js';
import { runVersus } from './versus.js';

const only = process.argv[2];
const runs = (part: string) => only === undefined || only === `--${part}`;
console.log(`node ${process.version}, ${cpus().length} × ${cpus()[0]?.model ?? 'cpu'}`);
if (runs('micro')) {
  console.log('\nmicro (tinybench)');
  console.table(await runMicro());
}
if (runs('e2e')) {
  console.log('\nend to end: the same load direct to the simulator and through Sluice');
  console.table(await runE2e());
}
if (runs('versus')) {
  console.log('\nversus: direct, nginx and Sluice in front of the same simulator, in alternating rounds');
  const report = await runVersus();
  console.table(report.table);
  console.table(report.targets);
  for (const note of report.notes) console.log(`- ${note}`);
  console.log(`written: ${report.files.join(', ')}`);
}
if (only === '--budget') {
  console.log('\nbudget: CPU and young-generation garbage per exchange, npm start and each default plugin left out (one thread)');
  console.table((await runBudget()).table);
}
if (only === '--memory') {
  console.log('\nmemory: the gateway\'s RSS per idle stream and per idle WebSocket (one thread)');
  const report = await runMemory();
  console.table(report.table);
  for (const note of report.notes) console.log(`- ${note}`);
}
