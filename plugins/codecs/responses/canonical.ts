/**
 * Responses requests and answers to and from the canonical pivot, including the bridge's limits:
 * what a chat-only upstream cannot do is refused up front, and what it can do in another shape
 * (custom tools, namespaced tools) is mapped there and back.
 */
import { canonical as C, type Exchange, GatewayError, type ModelConfig, newId, splitToolId, StateKey, toolIdWithSignature, unixNow, type Usage } from '../../../src/plugin-api.js';
import { itemType, type ResponsesRequest } from './schema.js';
import {
  type CallOutputItem,
  type CustomToolCallItem,
  type FunctionCallItem,
  type InputItem,
  type InputPart,
  isOfType,
  type MessageItem,
  type OutputCustomToolCall,
  type OutputFunctionCall,
  type OutputItem,
  type OutputMessage,
  type OutputPart,
  type OutputReasoning,
  type ResponseObject,
  type ResponsesTool,
  type ResponsesUpstreamBody,
  type ResponsesUsage,
  type UpstreamBoundItem,
  type UpstreamBoundPart,
  type UpstreamResponse,
  type UpstreamResponsesUsage,
} from './wire.js';

/** Tools the client declared in a shape the upstream does not have, to map calls back. */
export interface ToolMapping {
  /** Custom (free-text) tools, sent upstream as functions taking one string `input`. */
  custom: Set<string>;
  /** Flattened name → the namespace and name the client knows. */
  namespaced: Map<string, { namespace: string; name: string }>;
}

export const toolMapping = new StateKey<ToolMapping>('responses tool mapping');

const NAMESPACE_SEPARATOR = '__';

export function readResponsesUsage(u: UpstreamResponsesUsage | null | undefined): Usage | undefined {
  if (!u || typeof u !== 'object' || typeof u.input_tokens !== 'number') return undefined;
  return {
    inputTokens: u.input_tokens,
    outputTokens: u.output_tokens ?? 0,
    cachedTokens: u.input_tokens_details?.cached_tokens,
    cacheWriteTokens: u.input_tokens_details?.cache_write_tokens,
    reasoningTokens: u.output_tokens_details?.reasoning_tokens,
  };
}

export function writeResponsesUsage(u: Usage): ResponsesUsage {
  return {
    input_tokens: u.inputTokens,
    // Tokens written to the prompt cache (an Anthropic upstream's), where there were some.
    input_tokens_details: { cached_tokens: u.cachedTokens ?? 0, ...(u.cacheWriteTokens && { cache_write_tokens: u.cacheWriteTokens }) },
    output_tokens: u.outputTokens,
    output_tokens_details: { reasoning_tokens: u.reasoningTokens ?? 0 },
    total_tokens: u.inputTokens + u.outputTokens,
  };
}

const familyNames: Record<string, string> = { chat: 'chat completions', gemini: 'content generation' };

/** Refuses what the upstream cannot take when translating; a native upstream takes it as sent. */
type Refuse = (param: string, what: string) => undefined;

function partsOf(content: string | (InputPart | OutputPart)[], where: string, refuse: Refuse): C.Part[] {
  if (typeof content === 'string') return content ? [{ type: 'text', text: content }] : [];
  const parts: C.Part[] = [];
  content.forEach((p, i) => {
    const part = partOf(p, `${where}[${i}]`, refuse);
    if (part) parts.push(part);
  });
  return parts;
}

function partOf(p: InputPart | OutputPart, where: string, refuse: Refuse): C.Part | undefined {
  switch (p.type) {
    case 'input_text':
    case 'output_text':
      return { type: 'text', text: p.text };
    case 'refusal':
      return { type: 'text', text: p.refusal };
    case 'input_image':
      // An image by file id still counts for the vision rule; only a translation needs its URL.
      if (!p.image_url) refuse(`${where}.file_id`, 'images by file id');
      return { type: 'image', url: p.image_url ?? '', where, ...(p.detail && { detail: p.detail }) };
    case 'input_file':
      return { type: 'file', fileId: p.file_id, url: p.file_url, data: p.file_data, filename: p.filename };
    default:
      return refuse(`${where}.type`, `'${p.type}' content`);
  }
}


/**
 * A Responses request, canonically. For a Responses upstream nothing is refused (it gets the
 * client's own bytes); for another family, what it cannot take is refused here, except server-side
 * tools, which the model rules drop or refuse.
 */
