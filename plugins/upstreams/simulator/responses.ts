/**
 * The simulator's OpenAI Responses face (`POST /responses`): parses a request body into the
 * engine's neutral input and renders the plan as OpenAI does, as a Response object or as a stream
 * of typed events (`event:` and `data:` lines, `sequence_number` from 0, one terminal event).
 * Stateless: `previous_response_id` and `conversation` are refused.
 */
import { eventFrame } from '../../../src/plugin-api.js';
import {
  DIRECTIVE,
  calls,
  fragments,
  plan,
  units,
  type ChoicePlan,
  type EngineInput,
  type Plan,
  type ResponseFormat,
  type SimMessage,
  type SimTool,
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
  optionalNumber,
  optionalString,
  parseJsonBody,
  parseOr400,
  positiveInteger,
  randomHex,
  requiredString,
  scriptedReply,
  tokenIntervalMs,
  withWireQuirks,
  type ScriptItem,
  type SimReply,
} from './reply.js';

/** A parsed Responses request: wire-level switches, what the Response echoes, and the engine's view. */
export interface ResponsesRequest {
  model: string;
  stream: boolean;
  input: EngineInput;
  /** The reasoning summary's pieces (already cut to `max_output_tokens`); absent when none was asked for. */
  summary?: { units: string[]; complete: boolean };
  /** The query of a simulated web search that precedes the answer; absent when there is none. */
  webSearch?: { query: string };
  /** Request fields a Response object repeats, in OpenAI's normalized form. */
  echo: ResponseEcho;
}

export interface ResponseEcho {
  instructions: string | null;
  max_output_tokens: number | null;
  metadata: Record<string, unknown>;
  parallel_tool_calls: boolean;
  reasoning: { effort: string | null; summary: string | null };
  store: boolean;
  temperature: number;
  text: Record<string, unknown>;
  tool_choice: unknown;
  tools: unknown[];
  top_p: number;
}

/** The reasoning summary; its pieces are the reasoning tokens, which spend `max_output_tokens` first. */
const SUMMARY_TEXT = 'Considering the question and planning a clear answer.';
const SEARCH_QUERY_WORDS = 12;
/** OpenAI's ceiling on `tools`. */
const MAX_TOOLS = 128;
/** How far into the prompt the search query is looked for. */
const SEARCH_QUERY_SCAN = 4096;
const WEB_SEARCH_TOOLS = new Set(['web_search', 'web_search_preview', 'web_search_2025_08_26', 'web_search_preview_2025_03_11']);
/** Hosted and non-function tools the simulator accepts but never calls. */
const IDLE_TOOLS = new Set([
  'custom',
  'namespace',
  'file_search',
  'code_interpreter',
  'image_generation',
  'computer_use_preview',
  'computer_use',
  'mcp',
  'local_shell',
  'shell',
  'apply_patch',
  'tool_search',
]);
const EFFORTS = new Set(['none', 'minimal', 'low', 'medium', 'high', 'xhigh', 'max']);
const SUMMARIES = new Set(['auto', 'concise', 'detailed']);
/** Chat Completions parameters a Responses request must not carry, and where they moved. */
const MOVED_PARAMETERS: [string, string][] = [
  ['messages', 'input'],
  ['response_format', 'text.format'],
  ['max_tokens', 'max_output_tokens'],
  ['max_completion_tokens', 'max_output_tokens'],
];

/** Serves `POST /responses` (relative to the API root); undefined for any other route. */
export function routeResponses(method: string, path: string, body: Buffer | string | undefined, cache?: PromptCache): SimReply | undefined {
  const bare = path.split('?', 1)[0];
  if (method === 'POST' && bare === '/responses') return createResponse(body, cache);
  return undefined;
}

export function createResponse(body: Buffer | string | undefined, cache?: PromptCache): SimReply {
  const json = parseJsonBody(body);
  if ('reply' in json) return json.reply;
  const request = parseOr400(() => parseResponsesRequest(json.value));
  if ('reply' in request) return request.reply;
  const p = plan(request.value.input, cache);
  return withWireQuirks(renderResponses(request.value, p), p);
}

