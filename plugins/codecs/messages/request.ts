/** Messages requests to and from the canonical pivot. */
import { canonical as C, echoed, GatewayError, type ModelConfig, splitToolId } from '../../../src/plugin-api.js';
import type { MessagesRequest } from './schema.js';
import {
  type AnyBlock,
  isCustomTool,
  type MessagesBlock,
  type MessagesToolChoice,
  type MessagesUpstreamBody,
  parsedInput,
  type ResultBlock,
  safeToolId,
  type TextBlock,
  thinkingFromSignature,
  type ToolResultBlock,
  type UpstreamBoundBlock,
  type UpstreamBoundMessage,
} from './wire.js';

/** Claude Code's first system block: it changes every conversation, so it would spoil a translated upstream's prompt cache. */
const BILLING_LINE = 'x-anthropic-billing-header:';

/** Thinking budgets by reasoning effort, and back. */
const budgets: Record<string, number> = { low: 1024, medium: 4096, high: 16384, xhigh: 32768 };
const effortOfBudget = (budget: number) => (budget < 4096 ? 'low' : budget < 16384 ? 'medium' : 'high');
/** Anthropic's efforts beyond `high` are `high` elsewhere. */
const effortOf = (effort: unknown) => (effort === 'xhigh' || effort === 'max' ? 'high' : typeof effort === 'string' ? effort : undefined);

/** The model names a server tool by its type without the version date (`web_search_20250305` → `web_search`). */
export const serverToolName = (type: string) => type.replace(/_\d{8}$/, '');

const dataUrl = (mediaType: string, data: string) => `data:${mediaType};base64,${data}`;

/**
 * The client's Messages request, canonically. For a Messages upstream (`native`) nothing is
 * refused: it gets the client's own bytes. Translated, what other families cannot carry (thinking
 * blocks, cache breakpoints, betas such as context management) is left out, and a block that would
 * change the meaning if dropped is refused.
 */
export function messagesToCanonical(req: MessagesRequest, model: ModelConfig, native: boolean): C.Request {
  const refuse = (param: string, what: string) => {
    if (!native) throw new GatewayError('unsupported_parameter', `Unsupported parameter: '${param}': ${what} is not available for model \`${model.id}\`, whose upstream speaks another API.`, param);
  };
  const messages: C.Message[] = [];
  const system = systemParts(req.system, native);
  if (system.length) messages.push({ role: 'system', content: system });
  const toolNames = new Map<string, string>();

  req.messages.forEach((m, i) => {
    const where = `messages[${i}].content`;
    const blocks: MessagesBlock[] = typeof m.content === 'string' ? [{ type: 'text', text: m.content }] : m.content;
    if (m.role === 'assistant') {
      const content: C.Part[] = [];
      const toolCalls: C.ToolCall[] = [];
      for (const b of blocks) {
        if (b.type === 'text' && b.text) content.push({ type: 'text', text: b.text });
        else if (b.type === 'tool_use') {
          const { id, signature } = splitToolId(b.id);
          toolNames.set(b.id, b.name);
          toolCalls.push({ id, name: b.name, arguments: JSON.stringify(b.input ?? {}), ...(signature && { signature }) });
        }
        // Thinking only means something to the model that wrote it; server-tool history only to its upstream.
      }
      messages.push({ role: 'assistant', content, toolCalls });
      return;
    }
    const content: C.Part[] = [];
    blocks.forEach((b, j) => {
      const at = `${where}[${j}]`;
      if (b.type === 'tool_result' && m.role === 'user') {
        // Results go first, right after the calls, as the other families place them.
        messages.push({ role: 'tool', toolCallId: splitToolId(b.tool_use_id).id, name: toolNames.get(b.tool_use_id), content: resultParts(b, at, refuse) });
        return;
      }
      const part = userPart(b, at, refuse);
      if (part) content.push(part);
    });
    if (m.role === 'system') messages.push({ role: 'system', content });
    else if (content.length || typeof m.content === 'string') messages.push({ role: 'user', content });
  });

  const tools: C.Tool[] = [];
  const serverTools: C.ServerTool[] = [];
  (req.tools ?? []).forEach((t, i) => {
    if (isCustomTool(t)) tools.push({ name: t.name, description: t.description, parameters: t.input_schema, ...(t.strict !== undefined && { strict: t.strict }) });
    else serverTools.push({ type: serverToolName(t.type), param: `tools[${i}]` });
  });

  const choice = req.tool_choice;
  const toolChoice: C.ToolChoice | undefined =
    choice?.type === 'any' ? 'required' : choice?.type === 'tool' ? { name: choice.name } : choice?.type === 'none' ? 'none' : choice?.type === 'auto' ? 'auto' : undefined;

  const format = req.output_config?.format;
  const extra: Record<string, string> = {};
  if (req.max_tokens === 0) refuse('max_tokens', 'max_tokens 0 (warming the prompt cache)');
  return {
    model: model.upstreamModel,
    messages,
    tools,
    toolChoice,
    parallelToolCalls: choice?.disable_parallel_tool_use === true ? false : undefined,
    format: format?.type === 'json_schema' ? { type: 'json_schema', name: 'output', schema: format.schema } : undefined,
    maxOutputTokens: typeof req.max_tokens === 'number' ? req.max_tokens : undefined,
    temperature: req.temperature,
    topP: req.top_p,
    topK: req.top_k,
    stop: req.stop_sequences?.length ? req.stop_sequences : undefined,
    reasoning: reasoningOf(req),
    user: typeof req.metadata?.user_id === 'string' ? req.metadata.user_id : undefined,
    stream: req.stream === true,
    serverTools: serverTools.length ? serverTools : undefined,
    extra,
    params: { format: 'output_config.format', reasoning: 'thinking', maxOutputTokens: 'max_tokens', topP: 'top_p', topK: 'top_k', stop: 'stop_sequences' },
  };
}

