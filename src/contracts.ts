/**
 * The contracts between the core and its plugins. Everything with a name (a wire family, a
 * provider, a policy) lives in plugins/ and reaches the core only through these types.
 */
import type { Logger } from 'pino';
import type { GatewayError } from './errors.js';
import type { Exchange } from './exchange.js';
import type { Config, ModelConfig } from './config.js';
import type { Store } from './store/store.js';

/** Token usage in family-neutral terms. Output tokens include reasoning tokens. */
export interface Usage {
  inputTokens: number;
  outputTokens: number;
  cachedTokens?: number;
  reasoningTokens?: number;
  /** True when counted locally with a tokenizer because the upstream never reported it. */
  estimated?: boolean;
}

/** What a phase may return: nothing to continue, or an error that becomes a local reply. */
export type PhaseResult = void | GatewayError | Promise<void | GatewayError>;

export interface Plugin {
  name: string;
  /** Headers only: who is calling. */
  request?(ex: Exchange): PhaseResult;
  /** Model listing: narrow ex.catalog to what the caller may see. */
  catalog?(ex: Exchange): PhaseResult;
  /** The body is parsed and the model known: may this call go ahead? */
  admit?(ex: Exchange): PhaseResult;
  /** Pick or override the upstream channel (ex.upstream is preset from the model config). */
  route?(ex: Exchange): PhaseResult;
  /** Once per upstream SSE frame, synchronously: keep it cheap. */
  frame?(ex: Exchange, frame: Buffer): void;
  /** Exactly once per exchange, after success, error or abort. */
  done?(ex: Exchange): void;
  /** Graceful shutdown: flush whatever is buffered. */
  close?(): void | Promise<void>;
}

/** An HTTP route a codec serves. */
export interface Endpoint {
  method: 'get' | 'post';
  /** uWS pattern, e.g. `/v1/chat/completions` or `/v1beta/models/:target`. */
  path: string;
  kind: 'generate' | 'models';
}

/** A request ready to send upstream. The path is relative to the upstream's base URL. */
export interface UpstreamRequest {
  method: 'GET' | 'POST';
  path: string;
  headers: Record<string, string>;
  body?: Buffer | string;
  /** Whether the response will be an event stream. */
  stream: boolean;
  /** The upstream-side model name, for upstreams that route on it outside the body. */
  model: string;
}

/**
 * Receives an upstream response. Modelled on undici's dispatch handlers: start once, data per
 * chunk (return false to ask for a pause until `resume()`), then exactly one of end or error.
 */
export interface ResponseSink {
  start(status: number, headers: Record<string, string | string[] | undefined>): void;
  data(chunk: Buffer): boolean;
  end(): void;
  error(err: GatewayError): void;
}

export interface UpstreamCall {
  pause(): void;
  resume(): void;
  abort(): void;
}

export interface Upstream {
  /** The channel name from config. */
  readonly name: string;
  /** The wire family this upstream speaks. */
  readonly family: string;
  send(req: UpstreamRequest, sink: ResponseSink): UpstreamCall;
  close?(): Promise<void>;
}

export type UpstreamFactory = (name: string, options: Record<string, unknown>, ctx: BootContext) => Upstream;

/** Per-stream state a codec keeps while relaying an upstream stream of its own family. */
export interface PassthroughStream {
  /** Called per SSE frame; returns false to drop the frame before it reaches the client. */
  frame(frame: Buffer): boolean;
  /** Usage seen so far, if any. */
  usage(): Usage | undefined;
}

/** A wire family: how its clients authenticate, what they send and what they expect back. */
export interface Codec {
  readonly family: string;
  readonly endpoints: Endpoint[];
  /** The caller's credential, or undefined when none was sent. */
  credential(ex: Exchange): string | undefined;
  /** Parse and validate ex.body: sets ex.request, ex.modelId and ex.stream. Throws GatewayError. */
  decode(ex: Exchange): void;
  /** Apply the model's limits and features, then build the upstream request. Throws GatewayError. */
  prepare(ex: Exchange, upstream: Upstream): UpstreamRequest;
  /** Relay state for a same-family upstream stream. */
  passthroughStream(ex: Exchange): PassthroughStream;
  /** Usage from a complete same-family upstream body. */
  bodyUsage(body: Buffer): Usage | undefined;
  /** Text of the delivered output, for a tokenizer estimate when the upstream never said. */
  deliveredText(frames: Buffer[]): string;
  /** Text of the prompt, for a tokenizer estimate. */
  promptText(ex: Exchange): string;
  /** The model list in this family's shape. */
  modelList(models: ModelConfig[]): unknown;
  /** Error body in this family's shape. */
  errorBody(err: GatewayError): string;
  /** The family's stream-failure frame, written when a stream fails after it started. */
  streamErrorFrame(err: GatewayError): string;
  /** Extra response headers for an event stream. */
  readonly streamContentType: string;
}

export interface BootContext {
  config: Config;
  store: Store;
  log: Logger;
  /** This plugin's own options from config (`plugins[].options`). */
  options: Record<string, unknown>;
  addCodec(codec: Codec): void;
  addUpstreamKind(kind: string, factory: UpstreamFactory): void;
}

/** A plugin module's default export. */
export type PluginFactory = (ctx: BootContext) => Plugin | Promise<Plugin>;

export function definePlugin(factory: PluginFactory): PluginFactory {
  return factory;
}
