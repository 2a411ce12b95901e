/**
 * The simulator's Anthropic Messages face (paths relative to the API root `/v1`): `POST /messages`
 * (a Message, or its event stream), `POST /messages/count_tokens`, and, when it lists Anthropic's
 * models, `GET /models` and `GET /models/{id}`. It refuses what Anthropic refuses, in Anthropic's
 * error shape, and signs the thinking it emits so that a later turn replaying a changed, dropped or
 * made-up thinking block is refused as Anthropic refuses it: the checks a gateway must pass.
 */
import { createHmac } from 'node:crypto';
import { eventFrame } from '../../../src/plugin-api.js';
import { calls, fragments, inputTokens, plan, type EngineInput, type JsonSchema, type Plan, type PlannedCall, type PromptCache, type SimMessage, type SimTool, type ToolChoice } from './engine.js';
import {
  MAX_JSON_DEPTH,
  RequestError,
  SSE_HEADERS,
  generationMs,
  isRecord,
  jsonReply,
  parseOr,
  randomId,
  readJson,
  scriptedReply,
  tokenIntervalMs,
  withWireQuirks,
  type ScriptItem,
  type SimReply,
} from './reply.js';

export interface MessagesOptions {
  /** Model ids listed by `GET /models` and found by `GET /models/{id}`. */
  models: string[];
}

export const DEFAULT_MESSAGES_MODELS = ['sim-messages'];

/** A parsed Messages request: the wire-level switches plus the engine's neutral view. */
export interface MessagesRequest {
  model: string;
  stream: boolean;
  input: EngineInput;
  /** The thinking's pieces (cut to the budgets), present when thinking is on; `shown` is false for `display: omitted`. */
  thinking?: { units: string[]; shown: boolean };
  /** `tool_choice.disable_parallel_tool_use`: at most one call per turn. */
  singleCall: boolean;
}

/** Anthropic's error type for each status; other 4xx are invalid requests, other 5xx API errors. */
const ERROR_TYPES: Record<number, string> = {
  400: 'invalid_request_error',
  401: 'authentication_error',
  402: 'billing_error',
  403: 'permission_error',
  404: 'not_found_error',
  409: 'conflict_error',
  413: 'request_too_large',
  429: 'rate_limit_error',
  500: 'api_error',
  504: 'timeout_error',
  529: 'overloaded_error',
};

/** Messages for the `error=` directive, after Anthropic's own. */
const FAULT_MESSAGES: Record<number, string> = {
  401: 'invalid x-api-key',
  403: 'Your API key does not have permission to use the specified resource.',
  404: 'The requested resource could not be found.',
  413: 'Request exceeds the maximum allowed number of bytes.',
  429: 'Number of request tokens has exceeded your per-minute rate limit.',
  500: 'Internal server error',
  504: 'Request timed out',
  529: 'Overloaded',
};

/** Keyed so a gateway cannot forge a signature; fixed so every simulator process accepts the others'. */
const SIGNING_KEY = 'sluice-simulator-thinking-v1';
/** Fixed, so model lists are byte-identical across runs. */
const MODELS_CREATED_AT = '2025-01-01T00:00:00Z';
const MIN_THINKING_BUDGET = 1024;
const TOOL_NAME = /^[a-zA-Z0-9_-]{1,128}$/;
const TOOL_ID = /^[a-zA-Z0-9_-]+$/;
const IMAGE_TYPES = new Set(['image/jpeg', 'image/png', 'image/gif', 'image/webp']);
const EFFORTS = new Set(['low', 'medium', 'high', 'xhigh', 'max']);
const DISPLAYS = new Set(['summarized', 'omitted', 'updates']);
const THINKING_DOCS = 'Please consult our documentation at https://docs.claude.com/en/docs/build-with-claude/extended-thinking';

/** Top-level fields of `POST /messages`; anything else is an extra input Anthropic refuses. */
const MESSAGE_FIELDS = new Set([
  'model',
  'max_tokens',
  'messages',
  'system',
  'stream',
  'stop_sequences',
  'temperature',
  'top_p',
  'top_k',
  'metadata',
  'tools',
  'tool_choice',
  'thinking',
  'output_config',
  'cache_control',
  'service_tier',
  'inference_geo',
  'container',
  'context_management',
  'mcp_servers',
  'safeguards',
]);
/** Top-level fields of `POST /messages/count_tokens` (no `max_tokens`, no `stream`). */
const COUNT_FIELDS = new Set(['model', 'messages', 'system', 'tools', 'tool_choice', 'thinking', 'output_config', 'cache_control', 'context_management', 'mcp_servers']);
/** Body fields that exist only with their beta: without the `anthropic-beta` value they are extra inputs. */
const BETA_FIELDS: [field: string, beta: string][] = [['context_management', 'context-management-2025-06-27']];
const PER_TURN_BETA = 'per-turn-control-2026-07-01';

/** Block types by where they may appear; tool results hold a narrower set. */
const USER_BLOCKS = ['text', 'image', 'document', 'search_result', 'tool_result'];
const ASSISTANT_BLOCKS = ['text', 'thinking', 'redacted_thinking', 'tool_use', 'server_tool_use', 'web_search_tool_result', 'web_fetch_tool_result', 'code_execution_tool_result'];
const RESULT_BLOCKS = ['text', 'image', 'document', 'search_result', 'tool_reference'];

