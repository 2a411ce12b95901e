/**
 * One in-memory limiter for every worker thread: the primary thread holds it (LimiterHost) and
 * each thread asks it over a MessagePort (RemoteLimiter). The primary decides one message at a
 * time, synchronously, so limits stay as exact as with one thread; a decision costs a thread one
 * message each way (see the scale rows of `npm run bench`). Redis replaces this when several
 * instances share the limits.
 */
import type { MessagePort } from 'node:worker_threads';
import type { Amounts, Decision, LimitScope, Limiter } from '../limiter.js';

type Request = { op: 'acquire'; id: number; scopes: LimitScope[]; ask: Amounts } | { op: 'settle'; lease: number; used: Amounts } | { op: 'bye' };
type Reply = { id: number; decision: Decision<number> } | { id: number; error: string };

/** A thread's view of the primary's limiter; leases are numbers the primary maps to its own. */
export class RemoteLimiter implements Limiter<number> {
  private nextId = 1;
  private readonly waiting = new Map<number, { resolve(d: Decision<number>): void; reject(e: Error): void }>();

  constructor(private readonly port: MessagePort) {
    port.on('message', (reply: Reply) => {
      const waiter = this.waiting.get(reply.id);
      this.waiting.delete(reply.id);
      if ('error' in reply) waiter?.reject(new Error(`limiter: ${reply.error}`));
      else waiter?.resolve(reply.decision);
    });
    // The thread's server keeps it alive; the port must not keep it from exiting.
    port.unref();
  }

  acquire(scopes: LimitScope[], ask: Amounts): Promise<Decision<number>> {
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.waiting.set(id, { resolve, reject });
      this.port.postMessage({ op: 'acquire', id, scopes, ask } satisfies Request);
    });
  }

  settle(lease: number, used: Amounts): void {
    this.port.postMessage({ op: 'settle', lease, used } satisfies Request);
  }

  /** The thread is done: every settle it will send has been sent. */
  async close(): Promise<void> {
    this.port.postMessage({ op: 'bye' } satisfies Request);
    this.port.close();
  }
}

/** How long the primary waits for a thread's last settles after it ended without saying goodbye. */
const LAST_SETTLES_MS = 1000;

export class LimiterHost {
  constructor(private readonly limiter: Limiter) {}

  /**
   * Serves one thread. Returns what to call when that thread has ended: once its last settles are
   * in (it says goodbye after them), the leases it still holds are settled as if each had used its
   * whole reservation (what it used is unknown, and a budget must not be undercounted), which frees
   * their slots. A decision that grants after that is settled at once the same way.
   */
  serve(port: MessagePort): () => Promise<void> {
    const leases = new Map<number, { lease: unknown; ask: Amounts }>();
    let nextLease = 1;
    let ended = false;
    let goodbye!: () => void;
    const saidGoodbye = new Promise<void>((resolve) => (goodbye = resolve));
    const decide = (request: Extract<Request, { op: 'acquire' }>, decision: Decision<unknown>) => {
      if (ended) {
        if (decision.granted) void this.limiter.settle(decision.lease, request.ask);
        return;
      }
      if (!decision.granted) return port.postMessage({ id: request.id, decision } satisfies Reply);
      const lease = nextLease++;
      leases.set(lease, { lease: decision.lease, ask: request.ask });
      port.postMessage({ id: request.id, decision: { ...decision, lease } } satisfies Reply);
    };
    port.on('message', (request: Request) => {
      if (request.op === 'bye') return goodbye();
      if (request.op === 'settle') {
        const held = leases.get(request.lease);
        if (!held) return;
        leases.delete(request.lease);
        void this.limiter.settle(held.lease, request.used);
        return;
      }
      try {
        // Decided here and now when the limiter can (the memory one always can, once a budget's spend is known).
        const decision = this.limiter.acquire(request.scopes, request.ask);
        if (!(decision instanceof Promise)) return decide(request, decision);
        decision.then(
          (d) => decide(request, d),
          (err: Error) => !ended && port.postMessage({ id: request.id, error: err.message } satisfies Reply),
        );
      } catch (err) {
        port.postMessage({ id: request.id, error: (err as Error).message } satisfies Reply);
      }
    });
    return async () => {
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([saidGoodbye, new Promise<void>((resolve) => (timer = setTimeout(resolve, LAST_SETTLES_MS)))]);
      clearTimeout(timer);
      ended = true;
      port.close();
      for (const { lease, ask } of leases.values()) void this.limiter.settle(lease, ask);
      leases.clear();
    };
  }
}
