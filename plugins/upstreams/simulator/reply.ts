/**
 * What the simulator's wire families share: the reply script they render into, OpenAI-shaped
 * error replies, JSON body parsing, random ids, pacing of token steps and light request-validation
 * helpers.
 */
import { randomBytes } from 'node:crypto';
import type { JsonSchema, Plan } from './engine.js';

export interface ReplyStep {
  /** Wait this long after the previous step (or the request) before writing. */
  delayMs: number;
  bytes: string;
}

/** A complete scripted response. Headers go out with the first step. */
export interface SimReply {
  status: number;
  headers: Record<string, string>;
  /** Every step at once. A streamed reply (`play` set) makes them only when this is read. */
  steps: ReplyStep[];
  /** After the last step the transport closes abruptly instead of ending cleanly. */
  cut: boolean;
  /**
   * Set on a streamed reply: its steps made one at a time as a player asks for the next, none over
   * MAX_STEP_BYTES unless a single frame is (the extra steps wait 0 ms), so a long answer is never
   * held whole and a paused consumer stops its making. The bytes and timing are those of `steps`.
   */
  play?(): Iterator<ReplyStep>;
}

/** The most bytes of frames a played step gathers before it is handed over. */
export const MAX_STEP_BYTES = 16 * 1024;

/**
 * What a reply script yields: a frame (it joins the current step), or a number: the current step
 * closes (when it has frames) and the next one waits that many milliseconds.
 */
export type ScriptItem = string | number;

/**
 * A 200 reply whose steps a script makes on demand: `script` is run afresh for each reading, lazily
 * by `play()` (bounded steps) or whole by `steps` (as StepBuilder groups them). `cut` must be known
 * before the script runs. Ids and other random parts belong outside the script, so every run of it
 * gives the same bytes.
 */
export function scriptedReply(headers: Readonly<Record<string, string>>, cut: boolean, firstDelayMs: number, script: () => Iterable<ScriptItem>): SimReply {
  let whole: ReplyStep[] | undefined;
  return {
    status: 200,
    headers: { ...headers },
    cut,
    get steps(): ReplyStep[] {
      return (whole ??= [...gathered(script(), firstDelayMs, Infinity)]);
    },
    set steps(steps: ReplyStep[]) {
      whole = steps;
    },
    play: () => (whole ? whole[Symbol.iterator]() : gathered(script(), firstDelayMs, MAX_STEP_BYTES)),
  };
}

/** Groups a script's frames into steps, closing one at each number and once it holds `maxBytes`. */
function* gathered(items: Iterable<ScriptItem>, firstDelayMs: number, maxBytes: number): Generator<ReplyStep, void, undefined> {
  let delayMs = firstDelayMs;
  let frames: string[] = [];
  let size = 0;
  for (const item of items) {
    if (typeof item === 'number') {
      if (frames.length > 0) yield { delayMs, bytes: frames.join('') };
      frames = [];
      size = 0;
      delayMs = item;
      continue;
    }
    frames.push(item);
    size += item.length;
    if (size >= maxBytes) {
      const bytes = frames.join('');
      frames = [];
      size = 0;
      yield { delayMs, bytes };
      delayMs = 0;
    }
  }
  if (frames.length > 0) yield { delayMs, bytes: frames.join('') };
}

/** The same reply with `headers` in place of its own, its steps left unmade. */
export function withHeaders(reply: SimReply, headers: Record<string, string>): SimReply {
  reply.headers = headers;
  return reply;
}

export const JSON_HEADERS: Readonly<Record<string, string>> = { 'content-type': 'application/json' };
export const SSE_HEADERS: Readonly<Record<string, string>> = { 'content-type': 'text/event-stream; charset=utf-8' };

/** A request the simulator refuses with 400, in OpenAI's terms. */
export class RequestError extends Error {
  constructor(
    message: string,
    readonly param: string | null,
    readonly code: string | null,
  ) {
    super(message);
  }
}

/** The reply as an odd upstream labels it: `content_type=` replaces the content type of a 2xx answer. */
export function withWireQuirks(reply: SimReply, p: Plan): SimReply {
  const { contentType } = p.wire;
  if (!contentType || reply.status < 200 || reply.status >= 300) return reply;
  return withHeaders(reply, { ...reply.headers, 'content-type': contentType });
}

export function jsonReply(status: number, body: unknown, delayMs = 0): SimReply {
  return { status, headers: { ...JSON_HEADERS }, steps: [{ delayMs, bytes: JSON.stringify(body) }], cut: false };
}

export function errorReply(status: number, message: string, type: string, param: string | null, code: string | null): SimReply {
  return jsonReply(status, { error: { message, type, param, code } });
}

export function notFound(method: string, path: string): SimReply {
  return errorReply(404, `Invalid URL (${method} ${path})`, 'invalid_request_error', null, null);
}

