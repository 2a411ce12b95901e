/**
 * The simulator's Gemini face (content generation; paths relative to the API root `/v1beta`):
 * `POST /models/{model}:generateContent`, `POST /models/{model}:streamGenerateContent` (SSE with
 * `?alt=sse`, otherwise the streamed JSON array), `POST /models/{model}:countTokens`,
 * `GET /models` and `GET /models/{id}`. Parses a request body into the engine's neutral input and
 * renders the plan as Google does, errors in Google's shape included. Field names are read in
 * lowerCamelCase or snake_case, as Google's proto-JSON parser accepts both.
 */
import { createHash } from 'node:crypto';
import { dataFrame } from '../../../src/plugin-api.js';
import {
  fragments,
  inputTokens,
  plan,
  calls,
  units,
  type ChoicePlan,
  type PlannedCall,
  type EngineInput,
  type JsonSchema,
  type Plan,
  type ResponseFormat,
  type SimMessage,
  type SimTool,
  type ToolChoice,
  type PromptCache,
} from './engine.js';
import {
  JSON_HEADERS,
  MAX_JSON_DEPTH,
  RequestError,
  SSE_HEADERS,
  TickClock,
  TickScript,
  generationMs,
  isRecord,
  jsonReply,
  optionalBoolean,
  optionalNumber,
  optionalString,
  parseOr,
  positiveInteger,
  randomId,
  readJson,
  requiredString,
  scriptedReply,
  withWireQuirks,
  type ScriptItem,
  type SimReply,
} from './reply.js';

export interface GeminiOptions {
  /** Model ids listed by `GET /models` and found by `GET /models/{id}`. */
  models: string[];
}

export const DEFAULT_GEMINI_MODELS = ['sim-gemini', 'sim-gemini-lite'];

/** How `streamGenerateContent` frames its chunks: `?alt=sse` events, or one JSON array. */
export type GeminiStreamMode = 'sse' | 'json-array';

/** A parsed Gemini request: the wire-level switches plus the engine's neutral view. */
export interface GeminiRequest {
  /** The model id from the path, without `models/`. */
  model: string;
  /** Absent for `generateContent`. */
  stream?: GeminiStreamMode;
  input: EngineInput;
  /**
   * The thought summary's pieces (already cut to the budgets), present when `includeThoughts`
   * asked for thoughts; they spend `maxOutputTokens` before the answer does.
   */
  thoughts?: string[];
  /**
   * The model thinks (a `thinkingConfig` whose budget is not 0), summary or not: its calls carry
   * thought signatures, and in the current turn replayed calls must bring them back (Gemini 3).
   */
  signs?: boolean;
}

/** Google's canonical status names by HTTP status. */
const STATUS_NAMES: Record<number, string> = {
  400: 'INVALID_ARGUMENT',
  401: 'UNAUTHENTICATED',
  403: 'PERMISSION_DENIED',
  404: 'NOT_FOUND',
  409: 'ABORTED',
  429: 'RESOURCE_EXHAUSTED',
  499: 'CANCELLED',
  500: 'INTERNAL',
  501: 'UNIMPLEMENTED',
  503: 'UNAVAILABLE',
  504: 'DEADLINE_EXCEEDED',
};

/** Messages for the `error=` directive, after Google's own. */
const FAULT_MESSAGES: Record<number, string> = {
  400: 'Request contains an invalid argument.',
  401: 'Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid authentication credential.',
  403: 'The caller does not have permission.',
  404: 'Requested entity was not found.',
  429: 'Resource has been exhausted (e.g. check quota).',
  500: 'An internal error has occurred. Please retry or report in https://developers.generativeai.google/guide/troubleshooting',
  503: 'The model is overloaded. Please try again later.',
  504: 'Deadline expired before operation could complete.',
};

/** The thought summary; its pieces are the thought tokens. */
const THOUGHT_TEXT = '**Planning the answer**\n\nConsidering the question and planning a clear answer.';
const MAX_CANDIDATES = 8;
/** Google's ceiling on `stopSequences`. */
const MAX_STOP_SEQUENCES = 5;
const MAX_SCHEMA_DEPTH = 64;
/** What a JSON array stream puts between its elements. */
const ARRAY_SEPARATOR = ',\r\n';

// ---------------------------------------------------------------------------------------------
// Routes

/**
 * Serves the Gemini routes (paths relative to `/v1beta`, query string included, e.g.
 * `/models/sim-gemini:streamGenerateContent?alt=sse`); undefined for any other.
 */
export function routeGemini(method: string, path: string, body: Buffer | string | undefined, options: GeminiOptions, cache?: PromptCache): SimReply | undefined {
  const q = path.indexOf('?');
  const bare = q < 0 ? path : path.slice(0, q);
  const query = new URLSearchParams(q < 0 ? '' : path.slice(q + 1));
  if (bare === '/models') return method === 'GET' ? geminiModelList(options.models) : undefined;
  if (!bare.startsWith('/models/')) return undefined;
  const target = decodeTarget(bare.slice('/models/'.length));
  const colon = target.lastIndexOf(':');
  if (colon < 0) return method === 'GET' ? geminiModelInfo(modelId(target), options.models) : undefined;
  if (method !== 'POST') return undefined;
  const model = modelId(target.slice(0, colon));
  switch (target.slice(colon + 1)) {
    case 'generateContent':
      return generateContent(model, body, undefined, cache);
    case 'streamGenerateContent':
      return generateContent(model, body, query.get('alt') === 'sse' ? 'sse' : 'json-array', cache);
    case 'countTokens':
      return countTokens(body);
    default:
      return undefined;
  }
}

