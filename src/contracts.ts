/**
 * The contracts between the core and its plugins. Everything with a name (a wire family, a
 * provider, a policy) lives in plugins/ and reaches the core only through these types.
 */
import type { Logger } from 'pino';
import type { GatewayError } from './errors.js';
import type { SparseScan } from './sse.js';
import { StateKey } from './state-key.js';
import type { ChannelConfig, Config, FamilyMode, ModelConfig } from './config/types.js';
import type { CachedStore } from './store/cache.js';
import type { ApiKey, Group } from './store/store.js';
import type { Limiter, RateLimitWindows } from './limits/limiter.js';
import type * as canonical from './canonical.js';
import type { TraceContext } from './trace.js';
import type { ToolNameRule } from './tool-names.js';
import type { Usage } from './usage.js';

/**
 * A complete answer a plugin gives in place of an upstream's (a response cache hit), returned from
 * the admit or route phase: the phase stops there, no later plugin of it runs, no upstream is
 * called, and the client's family writes the answer as it would a translated one (a stream
 * request gets it as a stream). The exchange records `answeredBy`, and it costs nothing.
 */
export class LocalAnswer {
  constructor(
    readonly answer: canonical.Response,
    /** Who answered (the plugin's name), for the usage record and the logs. */
    readonly by: string,
  ) {}
}

/** What a phase may return: nothing to continue, an error that becomes a local reply, or (admit, route) an answer. */
export type PhaseResult = void | GatewayError | LocalAnswer | Promise<void | GatewayError | LocalAnswer>;

/**
 * How an exchange ended: `aborted` (the client went away), `client_stalled` (the client stopped
 * reading and was cut), `shutdown` (the gateway stopped before the exchange could finish).
 */
export type Outcome = 'finished' | 'aborted' | 'error' | 'client_stalled' | 'shutdown';

/**
 * How far an exchange got; docs/architecture.md draws the transitions. Done is not a stage but the
 * end of all of them: the stage an exchange ended in stays readable in the done phase.
 */
export type Stage = 'accepted' | 'headers' | 'body' | 'decoded' | 'admitted' | 'routed' | 'upstream' | 'streaming';

/** The caller, as established by the auth plugin. */
export interface Principal {
  keyId: string;
  keyName: string | null;
  group: Group;
  key: ApiKey;
}

/**
 * An exchange as plugins see it (the plugin API's `Exchange`): its facts, its state bag and its
 * response headers to write; how far it got and how it ended only to read, and no `cancel`: the
 * pipeline alone ends an exchange (a plugin refuses one by returning a GatewayError). The core's
 * Exchange (src/exchange.ts) implements it; written out here, not derived from that class, so the
 * contracts import nothing of the core, and exchange.ts checks that it shows every public member.
 */
export interface ExchangeView {
  readonly id: string;
  /** process.hrtime.bigint() at arrival. */
  readonly startedAt: bigint;
  /** Date.now() at arrival. */
  readonly createdAt: number;
  /** The family the client speaks (chosen by the endpoint it called). */
  readonly clientFamily: ClientFamily;
  /** The client family's name. */
  readonly family: string;
  readonly endpoint: Endpoint;
  readonly method: string;
  readonly path: string;
  readonly query: string;
  /** Copied when the request arrives (uWS frees its request object afterwards). */
  readonly headers: Record<string, string>;
  /** The route's parameters, in the order of the endpoint's pattern. */
  readonly params: string[];
  /** The W3C trace this exchange belongs to (src/trace.ts): the client's `traceparent`, or a new trace. */
  readonly trace: TraceContext;

  body: Buffer;
  /** The parsed client request, in the family's own shape: the family that decoded it reads it with its own type. */
  request: unknown;
  modelId: string;
  model: ModelConfig | undefined;
  stream: boolean;
  principal: Principal | undefined;
  /** Models the caller may see, for listing endpoints. */
  catalog: ModelConfig[];
  /** Extra headers for the client's response (the limits' `x-ratelimit-*`), set before it starts. */
  responseHeaders: Record<string, string> | undefined;

