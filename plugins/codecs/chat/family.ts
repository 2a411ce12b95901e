/**
 * The chat completions client family (OpenAI shape): `POST /v1/chat/completions`, and the one
 * `GET /v1/models` of both OpenAI families. Keys come in `Authorization: Bearer`.
 */
import {
  checkModelId,
  type ClientFamily,
  compileValidator,
  decodedParam,
  echoed,
  type Exchange,
  type FamilyPassthrough,
  frameJson,
  GatewayError,
  holdsArray,
  lengthOf,
  looksLikeJsonObject,
  type ModelConfig,
  parseRequestJson,
  partsIn,
  positiveNumber,
  type RequestCaps,
  type RequestShape,
  StateKey,
  withFields,
} from '../../../src/plugin-api.js';
import { bearerCredential, openAiErrorBody } from '../openai-common.js';
import { canonicalToChatResponse, chatToCanonical, outputCeilingField, readChatUsage } from './canonical.js';
import { chatPassthrough, chatStreamWriter, USAGE_OBJECT } from './stream.js';
import { type ChatRequest, chatRequestSchema } from './schema.js';
import type { UpstreamChatChunk, UpstreamChatUsage } from './wire.js';

const validate = compileValidator(chatRequestSchema);

const shape: RequestShape = {
  messagesField: 'messages',
  toolsField: 'tools',
  count(body) {
    let contentParts = 0;
    const messages = Array.isArray(body.messages) ? body.messages : [];
    for (const m of messages) contentParts += partsIn(m?.content);
    return { messages: messages.length, tools: lengthOf(body.tools), contentParts };
  },
};

/** The request decode checked against the schema the type is derived from. */
const requestOf = (ex: Exchange) => ex.request as ChatRequest;

/** Set when Sluice asked the upstream for stream usage that the client did not ask for. */
const usageInjected = new StateKey<boolean>('chat usage injected');

function textOf(content: unknown): string {
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) return '';
  return content.map((p) => (typeof p?.text === 'string' ? p.text : typeof p?.refusal === 'string' ? p.refusal : '')).join('');
}

/** Every chat completion has its `choices` array: JSON without it (`{}`, `{"ok":true}`) is no answer. */
const CHOICES = Buffer.from('"choices"');

/** A chat upstream gets the client's bytes, and its answers come back as they are. */
const passthrough: FamilyPassthrough = {
  modelKey: '"model"',

  prepare(ex, _upstream, rules) {
    const req = requestOf(ex);
    const model = ex.model!;
    const fields: Record<string, unknown> = {};
    // A default or a clamp goes in the field the client used. With both, the upstream gets one:
    // the larger, as the model rules checked it, in the current field.
    const ceiling = outputCeilingField(req);
    if (req.max_tokens != null && req.max_completion_tokens != null) {
      fields.max_tokens = undefined;
      fields.max_completion_tokens = rules.defaultOutputTokens ?? req[ceiling!];
    } else if (rules.defaultOutputTokens !== undefined) {
      fields[ceiling ?? 'max_completion_tokens'] = rules.defaultOutputTokens;
    }
    if (model.upstreamModel !== req.model) fields.model = model.upstreamModel;
    // The only server-side tool a chat client can ask for.
    if (rules.droppedTools.length) fields.web_search_options = undefined;
    if (ex.stream && !req.stream_options?.include_usage && model.features.streamUsage) {
      fields.stream_options = { ...req.stream_options, include_usage: true };
      ex.set(usageInjected, true);
    } else if (ex.stream && req.stream_options?.include_usage && !model.features.streamUsage) {
      // An upstream that cannot send usage is not asked for it; the passthrough sends an estimate instead.
      fields.stream_options = undefined;
    }
    return {
      method: 'POST',
      path: '/chat/completions',
      headers: { 'content-type': 'application/json' },
      body: withFields(ex.body, req, fields),
    };
  },

  asksForServerTools: (ex) => requestOf(ex).web_search_options != null,

  stream(ex) {
    return chatPassthrough(ex, { dropUsageChunk: ex.get(usageInjected) === true, wantsUsage: requestOf(ex).stream_options?.include_usage === true }, openAiErrorBody);
  },

  bodyUsage: (body) => readChatUsage(USAGE_OBJECT.objectIn(body) as UpstreamChatUsage | undefined),

  isAnswer: (body) => looksLikeJsonObject(body) && holdsArray(body, CHOICES),

  deliveredText(frames) {
    let text = '';
    for (const chunk of frameJson(frames) as Iterable<UpstreamChatChunk>) {
      for (const choice of chunk.choices ?? []) {
        const d = choice.delta ?? {};
        if (typeof d.content === 'string') text += d.content;
        for (const call of d.tool_calls ?? []) text += (call.function?.name ?? '') + (call.function?.arguments ?? '');
      }
    }
    return text;
  },
};

