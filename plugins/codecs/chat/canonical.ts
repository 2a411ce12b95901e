/** Chat completions requests and answers to and from the canonical pivot. */
import { canonical as C, type Exchange, GatewayError, type ModelConfig, newId, splitToolId, toolIdWithSignature, unixNow, type Usage } from '../../../src/plugin-api.js';
import type { ChatPart, ChatRequest } from './schema.js';
import type { ChatCompletion, ChatUpstreamBody, ChatUpstreamMessage, ChatUpstreamPart, ChatUsage, UpstreamChatCompletion, UpstreamChatUsage } from './wire.js';

/** OpenAI's usage object in family-neutral terms. */
export function readChatUsage(u: UpstreamChatUsage | null | undefined): Usage | undefined {
  if (!u || typeof u !== 'object' || typeof u.prompt_tokens !== 'number') return undefined;
  return {
    inputTokens: u.prompt_tokens,
    outputTokens: u.completion_tokens ?? 0,
    cachedTokens: u.prompt_tokens_details?.cached_tokens,
    cacheWriteTokens: u.prompt_tokens_details?.cache_write_tokens,
    reasoningTokens: u.completion_tokens_details?.reasoning_tokens,
  };
}

export function writeChatUsage(u: Usage): ChatUsage {
  return {
    prompt_tokens: u.inputTokens,
    completion_tokens: u.outputTokens,
    total_tokens: u.inputTokens + u.outputTokens,
    // Tokens written to the prompt cache (an Anthropic upstream's), where there were some.
    prompt_tokens_details: { cached_tokens: u.cachedTokens ?? 0, ...(u.cacheWriteTokens && { cache_write_tokens: u.cacheWriteTokens }) },
    completion_tokens_details: { reasoning_tokens: u.reasoningTokens ?? 0 },
  };
}

const finishReasons: Record<string, C.FinishReason> = {
  stop: 'stop',
  length: 'length',
  tool_calls: 'tool_calls',
  function_call: 'tool_calls',
  content_filter: 'content_filter',
};

export const readFinishReason = (reason: unknown): C.FinishReason => finishReasons[String(reason)] ?? 'stop';

function partsOf(content: unknown, where: string, native: boolean): C.Part[] {
  if (typeof content === 'string') return content ? [{ type: 'text', text: content }] : [];
  if (!Array.isArray(content)) return [];
  const parts: C.Part[] = [];
  content.forEach((p: ChatPart, i) => {
    const part = partOf(p, `${where}[${i}]`);
    // A part only the upstream of this family knows: it takes it as sent.
    if (part) parts.push(part);
    else if (!native) throw new GatewayError('invalid_request', `Unsupported content part type '${p.type}'.`, `${where}[${i}].type`);
  });
  return parts;
}

function partOf(p: ChatPart, where: string): C.Part | undefined {
  switch (p.type) {
    case 'text':
      return { type: 'text', text: p.text };
    case 'refusal':
      return { type: 'text', text: p.refusal };
    case 'image_url':
      return { type: 'image', url: p.image_url.url, where, ...(p.image_url.detail && { detail: p.image_url.detail }) };
    case 'file':
      return { type: 'file', fileId: p.file.file_id, data: p.file.file_data, filename: p.file.filename };
    case 'input_audio':
      return { type: 'audio', data: p.input_audio.data, format: p.input_audio.format };
    default:
      return undefined;
  }
}

/**
 * The field that holds a chat request's output ceiling: `max_completion_tokens`, or the older
 * `max_tokens`; with both, the larger, which the model rules check and the upstream may obey
 * (before, a `max_tokens` far above the model's maximum rode past them beside a small
 * `max_completion_tokens`).
 */
export function outputCeilingField(req: Pick<ChatRequest, 'max_tokens' | 'max_completion_tokens'>): 'max_tokens' | 'max_completion_tokens' | undefined {
  const { max_tokens: old, max_completion_tokens: current } = req;
  if (current == null) return old == null ? undefined : 'max_tokens';
  return old != null && old > current ? 'max_tokens' : 'max_completion_tokens';
}

/**
 * The client's chat request, canonically. For a chat upstream (`native`) nothing is refused: what
 * has no canonical form is left out, as the upstream gets the client's own bytes.
 */