  // What only the pipeline writes: how far the exchange got, and how it ended.
  readonly stage: Stage;
  readonly upstream: Upstream | undefined;
  /** The model's channel of the upstream call under way (or the last one made). */
  readonly channel: ChannelConfig | undefined;
  /** Upstream calls made so far: more than one after a failover. */
  readonly attempts: number;
  /** Each upstream call, in order, with its timing and how it ended (the tracing plugin's client spans). */
  readonly calls: readonly Readonly<UpstreamCallRecord>[];
  readonly status: number;
  /** Milliseconds from arrival to the first response byte written. */
  readonly ttfbMs: number | undefined;
  readonly usage: Usage | undefined;
  /**
   * Why the model stopped, in canonical terms (`stop`, `length`, `tool_calls`, `content_filter`),
   * one per answer choice, once the answer said; undefined before, or when it never did (a
   * failure, a stream cut short). Worked out when first read: only some plugins ask. For a
   * relayed (same-family) answer it is known only with a plugin that records upstream calls
   * (Plugin.callSpan, the tracing plugin) or one that kept the answer (keepAnswer).
   */
  readonly finishReasons: readonly canonical.FinishReason[] | undefined;
  /** What `usage` cost at the model's prices, set before the done phase; undefined without prices. */
  readonly cost: number | undefined;
  readonly outcome: Outcome;
  /** The status the usage records and metrics report: a client that left before any answer is a 499. */
  readonly reportedStatus: number;
  readonly error: GatewayError | undefined;
  /** Set when the client went away; nothing may be written after that. */
  readonly aborted: boolean;
  /** Set when the done phase starts: nothing more may happen to this exchange. */
  readonly over: boolean;
  /** The plugin that answered in place of an upstream (a LocalAnswer), if one did. */
  readonly answeredBy: string | undefined;
  /**
   * The complete answer in canonical form, after a successful upstream answer, when `keepAnswer`
   * was called before the upstream call; undefined otherwise, when it could not be read, or when a
   * stream ended without saying why it stopped (cut short).
   */
  readonly answer: canonical.Response | undefined;

  /** Milliseconds since arrival. */
  elapsedMs(): number;
  queryParam(name: string): string | undefined;
  get<T>(key: StateKey<T>): T | undefined;
  set<T>(key: StateKey<T>, value: T): void;
  /** Registers what to stop if the exchange is cut short; runs at once if it already was. */
  onCancel(cancel: () => void): void;
  /**
   * Asks for `answer` (the response cache stores it): the relay reads the upstream's answer into
   * canonical form as it goes, which a same-family passthrough otherwise never does. Costs a
   * parse of every frame: call it only for exchanges that need it, before the route phase ends.
   * An answer whose text, reasoning and tool arguments grow past `maxChars` is let go as it grows.
   */
  keepAnswer(maxChars: number): void;
}

/** One upstream call of an exchange. */
export interface UpstreamCallRecord {
  /** The channel's upstream and the model as that upstream knows it. */
  upstream: string;
  upstreamModel: string;
  startedAt: number;
  /** When its answer ended, it failed, or the exchange was cut short; undefined while under way. */
  endedAt: number | undefined;
  /** Why it failed; undefined when it answered. */
  error: string | undefined;
  /**
   * The span its `traceparent` named as parent: a tracing plugin's own span for this call
   * (Plugin.callSpan), else undefined, and the exchange's span was named.
   */
  spanId: string | undefined;
  /** `performance.now()` when it was sent. */
  sentMark: number;
  /**
   * How long the exchange waited on it: from sending to its answer (a stream's start, a whole
   * body) or its failure; undefined while that is still under way.
   */
  waitMs: number | undefined;
}

/** What the model rules (src/model-rules.ts) did to a request, as a family's `prepare` gets it. */
export interface RuleOutcome {
  /**
   * The output ceiling Sluice set: because the client set none, or (`overMax: clamp`) in place of
   * one above the model's max. Passthrough writes it into the client's body.
   */
  defaultOutputTokens?: number;
  /** Server-side tools removed from the request. */
  droppedTools: canonical.ServerTool[];
  /** Client parameter paths removed from the request. */
  droppedParams: string[];
}

