/**
 * The built-in simulator as an upstream kind: answers in process, without sockets, by playing the
 * reply script into the response sink with the script's timing. A stream's steps are made as the
 * sink takes them (bounded, and none while it is paused), so a client that reads nothing holds
 * little more than the plan, as a real upstream behind a socket would. Also exports the router
 * and the script player, which the standalone server (server.ts) shares.
 */
import { definePlugin, GatewayError, type ResponseSink, type Upstream, type UpstreamCall, type UpstreamRequest } from '../../../src/plugin-api.js';
import { DEFAULT_MODELS, routeChat, type ChatOptions } from './chat.js';
import { DEFAULT_GEMINI_MODELS, geminiNotFound, routeGemini } from './gemini.js';
import { DEFAULT_MESSAGES_MODELS, messagesNotFound, routeMessages } from './messages.js';
import { PromptCache } from './engine.js';
import { notFound, type ReplyStep, type SimReply } from './reply.js';
import { routeResponses } from './responses.js';

/** The wire families the simulator speaks. Whichever it is told, it serves every family's endpoints. */
export type SimulatorFamily = 'chat' | 'responses' | 'gemini' | 'messages';

export interface SimulatorRoutes extends ChatOptions {
  /** Ids the Gemini `GET /models` lists and `GET /models/{id}` finds; DEFAULT_GEMINI_MODELS when absent. */
  geminiModels?: string[];
  /** Ids the Anthropic `GET /models` lists and `GET /models/{id}` finds; DEFAULT_MESSAGES_MODELS when absent. */
  messagesModels?: string[];
  /**
   * Which API answers the listing routes, `GET /models` and `GET /models/{id}`: 'openai' (the
   * default), 'gemini' or 'anthropic'. Generation routes of every family are served either way.
   */
  listing?: 'openai' | 'gemini' | 'anthropic';
  /** The upstream's prompt cache, when it models one (`promptCache: true`): cached tokens follow what it has seen. */
  promptCache?: PromptCache;
}

/**
 * Routes a request (path relative to the API root, query string included): `POST /chat/completions`,
 * `POST /responses`, `POST /messages` (and `/messages/count_tokens`), `POST
 * /models/{model}:generateContent` (and `:streamGenerateContent`, `:countTokens`), `GET /models`
 * (and, when listing Gemini or Anthropic models, `GET /models/{id}`); undefined for any other
 * route. `headers` (lowercase names) are read by the Messages routes, for `anthropic-beta`.
 */