export function chatToCanonical(req: ChatRequest, model: ModelConfig, native: boolean): C.Request {
  // Throws only when translating; a native upstream takes what is left out.
  const refuse = (param: string, what: string) => {
    if (!native) throw new GatewayError('unsupported_parameter', `Unsupported parameter: '${param}': ${what} is not available for model \`${model.id}\`, whose upstream speaks another API.`, param);
  };
  // Made at the first tool call: most conversations have none.
  let toolNames: Map<string, string> | undefined;
  const messages: C.Message[] = [];
  req.messages.forEach((m, i) => {
    const where = `messages[${i}].content`;
    switch (m.role) {
      case 'system':
      case 'developer':
        return messages.push({ role: 'system', content: partsOf(m.content, where, native) });
      case 'user':
        return messages.push({ role: 'user', content: partsOf(m.content, where, native) });
      case 'assistant': {
        const toolCalls: C.ToolCall[] = [];
        (m.tool_calls ?? []).forEach((c, j) => {
          if (c.type !== 'function') return refuse(`messages[${i}].tool_calls[${j}]`, 'a custom tool call');
          // The id may carry the call's signature (src/tool-call-ids.ts), made when the gateway wrote it.
          const { id, signature } = splitToolId(c.id);
          (toolNames ??= new Map()).set(id, c.function.name);
          toolCalls.push({ id, name: c.function.name, arguments: c.function.arguments, ...(signature && { signature }) });
        });
        return messages.push({ role: 'assistant', content: partsOf(m.content, where, native), toolCalls });
      }
      case 'tool': {
        const { id } = splitToolId(m.tool_call_id);
        return messages.push({ role: 'tool', toolCallId: id, name: toolNames?.get(id), content: partsOf(m.content, where, native) });
      }
      default:
        return refuse(`messages[${i}].role`, `the '${m.role}' role`);
    }
  });
  const tools: C.Tool[] = [];
  (req.tools ?? []).forEach((t, i) => {
    if (t.type !== 'function') return refuse(`tools[${i}]`, 'a custom tool');
    const f = t.function;
    tools.push({ name: f.name, description: f.description, parameters: f.parameters, strict: f.strict ?? undefined });
  });
  let toolChoice: C.ToolChoice | undefined;
  const choice = req.tool_choice;
  if (typeof choice === 'string') toolChoice = choice;
  else if (choice?.type === 'function') toolChoice = { name: choice.function.name };
  else if (choice?.type === 'allowed_tools') {
    const allowed: string[] = [];
    choice.allowed_tools.tools.forEach((t, j) => {
      if (t.type !== 'function') return refuse(`tool_choice.allowed_tools.tools[${j}]`, 'a custom tool');
      allowed.push(t.function.name);
    });
    toolChoice = { mode: choice.allowed_tools.mode, allowed };
  } else if (choice) {
    refuse('tool_choice', `tool_choice '${choice.type}'`);
    toolChoice = 'auto';
  }
  const maxField = outputCeilingField(req);

  const rf = req.response_format;
  // Not checked by the schema: only a string is a description (other families' upstreams take only that).
  const description = rf?.type === 'json_schema' ? rf.json_schema.description : undefined;
  const format: C.OutputFormat | undefined =
    rf?.type === 'json_schema'
      ? { type: 'json_schema', name: rf.json_schema.name, schema: rf.json_schema.schema, strict: rf.json_schema.strict ?? undefined, description: typeof description === 'string' ? description : undefined }
      : rf?.type === 'json_object'
        ? { type: 'json_object' }
        : undefined;
  return {
    model: model.upstreamModel,
    messages,
    tools,
    toolChoice,
    parallelToolCalls: req.parallel_tool_calls,
    format,
    maxOutputTokens: maxField && req[maxField]!,
    temperature: req.temperature ?? undefined,
    topP: req.top_p ?? undefined,
    stop: typeof req.stop === 'string' ? [req.stop] : (req.stop ?? undefined),
    seed: req.seed ?? undefined,
    presencePenalty: req.presence_penalty ?? undefined,
    frequencyPenalty: req.frequency_penalty ?? undefined,
    reasoning: req.reasoning_effort ? { effort: req.reasoning_effort } : undefined,
    metadata: req.metadata ?? undefined,
    user: req.user,
    stream: req.stream === true,
    serverTools: req.web_search_options != null ? [{ type: 'web_search', param: 'web_search_options' }] : undefined,
    extra: {
      ...((req.n ?? 1) > 1 && { candidates: 'n' }),
      ...(req.logprobs === true && { logprobs: 'logprobs' }),
    },
    params: { format: 'response_format', reasoning: 'reasoning_effort', ...(maxField && { maxOutputTokens: maxField }) },
  };
}

function writeParts(parts: C.Part[]): string | ChatUpstreamPart[] {
  if (parts.every((p) => p.type === 'text')) return parts.map((p) => (p as { text: string }).text).join('');
  return parts.map((p) => {
    switch (p.type) {
      case 'text':
        return { type: 'text', text: p.text };
      case 'image':
        return { type: 'image_url', image_url: { url: p.url, ...(p.detail && { detail: p.detail }) } };
      case 'file':
        return { type: 'file', file: { file_id: p.fileId, file_data: p.data, filename: C.fileNameOf(p) } };
      case 'audio':
        return { type: 'input_audio', input_audio: { data: p.data, format: p.format } };
    }
  });
}

