/**
 * The simulator's OpenAI Chat Completions face: parses a request body into the engine's neutral
 * input and renders the plan the way OpenAI does, as a reply script (status, headers, timed byte
 * steps) that a transport plays out, in process or over a socket.
 */
import { randomBytes } from 'node:crypto';
import { dataFrame } from '../../../src/sse.js';
import {
  plan,
  units,
  type ChoicePlan,
  type EngineInput,
  type JsonSchema,
  type Plan,
  type ResponseFormat,
  type Role,
  type SimMessage,
  type SimTool,
  type SimToolCall,
  type ToolChoice,
} from './engine.js';

export interface ReplyStep {
  /** Wait this long after the previous step (or the request) before writing. */
  delayMs: number;
  bytes: string;
}

/** A complete scripted response. Headers go out with the first step. */
export interface SimReply {
  status: number;
  headers: Record<string, string>;
  steps: ReplyStep[];
  /** After the last step the transport closes abruptly instead of ending cleanly. */
  cut: boolean;
}

export interface ChatOptions {
  /** Model ids listed by `GET /models`. */
  models: string[];
}

export const DEFAULT_MODELS = ['sim-chat', 'sim-chat-basic'];

/** A parsed chat request: wire-level switches plus the engine's neutral view. */
export interface ChatRequest {
  model: string;
  stream: boolean;
  includeUsage: boolean;
  input: EngineInput;
}

/** A request the simulator refuses with 400, in OpenAI's terms. */
export class ChatRequestError extends Error {
  constructor(
    message: string,
    readonly param: string | null,
    readonly code: string | null,
  ) {
    super(message);
  }
}

const JSON_HEADERS = { 'content-type': 'application/json' };
const SSE_HEADERS = { 'content-type': 'text/event-stream; charset=utf-8' };
const FINGERPRINT = 'fp_simulator';
/** Fixed, so model lists are byte-identical across runs. */
const MODELS_CREATED = 1_700_000_000;
const MAX_CHOICES = 128;

/** Serves the chat routes (paths relative to the API root, e.g. `/chat/completions`); undefined for any other. */
export function routeChat(method: string, path: string, body: Buffer | string | undefined, options: ChatOptions): SimReply | undefined {
  const bare = path.split('?', 1)[0];
  if (method === 'POST' && bare === '/chat/completions') return chatCompletion(body);
  if (method === 'GET' && bare === '/models') return modelList(options.models);
  return undefined;
}

export function notFound(method: string, path: string): SimReply {
  return errorReply(404, `Invalid URL (${method} ${path})`, 'invalid_request_error', null, null);
}

export function chatCompletion(body: Buffer | string | undefined): SimReply {
  let parsed: unknown;
  try {
    parsed = JSON.parse(typeof body === 'string' ? body : (body?.toString('utf8') ?? ''));
  } catch {
    return errorReply(400, 'The request body is not valid JSON.', 'invalid_request_error', null, null);
  }
  let request: ChatRequest;
  try {
    request = parseChatRequest(parsed);
  } catch (err) {
    if (!(err instanceof ChatRequestError)) throw err;
    return errorReply(400, err.message, 'invalid_request_error', err.param, err.code);
  }
  return renderChat(request, plan(request.input));
}

export function renderChat(request: ChatRequest, p: Plan): SimReply {
  if (p.fault.errorStatus !== undefined) return faultReply(p.fault.errorStatus);
  const id = `chatcmpl-${randomId(29)}`;
  const created = Math.floor(Date.now() / 1000);
  return request.stream ? streamReply(request, p, id, created) : completionReply(request, p, id, created);
}

export function modelList(models: string[]): SimReply {
  const data = models.map((id) => ({ id, object: 'model', created: MODELS_CREATED, owned_by: 'sluice-simulator' }));
  return jsonReply(200, { object: 'list', data });
}

export function errorReply(status: number, message: string, type: string, param: string | null, code: string | null): SimReply {
  return jsonReply(status, { error: { message, type, param, code } });
}

// ---------------------------------------------------------------------------------------------
// Rendering

function completionReply(request: ChatRequest, p: Plan, id: string, created: number): SimReply {
  const choices = p.choices.map((choice, index) => ({
    index,
    message:
      choice.kind === 'text'
        ? { role: 'assistant', content: choice.tokens.join(''), refusal: null, annotations: [] }
        : { role: 'assistant', content: null, refusal: null, annotations: [], tool_calls: [toolCall(choice)] },
    logprobs: null,
    finish_reason: choice.finishReason,
  }));
  const body = {
    id,
    object: 'chat.completion',
    created,
    model: request.model,
    choices,
    usage: usage(p),
    service_tier: 'default',
    system_fingerprint: FINGERPRINT,
  };
  // A non-stream answer arrives when the last token would have.
  return jsonReply(200, body, generationMs(p));
}