export function routeSimulator(
  method: string,
  path: string,
  body: Buffer | string | undefined,
  options: SimulatorRoutes,
  headers: Record<string, string> = {},
): SimReply | undefined {
  const gemini = { models: options.geminiModels ?? DEFAULT_GEMINI_MODELS };
  const anthropic = options.listing === 'anthropic' ? { models: options.messagesModels ?? DEFAULT_MESSAGES_MODELS } : undefined;
  const cache = options.promptCache;
  const messages = () => routeMessages(method, path, body, headers, anthropic, cache);
  if (options.listing === 'gemini') return routeGemini(method, path, body, gemini, cache) ?? routeChat(method, path, body, options, cache) ?? routeResponses(method, path, body, cache) ?? messages();
  if (anthropic) return messages() ?? routeChat(method, path, body, options, cache) ?? routeResponses(method, path, body, cache) ?? (method === 'POST' ? routeGemini(method, path, body, gemini, cache) : undefined);
  return (
    routeChat(method, path, body, options, cache) ??
    routeResponses(method, path, body, cache) ??
    messages() ??
    (method === 'POST' ? routeGemini(method, path, body, gemini, cache) : undefined)
  );
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

/**
 * Plays `reply` into `out` asynchronously, honouring step delays, pause/resume and abort. A
 * streamed reply's steps are made one at a time (SimReply.play), the next only once the previous
 * one is written and `out` has room: a paused or aborted call makes nothing more, and an abort or
 * the end lets go of the reply.
 */
export function playReply(reply: SimReply, out: ReplyOutput): UpstreamCall {
  return new ReplyPlayer(reply, out);
}

const NO_STEPS: Iterator<ReplyStep> = { next: () => ({ done: true, value: undefined }) };

class ReplyPlayer implements UpstreamCall {
  private readonly status: number;
  private readonly headers: Record<string, string>;
  private readonly cut: boolean;
  private steps: Iterator<ReplyStep>;
  /** The step to write next; undefined once the steps are over. */
  private pending: ReplyStep | undefined;
  private started = false;
  /** The script failed: the reply ends as cut after what was made. */
  private broken = false;
  private paused = false;
  /** The wait before the next step (or the finish) is over. */
  private due = false;
  private stopped = false;
  private cancelWait: (() => void) | undefined;

  constructor(
    reply: SimReply,
    private readonly out: ReplyOutput,
  ) {
    this.status = reply.status;
    this.headers = reply.headers;
    this.cut = reply.cut;
    this.steps = reply.play ? reply.play() : reply.steps[Symbol.iterator]();
    this.pending = this.take();
    this.wait(this.pending?.delayMs ?? 0);
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
    this.stop();
  }

  /** No more steps, timers or reply: what is left of it can be collected. */
  private stop(): void {
    this.stopped = true;
    this.cancelWait?.();
    this.cancelWait = undefined;
    this.pending = undefined;
    const steps = this.steps;
    this.steps = NO_STEPS;
    try {
      steps.return?.();
    } catch {
      // A script that fails while closing has nothing left to give back.
    }
  }

  /** The next step, made now; a script that fails ends the reply as cut (a dropped connection). */
  private take(): ReplyStep | undefined {
    try {
      const next = this.steps.next();
      return next.done ? undefined : next.value;
    } catch {
      this.broken = true;
      return undefined;
    }
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
    const step = this.pending;
    if (!step) {
      const cut = this.cut || this.broken;
      this.stop();
      this.out.finish(cut);
      return;
    }
    if (!this.started) {
      this.started = true;
      this.out.start(this.status, this.headers);
      if (this.stopped) return;
    }
    // The step after this one is made before this one is written, to know whether this is the last.
    this.pending = this.take();
    const last = !this.pending;
    if (!this.out.data(step.bytes, last && !this.cut && !this.broken)) this.paused = true;
    if (!this.stopped) this.wait(last ? 0 : this.pending!.delayMs);
  }
}

/**
 * An in-process simulator channel. Options: `family` ('chat', the default, 'responses', 'gemini' or
 * 'messages': the family the gateway is told this upstream speaks) and `models` (ids listed by
 * `GET /models`: OpenAI's list, or Google's or Anthropic's for those families, whose
 * `GET /models/{id}` and 404s are theirs too), `promptCache` (true: a prompt cache of its own, so
 * `cached` usage counts the prompt's prefix this channel has seen before, as a provider's does).
 */
export function simulatorUpstream(name: string, options: Record<string, unknown>): Upstream {
  const family = familyOption(name, options.family);
  const fallback = family === 'gemini' ? DEFAULT_GEMINI_MODELS : family === 'messages' ? DEFAULT_MESSAGES_MODELS : DEFAULT_MODELS;
  const models = modelsOption(name, options.models, fallback);
  let routes: SimulatorRoutes = { models };
  if (family === 'gemini') routes = { models: DEFAULT_MODELS, geminiModels: models, listing: 'gemini' };
  else if (family === 'messages') routes = { models: DEFAULT_MODELS, messagesModels: models, listing: 'anthropic' };
  if (promptCacheOption(name, options.promptCache)) routes.promptCache = new PromptCache();
  const missing = family === 'gemini' ? geminiNotFound : family === 'messages' ? messagesNotFound : notFound;
  return {
    name,
    family,
    send(req: UpstreamRequest, sink: ResponseSink): UpstreamCall {
      const reply = routeSimulator(req.method, req.path, req.body, routes, req.headers) ?? missing(req.method, req.path);
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
  if (value === 'chat' || value === 'responses' || value === 'gemini' || value === 'messages') return value;
  throw new Error(`upstreams.${name}.family: must be 'chat', 'responses', 'gemini' or 'messages'`);
}

function promptCacheOption(name: string, value: unknown): boolean {
  if (value === undefined || typeof value === 'boolean') return value === true;
  throw new Error(`upstreams.${name}.promptCache: must be true or false`);
}

function modelsOption(name: string, value: unknown, fallback: string[]): string[] {
  if (value === undefined) return fallback;
  if (Array.isArray(value) && value.every((m) => typeof m === 'string')) return value;
  throw new Error(`upstreams.${name}.models: must be a list of model ids`);
}

export default definePlugin((ctx) => {
  ctx.addUpstreamKind('simulator', simulatorUpstream);
  return { name: 'upstreams/simulator' };
});
