/**
 * A thread that writes usage batches to the SQLite file, so that a batch (a few milliseconds for
 * 256 records, more at a WAL checkpoint) never blocks the event loop that serves requests. It has
 * its own connection; WAL lets it write while the serving thread reads. SqliteStore with
 * `usageWriter: 'thread'` starts it, sends it each batch, and ends it (the connection goes with it).
 */
import { parentPort, workerData } from 'node:worker_threads';
import { SqliteStore, type WriterReply, type WriterRequest } from './sqlite.js';
import { decodeRecord } from './journal-lines.js';

const store = new SqliteStore(workerData.file as string, workerData.options);
parentPort!.on('message', async ({ id, lines }: WriterRequest) => {
  try {
    await store.writeUsage(lines.map(decodeRecord));
    parentPort!.postMessage({ id } satisfies WriterReply);
  } catch (err) {
    parentPort!.postMessage({ id, error: (err as Error).message } satisfies WriterReply);
  }
});
