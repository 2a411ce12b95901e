/**
 * A worker thread's entry: one full gateway (its own uWebSockets.js app on the shared port, its
 * own store connection and usage journal) that takes the admin credential and, with the memory
 * limiter, the limits from the primary thread (primary.ts).
 */
import { parentPort, workerData } from 'node:worker_threads';
import { startGateway } from '../gateway.js';
import { createLogger } from '../log.js';
import { RemoteLimiter } from './limiter.js';
import type { PrimaryMessage, ThreadData, ThreadMessage } from './protocol.js';

const { config, source, index, port, admin, replacement, limiterPort } = workerData as ThreadData;
const parent = parentPort!;
const tell = (message: ThreadMessage) => parent.postMessage(message);
const log = createLogger(config.log.level).child({ worker: index });

const limiter = limiterPort && new RemoteLimiter(limiterPort);
/** This thread's gathers waiting for the primary's `gathered`. */
const gathering = new Map<number, (values: unknown[]) => void>();
let nextGather = 1;
const gateway = await startGateway(config, log, source, {
  index,
  admin,
  port,
  ...(limiter && { limiter }),
  reloaded: (via) => tell({ type: 'reloaded', via }),
  gather: (topic, timeoutMs) =>
    new Promise((resolve) => {
      const id = nextGather++;
      gathering.set(id, resolve);
      tell({ type: 'gather', id, topic, ...(timeoutMs !== undefined && { timeoutMs }) });
    }),
});
/**
 * A thread ends only by letting its event loop run empty: with uWebSockets.js 20.30 a thread that
 * exits or is terminated while the app holds its loop aborts the whole process. So a thread stops
 * the way the gateway shuts down (its exchanges end with their family's failure and their
 * records), closes its port to the primary, and leaves; the primary replaces it.
 */
let stopping: Promise<void> | undefined;
const stop = (drainMs?: number) =>
  (stopping ??= gateway
    .shutdown(drainMs)
    .catch((err) => log.error({ err }, 'worker thread shutdown failed'))
    .finally(() => {
      // After every settle it sent: the primary frees what is left only once it has them all.
      void limiter?.close();
      parent.close();
    }));

const crashed = (err: unknown) => {
  log.fatal({ err }, 'worker thread failed: it stops now and the primary replaces it');
  void stop(0);
};
process.on('uncaughtException', crashed);
process.on('unhandledRejection', crashed);

parent.on('message', async (message: PrimaryMessage) => {
  if (message.type === 'reload') tell({ type: 'reload-outcome', id: message.id, outcome: await gateway.reload(message.via) });
  else if (message.type === 'shutdown') void stop();
  else if (message.type === 'ask') {
    const answered = (value: unknown) => tell({ type: 'answer', id: message.id, value });
    gateway.answer!(message.topic).then(answered, (err) => {
      log.error({ err, topic: message.topic }, 'answering a gather failed');
      answered(undefined);
    });
  } else if (message.type === 'gathered') {
    gathering.get(message.id)?.(message.values);
    gathering.delete(message.id);
  }
  else if (message.type === 'crash') setImmediate(() => {
    throw new Error('crash drill: an uncaught error in a worker thread');
  });
});
if (replacement) await gateway.reload('replacement thread');
tell({ type: 'listening', port: gateway.port, families: gateway.families });