export interface Plugin {
  name: string;
  /**
   * Its request phase identifies every caller (sets `ex.principal`) or refuses the call. The
   * gateway refuses to serve model routes without such a plugin unless the config says
   * `allowAnonymous: true`.
   */
  authenticates?: boolean;
  /** Headers only: who is calling. */
  request?(ex: ExchangeView): PhaseResult;
  /** Model listing: narrow ex.catalog to what the caller may see. */
  catalog?(ex: ExchangeView): PhaseResult;
  /** The body is parsed and the model known: may this call go ahead? */
  admit?(ex: ExchangeView): PhaseResult;
  /** Just before the upstream call: may refuse it. The model's channels choose the upstream (src/channels/). */
  route?(ex: ExchangeView): PhaseResult;
  /** Once per upstream SSE frame, synchronously: keep it cheap. The bytes may be edited in place later (ClientStream.edit): copy what is kept. */
  frame?(ex: ExchangeView, frame: Buffer): void;
  /** Exactly once per exchange, after success, error or abort. */
  done?(ex: ExchangeView): void;
  /**
   * For a plugin that records traces (the tracing plugin): the span id it will record for the
   * upstream call about to be sent (the last of `ex.calls`), or undefined when it records none for
   * this exchange. The call's `traceparent` then names that span as its parent, with the sampled
   * flag set, since the trace is being recorded; the record keeps the id (UpstreamCallRecord.spanId).
   * Called synchronously just before each call: keep it cheap. The first plugin that has it is asked.
   */
  callSpan?(ex: ExchangeView): string | undefined;
  /** Graceful shutdown: flush whatever is buffered. */
  close?(): void | Promise<void>;
}

/** An HTTP route a client family serves. */
export interface Endpoint {
  method: 'get' | 'post' | 'head';
  /** uWS pattern, e.g. `/v1/chat/completions` or `/v1beta/models/:target`. */
  path: string;
  /**
   * `socket`: a WebSocket channel whose messages each run as one generate exchange. `count`: the
   * prompt's tokens, counted locally after the same checks as a generation (no upstream call, no
   * usage record). `probe`: answered 200 at once, without a key (a client's start-up check).
   */
  kind: 'generate' | 'models' | 'socket' | 'count' | 'probe';
  /**
   * Serves a request only when this holds (a header says which API the client speaks). Of the
   * families that declare one method and path, the first whose condition holds serves it; one
   * without a condition serves the rest.
   */
  when?(headers: Record<string, string>): boolean;
  /** Families whose keys may call it; the serving family when absent. */
  families?: string[];
}

/** A request ready to send upstream. The path is relative to the upstream's base URL. */
export interface UpstreamRequest {
  method: 'GET' | 'POST';
  path: string;
  headers: Record<string, string>;
  /**
   * The upstream's name for the model (the channel's `upstreamModel`), set by the pipeline for
   * upstreams that name it in the URL rather than the body (an Azure deployment).
   */
  model?: string;
  body?: Buffer | string;
  /** W3C trace headers for the call (src/trace.ts), set by the pipeline; HTTP upstreams send them. */
  traceparent?: string;
  tracestate?: string;
}

/**
 * Receives an upstream response. Modelled on undici's dispatch handlers: start once, data per
 * chunk (return false to ask for a pause until `resume()`), then exactly one of end or error.
 * A chunk handed to `data` is the sink's: a passthrough edits it in place (ClientStream.edit).
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
  /**
   * Its key and configured header values: replaced by `[redacted]` in the upstream's error words
   * before a client, a log or a usage record sees them (src/upstream-secrets.ts).
   */
  readonly secrets?: readonly string[];
  close?(): Promise<void>;
  /** Its connection pool now, for upstreams that keep one; read when metrics are scraped. */
  stats?(): UpstreamStats;
}

