/**
 * One in-memory limiter for every worker thread: the primary thread holds it (LimiterHost) and
 * each thread asks it over a MessagePort (RemoteLimiter). The primary decides one message at a
 * time, synchronously, so limits stay as exact as with one thread; a decision costs a thread one
 * message each way (see the scale rows of `npm run bench`). Redis replaces this when several
 * instances share the limits. The same ports carry channel cool-downs (an upstream's 429 with
 * Retry-After): a thread tells the primary, which tells every other thread and, later, any
 * replacement thread.
 */
import type { MessagePort } from 'node:worker_threads';
import type { Amounts, CoolDownBus, Decision, LimitScope, Limiter } from '../limits/limiter.js';

/** `cool`: a channel cool-down, from a thread to the primary and from the primary to the other threads. */
type CoolDown = { op: 'cool'; key: string; ms: number };
type Request = { op: 'acquire'; id: number; scopes: LimitScope[]; ask: Amounts } | { op: 'settle'; lease: number; used: Amounts } | { op: 'bye' } | CoolDown;
type Reply = { id: number; decision: Decision<number> } | { id: number; error: string } | CoolDown;

/** A thread's view of the primary's limiter; leases are numbers the primary maps to its own. */
export class RemoteLimiter implements Limiter<number> {
  private nextId = 1;
  private readonly waiting = new Map<number, { resolve(d: Decision<number>): void; reject(e: Error): void }>();
  private heard: ((key: string, ms: number) => void) | undefined;
  /** Cool-downs told before anyone subscribed (the primary's catch-up arrives at once): handed over on subscribe. */
  private early: (CoolDown & { at: number })[] = [];

  /** Channel cool-downs go through the primary to every other thread. */
  readonly coolDowns: CoolDownBus = {
    publish: (key, ms) => this.port.postMessage({ op: 'cool', key, ms } satisfies Request),
    subscribe: (heard) => {
      this.heard = heard;
      const now = Date.now();
      for (const c of this.early) if (c.at + c.ms > now) heard(c.key, c.at + c.ms - now);
      this.early = [];
    },
  };

  constructor(private readonly port: MessagePort) {
    port.on('message', (reply: Reply) => {
      if ('op' in reply) return this.heard ? this.heard(reply.key, reply.ms) : void this.early.push({ ...reply, at: Date.now() });
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
  /** Every thread's port, to pass a cool-down one thread heard of to the others. */
  private readonly ports = new Set<MessagePort>();
  /** Channel cool-downs under way (key → when it ends): a thread started later (a replacement) is told them. */
  private readonly cooling = new Map<string, number>();

  constructor(private readonly limiter: Limiter) {}

  private coolDown(from: MessagePort, key: string, ms: number): void {
    const now = Date.now();
    for (const [k, until] of this.cooling) if (until <= now) this.cooling.delete(k);
    this.cooling.set(key, Math.max(this.cooling.get(key) ?? 0, now + ms));
    for (const port of this.ports) if (port !== from) port.postMessage({ op: 'cool', key, ms } satisfies Reply);
  }

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
    this.ports.add(port);
    const now = Date.now();
    for (const [key, until] of this.cooling) if (until > now) port.postMessage({ op: 'cool', key, ms: until - now } satisfies Reply);
    port.on('message', (request: Request) => {
      if (request.op === 'bye') return goodbye();
      if (request.op === 'cool') return this.coolDown(port, request.key, request.ms);
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
      this.ports.delete(port);
      port.close();
      for (const { lease, ask } of leases.values()) void this.limiter.settle(lease, ask);
      leases.clear();
    };
  }
}
