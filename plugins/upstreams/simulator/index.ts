/**
 * The built-in simulator as an upstream kind: answers in process, without sockets, by playing the
 * rendered reply script into the response sink with the script's timing. Also exports the router
 * and the script player, which the standalone server (server.ts) shares.
 */
import { definePlugin, type ResponseSink, type Upstream, type UpstreamCall, type UpstreamRequest } from '../../../src/contracts.js';
import { GatewayError } from '../../../src/errors.js';
import { DEFAULT_MODELS, routeChat, type ChatOptions } from './chat.js';
import { notFound, type SimReply } from './reply.js';
import { routeResponses } from './responses.js';

/** The wire families the simulator speaks. Either way it serves both endpoints. */
export type SimulatorFamily = 'chat' | 'responses';

/**
 * Routes a request (path relative to the API root): `POST /chat/completions`, `POST /responses`,
 * `GET /models`; undefined for any other route.
 */
export function routeSimulator(method: string, path: string, body: Buffer | string | undefined, options: ChatOptions): SimReply | undefined {
  return routeChat(method, path, body, options) ?? routeResponses(method, path, body);
}

/** Where a reply script is played. */
export interface ReplyOutput {
  /** Called right before the first step. */
  start(status: number, headers: Record<string, string>): void;
  /**
   * One step's bytes. `final` says only a clean end follows, so the output may end right away.
   * Returns false to hold further steps (and the finish) until the call's resume().
   */
  data(bytes: string, final: boolean): boolean;
  /** Once, after the last step: end cleanly, or drop the connection when the reply is cut. */
  finish(cut: boolean): void;
}

/** Plays `reply` into `out` asynchronously, honouring step delays, pause/resume and abort. */
export function playReply(reply: SimReply, out: ReplyOutput): UpstreamCall {
  return new ReplyPlayer(reply, out);
}

class ReplyPlayer implements UpstreamCall {
  private next = 0;
  private paused = false;
  /** The wait before the next step (or the finish) is over. */
  private due = false;
  private stopped = false;
  private cancelWait: (() => void) | undefined;

  constructor(
    private readonly reply: SimReply,
    private readonly out: ReplyOutput,
  ) {
    this.wait(reply.steps[0]?.delayMs ?? 0);
  }

  pause(): void {
    this.paused = true;
  }

  resume(): void {
    if (this.stopped || !this.paused) return;
    this.paused = false;
    // Deliver on a later tick, never from inside the caller's resume().
    if (this.due && !this.cancelWait) this.wait(0);
  }

  abort(): void {
    this.stopped = true;
    this.cancelWait?.();
    this.cancelWait = undefined;
  }

  private wait(ms: number): void {
    const fire = () => {
      this.cancelWait = undefined;
      this.due = true;
      this.advance();
    };
    if (ms > 0) {
      const timer = setTimeout(fire, ms);
      this.cancelWait = () => clearTimeout(timer);
    } else {
      const immediate = setImmediate(fire);
      this.cancelWait = () => clearImmediate(immediate);
    }
  }

  private advance(): void {
    if (this.stopped || this.paused || !this.due) return;
    this.due = false;
    const { steps, cut, status, headers } = this.reply;
    if (this.next === steps.length) {
      this.stopped = true;
      this.out.finish(cut);
      return;
    }
    if (this.next === 0) {
      this.out.start(status, headers);
      if (this.stopped) return;
    }
    const step = steps[this.next++];
    const last = this.next === steps.length;
    if (!this.out.data(step.bytes, last && !cut)) this.paused = true;
    if (!this.stopped) this.wait(last ? 0 : steps[this.next].delayMs);
  }
}

/**
 * An in-process simulator channel. Options: `models` (ids listed by `GET /models`) and `family`
 * ('chat', the default, or 'responses': the family the gateway is told this upstream speaks).
 */
export function simulatorUpstream(name: string, options: Record<string, unknown>): Upstream {
  const chatOptions: ChatOptions = { models: modelsOption(name, options.models) };
  return {
    name,
    family: familyOption(name, options.family),
    send(req: UpstreamRequest, sink: ResponseSink): UpstreamCall {
      const reply = routeSimulator(req.method, req.path, req.body, chatOptions) ?? notFound(req.method, req.path);
      return playReply(reply, {
        start: (status, headers) => sink.start(status, headers),
        data: (bytes) => sink.data(Buffer.from(bytes)),
        finish: (cut) => (cut ? sink.error(new GatewayError('upstream_error', 'upstream closed the stream midway')) : sink.end()),
      });
    },
  };
}

function familyOption(name: string, value: unknown): SimulatorFamily {
  if (value === undefined) return 'chat';
  if (value === 'chat' || value === 'responses') return value;
  throw new Error(`upstream ${name}: 'family' must be 'chat' or 'responses'`);
}

function modelsOption(name: string, value: unknown): string[] {
  if (value === undefined) return DEFAULT_MODELS;
  if (Array.isArray(value) && value.every((m) => typeof m === 'string')) return value;
  throw new Error(`upstream ${name}: 'models' must be a list of model ids`);
}

export default definePlugin((ctx) => {
  ctx.addUpstreamKind('simulator', simulatorUpstream);
  return { name: 'upstreams/simulator' };
});