export function responsesToCanonical(req: ResponsesRequest, model: ModelConfig, upstreamFamily: string): { request: C.Request; mapping: ToolMapping } {
  const upstreamName = familyNames[upstreamFamily] ?? upstreamFamily;
  const native = upstreamFamily === 'responses';
  const refuse: Refuse = (param, what) => {
    if (!native) throw new GatewayError('unsupported_parameter', `Model \`${model.id}\` is served through an upstream that speaks ${upstreamName}, which cannot take ${what}.`, param);
    return undefined;
  };
  const serverTools: C.ServerTool[] = [];

  // Tools: functions as they are; custom tools as one-string functions; namespaces flattened.
  const mapping: ToolMapping = { custom: new Set(), namespaced: new Map() };
  const tools: C.Tool[] = [];
  const seen = new Map<string, string>();
  const addTool = (t: ResponsesTool, where: string, namespace?: string) => {
    // A hosted tool (web_search, file_search, …) has no name: it is the upstream's to run, not a
    // function the model calls by name, so two of them never collide.
    if (!isOfType(t, 'custom') && !isOfType(t, 'function')) {
      serverTools.push({ type: t.type, param: where });
      return;
    }
    // Function and custom tools have a name (the schema checks it).
    const named = t as { name: string };
    const name = namespace ? `${namespace}${NAMESPACE_SEPARATOR}${named.name}` : named.name;
    if (seen.has(name)) {
      throw new GatewayError('invalid_request', `Tools ${seen.get(name)} and ${where} both become '${name}' for the upstream; rename one.`, where);
    }
    if (namespace && !/^[A-Za-z0-9_-]{1,64}$/.test(name)) refuse(where, `the tool name '${name}' (namespace and name flattened)`);
    seen.set(name, where);
    if (namespace) mapping.namespaced.set(name, { namespace, name: named.name });
    if (isOfType(t, 'custom')) {
      mapping.custom.add(name);
      tools.push({
        name,
        description: t.description ?? (t.format?.type === 'grammar' ? `Input must match this ${t.format.syntax} grammar:\n${t.format.definition}` : undefined),
        parameters: { type: 'object', properties: { input: { type: 'string' } }, required: ['input'], additionalProperties: false },
      });
    } else if (isOfType(t, 'function')) {
      tools.push({ name, description: t.description ?? undefined, parameters: t.parameters ?? undefined, strict: t.strict ?? undefined });
    }
  };
  (req.tools ?? []).forEach((t, i) => {
    if (isOfType(t, 'namespace')) t.tools.forEach((inner, j) => addTool(inner, `tools[${i}].tools[${j}]`, t.name));
    else addTool(t, `tools[${i}]`);
  });
  const flatName = (name: string, namespace?: string) => (namespace ? `${namespace}${NAMESPACE_SEPARATOR}${name}` : name);

  // Input: consecutive calls (and the assistant text before them) form one assistant turn.
  const messages: C.Message[] = [];
  if (req.instructions) messages.push({ role: 'system', content: [{ type: 'text', text: req.instructions }] });
  const toolNames = new Map<string, string>();
  const assistantTurn = (): Extract<C.Message, { role: 'assistant' }> => {
    const last = messages.at(-1);
    if (last?.role === 'assistant') return last;
    const turn: C.Message = { role: 'assistant', content: [], toolCalls: [] };
    messages.push(turn);
    return turn;
  };
  const input: InputItem[] = typeof req.input === 'string' ? [{ role: 'user', content: req.input }] : req.input;
  // Each case reads the item as the type decode checked it against (itemType chose the schema).
  input.forEach((raw, i) => {
    const where = `input[${i}]`;
    switch (itemType(raw)) {
      case 'message': {
        const item = raw as MessageItem;
        const content = partsOf(item.content ?? [], `${where}.content`, refuse);
        if (item.role === 'assistant') {
          // A loop, not push(...content): spreading a huge array overflows the call stack.
          const turn = assistantTurn().content;
          for (const part of content) turn.push(part);
        } else messages.push({ role: item.role === 'user' ? 'user' : 'system', content });
        break;
      }
      case 'function_call': {
        const item = raw as FunctionCallItem;
        const name = flatName(item.name, item.namespace);
        // The id may carry the call's signature (src/tool-call-ids.ts), made when the gateway wrote it.
        const { id, signature } = splitToolId(item.call_id);
        toolNames.set(id, name);
        assistantTurn().toolCalls.push({ id, name, arguments: item.arguments, ...(signature && { signature }) });
        break;
      }
      case 'custom_tool_call': {
        const item = raw as CustomToolCallItem;
        const { id, signature } = splitToolId(item.call_id);
        toolNames.set(id, item.name);
        assistantTurn().toolCalls.push({ id, name: item.name, arguments: JSON.stringify({ input: item.input }), ...(signature && { signature }) });
        break;
      }
      case 'function_call_output':
      case 'custom_tool_call_output': {
        const item = raw as CallOutputItem;
        const { id } = splitToolId(item.call_id);
        messages.push({ role: 'tool', toolCallId: id, name: toolNames.get(id), content: partsOf(item.output, `${where}.output`, refuse) });
        break;
      }
      case 'reasoning':
        // Reasoning items only mean something to the model that wrote them.
        break;
      case 'item_reference':
        refuse(`${where}.id`, 'item references (send the items themselves)');
        break;
      default:
        refuse(`${where}.type`, `'${raw.type}' items`);
    }
  });

  let toolChoice: C.ToolChoice | undefined;
  const choice = req.tool_choice;
  if (typeof choice === 'string') toolChoice = choice;
  else if (choice && isOfType(choice, 'function', 'custom')) toolChoice = { name: flatName(choice.name, choice.namespace) };
  else if (choice && isOfType(choice, 'allowed_tools')) {
    const allowed: string[] = [];
    choice.tools.forEach((t, j) => {
      if (isOfType(t, 'function', 'custom')) allowed.push(flatName(t.name, t.namespace));
      else refuse(`tool_choice.tools[${j}]`, `the server-side tool '${t.type}' in allowed_tools`);
    });
    toolChoice = { mode: choice.mode, allowed };
  } else if (choice) refuse('tool_choice', `tool_choice '${choice.type}'`);

  const f = req.text?.format;
  const format: C.OutputFormat | undefined =
    f?.type === 'json_schema'
      ? { type: 'json_schema', name: f.name, schema: f.schema, strict: f.strict ?? undefined, description: f.description }
      : f?.type === 'json_object'
        ? { type: 'json_object' }
        : undefined;

  return {
    mapping,
    request: {
      model: model.upstreamModel,
      messages,
      tools,
      toolChoice,
      parallelToolCalls: req.parallel_tool_calls ?? undefined,
      format,
      maxOutputTokens: req.max_output_tokens ?? undefined,
      temperature: req.temperature ?? undefined,
      topP: req.top_p ?? undefined,
      reasoning: req.reasoning ? { effort: req.reasoning.effort ?? undefined, summary: req.reasoning.summary ?? undefined } : undefined,
      metadata: req.metadata ?? undefined,
      user: req.user as string | undefined,
      stream: req.stream === true,
      serverTools,
      extra: req.top_logprobs ? { logprobs: 'top_logprobs' } : undefined,
      params: { format: 'text.format', maxOutputTokens: 'max_output_tokens', topP: 'top_p' },
    },
  };
}