function streamReply(request: ChatRequest, p: Plan, id: string, created: number): SimReply {
  const head =
    `{"id":${JSON.stringify(id)},"object":"chat.completion.chunk","created":${created},` +
    `"model":${JSON.stringify(request.model)},"service_tier":"default","system_fingerprint":"${FINGERPRINT}","choices":[`;
  const chunk = (choice: object) => dataFrame(head + JSON.stringify(choice) + (request.includeUsage ? '],"usage":null}' : ']}'));

  const steps: ReplyStep[] = [];
  let frames: string[] = [];
  let delayMs = p.timing.ttftMs;
  const flush = (nextDelayMs: number) => {
    if (frames.length > 0) steps.push({ delayMs, bytes: frames.join('') });
    frames = [];
    delayMs = nextDelayMs;
  };

  // The opening chunks go out with the first token, after the ttft delay.
  p.choices.forEach((choice, index) => {
    frames.push(chunk(openingDelta(index, choice)));
    if (choice.kind === 'tool_call') {
      const header = { index: 0, id: `call_${choice.callId}`, type: 'function', function: { name: choice.name, arguments: '' } };
      frames.push(chunk(choiceDelta(index, { tool_calls: [header] })));
    }
  });

  const intervalMs = p.timing.tokensPerSecond > 0 ? 1000 / p.timing.tokensPerSecond : 0;
  const { cutAfter } = p.fault;
  const positions = longestAnswer(p);
  let emitted = 0;
  for (let pos = 0; pos < positions; pos++) {
    if (pos > 0 && intervalMs > 0) flush(intervalMs);
    for (const [index, choice] of p.choices.entries()) {
      const unit = units(choice)[pos];
      if (unit === undefined) continue;
      if (cutAfter !== undefined && emitted >= cutAfter) return cutReply(steps, flush);
      frames.push(chunk(unitDelta(index, choice, unit)));
      emitted++;
    }
  }
  // A cut beyond the answer's length still drops the connection, before the finish.
  if (cutAfter !== undefined) return cutReply(steps, flush);

  p.choices.forEach((choice, index) => frames.push(chunk({ index, delta: {}, logprobs: null, finish_reason: choice.finishReason })));
  if (request.includeUsage) frames.push(dataFrame(`${head}],"usage":${JSON.stringify(usage(p))}}`));
  frames.push(dataFrame('[DONE]'));
  flush(0);
  return { status: 200, headers: { ...SSE_HEADERS }, steps, cut: false };
}

function cutReply(steps: ReplyStep[], flush: (nextDelayMs: number) => void): SimReply {
  flush(0);
  return { status: 200, headers: { ...SSE_HEADERS }, steps, cut: true };
}

function openingDelta(index: number, choice: ChoicePlan): object {
  // OpenAI opens a tool-call answer with null content, a text answer with an empty string.
  return choiceDelta(index, { role: 'assistant', content: choice.kind === 'text' ? '' : null });
}

function unitDelta(index: number, choice: ChoicePlan, unit: string): object {
  if (choice.kind === 'text') return choiceDelta(index, { content: unit });
  return choiceDelta(index, { tool_calls: [{ index: 0, function: { arguments: unit } }] });
}

function choiceDelta(index: number, delta: object): object {
  return { index, delta, logprobs: null, finish_reason: null };
}

function toolCall(choice: Extract<ChoicePlan, { kind: 'tool_call' }>): object {
  return { id: `call_${choice.callId}`, type: 'function', function: { name: choice.name, arguments: choice.argumentsJson } };
}

function usage(p: Plan): object {
  const { inputTokens, outputTokens } = p.usage;
  return {
    prompt_tokens: inputTokens,
    completion_tokens: outputTokens,
    total_tokens: inputTokens + outputTokens,
    prompt_tokens_details: { cached_tokens: 0 },
    completion_tokens_details: { reasoning_tokens: 0 },
  };
}

/** Time until the last token: ttft, then one interval per further token. */
function generationMs(p: Plan): number {
  const tps = p.timing.tokensPerSecond;
  const positions = longestAnswer(p);
  return p.timing.ttftMs + (tps > 0 && positions > 1 ? ((positions - 1) * 1000) / tps : 0);
}

/** Choices are generated side by side, so the longest one sets the number of token steps. */
function longestAnswer(p: Plan): number {
  return Math.max(0, ...p.choices.map((c) => units(c).length));
}