/**
 * Thinking as a reasoning effort: a budget maps to one; adaptive thinking leaves it to the model
 * unless `output_config.effort` says how hard to think. Thinking is shown (a summary of the
 * reasoning, where the upstream gives one) unless its display is `omitted`.
 */
function reasoningOf(req: MessagesRequest): C.Request['reasoning'] {
  const thinking = req.thinking;
  const effort = effortOf(req.output_config?.effort) ?? (thinking?.type === 'enabled' ? effortOfBudget(thinking.budget_tokens) : undefined);
  if (!effort || thinking?.type === 'disabled') return undefined;
  return { effort, ...(thinking && thinking.display !== 'omitted' && { summary: 'auto' }) };
}

function systemParts(system: MessagesRequest['system'], native: boolean): C.Part[] {
  if (typeof system === 'string') return system ? [{ type: 'text', text: system }] : [];
  if (!Array.isArray(system)) return [];
  const parts: C.Part[] = [];
  for (const b of system) {
    if (!b.text || (!native && b.text.startsWith(BILLING_LINE))) continue;
    parts.push({ type: 'text', text: b.text });
  }
  return parts;
}

type Refuse = (param: string, what: string) => void;

/**
 * A client's value in a message, quoted: the schema does not type every field it lets through, and
 * an object can make string conversion throw (`{"toString": ""}`), which would be a 500.
 */
function shown(value: unknown): string {
  return typeof value === 'string' ? `'${echoed(value)}'` : echoed(JSON.stringify(value) ?? String(typeof value));
}

function userPart(b: MessagesBlock, where: string, refuse: Refuse): C.Part | undefined {
  switch (b.type) {
    case 'text':
      return b.text ? { type: 'text', text: b.text } : undefined;
    case 'image': {
      const s = b.source;
      if (s.type === 'base64') return { type: 'image', url: dataUrl(s.media_type, s.data), mimeType: s.media_type, where };
      if (s.type === 'url') return { type: 'image', url: s.url, where };
      refuse(`${where}.source`, `an image source of type ${shown(s.type)}`);
      return undefined;
    }
    case 'document': {
      const s = b.source;
      if (s.type === 'base64') return { type: 'file', data: dataUrl(s.media_type, s.data), mimeType: s.media_type, ...(b.title && { filename: b.title }) };
      if (s.type === 'url') return { type: 'file', url: s.url, ...(b.title && { filename: b.title }) };
      if (s.type === 'text') return { type: 'text', text: s.data };
      if (s.type === 'content') return { type: 'text', text: typeof s.content === 'string' ? s.content : textOfBlocks(s.content) };
      refuse(`${where}.source`, `a document source of type ${shown(s.type)}`);
      return undefined;
    }
    case 'search_result':
      return { type: 'text', text: [b.title, textOfBlocks(b.content)].filter(Boolean).join('\n') };
    case 'thinking':
    case 'redacted_thinking':
      return undefined;
    default:
      // A type the schema lets through unchecked: only its `type` is read.
      refuse(`${where}.type`, `a content block of type '${(b as AnyBlock).type}'`);
      return undefined;
  }
}

function resultParts(b: ToolResultBlock, where: string, refuse: Refuse): C.Part[] {
  const parts: C.Part[] = [];
  if (b.is_error === true) parts.push({ type: 'text', text: 'Error: ' });
  if (typeof b.content === 'string') parts.push({ type: 'text', text: b.content });
  else (b.content ?? []).forEach((c: ResultBlock, k) => {
    const part = userPart(c, `${where}.content[${k}]`, refuse);
    if (part) parts.push(part);
  });
  return parts;
}