function writeParts(parts: C.Part[], role: 'user' | 'assistant'): UpstreamBoundPart[] {
  return parts.map((p): UpstreamBoundPart => {
    switch (p.type) {
      case 'text':
        return role === 'assistant' ? { type: 'output_text', text: p.text, annotations: [] } : { type: 'input_text', text: p.text };
      case 'image':
        return { type: 'input_image', image_url: p.url, detail: p.detail ?? 'auto' };
      case 'file':
        return { type: 'input_file', ...(p.fileId && { file_id: p.fileId }), ...(p.url && { file_url: p.url }), ...(p.data && { file_data: p.data }), ...(C.fileNameOf(p) && { filename: C.fileNameOf(p) }) };
      case 'audio':
        return { type: 'input_audio', input_audio: { data: p.data, format: p.format } };
    }
  });
}

/** A canonical request as a Responses body for an upstream (7.2). */
export function canonicalToResponses(req: C.Request): ResponsesUpstreamBody {
  const instructions = req.messages
    .filter((m) => m.role === 'system')
    .map((m) => C.systemTextOf(m.content))
    .join('\n\n');
  const input: UpstreamBoundItem[] = [];
  for (const m of req.messages) {
    if (m.role === 'user') input.push({ role: 'user', content: writeParts(m.content, 'user') });
    else if (m.role === 'assistant') {
      if (m.content.length) input.push({ role: 'assistant', content: writeParts(m.content, 'assistant') });
      for (const c of m.toolCalls) input.push({ type: 'function_call', call_id: c.id, name: c.name, arguments: c.arguments });
    } else if (m.role === 'tool') {
      // Text alone as a string; a result with images or files as parts, which Responses takes too.
      const output = m.content.every((p) => p.type === 'text') ? m.content.map((p) => p.text).join('') : writeParts(m.content, 'user');
      input.push({ type: 'function_call_output', call_id: m.toolCallId, output });
    }
  }
  const body: ResponsesUpstreamBody = { model: req.model, input, store: false };
  if (instructions) body.instructions = instructions;
  if (req.tools.length) {
    body.tools = req.tools.map((t) => ({ type: 'function', name: t.name, description: t.description ?? null, parameters: t.parameters ?? null, strict: t.strict ?? false }));
  }
  const choice = req.toolChoice;
  if (typeof choice === 'string') body.tool_choice = choice;
  else if (choice && 'name' in choice) body.tool_choice = { type: 'function', name: choice.name };
  else if (choice) body.tool_choice = { type: 'allowed_tools', mode: choice.mode, tools: choice.allowed.map((name) => ({ type: 'function', name })) };
  if (req.parallelToolCalls !== undefined && req.tools.length) body.parallel_tool_calls = req.parallelToolCalls;
  if (req.format?.type === 'json_schema') {
    const { name, schema, strict, description } = req.format;
    body.text = { format: { type: 'json_schema', name, schema: schema ?? {}, ...(description && { description }), ...(strict !== undefined && { strict }) } };
  } else if (req.format?.type === 'json_object') body.text = { format: { type: 'json_object' } };
  if (req.maxOutputTokens !== undefined) body.max_output_tokens = req.maxOutputTokens;
  if (req.temperature !== undefined) body.temperature = req.temperature;
  if (req.topP !== undefined) body.top_p = req.topP;
  if (req.reasoning) body.reasoning = { ...(req.reasoning.effort && { effort: req.reasoning.effort }), ...(req.reasoning.summary && { summary: req.reasoning.summary }) };
  if (req.metadata) body.metadata = req.metadata;
  if (req.user) body.user = req.user;
  if (req.stream) body.stream = true;
  return body;
}