// ---------------------------------------------------------------------------------------------
// Routes

/**
 * Serves `POST /messages` and `POST /messages/count_tokens` (paths relative to `/v1`, query string
 * ignored: Claude Code appends `?beta=true`), and with `options` also `GET /models` and
 * `GET /models/{id}`; undefined for any other route. `headers` are the request's (lowercase names),
 * read for `anthropic-beta`.
 */
export function routeMessages(
  method: string,
  path: string,
  body: Buffer | string | undefined,
  headers: Record<string, string>,
  options?: MessagesOptions,
  cache?: PromptCache,
): SimReply | undefined {
  const bare = path.split('?', 1)[0];
  if (method === 'POST' && bare === '/messages') return createMessage(body, headers, cache);
  if (method === 'POST' && bare === '/messages/count_tokens') return countTokens(body, headers);
  if (method !== 'GET' || !options) return undefined;
  if (bare === '/models') return messagesModelList(options.models);
  if (bare.startsWith('/models/')) return messagesModelInfo(decodeSegment(bare.slice('/models/'.length)), options.models);
  return undefined;
}

/** What Anthropic refuses before reading the body: no credential (any value passes), no `anthropic-version`. */
export function messagesHeaderProblem(headers: Record<string, string>): SimReply | undefined {
  if (!headers['x-api-key'] && !/^Bearer \S/i.test(headers.authorization ?? '')) return anthropicError(401, 'x-api-key header is required');
  if (!headers['anthropic-version']) return anthropicError(400, 'anthropic-version: header is required');
  return undefined;
}

export function createMessage(body: Buffer | string | undefined, headers: Record<string, string> = {}, cache?: PromptCache): SimReply {
  const json = readJson(body);
  if (!('value' in json)) return unreadable(json.problem);
  const request = parseOr(() => parseMessagesRequest(json.value, headers), refuse);
  if ('reply' in request) return request.reply;
  const p = plan(request.value.input, cache);
  return withWireQuirks(renderMessages(request.value, p), p);
}

/** `{"input_tokens": N}`: the whole prompt, as a generation would report input, cache reads and writes together. */
export function countTokens(body: Buffer | string | undefined, headers: Record<string, string> = {}): SimReply {
  const json = readJson(body);
  if (!('value' in json)) return unreadable(json.problem);
  const request = parseOr(() => parseMessagesRequest(json.value, headers, COUNT_FIELDS), refuse);
  if ('reply' in request) return request.reply;
  return withRequestId(jsonReply(200, { input_tokens: inputTokens(request.value.input.messages) }));
}

export function renderMessages(request: MessagesRequest, p: Plan): SimReply {
  // With `cut_after` the stream starts and the error arrives as an event instead.
  if (p.fault.errorStatus !== undefined && !(request.stream && p.fault.cutAfter !== undefined)) return messagesFault(p.fault.errorStatus);
  const message = new MessageShape(request, p);
  if (!request.stream) return withRequestId(jsonReply(200, message.final(), generationMs(p, message.tokenSteps)));
  return streamReply(message, p);
}

export function messagesModelList(models: string[]): SimReply {
  const data = models.map(modelEntry);
  return jsonReply(200, { data, has_more: false, first_id: data[0]?.id ?? null, last_id: data.at(-1)?.id ?? null });
}

export function messagesModelInfo(id: string, models: string[]): SimReply {
  return models.includes(id) ? jsonReply(200, modelEntry(id)) : anthropicError(404, `model: ${id}`);
}

/** An error in Anthropic's shape, with the `request-id` header its answers carry. */
export function anthropicError(status: number, message: string): SimReply {
  return withRequestId(jsonReply(status, { type: 'error', error: errorObject(status, message), request_id: `req_${randomId(24)}` }));
}

/** The body Anthropic sends for a request the `error=` directive (or a process fault) fails. */
export function messagesFault(status: number): SimReply {
  return anthropicError(status, `${FAULT_MESSAGES[status] ?? `Simulated error with status ${status}.`} (simulated)`);
}

export function messagesNotFound(method: string, path: string): SimReply {
  return anthropicError(404, `Not found (${method} ${path.split('?', 1)[0]}).`);
}

/** The signature of a thinking text: what a replayed thinking block must carry unchanged. */
export function thinkingSignature(thinking: string): string {
  return createHmac('sha256', SIGNING_KEY).update(thinking).digest('base64');
}

function decodeSegment(raw: string): string {
  try {
    return decodeURIComponent(raw);
  } catch {
    return raw;
  }
}

function errorObject(status: number, message: string): { type: string; message: string } {
  return { type: ERROR_TYPES[status] ?? (status >= 500 ? 'api_error' : 'invalid_request_error'), message };
}

function withRequestId(reply: SimReply): SimReply {
  reply.headers['request-id'] = `req_${randomId(24)}`;
  return reply;
}

function refuse(err: RequestError): SimReply {
  return anthropicError(400, err.message);
}

function unreadable(problem: 'syntax' | 'depth'): SimReply {
  if (problem === 'syntax') return anthropicError(400, 'There was an issue with the JSON body of your request: it is not valid JSON.');
  return anthropicError(400, `There was an issue with the JSON body of your request: it nests deeper than ${MAX_JSON_DEPTH} levels.`);
}

function modelEntry(id: string): { type: string; id: string; display_name: string; created_at: string } {
  return { type: 'model', id, display_name: `Simulator ${id}`, created_at: MODELS_CREATED_AT };
}

