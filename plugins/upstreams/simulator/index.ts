/**
 * The built-in simulator as an upstream kind: answers in process, without sockets, by playing the
 * rendered reply script into the response sink with the script's timing. Also exports the router
 * and the script player, which the standalone server (server.ts) shares.
 */
import { definePlugin, type ResponseSink, type Upstream, type UpstreamCall, type UpstreamRequest } from '../../../src/contracts.js';
import { GatewayError } from '../../../src/errors.js';
import { DEFAULT_MODELS, routeChat, type ChatOptions } from './chat.js';
import { DEFAULT_GEMINI_MODELS, geminiNotFound, routeGemini } from './gemini.js';
import { DEFAULT_MESSAGES_MODELS, messagesNotFound, routeMessages } from './messages.js';
import { notFound, type SimReply } from './reply.js';
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
  const messages = () => routeMessages(method, path, body, headers, anthropic);
  if (options.listing === 'gemini') return routeGemini(method, path, body, gemini) ?? routeChat(method, path, body, options) ?? routeResponses(method, path, body) ?? messages();
  if (anthropic) return messages() ?? routeChat(method, path, body, options) ?? routeResponses(method, path, body) ?? (method === 'POST' ? routeGemini(method, path, body, gemini) : undefined);
  return (
    routeChat(method, path, body, options) ??
    routeResponses(method, path, body) ??
    messages() ??
    (method === 'POST' ? routeGemini(method, path, body, gemini) : undefined)
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
 * An in-process simulator channel. Options: `family` ('chat', the default, 'responses', 'gemini' or
 * 'messages': the family the gateway is told this upstream speaks) and `models` (ids listed by
 * `GET /models`: OpenAI's list, or Google's or Anthropic's for those families, whose
 * `GET /models/{id}` and 404s are theirs too).
 */
export function simulatorUpstream(name: string, options: Record<string, unknown>): Upstream {
  const family = familyOption(name, options.family);
  const fallback = family === 'gemini' ? DEFAULT_GEMINI_MODELS : family === 'messages' ? DEFAULT_MESSAGES_MODELS : DEFAULT_MODELS;
  const models = modelsOption(name, options.models, fallback);
  let routes: SimulatorRoutes = { models };
  if (family === 'gemini') routes = { models: DEFAULT_MODELS, geminiModels: models, listing: 'gemini' };
  else if (family === 'messages') routes = { models: DEFAULT_MODELS, messagesModels: models, listing: 'anthropic' };
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
  throw new Error(`upstream ${name}: 'family' must be 'chat', 'responses', 'gemini' or 'messages'`);
}

function modelsOption(name: string, value: unknown, fallback: string[]): string[] {
  if (value === undefined) return fallback;
  if (Array.isArray(value) && value.every((m) => typeof m === 'string')) return value;
  throw new Error(`upstream ${name}: 'models' must be a list of model ids`);
}

export default definePlugin((ctx) => {
  ctx.addUpstreamKind('simulator', simulatorUpstream);
  return { name: 'upstreams/simulator' };
});
