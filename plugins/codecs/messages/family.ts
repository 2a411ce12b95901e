/**
 * The Messages client family (Anthropic shape): `POST /v1/messages`, `POST /v1/messages/count_tokens`,
 * `GET /v1/models` when the request carries `anthropic-version`, and the `HEAD /api/hello` probe
 * Claude Code sends at start. Keys come in `x-api-key` or `Authorization: Bearer`.
 */
import {
  checkModelId,
  type ClientFamily,
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
  type RateLimitWindows,
  type RequestCaps,
  type RequestShape,
  withFields,
} from '../../../src/plugin-api.js';
import { bearerCredential } from '../openai-common.js';
import { messagesToCanonical } from './request.js';
import { canonicalToMessagesResponse } from './response.js';
import { type MessagesRequest, validateCountTokens, validateMessagesRequest } from './schema.js';
import { messagesPassthrough, messagesStreamWriter, USAGE_OBJECT } from './stream.js';
import { type MessagesBlock, type MessagesMessage, messagesErrorBody, messagesErrorStatus, readMessagesUsage, type UpstreamMessagesEvent, type UpstreamMessagesUsage } from './wire.js';

/** The request decode checked against the schema the type is derived from (a count_tokens request has no max_tokens). */
const requestOf = (ex: Exchange) => ex.request as MessagesRequest;

/** A model as Anthropic's model list shows it. */
interface MessagesModel {
  type: 'model';
  id: string;
  display_name: string;
  created_at: string;
  max_input_tokens: number;
  max_tokens?: number;
}

const shape: RequestShape = {
  messagesField: 'messages',
  toolsField: 'tools',
  count(body) {
    const messages = Array.isArray(body.messages) ? body.messages : [];
    let contentParts = lengthOf(body.system);
    for (const m of messages) {
      contentParts += partsIn(m?.content);
      if (Array.isArray(m?.content)) for (const b of m.content) contentParts += lengthOf(b?.content);
    }
    return { messages: messages.length, tools: lengthOf(body.tools), contentParts };
  },
};

/** Only requests that say they speak Anthropic's API get its model list; others get OpenAI's. */
const speaksAnthropic = (headers: Record<string, string>) => headers['anthropic-version'] !== undefined;

/** Client headers a Messages upstream needs as they were sent: the API version and the betas that unlock body fields. */
const FORWARDED_HEADERS = ['anthropic-version', 'anthropic-beta'];

function textOf(content: unknown): string {
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) return '';
  const texts: string[] = [];
  for (const b of content) {
    if (typeof b?.text === 'string') texts.push(b.text);
    // Earlier turns' thinking, sent back with its signature: the upstream reads (and bills) it too.
    else if (typeof b?.thinking === 'string') texts.push(b.thinking);
    else if (b?.type === 'tool_use') texts.push(b.name ?? '', JSON.stringify(b.input ?? {}));
    else if (b?.type === 'tool_result') texts.push(textOf(b.content));
  }
  return texts.join('\n');
}

function modelEntry(m: ModelConfig): MessagesModel {
  return {
    type: 'model',
    id: m.id,
    display_name: m.id,
    created_at: new Date(m.created * 1000).toISOString(),
    max_input_tokens: m.contextTokens,
    ...((m.maxOutputTokens.max ?? m.maxOutputTokens.default) && { max_tokens: m.maxOutputTokens.max ?? m.maxOutputTokens.default }),
  };
}

/** One page of the model list, by Anthropic's `limit` (default 20), `after_id` and `before_id`. */
/** `GET /v1/models/{id}`: that model, or Anthropic's 404; without an id, a page of the list. */
function models(models: ModelConfig[], ex: Exchange): MessagesModel | ReturnType<typeof modelPage> {
  if (ex.params[0] === undefined) return modelPage(models, ex);
  // SDKs percent-encode the id (`openai%2Fgpt-4o`).
  const id = decodedParam(ex.params[0]);
  const found = models.find((m) => m.id === id);
  if (!found) throw new GatewayError('not_found', `model: ${echoed(id)}`);
  return modelEntry(found);
}

