/**
 * The content-generation client family (Gemini shape): `POST /v1beta/models/{id}:generateContent`,
 * `:streamGenerateContent` (`?alt=sse` for SSE, a JSON array without), `GET /v1beta/models[/{id}]`.
 * Keys come in `x-svc-api-key`, or `x-goog-api-key` / `?key=` so the stock Gemini clients work.
 */
import {
  checkModelId,
  type ClientFamily,
  echoed,
  type Exchange,
  type FamilyPassthrough,
  hasObjectField,
  frameJson,
  GatewayError,
  holdsArray,
  lengthOf,
  looksLikeJsonObject,
  type ModelConfig,
  parseRequestJson,
  positiveNumber,
  type RequestCaps,
  type RequestShape,
  withFields,
} from '../../../src/plugin-api.js';
import { canonicalToGeminiBody, geminiToCanonical, readGeminiUsage } from './canonical.js';
import { RETRY_INFO, upstreamPath } from './dialect.js';
import { type GeminiRequest, validateGenerateContent } from './schema.js';
import { camelCaseFields } from './spelling.js';
import { geminiPassthrough, geminiStreamWriter, sseMode, USAGE_METADATA } from './stream.js';
import type { UpstreamGeminiAnswer, UpstreamGeminiUsage } from './wire.js';

/** The request decode checked against the schema the type is derived from. */
const requestOf = (ex: Exchange) => ex.request as GeminiRequest;

/** An entry of the model list. */
interface GeminiModel {
  name: string;
  version: string;
  displayName: string;
  description: string;
  inputTokenLimit: number | undefined;
  outputTokenLimit: number;
  supportedGenerationMethods: string[];
}

const statusNames: Record<number, string> = {
  400: 'INVALID_ARGUMENT',
  401: 'UNAUTHENTICATED',
  403: 'PERMISSION_DENIED',
  404: 'NOT_FOUND',
  405: 'INVALID_ARGUMENT',
  413: 'INVALID_ARGUMENT',
  429: 'RESOURCE_EXHAUSTED',
  499: 'CANCELLED',
  500: 'INTERNAL',
  502: 'INTERNAL',
  503: 'UNAVAILABLE',
  504: 'DEADLINE_EXCEEDED',
};

const methods = { generateContent: false, streamGenerateContent: true } as const;

const shape: RequestShape = {
  messagesField: 'contents',
  toolsField: 'tools',
  count(body) {
    const contents = Array.isArray(body.contents) ? body.contents : [];
    let contentParts = lengthOf(body.systemInstruction?.parts);
    for (const c of contents) contentParts += lengthOf(c?.parts);
    let tools = 0;
    for (const t of Array.isArray(body.tools) ? body.tools : []) tools += Array.isArray(t?.functionDeclarations) ? t.functionDeclarations.length : 1;
    return { messages: contents.length, tools, contentParts };
  },
};