export function renderResponses(request: ResponsesRequest, p: Plan): SimReply {
  if (p.fault.errorStatus !== undefined) return faultReply(p.fault.errorStatus);
  const response = new ResponseShape(request, p);
  return request.stream ? streamReply(response, p) : jsonReply(200, response.final(), generationMs(p, response.tokenSteps));
}

// ---------------------------------------------------------------------------------------------
// Rendering

type Item =
  | { type: 'reasoning'; id: string; units: string[] }
  | { type: 'web_search_call'; id: string; query: string }
  | { type: 'message'; id: string; units: string[]; incomplete: boolean }
  | { type: 'function_call'; id: string; callId: string; name: string; units: string[]; incomplete: boolean };

/** One response's items and its Response object at each stage. */
class ResponseShape {
  readonly id = `resp_${randomHex(48)}`;
  readonly createdAt = Math.floor(Date.now() / 1000);
  readonly items: Item[] = [];
  readonly incomplete: boolean;
  readonly reasoningTokens: number;
  readonly outputTokens: number;
  /** Pieces streamed one per token step: summary text, answer text, argument fragments. */
  readonly tokenSteps: number;

  constructor(
    private readonly request: ResponsesRequest,
    private readonly p: Plan,
  ) {
    const { summary, webSearch } = request;
    if (summary) this.items.push({ type: 'reasoning', id: `rs_${randomHex(48)}`, units: summary.units });
    if (webSearch) this.items.push({ type: 'web_search_call', id: `ws_${randomHex(48)}`, query: webSearch.query });
    const answer = p.choices[0];
    const cut = answer.finishReason === 'length';
    // A budget spent before the answer began leaves no answer item at all, as at OpenAI.
    if (!(cut && units(answer).length === 0)) this.items.push(...answerItems(answer));
    this.incomplete = cut || (summary !== undefined && !summary.complete);
    this.reasoningTokens = summary?.units.length ?? 0;
    this.outputTokens = this.reasoningTokens + p.usage.outputTokens;
    this.tokenSteps = this.items.reduce((sum, item) => sum + ('units' in item ? item.units.length : 0), 0);
  }

  /** The Response as `response.created` and `response.in_progress` carry it. */
  initial(): object {
    return this.object('in_progress', [], null);
  }

  final(): object {
    const { inputTokens, cachedTokens } = this.p.usage;
    const usage = {
      input_tokens: inputTokens,
      input_tokens_details: { cached_tokens: cachedTokens },
      output_tokens: this.outputTokens,
      output_tokens_details: { reasoning_tokens: this.reasoningTokens },
      total_tokens: inputTokens + this.outputTokens,
    };
    return this.object(this.incomplete ? 'incomplete' : 'completed', this.items.map(finalItem), this.p.wire.noUsage ? null : usage);
  }

  private object(status: string, output: object[], usage: object | null): object {
    const { echo } = this.request;
    return {
      id: this.id,
      object: 'response',
      created_at: this.createdAt,
      status,
      background: false,
      completed_at: status === 'completed' ? Math.floor(Date.now() / 1000) : null,
      error: null,
      incomplete_details: status === 'incomplete' ? { reason: 'max_output_tokens' } : null,
      instructions: echo.instructions,
      max_output_tokens: echo.max_output_tokens,
      max_tool_calls: null,
      model: this.request.model,
      output,
      parallel_tool_calls: echo.parallel_tool_calls,
      previous_response_id: null,
      reasoning: echo.reasoning,
      service_tier: 'default',
      store: echo.store,
      temperature: echo.temperature,
      text: echo.text,
      tool_choice: echo.tool_choice,
      tools: echo.tools,
      top_logprobs: 0,
      top_p: echo.top_p,
      truncation: 'disabled',
      usage,
      user: null,
      metadata: echo.metadata,
    };
  }
}

/** A message, or a function_call item per call (only the last of them can be cut short). */
function answerItems(choice: ChoicePlan): Item[] {
  const incomplete = choice.finishReason === 'length';
  if (choice.kind === 'text') return [{ type: 'message', id: `msg_${randomHex(48)}`, units: choice.tokens, incomplete }];
  const all = calls(choice);
  return all.map((call, k) => ({
    type: 'function_call',
    id: `fc_${randomHex(48)}`,
    callId: `call_${call.callId}`,
    name: call.name,
    units: call.fragments,
    incomplete: incomplete && k === all.length - 1,
  }));
}