export const family: Omit<ClientFamily, 'decode'> = {
  name: 'chat',
  endpoints: [
    { method: 'post', path: '/v1/chat/completions', kind: 'generate' },
    // One model list serves both OpenAI families: entries say which families each model serves.
    { method: 'get', path: '/v1/models', kind: 'models', families: ['chat', 'responses'] },
    { method: 'get', path: '/v1/models/:id', kind: 'models', families: ['chat', 'responses'] },
  ],
  streamContentType: () => 'text/event-stream; charset=utf-8',

  credential: bearerCredential,

  requestedOutputTokens: (ex) => {
    const field = outputCeilingField(requestOf(ex));
    return field && positiveNumber(requestOf(ex)[field]);
  },

  promptText(ex) {
    const req = requestOf(ex);
    const parts: string[] = [];
    for (const m of req.messages) {
      parts.push('content' in m ? textOf(m.content) : '');
      if (m.role === 'assistant') for (const call of m.tool_calls ?? []) parts.push(call.type === 'function' ? call.function.name : '', call.type === 'function' ? call.function.arguments : '');
    }
    if (req.tools) parts.push(JSON.stringify(req.tools));
    // The upstream reads these too: a structured output's schema, and the older `functions`.
    if (req.response_format?.type === 'json_schema') parts.push(JSON.stringify(req.response_format.json_schema));
    const legacy = (req as { functions?: unknown }).functions;
    if (legacy) parts.push(JSON.stringify(legacy));
    return parts.join('\n');
  },

  modelList(models, ex) {
    const entry = (m: ModelConfig) => ({ id: m.id, object: 'model', created: m.created, owned_by: m.ownedBy, families: m.families });
    if (ex.params[0] === undefined) return { object: 'list', data: models.map(entry) };
    // SDKs percent-encode the id (`openai%2Fgpt-4o`).
    const id = decodedParam(ex.params[0]);
    // `GET /v1/models/{id}` (the SDK's models.retrieve): one model, or OpenAI's 404.
    const found = models.find((m) => m.id === id);
    if (!found) throw new GatewayError('model_not_found', `The model '${echoed(id)}' does not exist or you do not have access to it.`, 'model', 404);
    return entry(found);
  },

  errorBody: openAiErrorBody,

  toCanonical: (ex, upstreamFamily) => chatToCanonical(requestOf(ex), ex.model!, upstreamFamily === 'chat'),

  writeResponse: (res, ex) => JSON.stringify(canonicalToChatResponse(res, ex)),

  streamWriter: (ex) => chatStreamWriter(ex, openAiErrorBody),

  passthrough,
};

export function decode(ex: Exchange, caps: RequestCaps): void {
  const parsed = parseRequestJson(ex.body, shape, caps);
  checkModelId(parsed.model, caps);
  const invalid = validate(parsed);
  if (invalid) throw invalid;
  ex.request = parsed;
  const req = requestOf(ex);
  ex.modelId = req.model;
  ex.stream = req.stream === true;
  if (req.stream_options != null && !ex.stream) {
    throw new GatewayError('invalid_request', "The 'stream_options' parameter is only allowed when 'stream' is enabled.", 'stream_options');
  }
}