function textOfBlocks(blocks: unknown): string {
  if (!Array.isArray(blocks)) return '';
  return blocks.map((b) => (typeof b?.text === 'string' ? b.text : '')).join('\n');
}

/** What the dialect needs besides the canonical request. */
export interface MessagesRequestOptions {
  /** Sent when the request sets no output ceiling: Anthropic requires one. */
  defaultMaxTokens: number;
  /** The forced tool that carries JSON output, when the request asks for a JSON format. */
  jsonTool?: JsonTool;
}

/**
 * JSON output through a forced tool: Anthropic's input_schema must describe an object, so any
 * other schema is wrapped as the tool's one `value` property.
 */
export interface JsonTool {
  name: string;
  wrapped: boolean;
}

/**
 * The forced tool a JSON format becomes, named so it does not clash with the request's tools. Not
 * when the request offers tools of its own: forced to answer through the JSON tool, the model could
 * never call them (an agent that calls tools, then answers in JSON). Such a request gets
 * `output_config.format` instead, Anthropic's own structured output on the models that have it.
 */
export function jsonToolFor(req: C.Request): JsonTool | undefined {
  const format = req.format;
  if (!format || format.type === 'text' || req.tools.length > 0) return undefined;
  const base = format.type === 'json_schema' && /^[A-Za-z0-9_-]{1,64}$/.test(format.name) ? format.name : 'json_output';
  let name = base;
  for (let n = 2; req.tools.some((t) => t.name === name); n++) name = `${base}_${n}`;
  const schema = format.type === 'json_schema' ? format.schema : undefined;
  return { name, wrapped: schema !== undefined && schema.type !== 'object' };
}

/** A canonical request as a Messages body for an upstream. */
export function canonicalToMessages(req: C.Request, options: MessagesRequestOptions): MessagesUpstreamBody {
  const system: TextBlock[] = [];
  const messages: UpstreamBoundMessage[] = [];
  const add = (role: 'user' | 'assistant', blocks: UpstreamBoundBlock[]) => {
    if (!blocks.length) return;
    const last = messages.at(-1);
    // Anthropic wants turns to alternate: consecutive turns of one role become one.
    if (last?.role === role) last.content.push(...blocks);
    else messages.push({ role, content: blocks });
  };
  const addResult = (block: UpstreamBoundBlock) => {
    const last = messages.at(-1);
    if (last?.role !== 'user') return void messages.push({ role: 'user', content: [block] });
    // Results come first in their user turn.
    const at = last.content.findIndex((b) => b.type !== 'tool_result');
    last.content.splice(at < 0 ? last.content.length : at, 0, block);
  };
  for (const m of req.messages) {
    switch (m.role) {
      case 'system':
        // Leading system messages are the system prompt; later ones are said in the user's turn.
        if (messages.length === 0) system.push(...textBlocks(m.content));
        else add('user', textBlocks(m.content));
        break;
      case 'user':
        add('user', userBlocks(m.content));
        break;
      case 'assistant': {
        const thinking = thinkingFromSignature(m.toolCalls[0]?.signature) ?? [];
        const calls = m.toolCalls.map((c): UpstreamBoundBlock => ({ type: 'tool_use', id: safeToolId(c.id), name: c.name, input: parsedInput(c.arguments) }));
        add('assistant', [...thinking, ...textBlocks(m.content), ...calls]);
        break;
      }
      case 'tool': {
        const content = userBlocks(m.content);
        addResult({ type: 'tool_result', tool_use_id: safeToolId(m.toolCallId), ...(content.length && { content }) });
        break;
      }
    }
  }

  const body: MessagesUpstreamBody = { model: req.model, max_tokens: req.maxOutputTokens ?? options.defaultMaxTokens, messages };
  if (system.length) body.system = system;
  const json = options.jsonTool;
  let tools = req.tools;
  let choice: MessagesToolChoice | undefined;
  const toolChoice = req.toolChoice;
  if (typeof toolChoice === 'object' && 'allowed' in toolChoice) {
    tools = tools.filter((t) => toolChoice.allowed.includes(t.name));
    choice = { type: toolChoice.mode === 'required' ? 'any' : 'auto' };
  } else if (toolChoice === 'required') choice = { type: 'any' };
  else if (toolChoice === 'none') choice = { type: 'none' };
  else if (toolChoice === 'auto') choice = { type: 'auto' };
  else if (toolChoice) choice = { type: 'tool', name: toolChoice.name };
  const declared: NonNullable<MessagesUpstreamBody['tools']> = tools.map((t) => ({ name: t.name, ...(t.description && { description: t.description }), input_schema: { type: 'object', ...t.parameters } }));
  if (json) {
    const schema = req.format?.type === 'json_schema' ? req.format.schema : undefined;
    declared.push({
      name: json.name,
      description: 'Give the answer as this tool\'s input, in JSON.',
      input_schema: json.wrapped ? { type: 'object', properties: { value: schema }, required: ['value'] } : { type: 'object', ...schema },
    });
    choice = { type: 'tool', name: json.name };
  }
  if (req.format && req.format.type !== 'text' && !json) {
    body.output_config = { format: { type: 'json_schema', schema: (req.format.type === 'json_schema' && req.format.schema) || { type: 'object' } } };
  }
  if (declared.length) body.tools = declared;
  if (req.parallelToolCalls === false && declared.length && choice?.type !== 'none') choice = { type: 'auto', ...choice, disable_parallel_tool_use: true };
  if (choice && declared.length) body.tool_choice = choice;

  const thinking = thinkingFor(req, body.max_tokens, choice, messages);
  if (thinking) body.thinking = thinking;
  // With thinking on, Anthropic takes no sampling changes.
  if (req.temperature !== undefined && !thinking) body.temperature = Math.min(1, req.temperature);
  if (req.topP !== undefined && !thinking) body.top_p = req.topP;
  if (req.topK !== undefined && !thinking) body.top_k = req.topK;
  if (req.stop?.length) body.stop_sequences = req.stop;
  if (req.user) body.metadata = { user_id: req.user };
  if (req.stream) body.stream = true;
  return body;
}