function finalItem(item: Item): object {
  switch (item.type) {
    case 'reasoning':
      return { type: 'reasoning', id: item.id, summary: [summaryPart(item.units.join(''))] };
    case 'web_search_call':
      return { type: 'web_search_call', id: item.id, status: 'completed', action: { type: 'search', query: item.query } };
    case 'message':
      return messageItem(item, item.incomplete ? 'incomplete' : 'completed', [textPart(item.units.join(''))]);
    case 'function_call':
      return functionCallItem(item, item.incomplete ? 'incomplete' : 'completed', item.units.join(''));
  }
}

function messageItem(item: Extract<Item, { type: 'message' }>, status: string, content: object[]): object {
  return { type: 'message', id: item.id, status, role: 'assistant', content };
}

function functionCallItem(item: Extract<Item, { type: 'function_call' }>, status: string, args: string): object {
  return { type: 'function_call', id: item.id, call_id: item.callId, name: item.name, arguments: args, status };
}

function textPart(text: string): object {
  return { type: 'output_text', text, annotations: [] };
}

function summaryPart(text: string): object {
  return { type: 'summary_text', text };
}

/** One event to write; `token` marks a piece that takes a token step (and counts toward `cut_after`). */
interface StreamEvent {
  type: string;
  fields: Record<string, unknown>;
  token?: boolean;
  terminal?: boolean;
}

function streamReply(response: ResponseShape, p: Plan): SimReply {
  // Like chat, nothing goes out before the first token: the opening events travel with it.
  return scriptedReply(SSE_HEADERS, p.fault.cutAfter !== undefined, p.timing.ttftMs, () => streamFrames(response, p));
}

/** The stream's frames, made as they are asked for; a number closes a token step. */
function* streamFrames(response: ResponseShape, p: Plan): Generator<ScriptItem, void, undefined> {
  const intervalMs = tokenIntervalMs(p);
  const { cutAfter } = p.fault;
  let sequence = 0;
  let tokens = 0;
  for (const event of streamEvents(response)) {
    if (event.token) {
      if (cutAfter !== undefined && tokens >= cutAfter) return;
      if (tokens > 0 && intervalMs > 0) yield intervalMs;
      tokens++;
    }
    // A cut beyond the answer's length still drops the connection, before the terminal event.
    if (event.terminal && cutAfter !== undefined) return;
    const payload = JSON.stringify({ type: event.type, sequence_number: sequence++, ...event.fields });
    yield eventFrame(event.type, payload);
  }
}

/** The events of section 2.8, in order: lifecycle, then each item added, filled and done. */
function* streamEvents(response: ResponseShape): Generator<StreamEvent> {
  yield { type: 'response.created', fields: { response: response.initial() } };
  yield { type: 'response.in_progress', fields: { response: response.initial() } };
  for (const [outputIndex, item] of response.items.entries()) {
    const at = { item_id: item.id, output_index: outputIndex };
    const done = { type: 'response.output_item.done', fields: { output_index: outputIndex, item: finalItem(item) } };
    switch (item.type) {
      case 'reasoning': {
        yield { type: 'response.output_item.added', fields: { output_index: outputIndex, item: { type: 'reasoning', id: item.id, summary: [] } } };
        const part = { ...at, summary_index: 0 };
        yield { type: 'response.reasoning_summary_part.added', fields: { ...part, part: summaryPart('') } };
        for (const delta of item.units) yield { type: 'response.reasoning_summary_text.delta', fields: { ...part, delta }, token: true };
        const text = item.units.join('');
        yield { type: 'response.reasoning_summary_text.done', fields: { ...part, text } };
        yield { type: 'response.reasoning_summary_part.done', fields: { ...part, part: summaryPart(text) } };
        break;
      }
      case 'web_search_call': {
        const added = { type: 'web_search_call', id: item.id, status: 'in_progress', action: { type: 'search', query: item.query } };
        yield { type: 'response.output_item.added', fields: { output_index: outputIndex, item: added } };
        yield { type: 'response.web_search_call.in_progress', fields: at };
        yield { type: 'response.web_search_call.searching', fields: at };
        yield { type: 'response.web_search_call.completed', fields: at };
        break;
      }
      case 'message': {
        yield { type: 'response.output_item.added', fields: { output_index: outputIndex, item: messageItem(item, 'in_progress', []) } };
        const part = { ...at, content_index: 0 };
        yield { type: 'response.content_part.added', fields: { ...part, part: textPart('') } };
        for (const delta of item.units) yield { type: 'response.output_text.delta', fields: { ...part, delta, logprobs: [] }, token: true };
        const text = item.units.join('');
        yield { type: 'response.output_text.done', fields: { ...part, text, logprobs: [] } };
        yield { type: 'response.content_part.done', fields: { ...part, part: textPart(text) } };
        break;
      }
      case 'function_call': {
        yield { type: 'response.output_item.added', fields: { output_index: outputIndex, item: functionCallItem(item, 'in_progress', '') } };
        for (const delta of item.units) yield { type: 'response.function_call_arguments.delta', fields: { ...at, delta }, token: true };
        yield { type: 'response.function_call_arguments.done', fields: { ...at, name: item.name, arguments: item.units.join('') } };
        break;
      }
    }
    yield done;
  }
  const final = response.final() as { status: string };
  yield { type: `response.${final.status}`, fields: { response: final }, terminal: true };
}

