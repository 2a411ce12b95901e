/**
 * `server.workers: N`: the primary thread starts N worker threads (thread.ts), each a whole
 * gateway listening on the same port (the kernel spreads connections between them), and serves
 * no request itself. It holds what the threads share: the in-memory limiter (limiter.ts; Redis
 * replaces it across instances), the admin credential, the first start's demo key. It also relays
 * gathers: a thread asking for every thread's answer to a topic (the metrics plugin's scrape of
 * the whole instance) gets them from the primary, which asks every thread.
 *
 * Everything else the threads share lives in the store: keys and groups (each thread's cache is
 * told of changes by the store's notifications), sessions and sign-in lockouts (shared state),
 * usage (each thread appends to its own journal and writes its own batches, so usage writes do
 * not wait on each other). A thread that fails (an uncaught error) stops like a shutdown, its
 * exchanges ending with their family's failure and their records, and is replaced with the same
 * index; the primary frees any limiter lease it still held. A thread cannot die any harder
 * without taking the process with it (see thread.ts): after a crash of the whole process, each
 * thread's journal records the exchanges it held as interrupted at the next start.
 */
import { createServer } from 'node:net';
import { MessageChannel, Worker } from 'node:worker_threads';
import type { Logger } from 'pino';
import { resolveAdminToken } from '../admin/token.js';
import type { LoadOptions } from '../config/load.js';
import type { Config } from '../config/types.js';
import { adoptJournals, createDemoKey, openStore, warnUnpricedBudgets, type Gateway } from '../boot.js';
import { MemoryLimiter } from '../limits/memory.js';
import { spendInUsage } from '../limits/limiter.js';
import type { ReloadOutcome } from '../reload.js';
import { LimiterHost } from './limiter.js';
import type { PrimaryMessage, ThreadData, ThreadMessage } from './protocol.js';

/** The replacement of a thread that keeps dying waits longer each time, up to this. */
const MAX_RESTART_DELAY_MS = 10_000;
/**
 * Each thread's young generation: 64 MB semi-spaces instead of V8's 16 MB. A gateway allocates
 * fast and briefly (every exchange's buffers and objects); with room for more of them between
 * scavenges, fewer of the short-lived ones survive one, and pauses are fewer: measured on one
 * thread, 79 scavenges instead of 140 under the same load, +15% req/s, p99 10 → 6.5 ms.
 * (`npm start` passes the same to the main thread as `--max-semi-space-size=64`.)
 */
const YOUNG_GENERATION_MB = 3 * 64;
/** A thread that served this long before dying is replaced at once. */
const STABLE_MS = 30_000;
/** A gather goes on without a thread that has not answered in this long, unless the asker says otherwise. */
const GATHER_TIMEOUT_MS = 3_000;