function modelPage(models: ModelConfig[], ex: Exchange): { data: MessagesModel[]; has_more: boolean; first_id: string | null; last_id: string | null } {
  const limit = Math.min(1000, Math.max(1, Number(ex.queryParam('limit')) || 20));
  const after = ex.queryParam('after_id');
  const before = ex.queryParam('before_id');
  let from = 0;
  let to = models.length;
  if (after !== undefined) from = models.findIndex((m) => m.id === after) + 1 || models.length;
  if (before !== undefined) to = Math.max(0, models.findIndex((m) => m.id === before));
  // Paging backwards takes the page that ends right before `before_id`.
  const start = before !== undefined && after === undefined ? Math.max(from, to - limit) : from;
  const page = models.slice(start, Math.min(to, start + limit));
  return {
    data: page.map(modelEntry),
    has_more: before !== undefined && after === undefined ? start > from : start + limit < to,
    first_id: page[0]?.id ?? null,
    last_id: page.at(-1)?.id ?? null,
  };
}

function decode(ex: Exchange, caps: RequestCaps): void {
  const counting = ex.endpoint.kind === 'count';
  const parsed = parseRequestJson(ex.body, shape, caps);
  checkModelId(parsed.model, caps);
  const invalid = counting ? validateCountTokens(parsed) : validateMessagesRequest(parsed);
  if (invalid) throw invalid;
  ex.request = parsed;
  // The schema made sure it is a string.
  ex.modelId = parsed.model as string;
  ex.stream = !counting && parsed.stream === true;
}

/**
 * Anthropic's names, which Claude Code and the SDKs read: a limit, what remains, and the RFC 3339
 * time the window is whole again (rounded up to the second, so a client that waits until then is
 * not refused). Sluice's token windows count input and output together, which is Anthropic's
 * `tokens` (the tightest of its token limits); it has no separate input and output windows to report.
 */
export function anthropicRateLimitHeaders({ requests, tokens }: RateLimitWindows, now: number): Record<string, string> {
  const headers: Record<string, string> = {};
  const at = (resetMs: number) => new Date(Math.ceil((now + resetMs) / 1000) * 1000).toISOString().replace('.000Z', 'Z');
  for (const [name, window] of [['requests', requests], ['tokens', tokens]] as const) {
    if (!window) continue;
    headers[`anthropic-ratelimit-${name}-limit`] = String(window.limit);
    headers[`anthropic-ratelimit-${name}-remaining`] = String(window.remaining);
    headers[`anthropic-ratelimit-${name}-reset`] = at(window.resetMs);
  }
  return headers;
}

/** Every answer has its `content` array: JSON without it (`{}`, `{"ok":true}`) is no answer. */
const CONTENT = Buffer.from('"content"');