// ---------------------------------------------------------------------------------------------
// Parsing: light validation, OpenAI-style messages naming the field that is refused.

export function parseResponsesRequest(body: unknown): ResponsesRequest {
  if (!isRecord(body)) throw new RequestError('The request body must be a JSON object.', null, 'invalid_type');
  if (typeof body.model !== 'string' || body.model === '') throw new RequestError('You must provide a model parameter.', 'model', null);
  for (const [old, now] of MOVED_PARAMETERS) {
    if (body[old] !== undefined) {
      throw new RequestError(`Unsupported parameter: '${old}'. In the Responses API, this parameter has moved to '${now}'.`, old, 'unsupported_parameter');
    }
  }
  // The simulator keeps no responses and no conversations, so it can continue neither.
  if (body.previous_response_id !== undefined && body.previous_response_id !== null) {
    const id = String(body.previous_response_id);
    throw new RequestError(`Previous response with id '${id}' not found (the simulator keeps no state).`, 'previous_response_id', 'previous_response_not_found');
  }
  if (body.conversation !== undefined && body.conversation !== null) {
    throw new RequestError('Conversations are not supported (the simulator keeps no state).', 'conversation', 'invalid_value');
  }

  const instructions = optionalString(body.instructions, 'instructions');
  const messages: SimMessage[] = instructions !== undefined && instructions !== '' ? [{ role: 'system', text: instructions, images: 0 }] : [];
  for (const message of parseInput(body.input)) messages.push(message);

  const stream = optionalBoolean(body.stream, 'stream') ?? false;
  const tools = parseTools(body.tools);
  const choice = parseToolChoice(body.tool_choice, tools.functions);
  const text = parseText(body.text);
  const reasoning = parseReasoning(body.reasoning);
  const maxOutputTokens = positiveInteger(body.max_output_tokens, 'max_output_tokens');

  let summary: ResponsesRequest['summary'];
  let answerBudget = maxOutputTokens;
  if (reasoning.summary !== null) {
    const full = fragments(SUMMARY_TEXT);
    const kept = maxOutputTokens !== undefined ? full.slice(0, maxOutputTokens) : full;
    summary = { units: kept, complete: kept.length === full.length };
    if (answerBudget !== undefined) answerBudget -= kept.length;
  }

  const last = messages.at(-1);
  const searchable = tools.webSearch && choice.toolChoice !== 'none' && last?.role === 'user';
  const webSearch = searchable && (choice.forceSearch || /\bsearch\b/i.test(last.text)) ? { query: searchQuery(last.text) } : undefined;

  return {
    model: body.model,
    stream,
    input: {
      messages,
      tools: tools.functions,
      toolChoice: choice.toolChoice,
      responseFormat: text.format,
      maxTokens: answerBudget,
      n: 1,
    },
    summary,
    webSearch,
    echo: {
      instructions: instructions ?? null,
      max_output_tokens: maxOutputTokens ?? null,
      metadata: parseMetadata(body.metadata),
      parallel_tool_calls: optionalBoolean(body.parallel_tool_calls, 'parallel_tool_calls') ?? true,
      reasoning,
      store: optionalBoolean(body.store, 'store') ?? true,
      temperature: optionalNumber(body.temperature, 'temperature') ?? 1,
      text: text.echo,
      tool_choice: body.tool_choice ?? 'auto',
      tools: tools.echo,
      top_p: optionalNumber(body.top_p, 'top_p') ?? 1,
    },
  };
}