export function generateContent(model: string, body: Buffer | string | undefined, stream?: GeminiStreamMode, cache?: PromptCache): SimReply {
  const json = readJson(body);
  if (!('value' in json)) return unreadable(json.problem);
  const request = parseOr(() => parseGeminiRequest(json.value, model, stream), refuse);
  if ('reply' in request) return request.reply;
  const p = plan(request.value.input, cache);
  return withWireQuirks(renderGemini(request.value, p), p);
}

/** `:countTokens`, with `contents` (and friends) at the top level or inside `generateContentRequest`. */
export function countTokens(body: Buffer | string | undefined): SimReply {
  const json = readJson(body);
  if (!('value' in json)) return unreadable(json.problem);
  const request = parseOr(() => {
    const raw = isRecord(json.value) ? json.value : {};
    const inner = field(raw, 'generateContentRequest');
    return parseGeminiRequest(isRecord(inner) ? inner : json.value, '');
  }, refuse);
  if ('reply' in request) return request.reply;
  const totalTokens = inputTokens(request.value.input.messages);
  return jsonReply(200, { totalTokens, promptTokensDetails: [{ modality: 'TEXT', tokenCount: totalTokens }] });
}

export function renderGemini(request: GeminiRequest, p: Plan): SimReply {
  if (p.fault.errorStatus !== undefined) return geminiFault(p.fault.errorStatus);
  const head = { modelVersion: request.model, responseId: randomId(22) };
  if (p.fault.blocked) return blockedReply(request, p, head);
  return request.stream ? streamReply(request, p, head) : jsonReply(200, finalResponse(request, p, head), generationMs(p, answerTicks(request, p)));
}

export function geminiModelList(models: string[]): SimReply {
  return jsonReply(200, { models: models.map(modelEntry) });
}

export function geminiModelInfo(id: string, models: string[]): SimReply {
  if (!models.includes(id)) return geminiError(404, `models/${id} is not found for API version v1beta, or is not supported for generateContent.`);
  return jsonReply(200, modelEntry(id));
}

/** An error in Google's shape: `{"error":{"code","message","status"}}`. */
export function geminiError(code: number, message: string): SimReply {
  return jsonReply(code, { error: { code, message, status: STATUS_NAMES[code] ?? 'UNKNOWN' } });
}

/** The body Google sends for a request the `error=` directive fails. */
export function geminiFault(code: number): SimReply {
  return geminiError(code, `${FAULT_MESSAGES[code] ?? `Simulated error with status ${code}.`} (simulated)`);
}

export function geminiNotFound(method: string, path: string): SimReply {
  return geminiError(404, `Method not found (${method} ${path.split('?', 1)[0]}).`);
}

function refuse(err: RequestError): SimReply {
  return geminiError(400, err.message);
}

function unreadable(problem: 'syntax' | 'depth'): SimReply {
  if (problem === 'syntax') return geminiError(400, 'Invalid JSON payload received. Unexpected token.');
  return geminiError(400, `Invalid JSON payload received. Nesting is deeper than ${MAX_JSON_DEPTH} levels.`);
}

function decodeTarget(raw: string): string {
  try {
    return decodeURIComponent(raw);
  } catch {
    return raw;
  }
}

/** A resource name or a bare id, as the id. */
function modelId(name: string): string {
  return name.startsWith('models/') ? name.slice('models/'.length) : name;
}

function modelEntry(id: string): object {
  return {
    name: `models/${id}`,
    version: '001',
    displayName: `Simulator ${id}`,
    description: 'Deterministic answers from the Sluice simulator.',
    inputTokenLimit: 1_048_576,
    outputTokenLimit: 65_536,
    supportedGenerationMethods: ['generateContent', 'countTokens'],
    temperature: 1,
    topP: 0.95,
    topK: 64,
    maxTemperature: 2,
    thinking: true,
  };
}

// ---------------------------------------------------------------------------------------------
// Rendering

interface ResponseHead {
  modelVersion: string;
  responseId: string;
}

const FINISH: Record<ChoicePlan['finishReason'], string> = { stop: 'STOP', length: 'MAX_TOKENS', tool_calls: 'STOP' };

/** Thought and answer pieces take one token tick each; the longest candidate sets the count. */
function answerTicks(request: GeminiRequest, p: Plan): number {
  return (request.thoughts?.length ?? 0) + Math.max(0, ...p.choices.map((c) => units(c).length));
}

