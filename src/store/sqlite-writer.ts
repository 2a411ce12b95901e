/**
 * A thread that writes usage batches to the SQLite file, so that a batch (a few milliseconds for
 * 256 records, more at a WAL checkpoint) never blocks the event loop that serves requests. It has
 * its own connection; WAL lets it write while the serving thread reads. SqliteStore with
 * `usageWriter: 'thread'` starts it, sends it each batch, and ends it (the connection goes with it);
 * usage-writer.ts is that side, and sets the thread's scheduling.
 */
import { readlinkSync } from 'node:fs';
import { parentPort, workerData } from 'node:worker_threads';
import { SqliteStore } from './sqlite.js';
import type { WriterReply, WriterRequest } from './usage-writer.js';

// First, the thread's own id for the kernel (`/proc/thread-self` is `PID/task/TID`): the store
// sets this thread's scheduling by it (usage-writer.ts).
let tid: number | null = null;
try {
  tid = Number(readlinkSync('/proc/thread-self').split('/').pop()) || null;
} catch {
  // Not Linux: the thread keeps its priority.
}
parentPort!.postMessage({ tid } satisfies WriterReply);

const store = new SqliteStore(workerData.file as string, workerData.options);
parentPort!.on('message', ({ id, lines }: WriterRequest) => {
  try {
    store.writeUsageLines(lines);
    parentPort!.postMessage({ id } satisfies WriterReply);
  } catch (err) {
    parentPort!.postMessage({ id, error: (err as Error).message } satisfies WriterReply);
  }
});
