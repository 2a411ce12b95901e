/**
 * The Responses client family (OpenAI shape): `POST /v1/responses`, and `GET /v1/responses` upgraded
 * to a WebSocket (socket.ts). Keys come in `Authorization: Bearer`.
 */
import {
  checkModelId,
  type ClientFamily,
  type Exchange,
  type FamilyPassthrough,
  frameJson,
  GatewayError,
  holdsArray,
  lengthOf,
  looksLikeJsonObject,
  ObjectKeyNeedle,
  parseRequestJson,
  partsIn,
  positiveNumber,
  type RequestCaps,
  type RequestShape,
  withFields,
} from '../../../src/plugin-api.js';
import { bearerCredential, openAiErrorBody } from '../openai-common.js';
import { canonicalToResponsesBody, readResponsesUsage, responsesToCanonical, toolMapping } from './canonical.js';
import { itemType, type ResponsesRequest, validateResponsesRequest } from './schema.js';
import { responsesPassthrough, responsesStreamWriter } from './stream.js';
import type { CallOutputItem, CustomToolCallItem, FunctionCallItem, InputItem, MessageItem, UpstreamResponsesEvent, UpstreamResponsesUsage } from './wire.js';

/** An answer's usage, read without parsing the rest of the answer (ObjectKeyNeedle.objectIn). */
const ANSWER_USAGE = new ObjectKeyNeedle('usage');

/** The request decode checked against the schema the type is derived from. */
const requestOf = (ex: Exchange) => ex.request as ResponsesRequest;

const shape: RequestShape = {
  messagesField: 'input',
  toolsField: 'tools',
  count(body) {
    const input = typeof body.input === 'string' ? [body.input] : Array.isArray(body.input) ? body.input : [];
    let contentParts = 0;
    for (const item of input) contentParts += typeof item === 'string' ? 1 : partsIn(item?.content) + partsIn(item?.output);
    let tools = 0;
    for (const t of Array.isArray(body.tools) ? body.tools : []) tools += t?.type === 'namespace' ? lengthOf(t.tools) : 1;
    return { messages: input.length, tools, contentParts };
  },
};

function textOf(content: unknown): string {
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) return '';
  return content.map((p) => (typeof p?.text === 'string' ? p.text : '')).join('');
}

/** Every response has its `output` array: JSON without it (`{}`, `{"ok":true}`) is no answer. */
const OUTPUT = Buffer.from('"output"');

/** A Responses upstream gets the client's bytes, and its answers come back as they are. */
const passthrough: FamilyPassthrough = {
  modelKey: '"model"',
  // A passthrough 200 that is not a JSON object with its `output` is a lying upstream: a 502 (relay).
  isAnswer: (body) => looksLikeJsonObject(body) && holdsArray(body, OUTPUT),

  prepare(ex, _upstream, rules) {
    const req = requestOf(ex);
    const model = ex.model!;
    const fields: Partial<Record<keyof ResponsesRequest, unknown>> = {};
    if (rules.defaultOutputTokens !== undefined) fields.max_output_tokens = rules.defaultOutputTokens;
    if (model.upstreamModel !== req.model) fields.model = model.upstreamModel;
    if (rules.droppedTools.length) {
      const dropped = new Set(rules.droppedTools.map((t) => t.param));
      // Tools are dropped only from a request that has them.
      fields.tools = req.tools!.filter((_, i) => !dropped.has(`tools[${i}]`));
    }
    return {
      method: 'POST',
      path: '/responses',
      headers: { 'content-type': 'application/json' },
      body: withFields(ex.body, req, fields),
    };
  },

  stream: (ex) => responsesPassthrough(ex),

  bodyUsage: (body) => readResponsesUsage(ANSWER_USAGE.objectIn(body) as UpstreamResponsesUsage | undefined),

  deliveredText(frames) {
    let text = '';
    for (const e of frameJson(frames) as Iterable<UpstreamResponsesEvent>) if (typeof e.delta === 'string') text += e.delta;
    return text;
  },
};

export const family: Omit<ClientFamily, 'decode' | 'socket'> = {
  name: 'responses',
  endpoints: [
    { method: 'post', path: '/v1/responses', kind: 'generate' },
    { method: 'get', path: '/v1/responses', kind: 'socket' },
  ],
  streamContentType: () => 'text/event-stream; charset=utf-8',

  translationMode: (upstreamFamily) => (upstreamFamily === 'chat' ? 'bridge' : 'translated'),

  credential: bearerCredential,

  errorBody: openAiErrorBody,

  requestedOutputTokens: (ex) => positiveNumber(requestOf(ex).max_output_tokens),

  promptText(ex) {
    const req = requestOf(ex);
    const parts: string[] = [req.instructions ?? ''];
    const input: InputItem[] = typeof req.input === 'string' ? [{ role: 'user', content: req.input }] : req.input;
    // Each item read as the type decode checked it against (itemType chose the schema).
    for (const item of input) {
      const type = itemType(item);
      if (type === 'message') parts.push(textOf((item as MessageItem).content));
      else if (type === 'function_call') parts.push((item as FunctionCallItem).name, (item as FunctionCallItem).arguments);
      else if (type === 'function_call_output' || type === 'custom_tool_call_output') parts.push(textOf((item as CallOutputItem).output));
      else if (type === 'custom_tool_call') parts.push((item as CustomToolCallItem).name, (item as CustomToolCallItem).input);
    }
    if (req.tools) parts.push(JSON.stringify(req.tools));
    // A structured output's schema is read by the upstream as input.
    if (req.text?.format) parts.push(JSON.stringify(req.text.format));
    return parts.join('\n');
  },

  toCanonical(ex, upstreamFamily) {
    const { request, mapping } = responsesToCanonical(requestOf(ex), ex.model!, upstreamFamily);
    ex.set(toolMapping, mapping);
    return request;
  },

  writeResponse: (res, ex) => JSON.stringify(canonicalToResponsesBody(res, ex)),

  streamWriter: (ex) => responsesStreamWriter(ex),

  passthrough,
};

export function decode(ex: Exchange, caps: RequestCaps): void {
  const parsed = parseRequestJson(ex.body, shape, caps);
  checkModelId(parsed.model, caps);
  const invalid = validateResponsesRequest(parsed);
  if (invalid) throw invalid;
  if (parsed.previous_response_id != null) {
    throw new GatewayError(
      'unsupported_parameter',
      "'previous_response_id' is supported only on the Responses WebSocket channel (the same path, upgraded to a WebSocket). Over HTTP, send the whole conversation in 'input'.",
      'previous_response_id',
    );
  }
  if (parsed.conversation != null) {
    throw new GatewayError('unsupported_parameter', "'conversation' is not supported: Sluice keeps no conversations. Send the whole conversation in 'input'.", 'conversation');
  }
  if (parsed.background === true) {
    throw new GatewayError('unsupported_parameter', "'background' responses are not supported.", 'background');
  }
  ex.request = parsed;
  // The schema made sure it is a string.
  ex.modelId = parsed.model as string;
  ex.stream = parsed.stream === true;
}
