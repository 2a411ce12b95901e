/**
 * The simulator's OpenAI Chat Completions face: parses a request body into the engine's neutral
 * input and renders the plan the way OpenAI does, as a reply script (status, headers, timed byte
 * steps) that a transport plays out, in process or over a socket.
 */
import { dataFrame } from '../../../src/plugin-api.js';
import {
  calls,
  plan,
  units,
  type ChoicePlan,
  type EngineInput,
  type Plan,
  type PlannedCall,
  type ResponseFormat,
  type Role,
  type SimMessage,
  type SimTool,
  type SimToolCall,
  type ToolChoice,
  type PromptCache,
} from './engine.js';
import {
  RequestError,
  SSE_HEADERS,
  checkMaxLength,
  faultReply,
  generationMs,
  isRecord,
  isSchema,
  jsonReply,
  optionalBoolean,
  parseJsonBody,
  parseOr400,
  positiveInteger,
  randomId,
  scriptedReply,
  tokenIntervalMs,
  withWireQuirks,
  type ScriptItem,
  type SimReply,
} from './reply.js';

export { errorReply, notFound, type ReplyStep, type SimReply } from './reply.js';

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
export const ChatRequestError = RequestError;
export type ChatRequestError = RequestError;

const FINGERPRINT = 'fp_simulator';
/** Fixed, so model lists are byte-identical across runs. */
const MODELS_CREATED = 1_700_000_000;
const MAX_CHOICES = 128;
/** OpenAI's own ceilings. */
const MAX_MESSAGES = 2048;
const MAX_TOOLS = 128;
const MAX_STOP = 4;

/** Serves the chat routes (paths relative to the API root, e.g. `/chat/completions`); undefined for any other. */
export function routeChat(method: string, path: string, body: Buffer | string | undefined, options: ChatOptions, cache?: PromptCache): SimReply | undefined {
  const bare = path.split('?', 1)[0];
  if (method === 'POST' && bare === '/chat/completions') return chatCompletion(body, cache);
  if (method === 'GET' && bare === '/models') return modelList(options.models);
  return undefined;
}