// ---------------------------------------------------------------------------------------------
// Rendering

type Block =
  | { type: 'thinking'; units: string[]; shown: boolean }
  | { type: 'text'; units: string[] }
  | { type: 'tool_use'; id: string; name: string; units: string[] };

type StopReason = 'end_turn' | 'max_tokens' | 'stop_sequence' | 'tool_use' | 'refusal';

/** One answer's blocks, stop reason and usage, as the Message and as its stream. */
class MessageShape {
  readonly id = `msg_${randomId(24)}`;
  readonly blocks: Block[] = [];
  readonly stopReason: StopReason;
  readonly stopSequence: string | null = null;
  readonly outputTokens: number;
  /** Pieces that take a token step: thinking (shown or not), answer text, argument fragments. */
  readonly tokenSteps: number;

  constructor(
    readonly request: MessagesRequest,
    readonly p: Plan,
  ) {
    const answer = p.choices[0];
    if (p.fault.blocked) {
      this.stopReason = 'refusal';
      this.outputTokens = this.tokenSteps = 0;
      return;
    }
    const thinking = request.thinking;
    if (thinking) this.blocks.push({ type: 'thinking', units: thinking.units, shown: thinking.shown });
    let spent = thinking?.units.length ?? 0;
    if (answer.kind === 'text') {
      if (answer.tokens.length > 0) this.blocks.push({ type: 'text', units: answer.tokens });
      spent += answer.tokens.length;
      this.stopReason = answer.finishReason === 'length' ? 'max_tokens' : answer.stopSequence ? 'stop_sequence' : 'end_turn';
      if (answer.stopSequence) this.stopSequence = answer.stopSequence;
    } else {
      const every = calls(answer);
      const kept = request.singleCall ? every.slice(0, 1) : every;
      // Only the engine's last call can be cut short by max_tokens; such a call is not sent (its
      // input is no object), but its tokens are spent.
      const cut = answer.finishReason === 'length' && kept.length === every.length;
      kept.forEach((call, k) => {
        spent += call.fragments.length;
        if (!(cut && k === kept.length - 1)) this.blocks.push(toolUse(call));
      });
      this.stopReason = cut ? 'max_tokens' : 'tool_use';
    }
    this.outputTokens = spent;
    this.tokenSteps = spent;
  }

  /** The usage object; `output` is the output so far (message_start carries a first figure). */
  usage(output: number): object {
    const { inputTokens: prompt, cachedTokens, cacheWriteTokens } = this.p.usage;
    return {
      input_tokens: prompt - cachedTokens - cacheWriteTokens,
      cache_creation_input_tokens: cacheWriteTokens,
      cache_read_input_tokens: cachedTokens,
      cache_creation: { ephemeral_5m_input_tokens: cacheWriteTokens, ephemeral_1h_input_tokens: 0 },
      output_tokens: output,
      service_tier: 'standard',
    };
  }

  /** The Message; content is empty and the stop reason null as message_start carries it. */
  message(content: object[], stopReason: StopReason | null, output: number): object {
    return {
      id: this.id,
      type: 'message',
      role: 'assistant',
      model: this.request.model,
      content,
      stop_reason: stopReason,
      stop_sequence: stopReason === null ? null : this.stopSequence,
      stop_details: stopReason === 'refusal' ? REFUSAL : null,
      ...(!this.p.wire.noUsage && { usage: this.usage(output) }),
    };
  }

  final(): object {
    return this.message(this.blocks.map(finalBlock), this.stopReason, this.outputTokens);
  }
}

const REFUSAL = { type: 'refusal', category: 'general_harms', explanation: 'The prompt was refused (simulated).' };

function toolUse(call: PlannedCall): Block {
  return { type: 'tool_use', id: `toolu_${call.callId}`, name: call.name, units: call.fragments };
}

function finalBlock(block: Block): object {
  switch (block.type) {
    case 'thinking': {
      const thinking = block.shown ? block.units.join('') : '';
      return { type: 'thinking', thinking, signature: thinkingSignature(thinking) };
    }
    case 'text':
      return { type: 'text', text: block.units.join('') };
    case 'tool_use': {
      // `empty_args=1` sends no fragments: the input stays the empty object it starts as.
      const json = block.units.join('');
      return { type: 'tool_use', id: block.id, name: block.name, input: json === '' ? {} : (JSON.parse(json) as unknown) };
    }
  }
}

/** The block as content_block_start opens it: empty, to be filled by deltas. */
function openedBlock(block: Block): object {
  switch (block.type) {
    case 'thinking':
      return { type: 'thinking', thinking: '', signature: '' };
    case 'text':
      return { type: 'text', text: '' };
    case 'tool_use':
      return { type: 'tool_use', id: block.id, name: block.name, input: {} };
  }
}

/** One event to write; `token` marks a piece that takes a token step (and counts toward `cut_after`). */
interface StreamEvent {
  type: string;
  fields: Record<string, unknown>;
  token?: boolean;
  /** A token step with nothing to send: thinking the client does not see (`display: omitted`). */
  silent?: boolean;
  terminal?: boolean;
}

/**
 * Events as Anthropic sends them (`event:` and `data:` lines). `cut_after=N` fails the stream after
 * N token pieces with an `error` event, `overloaded_error` unless `error=` names another status.
 */
