/**
 * The chat completions family (`/v1/chat/completions`, `/v1/models`, OpenAI shape).
 * Same-family requests go upstream as the client's own bytes, with a minimal splice when Sluice
 * must add something (the upstream model name, a default output ceiling, a usage request).
 */
import type { ModelConfig } from '../../../src/config.js';
import { definePlugin, type Codec, type PassthroughStream, type Usage } from '../../../src/contracts.js';
import { GatewayError, type ErrorKind } from '../../../src/errors.js';
import { StateKey, type Exchange } from '../../../src/exchange.js';
import { dataFrame, frameData } from '../../../src/sse.js';
import { compileValidator } from '../../../src/validation.js';
import { chatRequestSchema } from './schema.js';

const validate = compileValidator(chatRequestSchema);

/** Set when Sluice asked the upstream for stream usage that the client did not ask for. */
const usageInjected = new StateKey<boolean>('chat usage injected');

const errorTypes: Record<ErrorKind, string> = {
  invalid_request: 'invalid_request_error',
  authentication: 'invalid_request_error',
  permission: 'permission_error',
  not_found: 'invalid_request_error',
  too_large: 'invalid_request_error',
  rate_limit: 'rate_limit_error',
  upstream: 'upstream_error',
  unavailable: 'service_unavailable',
  timeout: 'timeout',
  internal: 'server_error',
};

/** OpenAI's usage object in family-neutral terms. */
export function readChatUsage(u: any): Usage | undefined {
  if (!u || typeof u !== 'object' || typeof u.prompt_tokens !== 'number') return undefined;
  return {
    inputTokens: u.prompt_tokens,
    outputTokens: u.completion_tokens ?? 0,
    cachedTokens: u.prompt_tokens_details?.cached_tokens,
    reasoningTokens: u.completion_tokens_details?.reasoning_tokens,
  };
}

const USAGE_KEY = Buffer.from('"usage"');

/** True when `"usage"` at `at` is followed by an object (not `null`). Cheaper than parsing. */
function usageObjectAt(frame: Buffer, at: number): boolean {
  let i = at + USAGE_KEY.length;
  while (frame[i] === 0x20) i++;
  if (frame[i++] !== 0x3a) return false;
  while (frame[i] === 0x20) i++;
  return frame[i] === 0x7b;
}

function textOf(content: unknown): string {
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) return '';
  return content.map((p) => (typeof p?.text === 'string' ? p.text : typeof p?.refusal === 'string' ? p.refusal : '')).join('');
}

/**
 * Adds or replaces top-level fields. New fields are spliced in before the closing brace so the
 * client's bytes stay as they were; replacing a field re-serialises the body.
 */
function withFields(raw: Buffer, parsed: Record<string, unknown>, fields: Record<string, unknown>): Buffer {
  const names = Object.keys(fields);
  if (names.length === 0) return raw;
  if (names.some((n) => n in parsed)) return Buffer.from(JSON.stringify({ ...parsed, ...fields }));
  let end = raw.length - 1;
  while (end > 0 && raw[end] !== 0x7d) end--;
  const added = names.map((n) => `,${JSON.stringify(n)}:${JSON.stringify(fields[n])}`).join('');
  return Buffer.concat([raw.subarray(0, end), Buffer.from(added), raw.subarray(end)]);
}

/** Refuses what the model's config says it cannot do, and applies its output ceiling. */
function applyModelRules(req: Record<string, any>, model: ModelConfig): Record<string, unknown> {
  const unsupported = (param: string, what: string) =>
    new GatewayError('unsupported_parameter', `Unsupported parameter: '${param}': model \`${model.id}\` does not support ${what}.`, param);
  const { features, maxOutputTokens } = model;
  if (!features.tools && (req.tools?.length || req.tool_choice)) throw unsupported('tools', 'tool calling');
  if (!features.jsonSchema && req.response_format?.type === 'json_schema') {
    throw unsupported('response_format', 'json_schema structured output');
  }
  if (!features.temperature && req.temperature != null) throw unsupported('temperature', 'a sampling temperature');
  if (!features.vision) {
    req.messages.forEach((m: any, i: number) => {
      if (!Array.isArray(m.content)) return;
      const j = m.content.findIndex((p: any) => p?.type === 'image_url');
      if (j >= 0) throw unsupported(`messages[${i}].content[${j}]`, 'image input');
    });
  }
  if (req.stream && req.stream_options?.include_usage && !features.streamUsage) {
    throw unsupported('stream_options.include_usage', 'usage in streams');
  }

  const fields: Record<string, unknown> = {};
  const field = req.max_completion_tokens != null ? 'max_completion_tokens' : req.max_tokens != null ? 'max_tokens' : undefined;
  if (field && maxOutputTokens.max && req[field] > maxOutputTokens.max) {
    throw new GatewayError(
      'invalid_value',
      `${field} is too large: ${req[field]}. Model \`${model.id}\` supports at most ${maxOutputTokens.max} completion tokens.`,
      field,
    );
  }
  if (!field && maxOutputTokens.default) fields.max_completion_tokens = maxOutputTokens.default;
  if (model.upstreamModel !== req.model) fields.model = model.upstreamModel;
  return fields;
}