function finalResponse(request: GeminiRequest, p: Plan, head: ResponseHead): object {
  const thoughts = request.thoughts ?? [];
  const candidates = p.choices.map((choice, index) => {
    const parts: object[] = [];
    if (thoughts.length > 0) parts.push({ text: thoughts.join(''), thought: true });
    if (choice.kind === 'text' && choice.tokens.length > 0) parts.push({ text: choice.tokens.join('') });
    else if (choice.kind === 'tool_call' && choice.finishReason !== 'length') parts.push(...calls(choice).map((call) => callPart(request, call)));
    // A candidate with nothing to say has a content without parts, as Google sends it.
    return { content: parts.length > 0 ? { role: 'model', parts } : { role: 'model' }, finishReason: FINISH[choice.finishReason], index };
  });
  const thoughtTokens = thoughts.length * p.choices.length;
  const usageMetadata = usage(p.usage, p.usage.outputTokens, request.thoughts ? thoughtTokens : undefined);
  return { candidates, ...(!p.wire.noUsage && { usageMetadata }), ...head };
}

/**
 * A complete call: Google has no call ids and no `tool_calls` finish reason. With thoughts on, the
 * call carries a signature derived from the call itself, so replays can be checked byte for byte.
 */
function callPart(request: GeminiRequest, call: PlannedCall): object {
  // `empty_args=1` leaves the arguments out, as Google does for a function without parameters.
  const parsed: unknown = call.argumentsJson === '' ? undefined : JSON.parse(call.argumentsJson);
  const args = parsed === undefined ? {} : { args: isRecord(parsed) ? parsed : { value: parsed } };
  const part: Record<string, unknown> = { functionCall: { name: call.name, ...args } };
  if (request.signs) part.thoughtSignature = thoughtSignature(call);
  return part;
}

export function thoughtSignature(choice: { name: string; argumentsJson: string; callId: string }): string {
  return createHash('sha256').update(`sim-thought\u0000${choice.name}\u0000${choice.argumentsJson}\u0000${choice.callId}`).digest('base64');
}

function usage({ inputTokens: prompt, cachedTokens }: Plan['usage'], candidates: number, thoughts: number | undefined): object {
  const out: Record<string, number> = { promptTokenCount: prompt, candidatesTokenCount: candidates, totalTokenCount: prompt + candidates + (thoughts ?? 0) };
  if (cachedTokens > 0) out.cachedContentTokenCount = cachedTokens;
  if (thoughts !== undefined && thoughts > 0) out.thoughtsTokenCount = thoughts;
  return out;
}

/** The blocked-prompt answer: HTTP 200, no candidates, a prompt feedback saying why. */
function blockedReply(request: GeminiRequest, p: Plan, head: ResponseHead): SimReply {
  const body = {
    promptFeedback: {
      blockReason: 'SAFETY',
      safetyRatings: [
        { category: 'HARM_CATEGORY_SEXUALLY_EXPLICIT', probability: 'NEGLIGIBLE' },
        { category: 'HARM_CATEGORY_HATE_SPEECH', probability: 'NEGLIGIBLE' },
        { category: 'HARM_CATEGORY_HARASSMENT', probability: 'NEGLIGIBLE' },
        { category: 'HARM_CATEGORY_DANGEROUS_CONTENT', probability: 'HIGH', blocked: true },
      ],
    },
    usageMetadata: { promptTokenCount: p.usage.inputTokens, totalTokenCount: p.usage.inputTokens },
    ...head,
  };
  if (!request.stream) return jsonReply(200, body, p.timing.ttftMs);
  const script = new TickScript(p);
  const frame = JSON.stringify(body);
  script.push(0, request.stream === 'sse' ? dataFrame(frame) : `[${frame}]`);
  return script.reply(request.stream === 'sse' ? SSE_HEADERS : JSON_HEADERS, false);
}

/**
 * Each chunk is a complete GenerateContentResponse holding only the new parts, with running usage
 * totals. Text goes out a token per tick; a call goes out whole at the tick of its last argument
 * token; the finish reason rides on a candidate's last chunk (an empty text part when the
 * candidate has no content of its own). `cut_after=N` drops the connection after N content chunks,
 * before any finish.
 */
function streamReply(request: GeminiRequest, p: Plan, head: ResponseHead): SimReply {
  const headers = request.stream === 'sse' ? SSE_HEADERS : JSON_HEADERS;
  return scriptedReply(headers, p.fault.cutAfter !== undefined, p.timing.ttftMs, () => streamFrames(request, p, head));
}