/** The user's first words without directives, cut to a search-box length. */
function searchQuery(text: string): string {
  return text
    .slice(0, SEARCH_QUERY_SCAN)
    .replace(DIRECTIVE, ' ')
    .split(/\s+/)
    .filter(Boolean)
    .slice(0, SEARCH_QUERY_WORDS)
    .join(' ');
}

function parseInput(raw: unknown): SimMessage[] {
  if (raw === undefined || raw === null) throw new RequestError("Missing required parameter: 'input'.", 'input', 'missing_required_parameter');
  if (typeof raw === 'string') return [{ role: 'user', text: raw, images: 0 }];
  if (!Array.isArray(raw)) throw new RequestError("Invalid type for 'input': expected a string or an array of input items.", 'input', 'invalid_type');
  const messages: SimMessage[] = [];
  const callIds = new Set<string>();
  raw.forEach((item: unknown, i) => {
    const where = `input[${i}]`;
    if (!isRecord(item)) throw new RequestError(`Invalid type for '${where}': expected an object.`, where, 'invalid_type');
    const type = item.type ?? (item.role !== undefined ? 'message' : undefined);
    switch (type) {
      case 'message':
        messages.push(parseMessage(item, where));
        break;
      case 'function_call':
      case 'custom_tool_call': {
        const callId = requiredString(item.call_id, `${where}.call_id`);
        const name = requiredString(item.name, `${where}.name`);
        const args = requiredString(type === 'function_call' ? item.arguments : item.input, `${where}.${type === 'function_call' ? 'arguments' : 'input'}`, true);
        callIds.add(callId);
        // Consecutive calls (and a message right before them) are one assistant turn.
        const previous = messages.at(-1);
        const call = { name, argumentsJson: args };
        if (previous?.role === 'assistant') (previous.toolCalls ??= []).push(call);
        else messages.push({ role: 'assistant', text: '', images: 0, toolCalls: [call] });
        break;
      }
      case 'function_call_output':
      case 'custom_tool_call_output': {
        const callId = requiredString(item.call_id, `${where}.call_id`);
        if (!callIds.has(callId)) {
          throw new RequestError(`No tool call found for function call output with call_id ${callId}.`, `${where}.call_id`, 'invalid_value');
        }
        messages.push(parseToolOutput(item.output, `${where}.output`));
        break;
      }
      case 'item_reference':
        throw new RequestError(`Item references are not supported (the simulator keeps no state).`, where, 'invalid_value');
      case 'reasoning':
      case 'web_search_call':
      case 'file_search_call':
      case 'code_interpreter_call':
      case 'image_generation_call':
      case 'compaction':
        // Earlier output replayed as context: nothing the simulator reads.
        break;
      default:
        throw new RequestError(`Invalid value for '${where}.type': ${JSON.stringify(type)}.`, `${where}.type`, 'invalid_value');
    }
  });
  return messages;
}

const INPUT_PARTS = new Set(['input_text', 'input_image', 'input_file', 'input_audio']);
const INPUT_PARTS_TEXT = "'input_text', 'input_image', 'input_file', and 'input_audio'";
const OUTPUT_PARTS = new Set(['output_text', 'refusal']);
const OUTPUT_PARTS_TEXT = "'output_text' and 'refusal'";