/** `sim-gemini:generateContent` → the model id and the method; a `models/` prefix is accepted. */
function parseTarget(target: string): { model: string; method?: string } {
  let decoded: string;
  try {
    decoded = decodeURIComponent(target).replace(/^models\//, '');
  } catch {
    throw new GatewayError('invalid_request', 'The model name in the path is not valid percent-encoding.', 'model');
  }
  const colon = decoded.lastIndexOf(':');
  return colon < 0 ? { model: decoded } : { model: decoded.slice(0, colon), method: decoded.slice(colon + 1) };
}

/** Google answers an unknown model with 404 NOT_FOUND (protocols.md 4.8), where the catalog says 400. */
const errorStatus = (err: GatewayError): number => (err.code === 'model_not_found' ? 404 : err.status);

function errorBody(err: GatewayError): string {
  const code = errorStatus(err);
  const status = statusNames[code] ?? (code >= 500 ? 'INTERNAL' : 'INVALID_ARGUMENT');
  // Google says how long to wait in the body too (google.rpc.RetryInfo), where its SDKs and CLI look.
  const details = err.retryAfterSeconds === undefined ? undefined : [{ '@type': RETRY_INFO, retryDelay: `${err.retryAfterSeconds}s` }];
  return JSON.stringify({ error: { code, message: err.message, status, ...(details && { details }) } });
}

function modelEntry(m: ModelConfig): GeminiModel {
  return {
    name: `models/${m.id}`,
    version: '1',
    displayName: m.id,
    description: `${m.id} via Sluice`,
    inputTokenLimit: m.contextTokens,
    outputTokenLimit: m.maxOutputTokens.max ?? m.maxOutputTokens.default ?? 8192,
    supportedGenerationMethods: ['generateContent', 'streamGenerateContent'],
  };
}

/** An answer has its `candidates` array, or a blocked prompt's `promptFeedback` in their place. */
const CANDIDATES = Buffer.from('"candidates"');
const PROMPT_FEEDBACK = Buffer.from('"promptFeedback"');

/** A Gemini upstream gets the client's bytes, and its answers come back as they are. */
const passthrough: FamilyPassthrough = {
  modelKey: '"modelVersion"',
  // A passthrough 200 that is not a JSON object with candidates (or a blocked prompt's feedback) is a lying upstream: a 502 (relay).
  isAnswer: (body) => looksLikeJsonObject(body) && (holdsArray(body, CANDIDATES) || hasObjectField(body, PROMPT_FEEDBACK)),

  prepare(ex, _upstream, rules) {
    const req = requestOf(ex);
    const model = ex.model!;
    const fields: Record<string, unknown> = {};
    if (rules.defaultOutputTokens !== undefined) fields.generationConfig = { ...req.generationConfig, maxOutputTokens: rules.defaultOutputTokens };
    if (rules.droppedTools.length) {
      const dropped = new Set(rules.droppedTools.map((t) => t.param));
      fields.tools = req
        .tools!.map((t, i) => Object.fromEntries(Object.entries(t).filter(([key]) => !dropped.has(`tools[${i}].${key}`))))
        .filter((t) => Object.keys(t).length);
    }
    const body = withFields(ex.body, req, fields);
    return {
      method: 'POST',
      path: upstreamPath(model.upstreamModel, ex.stream),
      headers: { 'content-type': 'application/json' },
      body,
    };
  },

  stream: (ex) => geminiPassthrough(ex, errorBody),

  bodyUsage: (body) => readGeminiUsage(USAGE_METADATA.objectIn(body) as UpstreamGeminiUsage | undefined),

  deliveredText(frames) {
    let text = '';
    for (const chunk of frameJson(frames) as Iterable<UpstreamGeminiAnswer>) {
      for (const p of chunk.candidates?.[0]?.content?.parts ?? []) {
        if (typeof p.text === 'string') text += p.text;
        if (p.functionCall) text += p.functionCall.name + JSON.stringify(p.functionCall.args ?? {});
      }
    }
    return text;
  },
};

export const family: Omit<ClientFamily, 'decode'> = {
  name: 'gemini',
  endpoints: [
    { method: 'post', path: '/v1beta/models/:target', kind: 'generate' },
    { method: 'get', path: '/v1beta/models', kind: 'models' },
    { method: 'get', path: '/v1beta/models/:target', kind: 'models' },
  ],

  streamContentType: (ex) => (ex.get(sseMode) ? 'text/event-stream' : 'application/json; charset=utf-8'),

  credential(ex) {
    return ex.headers['x-svc-api-key'] ?? ex.headers['x-goog-api-key'] ?? ex.queryParam('key');
  },

  modelList(models, ex: Exchange) {
    if (ex.params[0] === undefined) return { models: models.map(modelEntry) };
    const { model } = parseTarget(ex.params[0]);
    const found = models.find((m) => m.id === model);
    if (!found) throw new GatewayError('not_found', `Model models/${echoed(model)} is not found or not available to this key.`);
    return modelEntry(found);
  },

  errorBody,
  errorStatus,

  requestedOutputTokens: (ex) => positiveNumber(requestOf(ex).generationConfig?.maxOutputTokens),

  promptText(ex) {
    const req = requestOf(ex);
    const texts: string[] = [];
    for (const p of req.systemInstruction?.parts ?? []) texts.push(p.text ?? '');
    for (const c of req.contents) {
      for (const p of c.parts) {
        if (typeof p.text === 'string') texts.push(p.text);
        if (p.functionCall) texts.push(p.functionCall.name, JSON.stringify(p.functionCall.args ?? {}));
        if (p.functionResponse) texts.push(JSON.stringify(p.functionResponse.response));
      }
    }
    if (req.tools) texts.push(JSON.stringify(req.tools));
    // A structured output's schema is read by the upstream as input.
    const config = req.generationConfig;
    if (config?.responseSchema) texts.push(JSON.stringify(config.responseSchema));
    if (config?.responseJsonSchema) texts.push(JSON.stringify(config.responseJsonSchema));
    return texts.join('\n');
  },

  toCanonical: (ex, upstreamFamily) => geminiToCanonical(requestOf(ex), ex.model!, ex.stream, upstreamFamily === 'gemini'),

  writeResponse: (res, ex) => JSON.stringify(canonicalToGeminiBody(res, ex)),

  streamWriter: (ex) => geminiStreamWriter(ex, errorBody),

  passthrough,
};

export function decode(ex: Exchange, caps: RequestCaps): void {
  const { model, method } = parseTarget(ex.params[0] ?? '');
  if (!method || !Object.hasOwn(methods, method)) {
    throw new GatewayError('not_found', `Method '${echoed(method ?? '')}' is not supported; use generateContent or streamGenerateContent.`);
  }
  checkModelId(model, caps);
  let respelled = false;
  const parsed = parseRequestJson(ex.body, shape, caps, (body) => (respelled = camelCaseFields(body)));
  // The upstream gets the spelling every check read.
  if (respelled) ex.body = Buffer.from(JSON.stringify(parsed));
  const invalid = validateGenerateContent(parsed);
  if (invalid) throw invalid;
  ex.request = parsed;
  ex.modelId = model;
  ex.stream = methods[method as keyof typeof methods];
  ex.set(sseMode, ex.queryParam('alt') === 'sse');
}