/** The stream's frames, made as they are asked for, on the plan's token clock. */
function* streamFrames(request: GeminiRequest, p: Plan, head: ResponseHead): Generator<ScriptItem, void, undefined> {
  const thoughts = request.thoughts ?? [];
  const { cutAfter } = p.fault;
  const cut = cutAfter !== undefined;
  const answers = p.choices.map(units);
  const lastTick = answers.map((answer) => Math.max(0, thoughts.length + answer.length - 1));
  const ticks = Math.max(0, ...lastTick) + 1;
  // Chunks are written as text, a token's frame being most of the simulator's work on a long stream;
  // the keys keep the order JSON.stringify gave them: candidates, usageMetadata, then the head.
  const headTail = `,${JSON.stringify(head).slice(1)}`;

  const clock = new TickClock(p);
  const at = function* (tick: number, frame: string): Generator<ScriptItem, void, undefined> {
    const wait = clock.at(tick);
    if (wait !== undefined) yield wait;
    yield frame;
  };
  const sse = request.stream === 'sse';
  let chunks = 0;
  let thoughtTokens = 0;
  let answerTokens = 0;
  for (let tick = 0; tick < ticks; tick++) {
    let candidates = '';
    for (let index = 0; index < p.choices.length; index++) {
      const choice = p.choices[index]!;
      const answer = answers[index]!;
      let parts = '';
      if (tick < thoughts.length) {
        parts = `{"text":${JSON.stringify(thoughts[tick])},"thought":true}`;
        thoughtTokens++;
      } else if (tick - thoughts.length < answer.length) {
        answerTokens++;
        if (choice.kind === 'text') parts = `{"text":${JSON.stringify(answer[tick - thoughts.length])}}`;
      }
      // Every call of the turn goes out whole, together in one chunk, as Google streams parallel calls.
      if (choice.kind === 'tool_call' && tick === lastTick[index] && choice.finishReason !== 'length') {
        for (const call of calls(choice)) parts += (parts === '' ? '' : ',') + JSON.stringify(callPart(request, call));
      }
      let finish = '';
      if (tick === lastTick[index] && !cut) {
        if (parts === '') parts = '{"text":""}';
        finish = `,"finishReason":"${FINISH[choice.finishReason]}"`;
      } else if (parts === '') {
        continue;
      }
      candidates += `${candidates === '' ? '' : ','}{"content":{"role":"model","parts":[${parts}]}${finish},"index":${index}}`;
    }
    if (candidates === '') continue;
    if (cut && chunks >= cutAfter) break;
    const usageMetadata = p.wire.noUsage ? '' : `,"usageMetadata":${JSON.stringify(usage(p.usage, answerTokens, request.thoughts ? thoughtTokens : undefined))}`;
    const json = `{"candidates":[${candidates}]${usageMetadata}${headTail}`;
    yield* at(tick, sse ? dataFrame(json) : `${chunks === 0 ? '[' : ARRAY_SEPARATOR}${json}`);
    chunks++;
  }
  // Headers still go out when the cut comes before the first chunk.
  if (chunks === 0) yield* at(0, '');
  else if (!sse && !cut) yield* at(ticks - 1, ']');
}

// ---------------------------------------------------------------------------------------------
// Parsing: light validation, Google-style 400s for what the real API refuses.

/** The data fields of a Part, of which exactly one must be set. */
const DATA_FIELDS = ['text', 'inlineData', 'fileData', 'functionCall', 'functionResponse', 'executableCode', 'codeExecutionResult'] as const;
const MODES = new Set(['MODE_UNSPECIFIED', 'AUTO', 'ANY', 'NONE', 'VALIDATED']);
const FUNCTION_NAME = /^[A-Za-z_][A-Za-z0-9_.:-]{0,127}$/;
const BASE64 = /^[A-Za-z0-9+/_-]*={0,2}$/;
const CALL_TURN_RULE = 'Please ensure that function call turn comes immediately after a user turn or after a function response turn.';
const RESPONSE_COUNT_RULE =
  'Please ensure that the number of function response parts is equal to the number of function call parts of the function call turn.';

/** Parses a GenerateContentRequest body; `model` and `stream` come from the path. */
export function parseGeminiRequest(body: unknown, model: string, stream?: GeminiStreamMode): GeminiRequest {
  if (!isRecord(body)) throw invalid('Invalid JSON payload received. Expected an object.');
  const messages: SimMessage[] = [];
  const system = field(body, 'systemInstruction');
  if (system !== undefined) {
    const text = systemText(system);
    if (text !== '') messages.push({ role: 'system', text, images: 0 });
  }
  const config = field(body, 'generationConfig') ?? {};
  if (!isRecord(config)) throw invalid("Invalid value at 'generation_config': expected an object.");
  const rawThinking = field(config, 'thinkingConfig');
  const thinking = parseThinkingConfig(rawThinking);
  const signs = rawThinking !== undefined && thinking.budget !== 0;
  for (const message of parseContents(field(body, 'contents'), signs)) messages.push(message);

  const tools = parseTools(field(body, 'tools'));
  const toolChoice = parseToolConfig(field(body, 'toolConfig'), tools);
  const safety = field(body, 'safetySettings');
  if (safety !== undefined && !Array.isArray(safety)) throw invalid("Invalid value at 'safety_settings': expected a list.");

  for (const name of ['temperature', 'topP', 'topK', 'presencePenalty', 'frequencyPenalty']) optionalNumber(field(config, name), `generationConfig.${name}`);
  const n = positiveInteger(field(config, 'candidateCount'), 'generationConfig.candidateCount') ?? 1;
  if (n > MAX_CANDIDATES) throw invalid(`Only 1 to ${MAX_CANDIDATES} candidates are supported (generationConfig.candidateCount: ${n}).`);
  const maxOutputTokens = positiveInteger(field(config, 'maxOutputTokens'), 'generationConfig.maxOutputTokens');
  const stop = parseStopSequences(field(config, 'stopSequences'));
  const responseFormat = parseResponseFormat(config);

  let thoughts: string[] | undefined;
  let answerBudget = maxOutputTokens;
  if (thinking.includeThoughts && thinking.budget !== 0) {
    let kept = fragments(THOUGHT_TEXT);
    if (thinking.budget !== undefined && thinking.budget > 0) kept = kept.slice(0, thinking.budget);
    if (maxOutputTokens !== undefined) kept = kept.slice(0, maxOutputTokens);
    thoughts = kept;
    if (answerBudget !== undefined) answerBudget -= kept.length;
  }

  return {
    model,
    stream,
    input: { messages, tools, toolChoice, responseFormat, maxTokens: answerBudget, stop, n },
    thoughts,
    signs,
  };
}