/**
 * Thinking for a reasoning effort, when Anthropic would take it: not with a forced tool, not with
 * a budget that leaves no room under max_tokens, and not when the turn continues a tool use whose
 * thinking blocks the client did not send back (Anthropic refuses that request).
 */
function thinkingFor(req: C.Request, maxTokens: number, choice: MessagesToolChoice | undefined, messages: UpstreamBoundMessage[]): MessagesUpstreamBody['thinking'] {
  const effort = req.reasoning?.effort;
  if (!effort || effort === 'none' || effort === 'minimal') return undefined;
  if (choice?.type === 'any' || choice?.type === 'tool') return undefined;
  const lastAssistant = messages.findLast((m) => m.role === 'assistant');
  const content = lastAssistant?.content ?? [];
  if (content.some((b) => b.type === 'tool_use') && !content.some((b) => b.type === 'thinking' || b.type === 'redacted_thinking')) return undefined;
  const budget = Math.min(budgets[effort] ?? budgets.medium!, maxTokens - 1);
  return budget >= 1024 ? { type: 'enabled', budget_tokens: budget } : undefined;
}

/** Anthropic refuses empty and whitespace-only text blocks. */
function textBlocks(parts: C.Part[]): TextBlock[] {
  const out: TextBlock[] = [];
  for (const p of parts) if (p.type === 'text' && p.text.trim()) out.push({ type: 'text', text: p.text });
  return out;
}

function userBlocks(parts: C.Part[]): UpstreamBoundBlock[] {
  const out: UpstreamBoundBlock[] = [];
  for (const p of parts) {
    switch (p.type) {
      case 'text':
        if (p.text.trim()) out.push({ type: 'text', text: p.text });
        break;
      case 'image': {
        const inline = parseDataUrl(p.url);
        out.push({ type: 'image', source: inline ? { type: 'base64', media_type: inline.mediaType, data: inline.data } : { type: 'url', url: p.url } });
        break;
      }
      case 'file': {
        const inline = p.data ? (parseDataUrl(p.data) ?? { mediaType: p.mimeType ?? 'application/pdf', data: p.data }) : undefined;
        if (inline) out.push({ type: 'document', source: { type: 'base64', media_type: inline.mediaType, data: inline.data } });
        else if (p.url) out.push({ type: 'document', source: { type: 'url', url: p.url } });
        else throw new GatewayError('unsupported_parameter', 'Files by id cannot be sent to an Anthropic upstream; send the file data.', 'file');
        break;
      }
      case 'audio':
        throw new GatewayError('unsupported_parameter', 'Audio input cannot be sent to an Anthropic upstream.', 'input_audio');
    }
  }
  return out;
}

function parseDataUrl(url: string): { mediaType: string; data: string } | undefined {
  const m = /^data:([^;,]+);base64,/.exec(url);
  return m ? { mediaType: m[1]!, data: url.slice(m[0].length) } : undefined;
}