/** The body OpenAI sends for a request the `error=` directive fails. */
export function faultReply(status: number): SimReply {
  if (status === 429) return errorReply(status, 'Rate limit reached (simulated).', 'requests', null, 'rate_limit_exceeded');
  if (status >= 500) return errorReply(status, 'The server had an error while processing your request (simulated).', 'server_error', null, null);
  if (status === 401) return errorReply(status, 'Incorrect API key provided (simulated).', 'invalid_request_error', null, 'invalid_api_key');
  return errorReply(status, `Simulated error with status ${status}.`, 'invalid_request_error', null, null);
}

/** Deeper JSON is refused on arrival: rendering a reply recurses (JSON.stringify) into what it echoes. */
export const MAX_JSON_DEPTH = 100;

/** Parses a JSON body: its value, or why it cannot be read. */
export function readJson(body: Buffer | string | undefined): { value: unknown } | { problem: 'syntax' | 'depth' } {
  let value: unknown;
  try {
    value = JSON.parse(typeof body === 'string' ? body : (body?.toString('utf8') ?? ''));
  } catch {
    return { problem: 'syntax' };
  }
  return nestedDeeperThan(value, MAX_JSON_DEPTH) ? { problem: 'depth' } : { value };
}

/** Whether arrays and objects nest more than `limit` levels deep, found without recursion. */
function nestedDeeperThan(value: unknown, limit: number): boolean {
  const nodes: unknown[] = [value];
  const depths: number[] = [1];
  while (nodes.length > 0) {
    const node = nodes.pop();
    const depth = depths.pop()!;
    if (typeof node !== 'object' || node === null) continue;
    if (depth > limit) return true;
    for (const child of Array.isArray(node) ? node : Object.values(node)) {
      if (typeof child === 'object' && child !== null) {
        nodes.push(child);
        depths.push(depth + 1);
      }
    }
  }
  return false;
}

/** Parses a JSON body, or answers the 400 OpenAI gives for one it cannot read. */
export function parseJsonBody(body: Buffer | string | undefined): { value: unknown } | { reply: SimReply } {
  const json = readJson(body);
  if ('value' in json) return json;
  const message = json.problem === 'syntax' ? 'The request body is not valid JSON.' : `The request body nests deeper than ${MAX_JSON_DEPTH} levels.`;
  return { reply: errorReply(400, message, 'invalid_request_error', null, null) };
}

/** Runs a request parser, turning a RequestError into the reply `refuse` makes of it. */
export function parseOr<T>(parse: () => T, refuse: (err: RequestError) => SimReply): { value: T } | { reply: SimReply } {
  try {
    return { value: parse() };
  } catch (err) {
    if (!(err instanceof RequestError)) throw err;
    return { reply: refuse(err) };
  }
}

/** Runs a request parser, turning a RequestError into OpenAI's 400 reply. */
export function parseOr400<T>(parse: () => T): { value: T } | { reply: SimReply } {
  return parseOr(parse, (err) => errorReply(400, err.message, 'invalid_request_error', err.param, err.code));
}

// ---------------------------------------------------------------------------------------------
// Ids

const ID_ALPHABET = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789';

/** `length` random letters and digits. */
export function randomId(length: number): string {
  let id = '';
  for (const byte of randomBytes(length)) id += ID_ALPHABET[byte % ID_ALPHABET.length];
  return id;
}

/** `length` random lowercase hex digits (`length` even). */
export function randomHex(length: number): string {
  return randomBytes(Math.ceil(length / 2)).toString('hex').slice(0, length);
}

// ---------------------------------------------------------------------------------------------
// Pacing

/**
 * Collects frames into timed steps. The first step waits `firstDelayMs` (the ttft); `flush(ms)`
 * closes the current step and makes the next one wait `ms`.
 */
export class StepBuilder {
  readonly steps: ReplyStep[] = [];
  private frames: string[] = [];

  constructor(private delayMs: number) {}

  push(frame: string): void {
    this.frames.push(frame);
  }

  flush(nextDelayMs = 0): void {
    if (this.frames.length > 0) this.steps.push({ delayMs: this.delayMs, bytes: this.frames.join('') });
    this.frames = [];
    this.delayMs = nextDelayMs;
  }

  /** The finished event-stream reply; `cut` drops the connection after the last step. */
  sse(cut: boolean): SimReply {
    return this.reply(SSE_HEADERS, cut);
  }

  /** The finished 200 reply with these headers; `cut` drops the connection after the last step. */
  reply(headers: Readonly<Record<string, string>>, cut: boolean): SimReply {
    this.flush(0);
    return { status: 200, headers: { ...headers }, steps: this.steps, cut };
  }
}