/** snake_case spellings of the (few, fixed) field names read, worked out once each. */
const SNAKE_NAMES = new Map<string, string>();

/** Reads `name` in lowerCamelCase or in its snake_case spelling; null counts as absent. */
function field(obj: Record<string, unknown>, name: string): unknown {
  let snake = SNAKE_NAMES.get(name);
  if (snake === undefined) SNAKE_NAMES.set(name, (snake = name.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`)));
  return obj[name] ?? obj[snake] ?? undefined;
}

function invalid(message: string): RequestError {
  return new RequestError(message, null, null);
}

function systemText(raw: unknown): string {
  if (typeof raw === 'string') return raw;
  if (!isRecord(raw)) throw invalid("Invalid value at 'system_instruction': expected a Content object.");
  const parts = field(raw, 'parts') ?? [];
  if (!Array.isArray(parts)) throw invalid("Invalid value at 'system_instruction.parts': expected a list.");
  return parts.map((part: unknown, j) => parsePart(part, `system_instruction.parts[${j}]`)).flatMap((part) => (part.kind === 'text' ? [part.text] : [])).join('\n');
}

type Part =
  | { kind: 'text'; text: string }
  | { kind: 'thought' }
  | { kind: 'media'; image: boolean }
  | { kind: 'call'; name: string; args: Record<string, unknown>; signed: boolean }
  | { kind: 'response'; name: string; text: string }
  | { kind: 'skip' };

function parsePart(raw: unknown, where: string): Part {
  if (!isRecord(raw)) throw invalid(`Invalid value at '${where}': expected a Part object.`);
  const signature = field(raw, 'thoughtSignature');
  if (signature !== undefined && (typeof signature !== 'string' || !BASE64.test(signature))) {
    throw invalid(`Invalid value at '${where}.thought_signature' (TYPE_BYTES), Base64 decoding failed for ${JSON.stringify(signature)}`);
  }
  const thought = optionalBoolean(field(raw, 'thought'), `${where}.thought`);
  const present = DATA_FIELDS.filter((name) => field(raw, name) !== undefined);
  if (present.length > 1) throw invalid(`Invalid value at '${where}' (oneof), oneof field 'data' is already set. Cannot set '${present[1]}'`);
  if (present.length === 0) {
    // A bare signature carrier (Gemini 3 sends these) holds nothing to read.
    if (signature !== undefined) return { kind: 'skip' };
    throw invalid(`Invalid value at '${where}': a part needs one of ${DATA_FIELDS.join(', ')}.`);
  }
  const value = field(raw, present[0]);
  switch (present[0]) {
    case 'text': {
      if (typeof value !== 'string') throw invalid(`Invalid value at '${where}.text' (TYPE_STRING), ${JSON.stringify(value)}`);
      return thought ? { kind: 'thought' } : { kind: 'text', text: value };
    }
    case 'inlineData': {
      const data = record(value, `${where}.inline_data`);
      const mimeType = requiredString(field(data, 'mimeType'), `${where}.inline_data.mime_type`);
      const bytes = requiredString(field(data, 'data'), `${where}.inline_data.data`, true);
      if (!BASE64.test(bytes)) throw invalid(`Invalid value at '${where}.inline_data.data' (TYPE_BYTES), Base64 decoding failed.`);
      return { kind: 'media', image: mimeType.startsWith('image/') };
    }
    case 'fileData': {
      const data = record(value, `${where}.file_data`);
      requiredString(field(data, 'fileUri'), `${where}.file_data.file_uri`);
      const mimeType = optionalString(field(data, 'mimeType'), `${where}.file_data.mime_type`);
      return { kind: 'media', image: mimeType?.startsWith('image/') ?? false };
    }
    case 'functionCall': {
      const call = record(value, `${where}.function_call`);
      const name = requiredString(field(call, 'name'), `${where}.function_call.name`);
      const args = field(call, 'args') ?? {};
      if (!isRecord(args)) throw invalid(`Invalid value at '${where}.function_call.args' (type.googleapis.com/google.protobuf.Struct): expected an object.`);
      optionalString(field(call, 'id'), `${where}.function_call.id`);
      return { kind: 'call', name, args, signed: signature !== undefined };
    }
    case 'functionResponse': {
      const response = record(value, `${where}.function_response`);
      const name = requiredString(field(response, 'name'), `${where}.function_response.name`);
      const content = field(response, 'response');
      if (!isRecord(content)) throw invalid(`Invalid value at '${where}.function_response.response' (type.googleapis.com/google.protobuf.Struct): expected an object.`);
      optionalString(field(response, 'id'), `${where}.function_response.id`);
      // What the tool said: its `output` when that is text, else the whole response.
      return { kind: 'response', name, text: typeof content.output === 'string' ? content.output : JSON.stringify(content) };
    }
    case 'executableCode': {
      const code = record(value, `${where}.executable_code`);
      return { kind: 'text', text: typeof code.code === 'string' ? code.code : '' };
    }
    case 'codeExecutionResult': {
      const result = record(value, `${where}.code_execution_result`);
      return { kind: 'text', text: typeof result.output === 'string' ? result.output : '' };
    }
  }
}

function record(value: unknown, where: string): Record<string, unknown> {
  if (!isRecord(value)) throw invalid(`Invalid value at '${where}': expected an object.`);
  return value;
}

/** One Content, summarized for the turn rules. */
interface Turn {
  role: 'user' | 'model';
  calls: number;
  responses: number;
}

/**
 * Gemini 3's rule, played when thoughts are on: in the current turn (after the last user content
 * that is not only function responses), each model content's first call must come back with its
 * thought signature. Any value passes here, the documented bypass included.
 */
function missingSignature(contents: { role: string; firstCall?: { name: string; signed: boolean }; asks: boolean }[]): string | undefined {
  let start = 0;
  contents.forEach((c, i) => c.role === 'user' && c.asks && (start = i + 1));
  for (const [i, c] of contents.entries()) {
    if (i < start || !c.firstCall || c.firstCall.signed) continue;
    return `Function call is missing a thought_signature in functionCall parts. This is required for tools to work correctly, and missing thought_signature may lead to degraded model performance. Additional data, function call \`default_api:${c.firstCall.name}\` , position ${i + 1}. Please refer to https://ai.google.dev/gemini-api/docs/thought-signatures for more details.`;
  }
  return undefined;
}

function parseContents(raw: unknown, thinking: boolean): SimMessage[] {
  if (raw === undefined) throw invalid('* GenerateContentRequest.contents: contents is not specified');
  if (!Array.isArray(raw)) throw invalid("Invalid value at 'contents': expected a list of Content objects.");
  if (raw.length === 0) throw invalid('* GenerateContentRequest.contents: contents is not specified');
  const messages: SimMessage[] = [];
  const signing: Parameters<typeof missingSignature>[0] = [];
  let previous: Turn | undefined;
  raw.forEach((content: unknown, i) => {
    const where = `contents[${i}]`;
    if (!isRecord(content)) throw invalid(`Invalid value at '${where}': expected a Content object.`);
    const role = field(content, 'role') ?? 'user';
    if (role !== 'user' && role !== 'model') throw invalid(`Please use a valid role: user, model. (${where}.role: ${JSON.stringify(role)})`);
    const rawParts = field(content, 'parts');
    if (!Array.isArray(rawParts) || rawParts.length === 0) throw invalid(`* GenerateContentRequest.${where}.parts: contents.parts must not be empty.`);
    const parts = rawParts.map((part: unknown, j) => parsePart(part, `${where}.parts[${j}]`));

    const texts: string[] = [];
    const calls: { name: string; argumentsJson: string }[] = [];
    const responses: SimMessage[] = [];
    let images = 0;
    for (const [j, part] of parts.entries()) {
      if (part.kind === 'text') texts.push(part.text);
      else if (part.kind === 'media') images += part.image ? 1 : 0;
      else if (part.kind === 'call') {
        if (role !== 'model') throw invalid(`Invalid value at '${where}.parts[${j}]': a functionCall part belongs in a model turn.`);
        calls.push({ name: part.name, argumentsJson: JSON.stringify(part.args) });
      } else if (part.kind === 'response') {
        if (role !== 'user') throw invalid(`Invalid value at '${where}.parts[${j}]': a functionResponse part belongs in a user turn.`);
        responses.push({ role: 'tool', text: part.text, images: 0 });
      }
    }

    const firstCall = parts.find((part) => part.kind === 'call');
    signing.push({ role, asks: texts.length > 0 || images > 0, ...(firstCall?.kind === 'call' && { firstCall }) });
    const turn: Turn = { role, calls: calls.length, responses: responses.length };
    if (turn.calls > 0 && previous?.role !== 'user') throw invalid(CALL_TURN_RULE);
    if ((previous?.calls ?? 0) > 0 || turn.responses > 0) {
      if (turn.role !== 'user' || previous?.role !== 'model' || turn.responses !== previous.calls) throw invalid(RESPONSE_COUNT_RULE);
    }
    previous = turn;

    if (role === 'model') {
      // Replayed stream chunks are pieces of one text: join them as they were.
      const message: SimMessage = { role: 'assistant', text: texts.join(''), images };
      if (calls.length > 0) message.toolCalls = calls;
      messages.push(message);
    } else {
      for (const response of responses) messages.push(response);
      if (texts.length > 0 || images > 0 || responses.length === 0) messages.push({ role: 'user', text: texts.join('\n'), images });
    }
  });
  const missing = thinking ? missingSignature(signing) : undefined;
  if (missing) throw invalid(missing);
  return messages;
}

function parseTools(raw: unknown): SimTool[] {
  if (raw === undefined) return [];
  if (!Array.isArray(raw)) throw invalid("Invalid value at 'tools': expected a list of Tool objects.");
  const out: SimTool[] = [];
  raw.forEach((tool: unknown, i) => {
    if (!isRecord(tool)) throw invalid(`Invalid value at 'tools[${i}]': expected a Tool object.`);
    // googleSearch, codeExecution, urlContext and the like are accepted but never used.
    const declarations = field(tool, 'functionDeclarations');
    if (declarations === undefined) return;
    if (!Array.isArray(declarations)) throw invalid(`Invalid value at 'tools[${i}].function_declarations': expected a list.`);
    declarations.forEach((declaration: unknown, j) => {
      const where = `tools[${i}].function_declarations[${j}]`;
      if (!isRecord(declaration)) throw invalid(`Invalid value at '${where}': expected a FunctionDeclaration object.`);
      const name = field(declaration, 'name');
      if (typeof name !== 'string' || !FUNCTION_NAME.test(name)) {
        throw invalid(
          `* GenerateContentRequest.${where}.name: Invalid function name. Must start with a letter or an underscore. ` +
            'Must be alphameric (a-z, A-Z, 0-9), underscores (_), dots (.), colons (:), or dashes (-), with a maximum length of 128.',
        );
      }
      const parameters = field(declaration, 'parameters');
      const jsonSchema = field(declaration, 'parametersJsonSchema');
      if (parameters !== undefined && jsonSchema !== undefined) {
        throw invalid(`* GenerateContentRequest.${where}: parameters and parameters_json_schema are mutually exclusive.`);
      }
      if (jsonSchema !== undefined && typeof jsonSchema !== 'boolean' && !isRecord(jsonSchema)) {
        throw invalid(`Invalid value at '${where}.parameters_json_schema': expected a JSON Schema.`);
      }
      out.push({ name, parameters: parameters !== undefined ? toJsonSchema(parameters, `${where}.parameters`) : (jsonSchema as JsonSchema | undefined) });
    });
  });
  return out;
}

function parseToolConfig(raw: unknown, tools: SimTool[]): ToolChoice {
  let mode = 'AUTO';
  let allowed: string[] = [];
  if (raw !== undefined) {
    if (!isRecord(raw)) throw invalid("Invalid value at 'tool_config': expected an object.");
    const config = field(raw, 'functionCallingConfig');
    if (config !== undefined) {
      if (!isRecord(config)) throw invalid("Invalid value at 'tool_config.function_calling_config': expected an object.");
      const rawMode = field(config, 'mode') ?? 'AUTO';
      if (typeof rawMode !== 'string' || !MODES.has(rawMode)) {
        throw invalid(`Invalid value at 'tool_config.function_calling_config.mode' (type.googleapis.com/google.ai.generativelanguage.v1beta.FunctionCallingConfig.Mode), ${JSON.stringify(rawMode)}`);
      }
      mode = rawMode === 'MODE_UNSPECIFIED' ? 'AUTO' : rawMode;
      const names = field(config, 'allowedFunctionNames') ?? [];
      if (!Array.isArray(names) || !names.every((name) => typeof name === 'string')) {
        throw invalid("Invalid value at 'tool_config.function_calling_config.allowed_function_names': expected a list of strings.");
      }
      allowed = names as string[];
      if (allowed.length > 0 && mode !== 'ANY' && mode !== 'VALIDATED') {
        throw invalid('* GenerateContentRequest.tool_config.function_calling_config.allowed_function_names: only allowed when mode is ANY or VALIDATED.');
      }
      const unknown = allowed.find((name) => !tools.some((t) => t.name === name));
      if (unknown !== undefined) {
        throw invalid(`* GenerateContentRequest.tool_config.function_calling_config.allowed_function_names: function '${unknown}' is not declared in tools.`);
      }
    }
  }
  if (tools.length === 0 || mode === 'NONE') return 'none';
  // The simulator always calls when it may, and the first allowed function is its pick.
  if (allowed.length > 0) return { name: allowed[0] };
  return mode === 'ANY' ? 'required' : 'auto';
}

function parseStopSequences(raw: unknown): string[] {
  if (raw === undefined) return [];
  if (!Array.isArray(raw) || !raw.every((s) => typeof s === 'string')) {
    throw invalid("Invalid value at 'generation_config.stop_sequences': expected a list of strings.");
  }
  if (raw.length > MAX_STOP_SEQUENCES) {
    throw invalid(`* GenerateContentRequest.generation_config.stop_sequences: at most ${MAX_STOP_SEQUENCES} stop sequences are allowed, got ${raw.length}.`);
  }
  return raw as string[];
}

function parseResponseFormat(config: Record<string, unknown>): ResponseFormat {
  const mimeType = optionalString(field(config, 'responseMimeType'), 'generationConfig.responseMimeType') ?? 'text/plain';
  const schema = field(config, 'responseSchema');
  const jsonSchema = field(config, 'responseJsonSchema');
  if (mimeType !== 'text/plain' && mimeType !== 'application/json') {
    throw invalid(`* GenerateContentRequest.generation_config.response_mime_type: allowed mimetypes are \`text/plain\` and \`application/json\` (simulator), got ${JSON.stringify(mimeType)}.`);
  }
  if (schema !== undefined && jsonSchema !== undefined) {
    throw invalid('* GenerateContentRequest.generation_config: response_schema and response_json_schema are mutually exclusive.');
  }
  if ((schema !== undefined || jsonSchema !== undefined) && mimeType !== 'application/json') {
    throw invalid('* GenerateContentRequest.generation_config.response_mime_type: a response schema requires response_mime_type application/json.');
  }
  if (mimeType === 'text/plain') return 'text';
  if (schema !== undefined) return { schema: toJsonSchema(schema, 'generation_config.response_schema') };
  if (jsonSchema !== undefined) {
    if (typeof jsonSchema !== 'boolean' && !isRecord(jsonSchema)) throw invalid("Invalid value at 'generation_config.response_json_schema': expected a JSON Schema.");
    return { schema: jsonSchema };
  }
  return 'json_object';
}

function parseThinkingConfig(raw: unknown): { includeThoughts: boolean; budget?: number } {
  if (raw === undefined) return { includeThoughts: false };
  if (!isRecord(raw)) throw invalid("Invalid value at 'generation_config.thinking_config': expected an object.");
  const includeThoughts = optionalBoolean(field(raw, 'includeThoughts'), 'generationConfig.thinkingConfig.includeThoughts') ?? false;
  const budget = field(raw, 'thinkingBudget');
  if (budget !== undefined && (typeof budget !== 'number' || !Number.isInteger(budget) || budget < -1)) {
    throw invalid(`Invalid value at 'generation_config.thinking_config.thinking_budget': expected an integer >= -1, got ${JSON.stringify(budget)}.`);
  }
  optionalString(field(raw, 'thinkingLevel'), 'generationConfig.thinkingConfig.thinkingLevel');
  return { includeThoughts, budget };
}

/** The fields of Google's `Schema` (camelCase; snake_case spellings are accepted too). */
const SCHEMA_FIELDS = new Set([
  'type',
  'format',
  'title',
  'description',
  'nullable',
  'enum',
  'maxItems',
  'minItems',
  'properties',
  'required',
  'minProperties',
  'maxProperties',
  'minLength',
  'maxLength',
  'pattern',
  'example',
  'anyOf',
  'propertyOrdering',
  'default',
  'items',
  'minimum',
  'maximum',
]);
const SCHEMA_TYPES = new Set(['type_unspecified', 'string', 'number', 'integer', 'boolean', 'array', 'object', 'null']);
/** int64 fields: proto JSON may carry them as strings. */
const COUNT_FIELDS = new Set(['maxItems', 'minItems', 'minProperties', 'maxProperties', 'minLength', 'maxLength']);

/**
 * Google's Schema dialect (OpenAPI 3.0 subset, upper-case types) as the JSON Schema the engine
 * reads: lower-case types, `nullable` as a `null` type (and enum value), int64 counts as numbers.
 * Refuses what Google refuses: unknown keywords, type lists, an OBJECT with empty properties.
 */
export function toJsonSchema(raw: unknown, where: string, depth = 0): JsonSchema {
  if (!isRecord(raw)) throw invalid(`Invalid value at '${where}': expected a Schema object.`);
  if (depth > MAX_SCHEMA_DEPTH) throw invalid(`* GenerateContentRequest.${where}: the schema is nested too deeply.`);
  const out: Record<string, unknown> = {};
  for (const [rawKey, value] of Object.entries(raw)) {
    const key = rawKey.replace(/_([a-z])/g, (_, c: string) => c.toUpperCase());
    if (!SCHEMA_FIELDS.has(key)) throw invalid(`Invalid JSON payload received. Unknown name "${rawKey}" at '${where}': Cannot find field.`);
    if (value === null || value === undefined) continue;
    if (key === 'type') {
      if (Array.isArray(value)) throw invalid(`Invalid JSON payload received. Unknown name "type" at '${where}': Proto field is not repeating, cannot start list.`);
      const type = typeof value === 'string' ? value.toLowerCase() : '';
      if (!SCHEMA_TYPES.has(type)) throw invalid(`Invalid value at '${where}.type' (type.googleapis.com/google.ai.generativelanguage.v1beta.Type), ${JSON.stringify(value)}`);
      if (type !== 'type_unspecified') out.type = type;
    } else if (key === 'properties') {
      const properties = record(value, `${where}.properties`);
      out.properties = Object.fromEntries(Object.entries(properties).map(([name, sub]) => [name, toJsonSchema(sub, `${where}.properties[${name}]`, depth + 1)]));
    } else if (key === 'items') {
      out.items = toJsonSchema(value, `${where}.items`, depth + 1);
    } else if (key === 'anyOf') {
      if (!Array.isArray(value)) throw invalid(`Invalid value at '${where}.any_of': expected a list.`);
      out.anyOf = value.map((sub: unknown, i) => toJsonSchema(sub, `${where}.any_of[${i}]`, depth + 1));
    } else if (COUNT_FIELDS.has(key)) {
      const count = Number(value);
      if (!Number.isInteger(count) || count < 0) throw invalid(`Invalid value at '${where}.${rawKey}' (TYPE_INT64), ${JSON.stringify(value)}`);
      out[key] = count;
    } else if (key !== 'nullable' && key !== 'propertyOrdering' && key !== 'example') {
      out[key] = value;
    }
  }
  if (out.type === 'object' && isRecord(out.properties) && Object.keys(out.properties).length === 0) {
    throw invalid(`* GenerateContentRequest.${where}.properties: should be non-empty for OBJECT type`);
  }
  if (field(raw, 'nullable') === true) {
    if (typeof out.type === 'string') out.type = [out.type, 'null'];
    if (Array.isArray(out.enum)) out.enum = [...(out.enum as unknown[]), null];
  }
  return out;
}