function faultReply(status: number): SimReply {
  if (status === 429) return errorReply(status, 'Rate limit reached (simulated).', 'requests', null, 'rate_limit_exceeded');
  if (status >= 500) return errorReply(status, 'The server had an error while processing your request (simulated).', 'server_error', null, null);
  if (status === 401) return errorReply(status, 'Incorrect API key provided (simulated).', 'invalid_request_error', null, 'invalid_api_key');
  return errorReply(status, `Simulated error with status ${status}.`, 'invalid_request_error', null, null);
}

function jsonReply(status: number, body: unknown, delayMs = 0): SimReply {
  return { status, headers: { ...JSON_HEADERS }, steps: [{ delayMs, bytes: JSON.stringify(body) }], cut: false };
}

const ID_ALPHABET = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789';

function randomId(length: number): string {
  let id = '';
  for (const byte of randomBytes(length)) id += ID_ALPHABET[byte % ID_ALPHABET.length];
  return id;
}

// ---------------------------------------------------------------------------------------------
// Parsing: light validation, OpenAI-style messages for what is refused.

const ROLES = new Map<unknown, Role>([
  ['system', 'system'],
  ['developer', 'system'],
  ['user', 'user'],
  ['assistant', 'assistant'],
  ['tool', 'tool'],
  ['function', 'tool'],
]);

export function parseChatRequest(body: unknown): ChatRequest {
  if (!isRecord(body)) throw new ChatRequestError('The request body must be a JSON object.', null, 'invalid_type');
  if (typeof body.model !== 'string' || body.model === '') throw new ChatRequestError('You must provide a model parameter.', 'model', null);
  if (!Array.isArray(body.messages)) {
    const missing = body.messages === undefined;
    throw new ChatRequestError(
      missing ? "Missing required parameter: 'messages'." : "Invalid type for 'messages': expected an array.",
      'messages',
      missing ? 'missing_required_parameter' : 'invalid_type',
    );
  }
  if (body.messages.length === 0) throw new ChatRequestError("Invalid 'messages': empty array.", 'messages', 'empty_array');

  const stream = optionalBoolean(body.stream, 'stream') ?? false;
  let includeUsage = false;
  if (body.stream_options !== undefined && body.stream_options !== null) {
    if (!stream) throw new ChatRequestError("The 'stream_options' parameter is only allowed when 'stream' is enabled.", 'stream_options', 'invalid_value');
    if (!isRecord(body.stream_options)) throw new ChatRequestError("Invalid type for 'stream_options': expected an object.", 'stream_options', 'invalid_type');
    includeUsage = body.stream_options.include_usage === true;
  }

  const tools = parseTools(body.tools);
  const n = positiveInteger(body.n, 'n') ?? 1;
  if (n > MAX_CHOICES) throw new ChatRequestError(`Invalid 'n': expected a value <= ${MAX_CHOICES}.`, 'n', 'integer_above_max_value');
  return {
    model: body.model,
    stream,
    includeUsage,
    input: {
      messages: body.messages.map(parseMessage),
      tools,
      toolChoice: parseToolChoice(body.tool_choice, tools),
      responseFormat: parseResponseFormat(body.response_format),
      maxTokens: positiveInteger(body.max_completion_tokens, 'max_completion_tokens') ?? positiveInteger(body.max_tokens, 'max_tokens'),
      stop: parseStop(body.stop),
      n,
    },
  };
}

function parseMessage(raw: unknown, i: number): SimMessage {
  const where = `messages[${i}]`;
  if (!isRecord(raw)) throw new ChatRequestError(`Invalid type for '${where}': expected an object.`, where, 'invalid_type');
  const role = ROLES.get(raw.role);
  if (!role) throw new ChatRequestError(`Invalid value for '${where}.role': ${JSON.stringify(raw.role)}.`, `${where}.role`, 'invalid_value');
  const message: SimMessage = { role, text: '', images: 0 };
  const { content } = raw;
  if (typeof content === 'string') message.text = content;
  else if (Array.isArray(content)) {
    const texts: string[] = [];
    for (const part of content) {
      if (!isRecord(part)) throw new ChatRequestError(`Invalid type for '${where}.content': parts must be objects.`, `${where}.content`, 'invalid_type');
      if (part.type === 'text' && typeof part.text === 'string') texts.push(part.text);
      else if (part.type === 'refusal' && typeof part.refusal === 'string') texts.push(part.refusal);
      else if (part.type === 'image_url') message.images++;
    }
    message.text = texts.join('\n');
  } else if (content !== undefined && content !== null) {
    throw new ChatRequestError(`Invalid type for '${where}.content': expected a string or an array.`, `${where}.content`, 'invalid_type');
  }
  if (Array.isArray(raw.tool_calls)) message.toolCalls = raw.tool_calls.flatMap(parseToolCall);
  return message;
}

