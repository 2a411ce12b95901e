/**
 * The one place that loads uWebSockets.js. Two builds ship (docs/runtimes.md, "Supported runtimes"):
 * - 20.57 (official binaries, republished on npm as @btc-vision/uwebsockets.js) for Node 20, 22,
 *   24 and 25, linked against glibc 2.38 or newer;
 * - 20.30 (@trufflesuite/uws-js-unofficial, installed as `uWebSockets.js`) for Node 20 on an older
 *   glibc, such as Debian 12's 2.36.
 * The newest that loads natively wins. Neither package's JS imitation is ever used: 20.30's own
 * loader falls back to it silently, so its binary is loaded here directly; when no build fits the
 * runtime, the start fails with one sentence naming what to install.
 */
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import type * as UwsModule from 'uWebSockets.js';

export type { HttpRequest, HttpResponse, TemplatedApp, WebSocket, us_listen_socket } from 'uWebSockets.js';

type Uws = typeof UwsModule;

const require = createRequire(import.meta.url);
const binary = `uws_${process.platform}_${process.arch}_${process.versions.modules}.node`;

interface Build {
  version: string;
  /** The folder its binaries are in. */
  folder(): string;
}

const builds: Build[] = [
  { version: '20.57.0', folder: () => dirname(require.resolve('@btc-vision/uwebsockets.js')) },
  { version: '20.30.0', folder: () => join(dirname(require.resolve('uWebSockets.js/package.json')), 'binaries') },
];

let loaded: { uws: Uws; version: string } | undefined;

/**
 * uWebSockets.js, loaded on first use: the first build whose binary loads. Throws one sentence
 * naming what to install when none does (at start, where the CLI prints it without a stack).
 */
export function loadUws(): Uws {
  return (loaded ??= loadFirstBuild()).uws;
}

/** Which build serves: for the banner, the bench, and the tests that check what it answers. */
export function uwsVersion(): string {
  loadUws();
  return loaded!.version;
}

function loadFirstBuild(): { uws: Uws; version: string } {
  // The packages' own switch to their imitation: honoured by refusing, not by imitating.
  if (process.env.UWS_USE_FALLBACK) throw new Error(runtimeAdvice());
  const failures: string[] = [];
  for (const { version, folder } of builds) {
    try {
      // A path, not the package: the binary alone, without either package's wrapper.
      return { uws: require(join(folder(), binary)) as Uws, version };
    } catch (err) {
      failures.push(`${version}: ${(err as Error).message.split('\n')[0]}`);
    }
  }
  throw new Error(`${runtimeAdvice()} (tried uWebSockets.js ${failures.join('; ')})`);
}

/** The one sentence that says what to install, from what this runtime is. */
export function runtimeAdvice(node = process.versions.node, glibc = glibcVersion()): string {
  const here = `Node ${node} on ${process.platform}-${process.arch}${glibc ? ` with glibc ${glibc}` : ''}`;
  const major = Number(node.split('.')[0]);
  if (process.env.UWS_USE_FALLBACK) return `uWebSockets.js's JS imitation (UWS_USE_FALLBACK) is too slow to serve: unset UWS_USE_FALLBACK`;
  if (glibc && older(glibc, '2.38') && major !== 20) {
    return `Sluice cannot run on ${here}: Node ${major} needs glibc 2.38 or newer (Debian 13, Ubuntu 24.04); install Node 20, or run on a newer distribution`;
  }
  if (![20, 22, 24, 25].includes(major)) return `Sluice cannot run on ${here}: install Node 24 (or 22, or 20 where glibc is older than 2.38)`;
  return `Sluice cannot load uWebSockets.js on ${here}: its builds cover linux, darwin and win32 on x64 and arm64; reinstall with npm ci`;
}

function glibcVersion(): string | undefined {
  if (process.platform !== 'linux') return undefined;
  const header = (process.report?.getReport() as { header?: { glibcVersionRuntime?: string } } | undefined)?.header;
  return header?.glibcVersionRuntime;
}

function older(version: string, than: string): boolean {
  const [a = 0, b = 0] = version.split('.').map(Number);
  const [c = 0, d = 0] = than.split('.').map(Number);
  return a < c || (a === c && b < d);
}