export async function startWorkers(config: Config, log: Logger, source: LoadOptions): Promise<Gateway> {
  await adoptJournals(config, Array.from({ length: config.server.workers }, (_, i) => `usage-w${i}.journal`), log);
  const store = await openStore(config, { owner: false, log });
  const count = config.server.workers;
  const threads: (Worker | undefined)[] = Array(count).fill(undefined);
  let closing = false;
  let replacements = 0;
  try {
    const admin = await resolveAdminToken(config.dataDir, config.adminToken, store, config.store.kind !== 'sqlite');
    const host = config.limiter.kind === 'memory' ? new LimiterHost(new MemoryLimiter(spendInUsage(store))) : undefined;
    // The threads share the port, so none of them can refuse one already taken: check it here. Port
    // 0 is chosen here too: the kernel lets no second socket join one bound to port 0.
    let port = await portFree(config.server.host, config.server.port);
    let families: string[] = [];
    /** Reloads asked of one thread, answered by its outcome (or a refusal if it dies first). */
    const pendingReloads = new Map<number, { thread: Worker; resolve(outcome: ReloadOutcome): void }>();
    let nextReload = 1;
    /** Gathers under way: the threads still to answer, and the answers so far. */
    const asks = new Map<number, { waiting: Set<Worker>; values: unknown[]; done(): void }>();
    let nextAsk = 1;

    /** Every running thread's answer to `topic` (a thread's `gather`); one that ends or stays silent is left out. */
    const gather = (topic: string, timeoutMs = GATHER_TIMEOUT_MS) =>
      new Promise<unknown[]>((resolve) => {
        const id = nextAsk++;
        const waiting = new Set(threads.filter((t): t is Worker => t !== undefined));
        const values: unknown[] = [];
        const done = () => {
          clearTimeout(timer);
          asks.delete(id);
          resolve(values);
        };
        const timer = setTimeout(() => {
          log.warn({ topic, silent: waiting.size, timeoutMs }, 'a gather went on without the threads that had not answered in time');
          done();
        }, timeoutMs).unref();
        asks.set(id, { waiting, values, done });
        if (waiting.size === 0) return done();
        for (const thread of waiting) thread.postMessage({ type: 'ask', id, topic } satisfies PrimaryMessage);
      });

    /**
     * Starts thread `index`. A replacement (`failures` counts the quick deaths before it) re-reads
     * the config file, so it serves what the others have reloaded, and is retried with a growing
     * delay when it cannot start (the store unreachable, say) instead of leaving the pool smaller.
     */
    const spawn = (index: number, replacement: boolean, failures = 0): Promise<void> => {
      const channel = host && new MessageChannel();
      const data: ThreadData = { config, source, index, port, admin, replacement, ...(channel && { limiterPort: channel.port2 }) };
      const worker = new Worker(new URL('./thread.js', import.meta.url), { workerData: data, transferList: channel ? [channel.port2] : [], resourceLimits: { maxYoungGenerationSizeMb: YOUNG_GENERATION_MB } });
      const release = host && channel ? host.serve(channel.port1) : async () => {};
      threads[index] = worker;
      const started = Date.now();
      return new Promise<void>((resolve, reject) => {
        let listening = false;
        worker.on('message', (message: ThreadMessage) => {
          if (message.type === 'listening') {
            listening = true;
            families = message.families;
            resolve();
          } else if (message.type === 'reloaded') {
            // One thread reloaded through the admin API: the others read the same file.
            for (const other of threads) if (other && other !== worker) other.postMessage({ type: 'reload', id: 0, via: message.via } satisfies PrimaryMessage);
          } else if (message.type === 'reload-outcome') {
            pendingReloads.get(message.id)?.resolve(message.outcome as ReloadOutcome);
            pendingReloads.delete(message.id);
          } else if (message.type === 'gather') {
            void gather(message.topic, message.timeoutMs).then((values) => worker.postMessage({ type: 'gathered', id: message.id, values } satisfies PrimaryMessage));
          } else if (message.type === 'answer') {
            const ask = asks.get(message.id);
            if (!ask?.waiting.delete(worker)) return;
            if (message.value !== undefined) ask.values.push(message.value);
            if (ask.waiting.size === 0) ask.done();
          }
        });
        worker.on('error', (err) => {
          if (!listening) reject(err);
          else log.error({ err, worker: index }, 'worker thread failed');
        });
        worker.on('exit', async (code) => {
          if (threads[index] === worker) threads[index] = undefined;
          for (const ask of asks.values()) if (ask.waiting.delete(worker) && ask.waiting.size === 0) ask.done();
          for (const [id, pending] of pendingReloads) {
            if (pending.thread !== worker) continue;
            pendingReloads.delete(id);
            pending.resolve({ applied: false, reasons: ['the worker thread reloading the config ended first'] });
          }
          await release();
          if (!listening && !replacement) return reject(new Error(`worker thread ${index} exited (${code}) before listening`));
          if (closing) return;
          const stable = listening && Date.now() - started >= STABLE_MS;
          const delay = stable ? 0 : Math.min(MAX_RESTART_DELAY_MS, 250 * 2 ** failures);
          log.error({ worker: index, code, delayMs: delay }, listening ? 'worker thread ended: replacing it' : 'a replacement worker thread could not start: trying again');
          setTimeout(() => {
            if (closing) return;
            replacements++;
            spawn(index, true, stable ? 0 : failures + 1).catch((err) => log.error({ err, worker: index }, 'replacing a worker thread failed'));
          }, delay).unref();
        });
      });
    };

    await Promise.all(Array.from({ length: count }, (_, i) => spawn(i, false)));
    const firstStart = await createDemoKey(store, families);
    await warnUnpricedBudgets(store, config.models, log);
    log.info({ workers: count, port }, 'worker threads listening');

    const broadcast = (message: PrimaryMessage) => threads.forEach((t) => t?.postMessage(message));
    let shutdown: Promise<void> | undefined;
    return {
      port,
      store,
      adminToken: admin.token,
      admin,
      families,
      firstStart,
      workers: {
        size: count,
        get replacements() {
          return replacements;
        },
        crash(index) {
          threads[index]?.postMessage({ type: 'crash' } satisfies PrimaryMessage);
        },
      },
      async reload(via) {
        const [first, ...others] = threads.filter((t): t is Worker => t !== undefined);
        if (!first) return { applied: false, reasons: ['no worker thread is running'] };
        const id = nextReload++;
        const outcome = new Promise<ReloadOutcome>((resolve) => pendingReloads.set(id, { thread: first, resolve }));
        first.postMessage({ type: 'reload', id, via } satisfies PrimaryMessage);
        for (const other of others) other.postMessage({ type: 'reload', id: 0, via } satisfies PrimaryMessage);
        const result = await outcome;
        if (result.applied) {
          await store.recordAudit({ time: Date.now(), actor: `signal:${via}`, action: 'config.reload', target: null, detail: JSON.stringify(result.changes) }).catch((err) => log.error({ err }, 'auditing a reload failed'));
        }
        return result;
      },
      shutdown: () =>
        (shutdown ??= (async () => {
          closing = true;
          const exited = threads.filter(Boolean).map((t) => new Promise((resolve) => t!.once('exit', resolve)));
          broadcast({ type: 'shutdown' });
          // Each thread drains within the shutdown timeout and then ends by itself (see thread.ts).
          await Promise.all(exited);
          await store.close();
        })()),
    };
  } catch (err) {
    closing = true;
    const running = threads.filter((t): t is Worker => t !== undefined);
    await Promise.all(running.map((t) => new Promise((resolve) => (t.once('exit', resolve), t.postMessage({ type: 'shutdown' } satisfies PrimaryMessage)))));
    await store.close();
    throw err;
  }
}

/** `port` (a free one when 0) once nothing listens on it; fails the way a single-threaded start would otherwise. */
function portFree(host: string, port: number): Promise<number> {
  return new Promise((resolve, reject) => {
    const probe = createServer();
    probe.once('error', (err: NodeJS.ErrnoException) =>
      reject(new Error(`cannot listen on ${host}:${port}: ${err.code === 'EADDRINUSE' ? 'the address is already in use (is another Sluice running?)' : err.message}`)),
    );
    probe.listen({ host, port, exclusive: true }, () => {
      const chosen = (probe.address() as { port: number }).port;
      probe.close(() => resolve(chosen));
    });
  });
}