function streamReply(message: MessageShape, p: Plan): SimReply {
  // Like the other families, nothing goes out before the first token: the opening events travel with it.
  return withRequestId(scriptedReply(SSE_HEADERS, false, p.timing.ttftMs, () => streamFrames(message, p)));
}

/** The stream's frames, made as they are asked for; a number closes a token step. */
function* streamFrames(message: MessageShape, p: Plan): Generator<ScriptItem, void, undefined> {
  const intervalMs = tokenIntervalMs(p);
  const { cutAfter } = p.fault;
  const fail = () => {
    const status = p.fault.errorStatus ?? 529;
    const error = errorObject(status, `${FAULT_MESSAGES[status] ?? `Simulated error with status ${status}.`} (simulated)`);
    return eventFrame('error', JSON.stringify({ type: 'error', error }));
  };
  let steps = 0;
  let sent = 0;
  for (const event of streamEvents(message)) {
    if (event.token) {
      if (!event.silent && cutAfter !== undefined && sent >= cutAfter) {
        yield fail();
        return;
      }
      if (steps > 0 && intervalMs > 0) yield intervalMs;
      steps++;
      if (event.silent) continue;
      sent++;
    }
    // A cut beyond the answer's length still fails the stream, before it ends.
    if (event.terminal && cutAfter !== undefined) {
      yield fail();
      return;
    }
    yield eventFrame(event.type, JSON.stringify({ type: event.type, ...event.fields }));
  }
}

function* streamEvents(message: MessageShape): Generator<StreamEvent> {
  const noUsage = message.p.wire.noUsage;
  yield { type: 'message_start', fields: { message: message.message([], null, Math.min(1, message.outputTokens)) } };
  yield { type: 'ping', fields: {} };
  for (const [index, block] of message.blocks.entries()) {
    yield { type: 'content_block_start', fields: { index, content_block: openedBlock(block) } };
    const delta = (d: object) => ({ type: 'content_block_delta', fields: { index, delta: d }, token: true });
    switch (block.type) {
      case 'thinking':
        for (const thinking of block.units) yield block.shown ? delta({ type: 'thinking_delta', thinking }) : { ...delta({}), silent: true };
        yield { type: 'content_block_delta', fields: { index, delta: { type: 'signature_delta', signature: (finalBlock(block) as { signature: string }).signature } } };
        break;
      case 'text':
        for (const text of block.units) yield delta({ type: 'text_delta', text });
        break;
      case 'tool_use':
        // Anthropic opens the input with an empty fragment.
        yield { type: 'content_block_delta', fields: { index, delta: { type: 'input_json_delta', partial_json: '' } } };
        for (const partial_json of block.units) yield delta({ type: 'input_json_delta', partial_json });
        break;
    }
    yield { type: 'content_block_stop', fields: { index } };
  }
  const { input_tokens, cache_creation_input_tokens, cache_read_input_tokens } = message.usage(0) as Record<string, number>;
  const usage = { input_tokens, cache_creation_input_tokens, cache_read_input_tokens, output_tokens: message.outputTokens };
  const delta = { stop_reason: message.stopReason, stop_sequence: message.stopSequence, stop_details: message.stopReason === 'refusal' ? REFUSAL : null };
  yield { type: 'message_delta', fields: { delta, ...(!noUsage && { usage }) }, terminal: true };
  yield { type: 'message_stop', fields: {} };
}

// ---------------------------------------------------------------------------------------------
// Parsing: Anthropic's rules, with messages after its own (`messages.1.content.0.text: …`).

/** The thinking text of a turn: it names the turn, so each turn's signature differs. */
function thinkingText(messages: number): string {
  return `Turn ${messages}: considering the question and planning a clear answer.`;
}

function invalid(message: string): RequestError {
  return new RequestError(message, null, null);
}

/** A parsed turn element: one message of `messages`, with what the pairing checks need. */
interface Turn {
  index: number;
  role: 'user' | 'assistant';
  blocks: Record<string, unknown>[];
}

