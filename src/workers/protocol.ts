/**
 * What the primary thread (primary.ts) and its worker threads (thread.ts) tell each other, and the
 * pool the primary's Gateway shows. Apart from both, so that neither imports the other: the primary
 * starts thread.ts by its file, not by importing it.
 */
import type { MessagePort } from 'node:worker_threads';
import type { AdminCredential } from '../admin/token.js';
import type { LoadOptions } from '../config/load.js';
import type { Config } from '../config/types.js';

export interface WorkerPool {
  /** How many threads serve. */
  readonly size: number;
  /** Threads started to replace ones that died. */
  readonly replacements: number;
  /** Throws an uncaught error in a thread, the way a bug would; it stops and is replaced. For drills and tests. */
  crash(index: number): void;
}

export interface ThreadData {
  config: Config;
  source: LoadOptions;
  index: number;
  port: number;
  admin: AdminCredential;
  /** Started in place of a thread that ended: the others may have reloaded since `config` was read. */
  replacement: boolean;
  limiterPort?: MessagePort;
}

/**
 * What a thread tells the primary. `gather` asks for every thread's answer to a topic (a plugin's
 * report of the whole instance, `GatewayView.gather`); `answer` is this thread's part of one.
 */
export type ThreadMessage =
  | { type: 'listening'; port: number; families: string[] }
  | { type: 'reloaded'; via: string }
  | { type: 'reload-outcome'; id: number; outcome: unknown }
  | { type: 'gather'; id: number; topic: string; timeoutMs?: number }
  | { type: 'answer'; id: number; value: unknown };

/**
 * What the primary tells a thread. `crash` throws an uncaught error in it: a drill of the real
 * failure path. `ask` wants the thread's answer to a topic; `gathered` ends the thread's `gather`.
 */
export type PrimaryMessage =
  | { type: 'reload'; id: number; via: string }
  | { type: 'shutdown' }
  | { type: 'crash' }
  | { type: 'ask'; id: number; topic: string }
  | { type: 'gathered'; id: number; values: unknown[] };