/** A Responses body from an upstream, canonically (7.3). */
export function responsesBodyToCanonical(body: UpstreamResponse): C.Response {
  // JSON without its output (`{}`, `{"ok":true}`) is no answer: the channel failing, not an empty reply.
  if (!Array.isArray(body.output)) throw new GatewayError('upstream_error', 'The upstream answered with no output.');
  let text = '';
  let refused = false;
  let reasoning: string | undefined;
  const toolCalls: C.ToolCall[] = [];
  for (const item of body.output ?? []) {
    if (item.type === 'message') {
      for (const part of item.content ?? []) {
        if (part.type === 'output_text') text += part.text;
        // A refusal has no field in the other families: it is said as the answer's text, filtered.
        else if (part.type === 'refusal' && typeof part.refusal === 'string') {
          text += part.refusal;
          refused = true;
        }
      }
    } else if (item.type === 'reasoning') {
      const summary = (item.summary ?? []).map((s) => s.text).join('\n\n');
      if (summary) reasoning = (reasoning ? reasoning + '\n\n' : '') + summary;
    } else if (item.type === 'function_call') {
      // A call's id and name are read as sent: an upstream that leaves them out gives the client what it gave.
      toolCalls.push({ id: (item.call_id ?? item.id)!, name: item.name!, arguments: item.arguments || '{}' });
    } else if (item.type === 'custom_tool_call') {
      toolCalls.push({ id: (item.call_id ?? item.id)!, name: item.name!, arguments: JSON.stringify({ input: item.input }) });
    }
  }
  return {
    id: body.id,
    model: body.model,
    created: body.created_at,
    text,
    reasoning,
    toolCalls,
    finishReason: refused && !toolCalls.length ? 'content_filter' : finishFromStatus(body.status, body.incomplete_details?.reason, toolCalls.length),
    usage: readResponsesUsage(body.usage),
  };
}