function parseToolCall(raw: unknown): SimToolCall[] {
  if (!isRecord(raw)) return [];
  const fn = isRecord(raw.function) ? raw.function : isRecord(raw.custom) ? raw.custom : {};
  const args = typeof fn.arguments === 'string' ? fn.arguments : typeof fn.input === 'string' ? fn.input : '';
  return [{ name: typeof fn.name === 'string' ? fn.name : '', argumentsJson: args }];
}

function parseTools(raw: unknown): SimTool[] {
  if (raw === undefined || raw === null) return [];
  if (!Array.isArray(raw)) throw new ChatRequestError("Invalid type for 'tools': expected an array.", 'tools', 'invalid_type');
  return raw.flatMap((tool: unknown, i): SimTool[] => {
    // Custom (free-form) tools are accepted but never called.
    if (isRecord(tool) && tool.type === 'custom') return [];
    if (isRecord(tool) && tool.type === 'function' && isRecord(tool.function) && typeof tool.function.name === 'string') {
      const { parameters } = tool.function;
      return [{ name: tool.function.name, parameters: isSchema(parameters) ? parameters : undefined }];
    }
    throw new ChatRequestError(`Invalid value for 'tools[${i}]': expected a function tool with a name.`, `tools[${i}]`, 'invalid_value');
  });
}

function parseToolChoice(raw: unknown, tools: SimTool[]): ToolChoice {
  if (raw === undefined || raw === null) return tools.length > 0 ? 'auto' : 'none';
  if (raw === 'auto' || raw === 'none' || raw === 'required') return raw;
  if (isRecord(raw)) {
    if (raw.type === 'custom') return 'none';
    let name: unknown;
    if (raw.type === 'function' && isRecord(raw.function)) name = raw.function.name;
    else if (raw.type === 'allowed_tools' && isRecord(raw.allowed_tools) && Array.isArray(raw.allowed_tools.tools)) {
      // The simulator always calls, and the first allowed function is its pick.
      const first: unknown = raw.allowed_tools.tools.find((t: unknown) => isRecord(t) && t.type === 'function');
      name = isRecord(first) && isRecord(first.function) ? first.function.name : undefined;
    }
    if (typeof name === 'string') {
      if (tools.some((t) => t.name === name)) return { name };
      throw new ChatRequestError(`Invalid value for 'tool_choice': no function named '${name}' in 'tools'.`, 'tool_choice', 'invalid_value');
    }
  }
  throw new ChatRequestError("Invalid value for 'tool_choice'.", 'tool_choice', 'invalid_value');
}

function parseResponseFormat(raw: unknown): ResponseFormat {
  if (raw === undefined || raw === null) return 'text';
  if (!isRecord(raw)) throw new ChatRequestError("Invalid type for 'response_format': expected an object.", 'response_format', 'invalid_type');
  if (raw.type === 'text' || raw.type === 'json_object') return raw.type;
  if (raw.type === 'json_schema') {
    if (!isRecord(raw.json_schema)) {
      throw new ChatRequestError("Missing required parameter: 'response_format.json_schema'.", 'response_format.json_schema', 'missing_required_parameter');
    }
    const { schema } = raw.json_schema;
    return { schema: isSchema(schema) ? schema : {} };
  }
  throw new ChatRequestError(`Invalid value for 'response_format.type': ${JSON.stringify(raw.type)}.`, 'response_format.type', 'invalid_value');
}

function parseStop(raw: unknown): string[] {
  if (raw === undefined || raw === null) return [];
  if (typeof raw === 'string') return [raw];
  if (Array.isArray(raw) && raw.every((s) => typeof s === 'string')) return raw;
  throw new ChatRequestError("Invalid type for 'stop': expected a string or an array of strings.", 'stop', 'invalid_type');
}

function positiveInteger(raw: unknown, param: string): number | undefined {
  if (raw === undefined || raw === null) return undefined;
  if (typeof raw !== 'number' || !Number.isInteger(raw)) throw new ChatRequestError(`Invalid type for '${param}': expected an integer.`, param, 'invalid_type');
  if (raw < 1) throw new ChatRequestError(`Invalid '${param}': expected a value >= 1, got ${raw}.`, param, 'integer_below_min_value');
  return raw;
}

function optionalBoolean(raw: unknown, param: string): boolean | undefined {
  if (raw === undefined || raw === null) return undefined;
  if (typeof raw !== 'boolean') throw new ChatRequestError(`Invalid type for '${param}': expected a boolean.`, param, 'invalid_type');
  return raw;
}

function isSchema(value: unknown): value is JsonSchema {
  return typeof value === 'boolean' || isRecord(value);
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}