/** An upstream's connection pool and the queue in front of it (src/http-upstream.ts). */
export interface UpstreamStats {
  /** Connections the pool may open. */
  connections: number;
  /** Calls holding a connection. */
  busy: number;
  /** Calls waiting for one. */
  queued: number;
  /** Since start: calls that had to wait, and their waits added up. */
  waits: number;
  waitSeconds: number;
  /** Since start: calls refused with `upstream_busy` (queue full, or no connection in time). */
  refused: number;
}

export type UpstreamFactory = (name: string, options: Record<string, unknown>, ctx: BootContext) => Upstream;

/**
 * What relays one upstream stream to the client. For a same-family upstream it only looks at the
 * upstream's frames (they are forwarded as they are unless `frame` returns false); a translating
 * stream writes its own frames and keeps none of the upstream's.
 */
export interface ClientStream {
  /** Called per upstream SSE frame; returns false to keep the frame from the client. */
  frame(frame: Buffer): boolean;
  /**
   * The frames `frame` must see: those where a key (`usage`) holds an object and, if asked, each
   * chunk's last frame. Set, it lets a passthrough skip the rest unseen: a search per chunk instead
   * of per frame (when no plugin looks at frames and the model name needs no splicing).
   */
  sparse?: SparseScan;
  /**
   * Edits the upstream's kept frames in place on their way out (whole frames, a run at a time, in
   * views of the upstream's chunk), after every visit to them. It may only take bytes out: it
   * returns the length of the edited frames, which start where `frames` does.
   */
  edit?(frames: Buffer): number;
  /**
   * Where the first of the upstream's kept frames (as `edit` gets them, before it) that is not one
   * of the family's events starts, or -1: a passthrough writes the frames before it, then ends the
   * stream with `fail`. Meant as a byte check of each frame's outline (`firstMalformedFrame`), not a parse.
   * It may stop at the upstream's own failure event too (`firstFrameToStopAt`): that frame is
   * written as it came, and the stream ends with nothing after it, failed.
   */
  check?(frames: Buffer): number;
  /** After each upstream chunk: frames of its own the stream wrote for that chunk, if any. */
  take?(): string;
  /**
   * The upstream closed the stream: closing bytes for the client, if any. Throws a GatewayError
   * when the stream was cut short (its family's last event never came): the relay then ends it with
   * `fail`, as a failure of the channel.
   */
  end(): string;
  /** The upstream failed midway: the family's stream-failure frames. */
  fail(err: GatewayError): string;
  /** Usage seen so far, if any. */
  usage(): Usage | undefined;
}

/**
 * A family's WebSocket protocol. Each client message becomes the body of one streamed exchange on
 * the family's generate endpoint; each stream event goes back as one text message. A message may
 * name a lane: turns on one lane run in order, lanes run side by side. `S` is one lane's state.
 */
export interface SocketProtocol<S = unknown> {
  /** The state of one lane (e.g. its last response, for chaining); `lane` is echoed on its events. */
  open(lane: string | undefined): S;
  /** Reads one client message: the lane it runs on and the message itself. Throws GatewayError. */
  read(message: string): { lane?: string; message: unknown };
  /**
   * One turn from a read message, on its lane's state: the exchange body, or with `answer` the
   * events of a complete local answer that needs no upstream call (a warm-up). Throws GatewayError.
   */
  request(message: unknown, state: S): { body: Buffer; answer?: string[] };
  /** Every event of a turn passes here on its way to the client: returns the text to send. */
  sent(event: string, state: S): string;
  /**
   * A turn on the lane ended (answered, refused or cut): lets go of what only that turn needed and
   * returns the bytes the lane keeps for later turns (its chain), which the socket bounds. A
   * protocol that keeps nothing between turns leaves it out.
   */
  turnEnded?(state: S): number;
  /** Drops what the lane keeps for later turns: the socket holds more than it may. */
  forget?(state: S): void;
  /** An error in the protocol's message shape, on a lane when known. */
  error(err: GatewayError, lane?: string): string;
}