export function parseMessagesRequest(body: unknown, headers: Record<string, string>, fields = MESSAGE_FIELDS): MessagesRequest {
  if (!isRecord(body)) throw invalid('Input should be a valid dictionary');
  const betas = new Set((headers['anthropic-beta'] ?? '').split(',').map((b) => b.trim()));
  for (const key of Object.keys(body)) {
    const beta = BETA_FIELDS.find(([field]) => field === key)?.[1];
    if (!fields.has(key) || (beta !== undefined && !betas.has(beta))) throw invalid(`${key}: Extra inputs are not permitted`);
  }
  const counting = fields === COUNT_FIELDS;
  if (body.model === undefined) throw invalid('model: Field required');
  if (typeof body.model !== 'string' || body.model === '') throw invalid('model: Input should be a valid string');
  let maxTokens: number | undefined;
  if (!counting) {
    if (body.max_tokens === undefined) throw invalid('max_tokens: Field required');
    maxTokens = integer(body.max_tokens, 'max_tokens', 0);
  }
  const stream = body.stream === undefined ? false : boolean(body.stream, 'stream');

  const system: SimMessage[] = [];
  if (body.system !== undefined) {
    const text = systemText(body.system);
    if (text !== '') system.push({ role: 'system', text, images: 0 });
  }
  if (body.messages === undefined) throw invalid('messages: Field required');
  if (!Array.isArray(body.messages)) throw invalid('messages: Input should be a valid list');
  if (body.messages.length === 0) throw invalid('messages: at least one message is required');
  const turns: Turn[] = [];
  const messages: SimMessage[] = [];
  body.messages.forEach((raw: unknown, i) => {
    const parsed = parseMessage(raw, i, turns.length === 0, betas);
    // Mid-conversation system text joins the system prompt: it steers the answer, it is no turn.
    if (parsed.role === 'system') system.push(...parsed.sim);
    else {
      turns.push({ index: i, role: parsed.role, blocks: parsed.blocks });
      messages.push(...parsed.sim);
    }
  });

  const tools = parseTools(body.tools);
  const choice = parseToolChoice(body.tool_choice, tools);
  const thinking = parseThinking(body.thinking, maxTokens);
  if (thinking) {
    if (body.temperature !== undefined && body.temperature !== 1) {
      throw invalid(`\`temperature\` may only be set to 1 when thinking is enabled. ${THINKING_DOCS}#feature-compatibility`);
    }
    if (body.top_k !== undefined) throw invalid(`\`top_k\` must be unset when thinking is enabled. ${THINKING_DOCS}#feature-compatibility`);
    if (choice.forced) throw invalid('Thinking may not be enabled when tool_choice forces tool use.');
  }
  number(body.temperature, 'temperature', 0, 1);
  number(body.top_p, 'top_p', 0, 1);
  if (body.top_k !== undefined) integer(body.top_k, 'top_k', 0);
  parseMetadata(body.metadata);
  const format = parseOutputConfig(body.output_config, 'output_config');
  const stop = parseStopSequences(body.stop_sequences);
  checkTurns(turns, thinking !== undefined);

  const all = [...system, ...messages];
  let units: string[] | undefined;
  let answerBudget = maxTokens;
  if (thinking) {
    units = fragments(thinkingText(body.messages.length));
    if (thinking.budget !== undefined) units = units.slice(0, thinking.budget);
    if (maxTokens !== undefined) units = units.slice(0, maxTokens);
    if (answerBudget !== undefined) answerBudget -= units.length;
  }
  return {
    model: body.model,
    stream,
    input: { messages: all, tools, toolChoice: choice.toolChoice, responseFormat: format ?? 'text', maxTokens: answerBudget, stop, n: 1 },
    ...(units && thinking && { thinking: { units, shown: thinking.shown } }),
    singleCall: choice.singleCall,
  };
}

function systemText(raw: unknown): string {
  if (typeof raw === 'string') return raw;
  if (!Array.isArray(raw)) throw invalid('system: Input should be a valid string or a valid list');
  return raw
    .map((block: unknown, j) => {
      const where = `system.${j}`;
      if (!isRecord(block) || block.type !== 'text') throw invalid(`${where}.type: Input should be 'text'`);
      return textOf(block, where);
    })
    .join('\n');
}

function parseMessage(
  raw: unknown,
  i: number,
  first: boolean,
  betas: Set<string>,
): { role: 'system'; sim: SimMessage[] } | { role: 'user' | 'assistant'; sim: SimMessage[]; blocks: Record<string, unknown>[] } {
  const where = `messages.${i}`;
  if (!isRecord(raw)) throw invalid(`${where}: Input should be a valid dictionary`);
  for (const key of Object.keys(raw)) {
    const allowed = key === 'role' || key === 'content' || (key === 'output_config' && betas.has(PER_TURN_BETA));
    if (!allowed) throw invalid(`${where}.${key}: Extra inputs are not permitted`);
  }
  if (raw.output_config !== undefined) parseOutputConfig(raw.output_config, `${where}.output_config`);
  const { role, content } = raw;
  if (role !== 'user' && role !== 'assistant' && role !== 'system') throw invalid(`${where}.role: Input should be 'user', 'assistant' or 'system'`);
  if (content === undefined) throw invalid(`${where}.content: Field required`);
  if (typeof content !== 'string' && !Array.isArray(content)) throw invalid(`${where}.content: Input should be a valid string or a valid list`);

  if (role === 'system') {
    if (first) throw invalid(`${where}: a \`system\` message must follow a \`user\` message`);
    const blocks = typeof content === 'string' ? [{ type: 'text', text: content }] : content;
    const text = blocks
      .map((block: unknown, j) => {
        if (!isRecord(block) || block.type !== 'text') throw invalid(`${where}.content.${j}.type: Input should be 'text'`);
        return textOf(block, `${where}.content.${j}`);
      })
      .join('\n');
    return { role, sim: [{ role: 'system', text, images: 0 }] };
  }
  if (typeof content === 'string') {
    if (role === 'user' && content.trim() === '') throw invalid(`${where}: user messages must have non-empty content`);
    return { role, sim: [{ role, text: content, images: 0 }], blocks: content === '' ? [] : [{ type: 'text', text: content }] };
  }
  if (role === 'user' && content.length === 0) throw invalid(`${where}: user messages must have non-empty content`);
  const allowed = role === 'user' ? USER_BLOCKS : ASSISTANT_BLOCKS;
  const texts: string[] = [];
  const results: SimMessage[] = [];
  const toolCalls: { name: string; argumentsJson: string }[] = [];
  let images = 0;
  const blocks = content.map((block: unknown, j): Record<string, unknown> => {
    const at = `${where}.content.${j}`;
    if (!isRecord(block)) throw invalid(`${at}: Input should be a valid dictionary`);
    if (!allowed.includes(block.type as string)) {
      const known = [...USER_BLOCKS, ...ASSISTANT_BLOCKS].includes(block.type as string);
      if (known) throw invalid(`${at}: \`${tag(block.type)}\` blocks are not allowed in \`${role}\` messages`);
      throw invalid(`${at}: Input tag '${tag(block.type)}' found using 'type' does not match any of the expected tags: ${allowed.map((t) => `'${t}'`).join(', ')}`);
    }
    switch (block.type) {
      case 'text':
        texts.push(textOf(block, at));
        break;
      case 'image':
        checkImage(block, at);
        images++;
        break;
      case 'document':
      case 'search_result':
        texts.push(looseText(block));
        break;
      case 'tool_result': {
        const result = parseToolResult(block, at);
        results.push({ role: 'tool', text: result.text, images: result.images });
        break;
      }
      case 'tool_use':
        checkToolUse(block, at);
        toolCalls.push({ name: block.name as string, argumentsJson: JSON.stringify(block.input) });
        break;
      case 'thinking':
        if (typeof block.thinking !== 'string') throw invalid(`${at}.thinking.thinking: Field required`);
        if (block.signature === undefined) throw invalid(`${at}.thinking.signature: Field required`);
        if (block.signature !== thinkingSignature(block.thinking)) throw invalid(`${at}: Invalid \`signature\` in \`thinking\` block`);
        break;
      case 'redacted_thinking':
        if (typeof block.data !== 'string' || block.data === '') throw invalid(`${at}.redacted_thinking.data: Field required`);
        break;
    }
    return block;
  });
  // A user turn's own words come before its tool results, so the engine answers the results (the last message).
  const sim: SimMessage[] = [];
  if (texts.length > 0 || images > 0 || role === 'assistant') sim.push({ role, text: texts.join('\n'), images, ...(toolCalls.length > 0 && { toolCalls }) });
  sim.push(...results);
  return { role, sim, blocks };
}

