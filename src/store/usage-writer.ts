/**
 * The thread that writes usage batches to the SQLite file (sqlite-writer.ts is its entry), as the
 * store that starts it sees it: the batches sent and awaiting their answer, and the thread's
 * scheduling.
 *
 * **Background priority.** The thread runs under SCHED_IDLE: it gets a core only when nothing else
 * wants one. Its work is about 4 µs of CPU per record, in bursts of a few milliseconds per batch.
 * At normal priority each burst kept a core busy at moments when the clients and the upstream were
 * being woken, so the kernel woke them on the serving thread's core instead, and they preempted it:
 * with the inserts the serving thread was preempted 14,000–20,000 times in 6 s at saturation, 3,000–
 * 9,500 without them, and it ran 4.7–5.0 s of the 6 instead of 5.6. A core that runs only an idle
 * thread counts as idle when the kernel picks where to wake a task, so under SCHED_IDLE they go
 * there. `nice 19` does not do that (it lowers the share, not the placement) and measured no gain.
 *
 * Node has no call for a thread's scheduling policy, so util-linux's `chrt` sets it, for the
 * thread id the thread reads from /proc/thread-self: a fixed program and arguments, no shell, once
 * per thread. Without `chrt`, or off Linux, the thread stays at normal priority, and that is logged.
 *
 * **Starvation.** An idle thread gets next to nothing while every core is busy (weight 3 against
 * 1,024 for a normal one), and usage would wait in the journal until the load fell, holding up
 * every read of it. While a batch is out, the thread's time spent ready to run but not running is
 * read from /proc (`schedstat`); past STARVED_WAIT_MS the thread is replaced by one at normal
 * priority (only a privileged thread may raise its own priority back) and the batches out are sent
 * to it. A record written twice is skipped by the store (request ids are unique). The replacement
 * lowers itself again once it has run NORMAL_SPELL_MS at normal priority.
 */
import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { Worker } from 'node:worker_threads';
import type { Logger } from 'pino';

/** A batch for the thread as JSON texts, and what it says back; defined here, the side that starts it. */
export type WriterRequest = { id: number; lines: readonly string[] };
/** A batch's answer, or (first, once) the thread's own id for the kernel, null where there is none to read. */
export type WriterReply = { id: number; error?: string } | { tid: number | null };

/** Time ready to run but not running, while one batch is out, that makes an idle thread starved. Its batches take 2–20 ms. */
const STARVED_WAIT_MS = 1000;
/** How often a batch that is out is looked at. */
const CHECK_MS = 250;
/** How long a replacement waits for the write lock (the starved thread's, until it has ended). */
const REPLACEMENT_BUSY_TIMEOUT_MS = 60_000;
/** How long a replacement runs at normal priority before it lowers itself. */
const NORMAL_SPELL_MS = 30_000;

export interface UsageWriterOptions {
  busyTimeoutMs?: number;
  /** Where its notices go (it could not run at idle priority, it starved). */
  log?: Logger;
}

interface Batch {
  lines: readonly string[];
  resolve(): void;
  reject(err: Error): void;
}

/** One thread: its kernel id once it has said it, and its scheduling. */
interface Running {
  worker: Worker;
  tid: number | undefined;
  /** Moved to SCHED_IDLE (only then is it watched for starvation). */
  idle: boolean;
  /** Set on a replacement: when it started at normal priority. */
  normalSince: number | undefined;
  /** The oldest batch out when the watch first saw it, and the thread's wait time (ns, from schedstat) then. */
  watched: { id: number; waitNs: number } | undefined;
}

export class UsageWriter {
  private running: Running | undefined;
  private nextId = 1;
  private readonly waiting = new Map<number, Batch>();
  private watch: NodeJS.Timeout | undefined;
  /** Said once: the thread could not be made idle. */
  private toldNormal = false;

  constructor(
    private readonly file: string,
    private readonly options: UsageWriterOptions,
  ) {}