/** A canonical request as a chat completions body for an upstream. */
export function canonicalToChat(req: C.Request, streamUsage: boolean): ChatUpstreamBody {
  const messages = req.messages.map((m): ChatUpstreamMessage => {
    switch (m.role) {
      case 'system':
        return { role: 'system', content: m.content.every((p) => p.type === 'text') ? C.systemTextOf(m.content) : writeParts(m.content) };
      case 'user':
        return { role: m.role, content: writeParts(m.content) };
      case 'assistant': {
        const text = writeParts(m.content);
        return {
          role: 'assistant',
          content: text === '' && m.toolCalls.length ? null : text,
          ...(m.toolCalls.length && {
            tool_calls: m.toolCalls.map((c) => ({ id: c.id, type: 'function', function: { name: c.name, arguments: c.arguments } })),
          }),
        };
      }
      case 'tool':
        return { role: 'tool', tool_call_id: m.toolCallId, content: writeParts(m.content) };
    }
  });
  const body: ChatUpstreamBody = { model: req.model, messages };
  if (req.tools.length) {
    body.tools = req.tools.map((t) => ({
      type: 'function',
      function: { name: t.name, ...(t.description && { description: t.description }), ...(t.parameters && { parameters: t.parameters }), ...(t.strict !== undefined && { strict: t.strict }) },
    }));
  }
  const choice = req.toolChoice;
  if (typeof choice === 'string') body.tool_choice = choice;
  else if (choice && 'name' in choice) body.tool_choice = { type: 'function', function: { name: choice.name } };
  else if (choice) body.tool_choice = { type: 'allowed_tools', allowed_tools: { mode: choice.mode, tools: choice.allowed.map((name) => ({ type: 'function', function: { name } })) } };
  if (req.parallelToolCalls !== undefined && req.tools.length) body.parallel_tool_calls = req.parallelToolCalls;
  if (req.format?.type === 'json_schema') {
    const { name, schema, strict, description } = req.format;
    body.response_format = { type: 'json_schema', json_schema: { name, ...(description && { description }), ...(schema && { schema }), ...(strict !== undefined && { strict }) } };
  } else if (req.format?.type === 'json_object') body.response_format = { type: 'json_object' };
  if (req.maxOutputTokens !== undefined) body.max_completion_tokens = req.maxOutputTokens;
  if (req.temperature !== undefined) body.temperature = req.temperature;
  if (req.topP !== undefined) body.top_p = req.topP;
  if (req.stop?.length) body.stop = req.stop;
  if (req.seed !== undefined) body.seed = req.seed;
  if (req.presencePenalty !== undefined) body.presence_penalty = req.presencePenalty;
  if (req.frequencyPenalty !== undefined) body.frequency_penalty = req.frequencyPenalty;
  if (req.reasoning?.effort) body.reasoning_effort = req.reasoning.effort;
  if (req.metadata) body.metadata = req.metadata;
  if (req.user) body.user = req.user;
  if (req.stream) {
    body.stream = true;
    if (streamUsage) body.stream_options = { include_usage: true };
  }
  return body;
}

/** A chat completions body from an upstream, canonically. */
export function chatResponseToCanonical(body: UpstreamChatCompletion): C.Response {
  // JSON without its choices (`{}`, `{"ok":true}`) is no answer: the channel failing, not an empty reply.
  if (!Array.isArray(body.choices)) throw new GatewayError('upstream_error', 'The upstream answered with no choices.');
  const choice = body.choices[0] ?? {};
  const message = choice.message ?? {};
  const toolCalls: C.ToolCall[] = (message.tool_calls ?? [])
    .filter((c) => c.type === 'function')
    // A function call's id and name are read as sent: an upstream that leaves them out gives the client what it gave.
    .map((c) => ({ id: c.id!, name: c.function!.name!, arguments: c.function!.arguments || '{}' }));
  // A refusal has no field in the other families: it is said as the answer's text, filtered.
  const refusal = typeof message.refusal === 'string' && message.refusal ? message.refusal : undefined;
  const content = typeof message.content === 'string' ? message.content : '';
  return {
    id: body.id,
    model: body.model,
    created: body.created,
    text: content || (refusal ?? ''),
    reasoning: typeof message.reasoning_content === 'string' ? message.reasoning_content : undefined,
    toolCalls,
    finishReason: toolCalls.length ? 'tool_calls' : refusal ? 'content_filter' : readFinishReason(choice.finish_reason),
    usage: readChatUsage(body.usage),
  };
}

/** Tool calls make the finish `tool_calls`, whatever the upstream called it. */
export const chatFinishReason = (reason: C.FinishReason, toolCalls: number) => (toolCalls > 0 ? 'tool_calls' : reason);

/** A canonical answer as a chat completions body for the client. */
export function canonicalToChatResponse(res: C.Response, ex: Exchange): ChatCompletion {
  return {
    id: newId('chatcmpl-', 12),
    object: 'chat.completion',
    created: unixNow(),
    model: ex.modelId,
    choices: [
      {
        index: 0,
        message: {
          role: 'assistant',
          content: res.text === '' && res.toolCalls.length ? null : res.text,
          refusal: null,
          ...(res.reasoning && { reasoning_content: res.reasoning }),
          ...(res.toolCalls.length && {
            tool_calls: res.toolCalls.map((c) => ({ id: toolIdWithSignature(c.id, c.signature), type: 'function', function: { name: c.name, arguments: c.arguments } })),
          }),
        },
        logprobs: null,
        finish_reason: chatFinishReason(res.finishReason, res.toolCalls.length),
      },
    ],
    ...(res.usage && { usage: writeChatUsage(res.usage) }),
  };
}