export function finishFromStatus(status: string | undefined, incompleteReason: string | undefined, toolCalls: number): C.FinishReason {
  if (status === 'incomplete') return incompleteReason === 'content_filter' ? 'content_filter' : 'length';
  return toolCalls > 0 ? 'tool_calls' : 'stop';
}

/** Status and incomplete_details for a canonical finish reason. */
export function statusOf(reason: C.FinishReason): { status: string; incomplete_details: ResponseObject['incomplete_details'] } {
  if (reason === 'length') return { status: 'incomplete', incomplete_details: { reason: 'max_output_tokens' } };
  if (reason === 'content_filter') return { status: 'incomplete', incomplete_details: { reason: 'content_filter' } };
  return { status: 'completed', incomplete_details: null };
}

/** The Response object around some output, echoing the request as OpenAI does. */
export function responseObject(ex: Exchange, { id, created_at, status, ...rest }: Pick<ResponseObject, 'id' | 'created_at' | 'status'> & Partial<ResponseObject>): ResponseObject {
  const r = ex.request as ResponsesRequest;
  return {
    id,
    object: 'response',
    created_at,
    status,
    error: null,
    incomplete_details: null,
    instructions: r.instructions ?? null,
    max_output_tokens: r.max_output_tokens ?? null,
    model: ex.modelId,
    output: [],
    parallel_tool_calls: r.parallel_tool_calls ?? true,
    previous_response_id: null,
    reasoning: r.reasoning ?? { effort: null, summary: null },
    store: false,
    temperature: r.temperature ?? 1,
    text: r.text ?? { format: { type: 'text' } },
    tool_choice: r.tool_choice ?? 'auto',
    tools: r.tools ?? [],
    top_p: r.top_p ?? 1,
    truncation: 'disabled',
    usage: null,
    metadata: r.metadata ?? {},
    ...rest,
  };
}

/** A canonical tool call as the output item the client declared it as. */
export function callItem(call: C.ToolCall, mapping: ToolMapping | undefined, status: string, itemId?: string): OutputFunctionCall | OutputCustomToolCall {
  if (mapping?.custom.has(call.name)) {
    let input = call.arguments;
    try {
      const parsed = JSON.parse(call.arguments);
      if (typeof parsed?.input === 'string') input = parsed.input;
    } catch {
      // Arguments that are not the expected object are passed on as the input text.
    }
    return { type: 'custom_tool_call', id: itemId ?? newId('ctc_'), call_id: toolIdWithSignature(call.id, call.signature), name: call.name, input, status };
  }
  const original = mapping?.namespaced.get(call.name);
  return {
    type: 'function_call',
    id: itemId ?? newId('fc_'),
    call_id: toolIdWithSignature(call.id, call.signature),
    name: original?.name ?? call.name,
    ...(original && { namespace: original.namespace }),
    arguments: call.arguments,
    status,
  };
}

export const messageItem = (id: string, text: string, status: string): OutputMessage => ({
  type: 'message',
  id,
  status,
  role: 'assistant',
  content: [{ type: 'output_text', text, annotations: [] }],
});

export const reasoningItem = (id: string, text: string): OutputReasoning => ({ type: 'reasoning', id, summary: [{ type: 'summary_text', text }] });

/** A canonical answer as a complete Response for the client. */
export function canonicalToResponsesBody(res: C.Response, ex: Exchange): ResponseObject {
  const mapping = ex.get(toolMapping);
  const output: OutputItem[] = [];
  const status = statusOf(res.finishReason);
  if (res.reasoning) output.push(reasoningItem(newId('rs_'), res.reasoning));
  // An answer cut by its ceiling or a filter leaves its items incomplete too, as OpenAI marks them.
  if (res.text) output.push(messageItem(newId('msg_'), res.text, status.status));
  for (const call of res.toolCalls) output.push(callItem(call, mapping, status.status));
  return responseObject(ex, {
    id: newId('resp_'),
    created_at: unixNow(),
    ...status,
    output,
    usage: res.usage ? writeResponsesUsage(res.usage) : null,
  });
}