/** Which socket, turn and lane a WebSocket turn's exchange is, for the logs. */
export interface SocketTurnInfo {
  socket: string;
  /** 1 for the first message on the socket. */
  turn: number;
  lane?: string;
}
export const socketTurn = new StateKey<SocketTurnInfo>('socket turn');

/**
 * A client family: what a client speaks. How it authenticates, what it sends (decoded, and
 * expressed canonically), what it reads back (answers, stream frames, errors in its shape), and,
 * optionally, the same-family passthrough (FamilyPassthrough).
 * Paired with an UpstreamDialect of the same name when upstreams speak it too (docs/plugins.md).
 */
export interface ClientFamily {
  /** The family's name (`chat`): keys' groups grant it, upstreams and dialects name it. */
  readonly name: string;
  readonly endpoints: Endpoint[];
  /** Content type of a stream answer (most families: `text/event-stream`). */
  streamContentType(ex: ExchangeView): string;
  /** The family's WebSocket protocol, for families with a `socket` endpoint. */
  readonly socket?: SocketProtocol<any>;
  /** How this family is served from another family's upstream; 'translated' when absent. */
  translationMode?(upstreamFamily: string): FamilyMode;
  /** The caller's credential: undefined when none was sent, '' when it is malformed. */
  credential(ex: ExchangeView): string | undefined;
  /** Parse and validate ex.body: sets ex.request, ex.modelId and ex.stream. Throws GatewayError. */
  decode(ex: ExchangeView): void;
  /** The model list in this family's shape (for families with a `models` endpoint). */
  modelList?(models: ModelConfig[], ex: ExchangeView): unknown;
  /** Error body in this family's shape. */
  errorBody(err: GatewayError): string;
  /** The status of an error reply, where the family's API differs from the catalog's. */
  errorStatus?(err: GatewayError): number;
  /** The answer of a `count` endpoint, in this family's shape. */
  tokenCount?(inputTokens: number, ex: ExchangeView): unknown;
  /** Text of the prompt, for a tokenizer estimate. */
  promptText(ex: ExchangeView): string;
  /** The output-token ceiling the client asked for, if it asked for one (the limits reserve it). */
  requestedOutputTokens?(ex: ExchangeView): number | undefined;
  /**
   * A limited caller's windows under the header names this family's clients read and pace
   * themselves by (Anthropic's `anthropic-ratelimit-*`); without it the limits plugin sends
   * OpenAI's `x-ratelimit-*`, which most clients and tools understand.
   */
  rateLimitHeaders?(windows: RateLimitWindows, now: number): Record<string, string>;

  /**
   * The client's request canonically, for the model rules and, when translating, the upstream.
   * For its own family's upstream it refuses nothing that upstream could take. Throws GatewayError.
   */
  toCanonical(ex: ExchangeView, upstreamFamily: string): canonical.Request;
  /** A translated answer, in this family's shape. */
  writeResponse(res: canonical.Response, ex: ExchangeView): string;
  /** Writes canonical stream events as this family's frames. */
  streamWriter(ex: ExchangeView): canonical.StreamWriter;

  /**
   * The same-family passthrough, for families whose own upstreams can take the client's bytes.
   * Without it, an upstream of the family's own name is served by translation like any other.
   */
  readonly passthrough?: FamilyPassthrough;
}

/**
 * A family's same-family passthrough: the upstream speaks the client's wire format, so the
 * client's bytes go upstream and the upstream's bytes come back, edited only where they must be.
 * It lives on the family, not the dialect, because only the family parses its own request and
 * writes frames its clients understand; the dialect only ever sees canonical requests.
 */