  /** `lines`: the batch's records as JSON texts, strings to copy rather than objects to clone field by field. */
  write(lines: readonly string[]): Promise<void> {
    const running = (this.running ??= this.start(undefined));
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.waiting.set(id, { lines, resolve, reject });
      // Held while a batch is under way, so a flush at shutdown completes.
      running.worker.ref();
      running.worker.postMessage({ id, lines } satisfies WriterRequest);
      this.watchStarvation();
    });
  }

  async close(): Promise<void> {
    const running = this.running;
    this.running = undefined;
    clearInterval(this.watch);
    this.watch = undefined;
    await running?.worker.terminate();
  }

  private start(normalSince: number | undefined): Running {
    // A replacement may find the write lock still held by the starved thread, which gives it up
    // only as it ends (its transaction rolled back), itself at idle priority: it waits for longer.
    const busyTimeoutMs = normalSince === undefined ? this.options.busyTimeoutMs : Math.max(this.options.busyTimeoutMs ?? 0, REPLACEMENT_BUSY_TIMEOUT_MS);
    const worker = new Worker(new URL('./sqlite-writer.js', import.meta.url), { workerData: { file: this.file, options: { busyTimeoutMs } } });
    const running: Running = { worker, tid: undefined, idle: false, normalSince, watched: undefined };
    worker.on('message', (reply: WriterReply) => {
      // A replaced thread's late answers: its batches went to its replacement.
      if (this.running !== running) return;
      if ('tid' in reply) {
        running.tid = reply.tid ?? undefined;
        if (normalSince === undefined) this.lower(running);
        return;
      }
      const batch = this.waiting.get(reply.id);
      this.waiting.delete(reply.id);
      if (reply.error === undefined) batch?.resolve();
      else batch?.reject(new Error(reply.error));
      if (this.waiting.size === 0) worker.unref();
      if (running.normalSince !== undefined && Date.now() - running.normalSince >= NORMAL_SPELL_MS) {
        running.normalSince = undefined;
        this.lower(running);
      }
    });
    // A thread that dies fails what it was given (the journal keeps those records and tries
    // again) and is started anew by the next batch.
    let failure: Error | undefined;
    // Why it died (a bad path, a lock) is what its waiters are told.
    worker.on('error', (err) => (failure = err));
    worker.once('exit', (code) => {
      if (this.running !== running) return;
      this.running = undefined;
      for (const batch of this.waiting.values()) batch.reject(failure ?? new Error(`the usage writer thread exited (${code})`));
      this.waiting.clear();
    });
    worker.unref();
    return running;
  }

  /** Moves the thread to SCHED_IDLE; where that cannot be done it stays normal, said once. */
  private lower(running: Running): void {
    const tid = running.tid;
    if (tid === undefined || waitNs(tid) === undefined) return this.stayNormal(running, 'its thread id or scheduling counters cannot be read (not Linux)');
    execFile('chrt', ['--idle', '--pid', '0', String(tid)], { timeout: 10_000 }, (err) => {
      if (err) return this.stayNormal(running, `chrt failed: ${(err as NodeJS.ErrnoException).code === 'ENOENT' ? 'not installed (util-linux)' : err.message.trim()}`);
      running.idle = true;
    });
  }

  private stayNormal(running: Running, reason: string): void {
    if (this.toldNormal || this.running !== running) return;
    this.toldNormal = true;
    this.options.log?.info({ reason }, 'usage writer thread runs at normal priority: it may take CPU from the serving thread under load');
  }

  /**
   * Looks at the oldest batch out every CHECK_MS (a read of /proc each time, not one per batch:
   * per batch it cost the serving thread 0.8% at saturation): starved when the thread has waited
   * STARVED_WAIT_MS ready to run since the watch first saw that batch.
   */
  private watchStarvation(): void {
    this.watch ??= setInterval(() => {
      const running = this.running;
      if (!running || this.waiting.size === 0) {
        clearInterval(this.watch);
        this.watch = undefined;
        return;
      }
      if (!running.idle || running.tid === undefined) return;
      const waited = waitNs(running.tid);
      if (waited === undefined) return;
      const oldest = this.waiting.keys().next().value!;
      if (running.watched?.id !== oldest) running.watched = { id: oldest, waitNs: waited };
      else if (waited - running.watched.waitNs >= STARVED_WAIT_MS * 1e6) this.replace(running, (waited - running.watched.waitNs) / 1e6);
    }, CHECK_MS).unref();
  }

  /** A starved idle thread gives way to one at normal priority, which gets the batches out. */
  private replace(starved: Running, waitedMs: number): void {
    this.options.log?.warn(
      { waitedMs: Math.round(waitedMs), batches: this.waiting.size },
      'usage writer thread starved at idle priority (every core busy): replaced by one at normal priority for a while',
    );
    const next = this.start(Date.now());
    this.running = next;
    next.worker.ref();
    for (const [id, { lines }] of this.waiting) next.worker.postMessage({ id, lines } satisfies WriterRequest);
    void starved.worker.terminate();
  }
}

/** A thread's time ready to run but not running so far (ns), from /proc; undefined where unreadable. */
function waitNs(tid: number): number | undefined {
  try {
    const waited = Number(readFileSync(`/proc/self/task/${tid}/schedstat`, 'latin1').split(' ')[1]);
    return Number.isFinite(waited) ? waited : undefined;
  } catch {
    return undefined;
  }
}