function parseMessage(item: Record<string, unknown>, where: string): SimMessage {
  const { role, content } = item;
  if (role !== 'user' && role !== 'system' && role !== 'developer' && role !== 'assistant') {
    throw new RequestError(
      `Invalid value: ${JSON.stringify(role)}. Supported values are: 'assistant', 'system', 'developer', and 'user'.`,
      `${where}.role`,
      'invalid_value',
    );
  }
  const message: SimMessage = { role: role === 'developer' ? 'system' : role, text: '', images: 0 };
  if (typeof content === 'string') {
    message.text = content;
    return message;
  }
  if (!Array.isArray(content)) {
    throw new RequestError(`Invalid type for '${where}.content': expected a string or an array of content parts.`, `${where}.content`, 'invalid_type');
  }
  const texts: string[] = [];
  content.forEach((part: unknown, j) => {
    const at = `${where}.content[${j}]`;
    if (!isRecord(part)) throw new RequestError(`Invalid type for '${at}': expected an object.`, at, 'invalid_type');
    // Assistant history holds output parts; every other role sends input parts.
    const [allowed, supported] = role === 'assistant' ? [OUTPUT_PARTS, OUTPUT_PARTS_TEXT] : [INPUT_PARTS, INPUT_PARTS_TEXT];
    if (typeof part.type !== 'string' || !allowed.has(part.type)) {
      throw new RequestError(`Invalid value: ${JSON.stringify(part.type)}. Supported values are: ${supported}.`, `${at}.type`, 'invalid_value');
    }
    if (part.type === 'input_text' || part.type === 'output_text') texts.push(requiredString(part.text, `${at}.text`, true));
    else if (part.type === 'refusal') texts.push(requiredString(part.refusal, `${at}.refusal`, true));
    else if (part.type === 'input_image') message.images++;
  });
  message.text = texts.join('\n');
  return message;
}

function parseToolOutput(output: unknown, where: string): SimMessage {
  const message: SimMessage = { role: 'tool', text: '', images: 0 };
  if (typeof output === 'string') message.text = output;
  else if (Array.isArray(output)) {
    const texts: string[] = [];
    for (const part of output) {
      if (!isRecord(part)) throw new RequestError(`Invalid type for '${where}': parts must be objects.`, where, 'invalid_type');
      if (part.type === 'input_text' && typeof part.text === 'string') texts.push(part.text);
      else if (part.type === 'input_image') message.images++;
    }
    message.text = texts.join('\n');
  } else {
    throw new RequestError(`Invalid type for '${where}': expected a string or an array of content parts.`, where, 'invalid_type');
  }
  return message;
}

interface ParsedTools {
  functions: SimTool[];
  webSearch: boolean;
  echo: unknown[];
}

function parseTools(raw: unknown): ParsedTools {
  const out: ParsedTools = { functions: [], webSearch: false, echo: [] };
  if (raw === undefined || raw === null) return out;
  if (!Array.isArray(raw)) throw new RequestError("Invalid type for 'tools': expected an array.", 'tools', 'invalid_type');
  checkMaxLength(raw, MAX_TOOLS, 'tools');
  raw.forEach((tool: unknown, i) => {
    const where = `tools[${i}]`;
    if (!isRecord(tool)) throw new RequestError(`Invalid type for '${where}': expected an object.`, where, 'invalid_type');
    if (tool.type === 'function') {
      // Function tools are flat here: a Chat-style nested `function` object has no top-level name.
      const name = requiredString(tool.name, `${where}.name`);
      const { parameters } = tool;
      if (parameters !== undefined && parameters !== null && !isRecord(parameters)) {
        throw new RequestError(`Invalid type for '${where}.parameters': expected an object.`, `${where}.parameters`, 'invalid_type');
      }
      out.functions.push({ name, parameters: isSchema(parameters) ? parameters : undefined, ...(tool.defer_loading === true && { deferred: true }) });
      out.echo.push({
        type: 'function',
        description: typeof tool.description === 'string' ? tool.description : null,
        name,
        parameters: parameters ?? null,
        strict: typeof tool.strict === 'boolean' ? tool.strict : true,
      });
    } else if (typeof tool.type === 'string' && (WEB_SEARCH_TOOLS.has(tool.type) || IDLE_TOOLS.has(tool.type))) {
      if (WEB_SEARCH_TOOLS.has(tool.type)) out.webSearch = true;
      out.echo.push(tool);
    } else {
      throw new RequestError(`Invalid value for '${where}.type': ${JSON.stringify(tool.type)}.`, `${where}.type`, 'invalid_value');
    }
  });
  return out;
}