export function chatCompletion(body: Buffer | string | undefined, cache?: PromptCache): SimReply {
  const json = parseJsonBody(body);
  if ('reply' in json) return json.reply;
  const request = parseOr400(() => parseChatRequest(json.value));
  if ('reply' in request) return request.reply;
  const p = plan(request.value.input, cache);
  return withWireQuirks(renderChat(request.value, p), p);
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

// ---------------------------------------------------------------------------------------------
// Rendering

function completionReply(request: ChatRequest, p: Plan, id: string, created: number): SimReply {
  const choices = p.choices.map((choice, index) => ({
    index,
    message:
      choice.kind === 'text'
        ? { role: 'assistant', content: choice.tokens.join(''), refusal: null, annotations: [] }
        : { role: 'assistant', content: null, refusal: null, annotations: [], tool_calls: calls(choice).map(toolCall) },
    logprobs: null,
    finish_reason: choice.finishReason,
  }));
  const body = {
    id,
    object: 'chat.completion',
    created,
    model: request.model,
    choices,
    ...(!p.wire.noUsage && { usage: usage(p) }),
    service_tier: 'default',
    system_fingerprint: FINGERPRINT,
  };
  // A non-stream answer arrives when the last token would have.
  return jsonReply(200, body, generationMs(p, longestAnswer(p)));
}

function streamReply(request: ChatRequest, p: Plan, id: string, created: number): SimReply {
  const head =
    `{"id":${JSON.stringify(id)},"object":"chat.completion.chunk","created":${created},` +
    `"model":${JSON.stringify(request.model)},"service_tier":"default","system_fingerprint":"${FINGERPRINT}","choices":[`;
  // A cut drops the connection after `cut_after` deltas, or before the finish when the answer is shorter.
  const cut = p.fault.cutAfter !== undefined;
  // The opening chunks go out with the first token, after the ttft delay.
  return scriptedReply(SSE_HEADERS, cut, p.timing.ttftMs, () => streamFrames(request, p, head));
}

/** The stream's frames, made as they are asked for; a number closes a token step. */
function* streamFrames(request: ChatRequest, p: Plan, head: string): Generator<ScriptItem, void, undefined> {
  const chunk = (choice: object) => dataFrame(head + JSON.stringify(choice) + (request.includeUsage ? '],"usage":null}' : ']}'));
  for (const [index, choice] of p.choices.entries()) {
    yield chunk(openingDelta(index, choice));
    if (choice.kind === 'tool_call') yield chunk(choiceDelta(index, { tool_calls: [callHeader(choice, 0)] }));
  }

  const intervalMs = tokenIntervalMs(p);
  const { cutAfter } = p.fault;
  const positions = Math.max(0, ...p.choices.map(deltaCount));
  const deltas = p.choices.map((choice, index) => streamDeltas(index, choice));
  let emitted = 0;
  for (let pos = 0; pos < positions; pos++) {
    if (pos > 0 && intervalMs > 0) yield intervalMs;
    for (const choiceDeltas of deltas) {
      const next = choiceDeltas.next();
      if (next.done) continue;
      if (cutAfter !== undefined && emitted >= cutAfter) return;
      yield chunk(next.value);
      emitted++;
    }
  }
  // A cut beyond the answer's length still drops the connection, before the finish.
  if (cutAfter !== undefined) return;

  for (const [index, choice] of p.choices.entries()) yield chunk({ index, delta: {}, logprobs: null, finish_reason: choice.finishReason });
  if (request.includeUsage && !p.wire.noUsage) yield dataFrame(`${head}],"usage":${JSON.stringify(usage(p))}}`);
  yield dataFrame('[DONE]');
}

function openingDelta(index: number, choice: ChoicePlan): object {
  // OpenAI opens a tool-call answer with null content, a text answer with an empty string.
  return choiceDelta(index, { role: 'assistant', content: choice.kind === 'text' ? '' : null });
}

/**
 * A choice's deltas after the opening: a token each, or an argument fragment each, with OpenAI's
 * `index` per call; a further call's header (id and name) rides on its first fragment.
 */
function* streamDeltas(index: number, choice: ChoicePlan): Generator<object, void, undefined> {
  if (choice.kind === 'text') {
    for (const unit of choice.tokens) yield choiceDelta(index, { content: unit });
    return;
  }
  for (const [k, call] of calls(choice).entries()) {
    if (k > 0) yield choiceDelta(index, { tool_calls: [{ ...callHeader(call, k), function: { name: call.name, arguments: call.fragments[0] ?? '' } }] });
    for (let i = k > 0 ? 1 : 0; i < call.fragments.length; i++) yield choiceDelta(index, { tool_calls: [{ index: k, function: { arguments: call.fragments[i] } }] });
  }
}

/** How many deltas streamDeltas makes. */
function deltaCount(choice: ChoicePlan): number {
  if (choice.kind === 'text') return choice.tokens.length;
  return calls(choice).reduce((sum, call, k) => sum + Math.max(call.fragments.length, k > 0 ? 1 : 0), 0);
}

function callHeader(call: PlannedCall, k: number): object {
  return { index: k, id: `call_${call.callId}`, type: 'function', function: { name: call.name, arguments: '' } };
}

function choiceDelta(index: number, delta: object): object {
  return { index, delta, logprobs: null, finish_reason: null };
}

function toolCall(call: PlannedCall): object {
  return { id: `call_${call.callId}`, type: 'function', function: { name: call.name, arguments: call.argumentsJson } };
}

function usage(p: Plan): object {
  const { inputTokens, outputTokens, cachedTokens } = p.usage;
  return {
    prompt_tokens: inputTokens,
    completion_tokens: outputTokens,
    total_tokens: inputTokens + outputTokens,
    prompt_tokens_details: { cached_tokens: cachedTokens },
    completion_tokens_details: { reasoning_tokens: 0 },
  };
}

/** Choices are generated side by side, so the longest one sets the number of token steps. */
function longestAnswer(p: Plan): number {
  return Math.max(0, ...p.choices.map((c) => units(c).length));
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
  if (!isRecord(body)) throw new RequestError('The request body must be a JSON object.', null, 'invalid_type');
  if (typeof body.model !== 'string' || body.model === '') throw new RequestError('You must provide a model parameter.', 'model', null);
  if (!Array.isArray(body.messages)) {
    const missing = body.messages === undefined;
    throw new RequestError(
      missing ? "Missing required parameter: 'messages'." : "Invalid type for 'messages': expected an array.",
      'messages',
      missing ? 'missing_required_parameter' : 'invalid_type',
    );
  }
  if (body.messages.length === 0) throw new RequestError("Invalid 'messages': empty array.", 'messages', 'empty_array');
  checkMaxLength(body.messages, MAX_MESSAGES, 'messages');

  const stream = optionalBoolean(body.stream, 'stream') ?? false;
  let includeUsage = false;
  if (body.stream_options !== undefined && body.stream_options !== null) {
    if (!stream) throw new RequestError("The 'stream_options' parameter is only allowed when 'stream' is enabled.", 'stream_options', 'invalid_value');
    if (!isRecord(body.stream_options)) throw new RequestError("Invalid type for 'stream_options': expected an object.", 'stream_options', 'invalid_type');
    includeUsage = body.stream_options.include_usage === true;
  }

  const tools = parseTools(body.tools);
  const n = positiveInteger(body.n, 'n') ?? 1;
  if (n > MAX_CHOICES) throw new RequestError(`Invalid 'n': expected a value <= ${MAX_CHOICES}.`, 'n', 'integer_above_max_value');
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
  if (!isRecord(raw)) throw new RequestError(`Invalid type for '${where}': expected an object.`, where, 'invalid_type');
  const role = ROLES.get(raw.role);
  if (!role) throw new RequestError(`Invalid value for '${where}.role': ${JSON.stringify(raw.role)}.`, `${where}.role`, 'invalid_value');
  const message: SimMessage = { role, text: '', images: 0 };
  const { content } = raw;
  if (typeof content === 'string') message.text = content;
  else if (Array.isArray(content)) {
    const texts: string[] = [];
    for (const part of content) {
      if (!isRecord(part)) throw new RequestError(`Invalid type for '${where}.content': parts must be objects.`, `${where}.content`, 'invalid_type');
      if (part.type === 'text' && typeof part.text === 'string') texts.push(part.text);
      else if (part.type === 'refusal' && typeof part.refusal === 'string') texts.push(part.refusal);
      else if (part.type === 'image_url') message.images++;
    }
    message.text = texts.join('\n');
  } else if (content !== undefined && content !== null) {
    throw new RequestError(`Invalid type for '${where}.content': expected a string or an array.`, `${where}.content`, 'invalid_type');
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
  if (!Array.isArray(raw)) throw new RequestError("Invalid type for 'tools': expected an array.", 'tools', 'invalid_type');
  checkMaxLength(raw, MAX_TOOLS, 'tools');
  return raw.flatMap((tool: unknown, i): SimTool[] => {
    // Custom (free-form) tools are accepted but never called.
    if (isRecord(tool) && tool.type === 'custom') return [];
    if (isRecord(tool) && tool.type === 'function' && isRecord(tool.function) && typeof tool.function.name === 'string') {
      const { parameters } = tool.function;
      return [{ name: tool.function.name, parameters: isSchema(parameters) ? parameters : undefined }];
    }
    throw new RequestError(`Invalid value for 'tools[${i}]': expected a function tool with a name.`, `tools[${i}]`, 'invalid_value');
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
      throw new RequestError(`Invalid value for 'tool_choice': no function named '${name}' in 'tools'.`, 'tool_choice', 'invalid_value');
    }
  }
  throw new RequestError("Invalid value for 'tool_choice'.", 'tool_choice', 'invalid_value');
}

function parseResponseFormat(raw: unknown): ResponseFormat {
  if (raw === undefined || raw === null) return 'text';
  if (!isRecord(raw)) throw new RequestError("Invalid type for 'response_format': expected an object.", 'response_format', 'invalid_type');
  if (raw.type === 'text' || raw.type === 'json_object') return raw.type;
  if (raw.type === 'json_schema') {
    if (!isRecord(raw.json_schema)) {
      throw new RequestError("Missing required parameter: 'response_format.json_schema'.", 'response_format.json_schema', 'missing_required_parameter');
    }
    const { schema } = raw.json_schema;
    return { schema: isSchema(schema) ? schema : {} };
  }
  throw new RequestError(`Invalid value for 'response_format.type': ${JSON.stringify(raw.type)}.`, 'response_format.type', 'invalid_value');
}

function parseStop(raw: unknown): string[] {
  if (raw === undefined || raw === null) return [];
  if (typeof raw === 'string') return [raw];
  if (Array.isArray(raw) && raw.every((s) => typeof s === 'string')) {
    checkMaxLength(raw, MAX_STOP, 'stop');
    return raw;
  }
  throw new RequestError("Invalid type for 'stop': expected a string or an array of strings.", 'stop', 'invalid_type');
}