/** A text block's text: Anthropic refuses empty and whitespace-only text. */
function textOf(block: Record<string, unknown>, at: string): string {
  if (typeof block.text !== 'string') throw invalid(`${at}.text: Field required`);
  if (block.text === '') throw invalid(`${at}.text: text content blocks must be non-empty`);
  if (block.text.trim() === '') throw invalid(`${at}.text: text content blocks must contain non-whitespace text`);
  return block.text;
}

/** Text a document or search result carries, for token counts; what else it holds is not checked. */
function looseText(block: Record<string, unknown>): string {
  const source = block.source;
  if (isRecord(source) && source.type === 'text' && typeof source.data === 'string') return source.data;
  if (Array.isArray(block.content)) return block.content.map((c: unknown) => (isRecord(c) && typeof c.text === 'string' ? c.text : '')).join('\n');
  return '';
}

function checkImage(block: Record<string, unknown>, at: string): void {
  const source = block.source;
  if (!isRecord(source)) throw invalid(`${at}.source: Field required`);
  if (source.type === 'base64') {
    if (!IMAGE_TYPES.has(source.media_type as string)) {
      throw invalid(`${at}.source.base64.media_type: Input should be 'image/jpeg', 'image/png', 'image/gif' or 'image/webp'`);
    }
    if (typeof source.data !== 'string' || source.data === '') throw invalid(`${at}.source.base64.data: Field required`);
  } else if (source.type === 'url') {
    if (typeof source.url !== 'string' || !/^https?:\/\//.test(source.url)) throw invalid(`${at}.source.url.url: Input should be a valid URL`);
  } else if (source.type !== 'file') {
    throw invalid(`${at}.source: Input tag '${tag(source.type)}' found using 'type' does not match any of the expected tags: 'base64', 'url', 'file'`);
  }
}

/** A client's value in an error message: an object may make `String()` throw (`{"toString": ""}`). */
function tag(value: unknown): string {
  return typeof value === 'string' ? value : (JSON.stringify(value) ?? typeof value);
}

function checkToolUse(block: Record<string, unknown>, at: string): void {
  if (typeof block.id !== 'string' || !TOOL_ID.test(block.id)) throw invalid(`${at}.tool_use.id: String should match pattern '^[a-zA-Z0-9_-]+$'`);
  if (typeof block.name !== 'string' || block.name === '') throw invalid(`${at}.tool_use.name: Field required`);
  if (!isRecord(block.input)) throw invalid(`${at}.tool_use.input: Input should be a valid dictionary`);
}

function parseToolResult(block: Record<string, unknown>, at: string): { text: string; images: number } {
  if (typeof block.tool_use_id !== 'string' || !TOOL_ID.test(block.tool_use_id)) {
    throw invalid(`${at}.tool_result.tool_use_id: String should match pattern '^[a-zA-Z0-9_-]+$'`);
  }
  if (block.is_error !== undefined) boolean(block.is_error, `${at}.tool_result.is_error`);
  const { content } = block;
  if (content === undefined || typeof content === 'string') return { text: content ?? '', images: 0 };
  if (!Array.isArray(content)) throw invalid(`${at}.tool_result.content: Input should be a valid string or a valid list`);
  const texts: string[] = [];
  let images = 0;
  content.forEach((part: unknown, k) => {
    const where = `${at}.tool_result.content.${k}`;
    if (!isRecord(part) || !RESULT_BLOCKS.includes(part.type as string)) {
      throw invalid(`${where}: Input tag '${tag(isRecord(part) ? part.type : part)}' found using 'type' does not match any of the expected tags: ${RESULT_BLOCKS.map((t) => `'${t}'`).join(', ')}`);
    }
    if (part.type === 'text') texts.push(textOf(part, where));
    else if (part.type === 'image') {
      checkImage(part, where);
      images++;
    } else texts.push(looseText(part));
  });
  return { text: texts.join('\n'), images };
}

/**
 * Anthropic's rules across turns (consecutive same-role messages merge into one turn): every
 * `tool_use` is answered in the next turn, whose tool results come first; every tool result answers
 * a call of the turn before. With thinking on, the assistant turn whose calls the last turn answers
 * starts with its thinking.
 */
function checkTurns(turns: Turn[], thinking: boolean): void {
  const merged: Turn[] = [];
  for (const turn of turns) {
    const prev = merged.at(-1);
    if (prev && prev.role === turn.role) merged[merged.length - 1] = { ...prev, blocks: [...prev.blocks, ...turn.blocks] };
    else merged.push({ ...turn, blocks: [...turn.blocks] });
  }
  merged.forEach((turn, t) => {
    const before = merged[t - 1];
    const asked = new Set(before?.role === 'assistant' ? before.blocks.filter((b) => b.type === 'tool_use').map((b) => b.id as string) : []);
    if (turn.role === 'assistant') {
      const ids = turn.blocks.filter((b) => b.type === 'tool_use').map((b) => b.id as string);
      const next = merged[t + 1];
      const answered = new Set(next?.blocks.filter((b) => b.type === 'tool_result').map((b) => b.tool_use_id as string) ?? []);
      const missing = ids.filter((id) => !answered.has(id));
      if (missing.length > 0) {
        throw invalid(
          `messages.${turn.index}: \`tool_use\` ids were found without \`tool_result\` blocks immediately after: ${missing.join(', ')}. ` +
            'Each `tool_use` block must have a corresponding `tool_result` block in the next message.',
        );
      }
      return;
    }
    let seenOther = false;
    turn.blocks.forEach((block, k) => {
      if (block.type !== 'tool_result') {
        seenOther = true;
        return;
      }
      if (!asked.has(block.tool_use_id as string)) {
        throw invalid(
          `messages.${turn.index}.content.${k}: unexpected \`tool_use_id\` found in \`tool_result\` blocks: ${tag(block.tool_use_id)}. ` +
            'Each `tool_result` block must have a corresponding `tool_use` block in the previous message.',
        );
      }
      if (seenOther) throw invalid(`messages.${turn.index}: \`tool_result\` blocks must come first in the content of a \`user\` message, before any other block.`);
    });
  });
  const last = merged.at(-1);
  const caller = merged.at(-2);
  if (!thinking || !last || !caller || !last.blocks.some((b) => b.type === 'tool_result')) return;
  const first = caller.blocks[0];
  if (first?.type !== 'thinking' && first?.type !== 'redacted_thinking') {
    throw invalid(
      `messages.${caller.index}.content.0.type: Expected \`thinking\` or \`redacted_thinking\`, but found \`${tag(first?.type ?? 'nothing')}\`. ` +
        'When `thinking` is enabled, a final `assistant` message must start with a thinking block (preceeding the lastmost set of `tool_use` and `tool_result` blocks). ' +
        `We recommend you include thinking blocks from previous turns. To avoid this requirement, disable \`thinking\`. ${THINKING_DOCS}`,
    );
  }
}

function parseTools(raw: unknown): SimTool[] {
  if (raw === undefined) return [];
  if (!Array.isArray(raw)) throw invalid('tools: Input should be a valid list');
  const names = new Set<string>();
  const tools: SimTool[] = [];
  raw.forEach((tool: unknown, i) => {
    const where = `tools.${i}`;
    if (!isRecord(tool)) throw invalid(`${where}: Input should be a valid dictionary`);
    const name = tool.name;
    // Server tools (`web_search_20250305`, …) are typed; the simulator accepts them and never runs them.
    const server = tool.type !== undefined && tool.type !== 'custom';
    if (typeof name !== 'string' || !TOOL_NAME.test(name)) throw invalid(`${where}.${server ? tool.type : 'custom'}.name: String should match pattern '^[a-zA-Z0-9_-]{1,128}$'`);
    if (names.has(name)) throw invalid('tools: Tool names must be unique.');
    names.add(name);
    if (server) return;
    const schema = tool.input_schema;
    if (schema === undefined) throw invalid(`${where}.custom.input_schema: Field required`);
    if (!isRecord(schema) || schema.type !== 'object') throw invalid(`${where}.custom.input_schema.type: Input should be 'object'`);
    tools.push({ name, parameters: schema as JsonSchema, ...(tool.defer_loading === true && { deferred: true }) });
  });
  return tools;
}

function parseToolChoice(raw: unknown, tools: SimTool[]): { toolChoice: ToolChoice; forced: boolean; singleCall: boolean } {
  if (raw === undefined) return { toolChoice: tools.length > 0 ? 'auto' : 'none', forced: false, singleCall: false };
  if (!isRecord(raw)) throw invalid('tool_choice: Input should be a valid dictionary');
  const singleCall = raw.disable_parallel_tool_use === undefined ? false : boolean(raw.disable_parallel_tool_use, `tool_choice.${tag(raw.type)}.disable_parallel_tool_use`);
  switch (raw.type) {
    case 'auto':
      return { toolChoice: tools.length > 0 ? 'auto' : 'none', forced: false, singleCall };
    case 'none':
      return { toolChoice: 'none', forced: false, singleCall };
    case 'any':
      if (tools.length === 0) throw invalid('tool_choice: `tool_choice` may only be specified while providing tools.');
      return { toolChoice: 'required', forced: true, singleCall };
    case 'tool': {
      if (typeof raw.name !== 'string') throw invalid('tool_choice.tool.name: Field required');
      const name = raw.name;
      if (!tools.some((t) => t.name === name)) throw invalid(`tool_choice.tool.name: Tool '${name}' not found in the provided tools.`);
      return { toolChoice: { name }, forced: true, singleCall };
    }
    default:
      throw invalid(`tool_choice: Input tag '${tag(raw.type)}' found using 'type' does not match any of the expected tags: 'auto', 'any', 'tool', 'none'`);
  }
}

/** Thinking that is on: its budget (`enabled`) and whether its text is shown. Undefined when off. */
function parseThinking(raw: unknown, maxTokens: number | undefined): { budget?: number; shown: boolean } | undefined {
  if (raw === undefined) return undefined;
  if (!isRecord(raw)) throw invalid('thinking: Input should be a valid dictionary');
  const display = raw.display;
  if (display !== undefined && !DISPLAYS.has(display as string)) throw invalid(`thinking.${tag(raw.type)}.display: Input should be 'summarized', 'omitted' or 'updates'`);
  const shown = display !== 'omitted';
  switch (raw.type) {
    case 'disabled':
      return undefined;
    case 'adaptive':
      return { shown };
    case 'enabled': {
      if (raw.budget_tokens === undefined) throw invalid('thinking.enabled.budget_tokens: Field required');
      const budget = integer(raw.budget_tokens, 'thinking.enabled.budget_tokens', MIN_THINKING_BUDGET);
      if (maxTokens !== undefined && maxTokens <= budget) {
        throw invalid(`\`max_tokens\` must be greater than \`thinking.budget_tokens\`. ${THINKING_DOCS}#max-tokens-and-context-window-size`);
      }
      return { budget, shown };
    }
    default:
      throw invalid(`thinking: Input tag '${tag(raw.type)}' found using 'type' does not match any of the expected tags: 'adaptive', 'disabled', 'enabled'`);
  }
}

/** `output_config`: `effort` is checked, a JSON schema `format` shapes the answer. */
function parseOutputConfig(raw: unknown, where: string): { schema: JsonSchema } | undefined {
  if (raw === undefined) return undefined;
  if (!isRecord(raw)) throw invalid(`${where}: Input should be a valid dictionary`);
  for (const key of Object.keys(raw)) if (key !== 'effort' && key !== 'format') throw invalid(`${where}.${key}: Extra inputs are not permitted`);
  if (raw.effort !== undefined && !EFFORTS.has(raw.effort as string)) throw invalid(`${where}.effort: Input should be 'low', 'medium', 'high', 'xhigh' or 'max'`);
  if (raw.format === undefined || raw.format === null) return undefined;
  if (!isRecord(raw.format) || raw.format.type !== 'json_schema') throw invalid(`${where}.format.type: Input should be 'json_schema'`);
  if (!isRecord(raw.format.schema)) throw invalid(`${where}.format.json_schema.schema: Field required`);
  return { schema: raw.format.schema };
}

function parseMetadata(raw: unknown): void {
  if (raw === undefined) return;
  if (!isRecord(raw)) throw invalid('metadata: Input should be a valid dictionary');
  for (const key of Object.keys(raw)) if (key !== 'user_id') throw invalid(`metadata.${key}: Extra inputs are not permitted`);
  if (raw.user_id !== undefined && raw.user_id !== null && typeof raw.user_id !== 'string') throw invalid('metadata.user_id: Input should be a valid string');
}

function parseStopSequences(raw: unknown): string[] {
  if (raw === undefined) return [];
  if (!Array.isArray(raw)) throw invalid('stop_sequences: Input should be a valid list');
  raw.forEach((s: unknown, i) => {
    if (typeof s !== 'string') throw invalid(`stop_sequences.${i}: Input should be a valid string`);
    if (s.trim() === '') throw invalid('stop_sequences: each stop sequence must contain non-whitespace characters');
  });
  return raw as string[];
}

function integer(raw: unknown, where: string, min: number): number {
  if (typeof raw !== 'number' || !Number.isInteger(raw)) throw invalid(`${where}: Input should be a valid integer`);
  if (raw < min) throw invalid(`${where}: Input should be greater than or equal to ${min}`);
  return raw;
}

function number(raw: unknown, where: string, min: number, max: number): void {
  if (raw === undefined) return;
  if (typeof raw !== 'number' || !Number.isFinite(raw)) throw invalid(`${where}: Input should be a valid number`);
  if (raw < min) throw invalid(`${where}: Input should be greater than or equal to ${min}`);
  if (raw > max) throw invalid(`${where}: Input should be less than or equal to ${max}`);
}

function boolean(raw: unknown, where: string): boolean {
  if (typeof raw !== 'boolean') throw invalid(`${where}: Input should be a valid boolean`);
  return raw;
}
