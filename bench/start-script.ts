/**
 * `npm start`'s command line, read from package.json, for whatever starts Sluice as users do: the
 * benches take its Node flags, the tests the whole line (npm and the shell's `exec` left out).
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';

export interface StartScript {
  /** Node's flags, between `node` and the script. */
  flags: string[];
  /** The script and its arguments, the script's path made absolute under the project root. */
  script: string[];
}

/** `root`: the project's root, where package.json is. */
export function readStartScript(root: string): StartScript {
  const line: string = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')).scripts.start;
  // `exec`: npm runs the line with `sh -c`, and a SIGTERM it forwards would stop the shell, not node.
  const [node, ...args] = line.trim().replace(/^exec\s+/, '').split(/\s+/);
  const main = args.findIndex((a) => !a.startsWith('-'));
  if (node !== 'node' || main < 0) throw new Error(`the start script is not \`[exec] node FLAGS SCRIPT …\`: ${line}`);
  return { flags: args.slice(0, main), script: args.slice(main).map((a) => (a.startsWith('dist/') ? join(root, a) : a)) };
}