export interface FamilyPassthrough {
  /**
   * The JSON key that names the model in this family's answers and stream events (`"model"`,
   * quotes included). A passthrough answer gets the client's name for the model spliced in there,
   * since the upstream answers with its own name for it.
   */
  readonly modelKey?: string;
  /**
   * The upstream request from the client's bytes, with what the model rules dropped or added:
   * the bytes are spliced, not re-serialised, so whatever the family does not parse reaches the
   * upstream as the client sent it.
   */
  prepare(ex: ExchangeView, upstream: Upstream, rules: RuleOutcome): UpstreamRequest;
  /**
   * Whether the client's request asks for a server-side tool (in this family's own field, such as
   * chat's `web_search_options`). For a model that allows every feature and sets no output
   * ceiling, that is all the model rules could act on in a native request: when this says no, the
   * pipeline builds no canonical form and applies no rules. A family without it always gets both.
   */
  asksForServerTools?(ex: ExchangeView): boolean;
  /**
   * Relays the upstream's stream: it finds usage in frames it does not otherwise parse, and writes
   * what the client is owed that the upstream did not send (a usage chunk it asked for, a failure
   * frame in the family's shape).
   */
  stream(ex: ExchangeView): ClientStream;
  /** Usage from a complete upstream body of this family: the answer is relayed unparsed, so usage is read apart. */
  bodyUsage(body: Buffer): Usage | undefined;
  /**
   * Whether a complete 2xx upstream body could be one of this family's answers, by its outline
   * (`looksLikeJsonObject`) and the field every answer has (`holdsArray`, `fieldStartsWith`: chat's
   * `choices` array), not a parse: a passthrough answers anything else (`{}`, `{"ok":true}`, a page of text)
   * with a 502 rather than relay it as a success.
   */
  isAnswer?(body: Buffer): boolean;
  /**
   * Text of delivered frames of this family, for a tokenizer estimate when the upstream sent no
   * usage: only the family knows where the text is in its frames.
   */
  deliveredText(frames: Buffer[]): string;
}

/**
 * An upstream dialect: what an upstream speaks. Builds the upstream request from the canonical one
 * and reads the upstream's answers, streams and errors back into canonical terms. Upstream kinds
 * name it by `Upstream.family`; many kinds (hosts, paths, auth headers) share one dialect.
 */
export interface UpstreamDialect {
  /** The wire family it speaks: the `family` of the upstreams it serves. */
  readonly family: string;
  /** Canonical fields this dialect cannot send; the model rules drop or refuse them. */
  readonly unsendable?: readonly canonical.SamplingParam[];
  /** The tool names it takes; others are renamed for it, and its answers' names back (src/tool-names.ts). */
  readonly toolNames?: ToolNameRule;
  fromCanonical(req: canonical.Request, ex: ExchangeView): UpstreamRequest;
  readResponse(body: Buffer, ex: ExchangeView): canonical.Response;
  streamReader(ex: ExchangeView): canonical.StreamReader;
  /** An upstream error body of this family, in the gateway's terms. */
  readError(status: number, body: Buffer): GatewayError;
}

export interface BootContext {
  config: Config;
  /** The store behind its cache layer: the request path's key lookups rarely wait. */
  store: CachedStore;
  /** Where limit decisions are made (in memory, or shared by many instances). */
  limiter: Limiter;
  log: Logger;
  /** This plugin's own options from config (`plugins[].options`). */
  options: Record<string, unknown>;
  /** Serve a client family's endpoints. */
  addFamily(family: ClientFamily): void;
  /** Speak to upstreams whose `family` is `dialect.family`. */
  addDialect(dialect: UpstreamDialect): void;
  addUpstreamKind(kind: string, factory: UpstreamFactory): void;
  /** Serve plain HTTP under a path prefix (e.g. the web console under `/console`). */
  addRoute(prefix: string, handler: JsonHandler): void;
  /** The running gateway, for plugins that report on it; absent when plugins are loaded to serve nothing (the CLI). */
  gateway?: GatewayView;
}