/**
 * Frames placed on a plan's token clock: tick k is due `ttft + k × interval` after the request.
 * Ticks may be skipped (time still passes); frames of one tick share a step, and an unpaced plan
 * puts everything in one step.
 */
export class TickScript {
  private builder: StepBuilder | undefined;
  private tick = 0;

  constructor(private readonly p: Plan) {}

  push(tick: number, frame: string): void {
    const intervalMs = tokenIntervalMs(this.p);
    if (!this.builder) {
      this.builder = new StepBuilder(this.p.timing.ttftMs + tick * intervalMs);
      this.tick = tick;
    } else if (tick > this.tick) {
      if (intervalMs > 0) this.builder.flush((tick - this.tick) * intervalMs);
      this.tick = tick;
    }
    this.builder.push(frame);
  }

  /** The finished 200 reply; `cut` drops the connection after the last step. */
  reply(headers: Readonly<Record<string, string>>, cut: boolean): SimReply {
    return (this.builder ?? new StepBuilder(this.p.timing.ttftMs)).reply(headers, cut);
  }
}

/**
 * TickScript for a lazy script: `at(tick)` is the number to yield before a frame at `tick`, if
 * any (the first frame's sets the opening wait, `ttft + tick × interval`).
 */
export class TickClock {
  private tick: number | undefined;
  private readonly intervalMs: number;

  constructor(private readonly p: Plan) {
    this.intervalMs = tokenIntervalMs(p);
  }

  at(tick: number): number | undefined {
    const previous = this.tick;
    if (previous === undefined) {
      this.tick = tick;
      return this.p.timing.ttftMs + tick * this.intervalMs;
    }
    if (tick <= previous) return undefined;
    this.tick = tick;
    return this.intervalMs > 0 ? (tick - previous) * this.intervalMs : undefined;
  }
}

/** Milliseconds between two token steps; 0 when the plan is unpaced. */
export function tokenIntervalMs(p: Plan): number {
  return p.timing.tokensPerSecond > 0 ? 1000 / p.timing.tokensPerSecond : 0;
}

/** Time until the last of `tokenSteps` token steps: ttft, then one interval per further step. */
export function generationMs(p: Plan, tokenSteps: number): number {
  const tps = p.timing.tokensPerSecond;
  return p.timing.ttftMs + (tps > 0 && tokenSteps > 1 ? ((tokenSteps - 1) * 1000) / tps : 0);
}

// ---------------------------------------------------------------------------------------------
// Validation helpers

export function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

export function isSchema(value: unknown): value is JsonSchema {
  return typeof value === 'boolean' || isRecord(value);
}

/** An optional integer >= 1. */
export function positiveInteger(raw: unknown, param: string): number | undefined {
  if (raw === undefined || raw === null) return undefined;
  if (typeof raw !== 'number' || !Number.isInteger(raw)) throw new RequestError(`Invalid type for '${param}': expected an integer.`, param, 'invalid_type');
  if (raw < 1) throw new RequestError(`Invalid '${param}': expected a value >= 1, got ${raw}.`, param, 'integer_below_min_value');
  return raw;
}

export function optionalBoolean(raw: unknown, param: string): boolean | undefined {
  if (raw === undefined || raw === null) return undefined;
  if (typeof raw !== 'boolean') throw new RequestError(`Invalid type for '${param}': expected a boolean.`, param, 'invalid_type');
  return raw;
}

export function requiredString(raw: unknown, param: string, allowEmpty = false): string {
  if (raw === undefined || raw === null) throw new RequestError(`Missing required parameter: '${param}'.`, param, 'missing_required_parameter');
  if (typeof raw !== 'string') throw new RequestError(`Invalid type for '${param}': expected a string.`, param, 'invalid_type');
  if (raw === '' && !allowEmpty) throw new RequestError(`Invalid '${param}': empty string.`, param, 'empty_string');
  return raw;
}

export function optionalString(raw: unknown, param: string): string | undefined {
  if (raw === undefined || raw === null) return undefined;
  if (typeof raw !== 'string') throw new RequestError(`Invalid type for '${param}': expected a string.`, param, 'invalid_type');
  return raw;
}

/** OpenAI's refusal of an array longer than it accepts (`messages` 2048, `tools` 128, `stop` 4). */
export function checkMaxLength(raw: unknown[], max: number, param: string): void {
  if (raw.length > max) {
    throw new RequestError(
      `Invalid '${param}': array too long. Expected an array with maximum length ${max}, but got an array with length ${raw.length} instead.`,
      param,
      'array_above_max_length',
    );
  }
}

export function optionalNumber(raw: unknown, param: string): number | undefined {
  if (raw === undefined || raw === null) return undefined;
  if (typeof raw !== 'number' || !Number.isFinite(raw)) throw new RequestError(`Invalid type for '${param}': expected a number.`, param, 'invalid_type');
  return raw;
}