/** A Messages upstream gets the client's bytes and headers, and its answers come back as they are. */
const passthrough: FamilyPassthrough = {
  modelKey: '"model"',
  // A passthrough 200 that is not a JSON object with its content is a lying upstream: a 502 (relay).
  // One field, as for the other families: a second search (its "type") cost 80 ns more an answer.
  isAnswer: (body) => looksLikeJsonObject(body) && holdsArray(body, CONTENT),

  prepare(ex, _upstream, rules) {
    const req = requestOf(ex);
    const model = ex.model!;
    const fields: Partial<Record<keyof MessagesRequest, unknown>> = {};
    if (model.upstreamModel !== req.model) fields.model = model.upstreamModel;
    const ceiling = rules.defaultOutputTokens;
    if (ceiling !== undefined) {
      fields.max_tokens = ceiling;
      // A thinking budget must stay below max_tokens: lowered with it, or thinking is left off.
      const budget = req.thinking?.type === 'enabled' ? req.thinking.budget_tokens : undefined;
      if (budget !== undefined && budget >= ceiling) fields.thinking = ceiling > 1024 ? { ...req.thinking, budget_tokens: ceiling - 1 } : undefined;
    }
    // Thinking this gateway answered unsigned (from a translated model) would be refused here.
    const unsigned = (b: MessagesBlock) => b?.type === 'thinking' && !b.signature;
    const hasUnsigned = (m: MessagesMessage) => Array.isArray(m.content) && m.content.some(unsigned);
    if (req.messages.some(hasUnsigned)) {
      fields.messages = req.messages.map((m) => (hasUnsigned(m) ? { ...m, content: (m.content as MessagesBlock[]).filter((b) => !unsigned(b)) } : m));
    }
    if (rules.droppedTools.length) {
      const dropped = new Set(rules.droppedTools.map((t) => t.param));
      // Tools are dropped only from a request that has them.
      fields.tools = req.tools!.filter((_, i) => !dropped.has(`tools[${i}]`));
    }
    const headers: Record<string, string> = { 'content-type': 'application/json' };
    for (const name of FORWARDED_HEADERS) if (ex.headers[name] !== undefined) headers[name] = ex.headers[name]!;
    return { method: 'POST', path: '/messages', headers, body: withFields(ex.body, req, fields) };
  },

  stream: (ex) => messagesPassthrough(ex),

  bodyUsage: (body) => readMessagesUsage(USAGE_OBJECT.objectIn(body) as UpstreamMessagesUsage | undefined),

  deliveredText(frames) {
    let text = '';
    for (const e of frameJson(frames) as Iterable<UpstreamMessagesEvent>) {
      if (e.type === 'content_block_start' && e.content_block?.type === 'tool_use') text += e.content_block.name ?? '';
      const d = e.type === 'content_block_delta' ? e.delta : undefined;
      if (!d) continue;
      text += d.text ?? d.thinking ?? d.partial_json ?? '';
    }
    return text;
  },
};

export function messagesFamily(caps: RequestCaps): ClientFamily {
  return {
    name: 'messages',
    endpoints: [
      { method: 'post', path: '/v1/messages', kind: 'generate' },
      { method: 'post', path: '/v1/messages/count_tokens', kind: 'count' },
      { method: 'get', path: '/v1/models', kind: 'models', when: speaksAnthropic },
      { method: 'get', path: '/v1/models/:id', kind: 'models', when: speaksAnthropic },
      { method: 'head', path: '/api/hello', kind: 'probe' },
    ],
    streamContentType: () => 'text/event-stream; charset=utf-8',

    credential(ex) {
      const key = ex.headers['x-api-key'];
      if (key === undefined) return bearerCredential(ex);
      return key.trim();
    },

    decode: (ex) => decode(ex, caps),

    modelList: models,

    errorBody: messagesErrorBody,
    errorStatus: messagesErrorStatus,

    tokenCount: (inputTokens) => ({ input_tokens: inputTokens }),

    rateLimitHeaders: anthropicRateLimitHeaders,

    promptText(ex) {
      const req = requestOf(ex);
      const parts: string[] = [textOf(req.system)];
      for (const m of req.messages ?? []) parts.push(textOf(m.content));
      if (req.tools) parts.push(JSON.stringify(req.tools));
      // A structured output's schema is read by the upstream as input.
      if (req.output_config?.format) parts.push(JSON.stringify(req.output_config.format));
      return parts.join('\n');
    },

    requestedOutputTokens: (ex) => positiveNumber(requestOf(ex).max_tokens),

    toCanonical: (ex, upstreamFamily) => messagesToCanonical(requestOf(ex), ex.model!, upstreamFamily === 'messages'),

    writeResponse: (res, ex) => JSON.stringify(canonicalToMessagesResponse(res, ex)),

    streamWriter: messagesStreamWriter,

    passthrough,
  };
}