const codec: Codec = {
  family: 'chat',
  endpoints: [
    { method: 'post', path: '/v1/chat/completions', kind: 'generate' },
    { method: 'get', path: '/v1/models', kind: 'models' },
  ],
  streamContentType: 'text/event-stream; charset=utf-8',

  credential(ex) {
    const header = ex.headers.authorization;
    if (header === undefined) return undefined;
    const match = /^Bearer\s+(\S+)\s*$/i.exec(header);
    return match ? match[1] : '';
  },

  decode(ex) {
    let parsed: unknown;
    try {
      parsed = JSON.parse(ex.body.toString('utf8'));
    } catch {
      throw new GatewayError('invalid_json', 'We could not parse the JSON body of your request. Send valid JSON.');
    }
    if (!parsed || typeof parsed !== 'object' || Array.isArray(parsed)) {
      throw new GatewayError('invalid_request', 'The request body must be a JSON object.');
    }
    const invalid = validate(parsed);
    if (invalid) throw invalid;
    ex.request = parsed as Record<string, any>;
    ex.modelId = ex.request.model;
    ex.stream = ex.request.stream === true;
    if (ex.request.stream_options != null && !ex.stream) {
      throw new GatewayError('invalid_request', "The 'stream_options' parameter is only allowed when 'stream' is enabled.", 'stream_options');
    }
  },

  prepare(ex) {
    const req = ex.request;
    const model = ex.model!;
    const fields = applyModelRules(req, model);
    if (ex.stream && !req.stream_options?.include_usage && model.features.streamUsage) {
      fields.stream_options = { ...req.stream_options, include_usage: true };
      ex.set(usageInjected, true);
    }
    return {
      method: 'POST',
      path: '/chat/completions',
      headers: { 'content-type': 'application/json' },
      body: withFields(ex.body, req, fields),
      stream: ex.stream,
      model: model.upstreamModel,
    };
  },

  passthroughStream(ex): PassthroughStream {
    const dropUsageChunk = ex.get(usageInjected) === true;
    let usage: Usage | undefined;
    return {
      frame(frame) {
        const at = frame.indexOf(USAGE_KEY);
        if (at < 0 || !usageObjectAt(frame, at)) return true;
        const data = frameData(frame);
        if (!data) return true;
        let chunk: any;
        try {
          chunk = JSON.parse(data);
        } catch {
          return true;
        }
        usage = readChatUsage(chunk.usage) ?? usage;
        // The usage-only chunk the client did not ask for stays with Sluice.
        return !(dropUsageChunk && Array.isArray(chunk.choices) && chunk.choices.length === 0);
      },
      usage: () => usage,
    };
  },

  bodyUsage(body) {
    try {
      return readChatUsage(JSON.parse(body.toString('utf8')).usage);
    } catch {
      return undefined;
    }
  },

  deliveredText(frames) {
    let text = '';
    for (const frame of frames) {
      const data = frameData(frame);
      if (!data || data === '[DONE]') continue;
      try {
        for (const choice of JSON.parse(data).choices ?? []) {
          const d = choice.delta ?? {};
          if (typeof d.content === 'string') text += d.content;
          for (const call of d.tool_calls ?? []) text += (call.function?.name ?? '') + (call.function?.arguments ?? '');
        }
      } catch {
        // A frame that is not JSON carries no output.
      }
    }
    return text;
  },

  promptText(ex) {
    const req = ex.request;
    const parts: string[] = [];
    for (const m of req.messages ?? []) {
      parts.push(textOf(m.content));
      for (const call of m.tool_calls ?? []) parts.push(call.function?.name ?? '', call.function?.arguments ?? '');
    }
    if (req.tools) parts.push(JSON.stringify(req.tools));
    return parts.join('\n');
  },

  modelList(models) {
    return {
      object: 'list',
      data: models.map((m) => ({ id: m.id, object: 'model', created: m.created, owned_by: m.ownedBy })),
    };
  },

  errorBody(err) {
    return JSON.stringify({ error: { message: err.message, type: errorTypes[err.kind], param: err.param, code: err.code } });
  },

  streamErrorFrame(err) {
    return dataFrame(codec.errorBody(err));
  },
};

export default definePlugin((ctx) => {
  ctx.addCodec(codec);
  return { name: 'codecs/chat' };
});