function parseToolChoice(raw: unknown, tools: SimTool[]): { toolChoice: ToolChoice; forceSearch: boolean } {
  if (raw === undefined || raw === null) return { toolChoice: 'auto', forceSearch: false };
  if (raw === 'auto' || raw === 'none' || raw === 'required') return { toolChoice: raw, forceSearch: false };
  if (isRecord(raw) && typeof raw.type === 'string') {
    let name: unknown;
    if (raw.type === 'function') {
      name = raw.name;
      if (typeof name !== 'string') throw new RequestError("Missing required parameter: 'tool_choice.name'.", 'tool_choice.name', 'missing_required_parameter');
    } else if (raw.type === 'allowed_tools' && Array.isArray(raw.tools)) {
      // The simulator always calls, and the first allowed function is its pick.
      const first: unknown = raw.tools.find((t: unknown) => isRecord(t) && t.type === 'function');
      if (!isRecord(first)) return { toolChoice: 'none', forceSearch: raw.tools.some((t: unknown) => isRecord(t) && WEB_SEARCH_TOOLS.has(t.type as string)) };
      name = first.name;
    } else if (WEB_SEARCH_TOOLS.has(raw.type)) {
      return { toolChoice: 'none', forceSearch: true };
    } else if (IDLE_TOOLS.has(raw.type)) {
      return { toolChoice: 'none', forceSearch: false };
    }
    if (typeof name === 'string') {
      if (tools.some((t) => t.name === name)) return { toolChoice: { name }, forceSearch: false };
      throw new RequestError(`Invalid value for 'tool_choice': no function named '${name}' in 'tools'.`, 'tool_choice', 'invalid_value');
    }
  }
  throw new RequestError("Invalid value for 'tool_choice'.", 'tool_choice', 'invalid_value');
}

function parseText(raw: unknown): { format: ResponseFormat; echo: Record<string, unknown> } {
  if (raw === undefined || raw === null) return { format: 'text', echo: { format: { type: 'text' }, verbosity: 'medium' } };
  if (!isRecord(raw)) throw new RequestError("Invalid type for 'text': expected an object.", 'text', 'invalid_type');
  const echo = { ...raw, format: raw.format ?? { type: 'text' }, verbosity: raw.verbosity ?? 'medium' };
  const format = raw.format;
  if (format === undefined || format === null) return { format: 'text', echo };
  if (!isRecord(format)) throw new RequestError("Invalid type for 'text.format': expected an object.", 'text.format', 'invalid_type');
  if (format.type === 'text' || format.type === 'json_object') return { format: format.type, echo };
  if (format.type === 'json_schema') {
    // Flat here: a Chat-style `json_schema` wrapper leaves name and schema missing.
    requiredString(format.name, 'text.format.name');
    if (!isRecord(format.schema)) {
      throw new RequestError("Missing required parameter: 'text.format.schema'.", 'text.format.schema', 'missing_required_parameter');
    }
    return { format: { schema: format.schema }, echo };
  }
  throw new RequestError(`Invalid value for 'text.format.type': ${JSON.stringify(format.type)}.`, 'text.format.type', 'invalid_value');
}

function parseReasoning(raw: unknown): ResponseEcho['reasoning'] {
  if (raw === undefined || raw === null) return { effort: null, summary: null };
  if (!isRecord(raw)) throw new RequestError("Invalid type for 'reasoning': expected an object.", 'reasoning', 'invalid_type');
  const effort = raw.effort ?? 'medium';
  if (typeof effort !== 'string' || !EFFORTS.has(effort)) {
    throw new RequestError(`Invalid value for 'reasoning.effort': ${JSON.stringify(effort)}.`, 'reasoning.effort', 'invalid_value');
  }
  // `generate_summary` is the deprecated spelling of `summary`.
  const key = raw.summary === undefined && raw.generate_summary !== undefined ? 'generate_summary' : 'summary';
  const summary = raw[key] ?? null;
  if (summary !== null && (typeof summary !== 'string' || !SUMMARIES.has(summary))) {
    throw new RequestError(`Invalid value for 'reasoning.${key}': ${JSON.stringify(summary)}.`, `reasoning.${key}`, 'invalid_value');
  }
  return { effort, summary };
}

function parseMetadata(raw: unknown): Record<string, unknown> {
  if (raw === undefined || raw === null) return {};
  if (!isRecord(raw)) throw new RequestError("Invalid type for 'metadata': expected an object.", 'metadata', 'invalid_type');
  return raw;
}