/** What a plugin may read of the running gateway (the metrics plugin does, at scrape time). */
export interface GatewayView {
  /** Hex SHA-256 of the admin token (src/admin/token.ts), for routes only the admin may call. */
  readonly adminTokenDigest: string;
  /**
   * Whether the caller of a plugin's admin route is the admin, as the admin API decides it: the
   * admin token (wrong ones throttled) or a console session (its CSRF token on a change). Resolves
   * to a refusal to answer with, or undefined for the admin.
   */
  authorizeAdmin(req: Omit<JsonRequest, 'body'>): Promise<JsonReply | undefined>;
  /** With `server.workers` above 1, this worker thread's index; undefined when one thread serves. */
  readonly thread: number | undefined;
  /** Exchanges accepted and not yet done in this thread. */
  inFlight(): number;
  /** Every upstream with its pool, if it keeps one, and the breaker state of each model channel on it. */
  upstreams(): UpstreamStatus[];
  /** Usage records journaled in this thread and not yet written to the store. */
  usageQueued(): number;
  /**
   * Every thread's answer to `topic` (this thread's alone when one thread serves), as registered
   * with `answer`: what a report of the whole instance is made of. A thread that does not answer
   * within a few seconds is left out.
   */
  gather(topic: string): Promise<unknown[]>;
  /** This thread's answer to `gather(topic)`, from any thread; it must survive structured cloning. */
  answer(topic: string, answer: () => unknown): void;
  /** Reports a figure a plugin keeps (the response cache's hits), for the metrics plugin to export. */
  addFigure(figure: Figure): void;
  /** The figures plugins reported, in the order they were added. */
  figures(): readonly Figure[];
}

/** A number a plugin keeps, exported as a Prometheus metric of this name by the metrics plugin. */
export interface Figure {
  /** A Prometheus name, `sluice_` first by convention; a counter's ends in `_total`. */
  name: string;
  help: string;
  type: 'counter' | 'gauge';
  /** With worker threads, how the threads' values add up: `sum` (the default) or, for a figure every thread reads from one shared place, `max`. */
  aggregate?: 'sum' | 'max';
  read(): number;
}

export interface UpstreamStatus {
  name: string;
  pool: UpstreamStats | undefined;
  /** `coolDownSeconds`: what is left of the channel's cool-down after an upstream's 429 with Retry-After (0: none). */
  channels: { model: string; channel: string; state: 'closed' | 'half-open' | 'open'; coolDownSeconds: number }[];
}

/** A plugin module's default export. */
export type PluginFactory = (ctx: BootContext) => Plugin | Promise<Plugin>;

export function definePlugin(factory: PluginFactory): PluginFactory {
  return factory;
}

/** A plain HTTP route outside the model families (the admin API, the console). */
export interface JsonRequest {
  method: string;
  path: string;
  query: URLSearchParams;
  headers: Record<string, string>;
  body: Buffer;
  remoteAddress: string;
  /** Aborted when the client goes away before its reply is complete (set by the server). */
  signal?: AbortSignal;
}

export interface JsonReply {
  status: number;
  /** Sent as JSON. */
  body?: unknown;
  /** Sent as it is, instead of `body`. */
  raw?: { contentType: string; data: Buffer | string };
  /**
   * Sent chunk by chunk as it is produced (server-sent events), instead of `body`: each chunk is
   * written when the client has taken the last, and the iteration is ended early (its `return`)
   * when the client goes away, even before the reply was ready (then the iteration may never
   * have begun, so a generator's `finally` does not run: what it holds must be let go another
   * way, as on the request's `signal`). A client that reads nothing for ten seconds is cut.
   */
  stream?: { contentType: string; chunks: AsyncIterable<Uint8Array | string> };
  /** A list sends the header once per value (Set-Cookie). */
  headers?: Record<string, string | string[]>;
}

export interface JsonHandler {
  (req: JsonRequest): JsonReply | Promise<JsonReply>;
  /** The largest request body it reads; 64 KiB when unset (admin and console bodies are small). */
  maxBodyBytes?: number;
  /**
   * Runs on the headers, before any body byte is read: a reply here answers at once and closes
   * the connection, so a caller refused here (no admin token) never gets its body held in memory.
   */
  beforeBody?(req: Omit<JsonRequest, 'body'>): JsonReply | undefined | Promise<JsonReply | undefined>;
}
