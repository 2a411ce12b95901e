/**
 * Content generation (Gemini) requests and answers to and from the canonical pivot, respecting
 * the pitfalls other gateways hit (protocols.md 7.6–7.11): function responses of one turn travel
 * in one user content, call ids are synthesized and mapped back, thought signatures survive the
 * round trip, tool calls report `tool_calls`, usage is cumulative, blocked prompts are errors.
 */
import { canonical as C, type Exchange, GatewayError, isGatewaySignature, type JsonObject, type ModelConfig, newId, type Usage } from '../../../src/plugin-api.js';
import { geminiSchemaToJsonSchema } from './json-schema.js';
import type { GeminiGenerationConfig, GeminiRequest, GeminiRequestPart } from './schema.js';
import type { GeminiAnswer, GeminiContent, GeminiGenerationOut, GeminiPart, GeminiUpstreamBody, GeminiUsage, UpstreamGeminiAnswer, UpstreamGeminiPart, UpstreamGeminiUsage } from './wire.js';

/**
 * The thought signature Google documents for a function call it did not make (history moved from
 * another model, or written by the client): Gemini 3 skips its validation instead of refusing the
 * turn with "Function call is missing a thought_signature".
 */
export const NO_THOUGHT_SIGNATURE = 'skip_thought_signature_validator';

/** Whether a chunk's `usageMetadata` holds totals (a prompt count at least); readGeminiUsage reads only those. */
export const hasGeminiUsage = (u: UpstreamGeminiUsage | null | undefined): u is UpstreamGeminiUsage & { promptTokenCount: number } =>
  !!u && typeof u === 'object' && typeof u.promptTokenCount === 'number';

export function readGeminiUsage(u: UpstreamGeminiUsage | null | undefined): Usage | undefined {
  if (!hasGeminiUsage(u)) return undefined;
  const thoughts = u.thoughtsTokenCount ?? 0;
  return {
    inputTokens: u.promptTokenCount + (u.toolUsePromptTokenCount ?? 0),
    outputTokens: (u.candidatesTokenCount ?? 0) + thoughts,
    cachedTokens: u.cachedContentTokenCount,
    reasoningTokens: thoughts || undefined,
  };
}

export function writeGeminiUsage(u: Usage): GeminiUsage {
  const thoughts = u.reasoningTokens ?? 0;
  return {
    promptTokenCount: u.inputTokens,
    candidatesTokenCount: u.outputTokens - thoughts,
    totalTokenCount: u.inputTokens + u.outputTokens,
    ...(thoughts && { thoughtsTokenCount: thoughts }),
    ...(u.cachedTokens && { cachedContentTokenCount: u.cachedTokens }),
  };
}

const finishReasons: Record<string, C.FinishReason> = { STOP: 'stop', MAX_TOKENS: 'length' };

/** Everything but STOP and MAX_TOKENS is some kind of filter (7.9); calls make it `tool_calls`. */
export function readFinishReason(reason: string | undefined, toolCalls: number): C.FinishReason {
  if (toolCalls > 0 && (reason === undefined || reason === 'STOP')) return 'tool_calls';
  return reason === undefined ? 'stop' : (finishReasons[reason] ?? 'content_filter');
}

export const writeFinishReason = (reason: C.FinishReason) => (reason === 'length' ? 'MAX_TOKENS' : reason === 'content_filter' ? 'SAFETY' : 'STOP');

/** No candidates but a block reason: the real API's answer to a blocked prompt (7.11 item 7). */
export function blockedPrompt(body: UpstreamGeminiAnswer): GatewayError | undefined {
  if (body.candidates?.length) return undefined;
  const reason = body.promptFeedback?.blockReason;
  if (!reason) return undefined;
  return new GatewayError('prompt_blocked', `The upstream blocked the prompt (${reason}).`, null, 400, 'prompt_blocked');
}

/** `where` names the content, for the vision rule. */
function partsOf(parts: GeminiRequestPart[], where: string): C.Part[] {
  const out: C.Part[] = [];
  for (const [j, p] of parts.entries()) {
    if (typeof p.text === 'string' && !p.thought) {
      if (p.text) out.push({ type: 'text', text: p.text });
    } else if (p.inlineData) {
      const { mimeType, data } = p.inlineData;
      out.push(mimeType.startsWith('image/') ? { type: 'image', url: `data:${mimeType};base64,${data}`, mimeType, where: `${where}[${j}]` } : { type: 'file', data: `data:${mimeType};base64,${data}`, mimeType });
    } else if (p.fileData) {
      const { mimeType = '', fileUri } = p.fileData;
      out.push(mimeType.startsWith('image/') ? { type: 'image', url: fileUri, mimeType, where: `${where}[${j}]` } : { type: 'file', url: fileUri, mimeType });
    }
  }
  return out;
}

function effortFromThinking(config: GeminiGenerationConfig['thinkingConfig']): C.Request['reasoning'] {
  if (!config) return undefined;
  const { thinkingBudget: budget, thinkingLevel: level, includeThoughts } = config;
  let effort: string | undefined;
  if (typeof level === 'string' && level !== 'THINKING_LEVEL_UNSPECIFIED') effort = level.toLowerCase();
  else if (budget === 0) effort = 'none';
  else if (typeof budget === 'number' && budget > 0) effort = budget <= 512 ? 'minimal' : budget <= 1024 ? 'low' : budget <= 4096 ? 'medium' : 'high';
  if (!effort && !includeThoughts) return undefined;
  return { ...(effort && { effort }), ...(includeThoughts && { summary: 'auto' }) };
}

/**
 * A generateContent request, canonically. Parameters with no canonical field and server-side tools
 * are listed for the model rules (a Gemini upstream takes them as sent); for a Gemini upstream
 * (`native`) nothing is refused here.
 */
export function geminiToCanonical(req: GeminiRequest, model: ModelConfig, stream: boolean, native: boolean): C.Request {
  const gen: GeminiGenerationConfig = req.generationConfig ?? {};
  const extra: Record<string, string> = {};
  if (req.safetySettings?.length) extra.safetySettings = 'safetySettings';
  if ((gen.candidateCount ?? 1) > 1) extra.candidates = 'generationConfig.candidateCount';
  if (req.cachedContent) extra.cachedContent = 'cachedContent';
  if (gen.responseLogprobs) extra.logprobs = 'generationConfig.responseLogprobs';
  if (gen.responseMimeType && gen.responseMimeType !== 'text/plain' && gen.responseMimeType !== 'application/json') extra.responseMimeType = 'generationConfig.responseMimeType';

  const messages: C.Message[] = [];
  // Each part its own block, as Messages' system blocks are: an upstream that takes one string joins them (C.systemTextOf).
  const system: C.Part[] = [];
  for (const p of req.systemInstruction?.parts ?? []) if (p.text) system.push({ type: 'text', text: p.text });
  if (system.length) messages.push({ role: 'system', content: system });

  // Gemini calls carry no ids: synthesize them, and hand them to the responses in call order.
  const pending = new Map<string, string[]>();
  req.contents.forEach((content, i) => {
    const parts = content.parts;
    if (content.role === 'model') {
      const toolCalls: C.ToolCall[] = [];
      parts.forEach((p) => {
        if (!p.functionCall) return;
        const id = p.functionCall.id ?? newId('call_', 12);
        const ids = pending.get(p.functionCall.name);
        if (ids) ids.push(id);
        else pending.set(p.functionCall.name, [id]);
        toolCalls.push({ id, name: p.functionCall.name, arguments: JSON.stringify(p.functionCall.args ?? {}), ...(p.thoughtSignature && { signature: p.thoughtSignature }) });
      });
      messages.push({ role: 'assistant', content: partsOf(parts, `contents[${i}].parts`), toolCalls });
      return;
    }
    const content_ = partsOf(parts, `contents[${i}].parts`);
    parts.forEach((p, j) => {
      if (!p.functionResponse) return;
      const { name, response, id } = p.functionResponse;
      const toolCallId = id ?? pending.get(name)?.shift();
      if (!toolCallId && native) return;
      if (!toolCallId) throw new GatewayError('invalid_request', `contents[${i}].parts[${j}].functionResponse answers no earlier call to '${name}'.`, `contents[${i}].parts[${j}].functionResponse`);
      messages.push({ role: 'tool', toolCallId, name, content: [{ type: 'text', text: JSON.stringify(response) }] });
    });
    if (content_.length) messages.push({ role: 'user', content: content_ });
  });

  const tools: C.Tool[] = [];
  const serverTools: C.ServerTool[] = [];
  (req.tools ?? []).forEach((t, i) => {
    // Every other key of a tool (googleSearch, codeExecution) is a tool the upstream runs itself.
    for (const key of Object.keys(t)) if (key !== 'functionDeclarations') serverTools.push({ type: key, param: `tools[${i}].${key}` });
    for (const f of t.functionDeclarations ?? []) {
      const parameters = f.parametersJsonSchema ?? (f.parameters ? geminiSchemaToJsonSchema(f.parameters) : undefined);
      tools.push({ name: f.name, description: f.description, parameters });
    }
  });

  let toolChoice: C.ToolChoice | undefined;
  const fcc = req.toolConfig?.functionCallingConfig;
  if (fcc?.mode === 'NONE') toolChoice = 'none';
  else if (fcc?.mode === 'AUTO') toolChoice = 'auto';
  else if (fcc?.mode === 'ANY' || fcc?.mode === 'VALIDATED') {
    const names = fcc.allowedFunctionNames ?? [];
    toolChoice = names.length === 1 ? { name: names[0]! } : names.length ? { allowed: names, mode: 'required' } : 'required';
  }

  let format: C.OutputFormat | undefined;
  if (gen.responseMimeType === 'application/json') {
    const schema = gen.responseJsonSchema ?? (gen.responseSchema ? geminiSchemaToJsonSchema(gen.responseSchema) : undefined);
    format = schema ? { type: 'json_schema', name: 'response', schema } : { type: 'json_object' };
  }

  return {
    model: model.upstreamModel,
    messages,
    tools,
    toolChoice,
    format,
    maxOutputTokens: gen.maxOutputTokens,
    temperature: gen.temperature,
    topP: gen.topP,
    topK: gen.topK,
    stop: gen.stopSequences,
    seed: gen.seed,
    presencePenalty: gen.presencePenalty,
    frequencyPenalty: gen.frequencyPenalty,
    reasoning: effortFromThinking(gen.thinkingConfig),
    stream,
    serverTools,
    extra,
    params: {
      format: 'generationConfig.responseSchema',
      reasoning: 'generationConfig.thinkingConfig',
      maxOutputTokens: 'generationConfig.maxOutputTokens',
      temperature: 'generationConfig.temperature',
      topP: 'generationConfig.topP',
      topK: 'generationConfig.topK',
      stop: 'generationConfig.stopSequences',
      seed: 'generationConfig.seed',
      presencePenalty: 'generationConfig.presencePenalty',
      frequencyPenalty: 'generationConfig.frequencyPenalty',
    },
  };
}

const thinkingBudgets: Record<string, number> = { none: 0, minimal: 128, low: 1024, medium: 2048, high: 4096, xhigh: 8192, max: 16384 };

function dataUrl(url: string): { mimeType: string; data: string } | undefined {
  const m = /^data:([^;,]+);base64,(.*)$/s.exec(url);
  return m ? { mimeType: m[1]!, data: m[2]! } : undefined;
}

function writeParts(parts: C.Part[]): GeminiPart[] {
  return parts.map((p) => {
    switch (p.type) {
      case 'text':
        return { text: p.text };
      case 'image': {
        const inline = dataUrl(p.url);
        return inline ? { inlineData: inline } : { fileData: { mimeType: p.mimeType ?? guessImageType(p.url), fileUri: p.url } };
      }
      case 'file':
        // A data URL's type and bytes; bare base64 (a plugin's canonical request, say) is taken as it is.
        if (p.data) return { inlineData: dataUrl(p.data) ?? { mimeType: p.mimeType ?? 'application/pdf', data: p.data } };
        if (p.url) return { fileData: { mimeType: p.mimeType ?? 'application/pdf', fileUri: p.url } };
        throw new GatewayError('unsupported_parameter', 'Files by id cannot be sent to a content-generation upstream; send the file data.', 'file');
      case 'audio':
        return { inlineData: { mimeType: `audio/${p.format}`, data: p.data } };
    }
  });
}

function guessImageType(url: string): string {
  const ext = /\.(png|jpe?g|webp|gif|heic|heif)(?:$|\?)/i.exec(url)?.[1]?.toLowerCase();
  return ext === 'jpg' ? 'image/jpeg' : ext ? `image/${ext}` : 'image/jpeg';
}

/** A tool result as the JSON object Gemini requires for `functionResponse.response`. */
function responseObject(text: string): JsonObject {
  try {
    const parsed = JSON.parse(text);
    if (parsed && typeof parsed === 'object' && !Array.isArray(parsed)) return parsed;
    if (Array.isArray(parsed)) return { result: parsed };
  } catch {
    // Plain text below.
  }
  return { content: text };
}

/** A canonical request as a generateContent body, with its path, for a Gemini upstream. */
export function canonicalToGemini(req: C.Request): GeminiUpstreamBody {
  const contents: GeminiContent[] = [];
  const names = new Map<string, string>();
  const system: string[] = [];
  for (const m of req.messages) {
    if (m.role === 'system') system.push(C.systemTextOf(m.content));
    else if (m.role === 'user') contents.push({ role: 'user', parts: writeParts(m.content) });
    else if (m.role === 'assistant') {
      const parts = writeParts(m.content);
      for (const [i, c] of m.toolCalls.entries()) {
        names.set(c.id, c.name);
        let args: unknown;
        try {
          args = JSON.parse(c.arguments || '{}');
        } catch {
          throw new GatewayError('invalid_request', `The arguments of tool call '${c.id}' are not valid JSON.`, 'tool_calls');
        }
        // Gemini 3 wants each call part replayed with its signature (7.11 item 3), and refuses a
        // turn whose first call has none: a call made elsewhere (another model, a client's own
        // history) gets the value Google documents for history it did not write.
        // A signature the gateway made for another family (Anthropic's thinking) is none of Gemini's.
        const own = c.signature && !isGatewaySignature(c.signature) ? c.signature : undefined;
        const signature = own ?? (i === 0 ? NO_THOUGHT_SIGNATURE : undefined);
        parts.push({ functionCall: { name: c.name, args }, ...(signature && { thoughtSignature: signature }) });
      }
      contents.push({ role: 'model', parts: parts.length ? parts : [{ text: '' }] });
    } else {
      // All results of one turn go in one user content (7.11 item 2).
      const text = m.content.map((p) => (p.type === 'text' ? p.text : '')).join('');
      // A result's images and files go with it, as the response's own parts (Gemini's multimodal function responses).
      const media = m.content.some((p) => p.type !== 'text') ? writeParts(m.content.filter((p) => p.type !== 'text')) : undefined;
      const part = { functionResponse: { name: m.name ?? names.get(m.toolCallId) ?? 'tool', response: responseObject(text), ...(media && { parts: media }) } };
      const last = contents.at(-1);
      if (last?.role === 'user' && last.parts.every((p) => 'functionResponse' in p && p.functionResponse)) last.parts.push(part);
      else contents.push({ role: 'user', parts: [part] });
    }
  }
  const body: GeminiUpstreamBody = { contents };
  if (system.length) body.systemInstruction = { parts: [{ text: system.join('\n\n') }] };
  if (req.tools.length) {
    body.tools = [
      {
        functionDeclarations: req.tools.map((t) => ({
          name: t.name,
          ...(t.description && { description: t.description }),
          ...(t.parameters && Object.keys(t.parameters.properties ?? {}).length > 0 && { parametersJsonSchema: t.parameters }),
        })),
      },
    ];
  }
  const choice = req.toolChoice;
  if (choice) {
    const functionCallingConfig: NonNullable<GeminiUpstreamBody['toolConfig']>['functionCallingConfig'] =
      choice === 'auto' ? { mode: 'AUTO' }
      : choice === 'none' ? { mode: 'NONE' }
      : choice === 'required' ? { mode: 'ANY' }
      : 'name' in choice ? { mode: 'ANY', allowedFunctionNames: [choice.name] }
      : choice.mode === 'required' ? { mode: 'ANY', allowedFunctionNames: choice.allowed }
      : { mode: 'AUTO' };
    body.toolConfig = { functionCallingConfig };
  }
  const gen: GeminiGenerationOut = {};
  if (req.maxOutputTokens !== undefined) gen.maxOutputTokens = req.maxOutputTokens;
  if (req.temperature !== undefined) gen.temperature = req.temperature;
  if (req.topP !== undefined) gen.topP = req.topP;
  if (req.topK !== undefined) gen.topK = req.topK;
  if (req.stop?.length) gen.stopSequences = req.stop.slice(0, 5);
  if (req.seed !== undefined) gen.seed = req.seed;
  if (req.presencePenalty !== undefined) gen.presencePenalty = req.presencePenalty;
  if (req.frequencyPenalty !== undefined) gen.frequencyPenalty = req.frequencyPenalty;
  if (req.format?.type === 'json_object') gen.responseMimeType = 'application/json';
  if (req.format?.type === 'json_schema') {
    gen.responseMimeType = 'application/json';
    if (req.format.schema) gen.responseJsonSchema = req.format.schema;
  }
  if (req.reasoning) {
    const budget = req.reasoning.effort ? thinkingBudgets[req.reasoning.effort] : undefined;
    gen.thinkingConfig = { ...(budget !== undefined && { thinkingBudget: budget }), ...(req.reasoning.summary && { includeThoughts: true }) };
  }
  if (Object.keys(gen).length) body.generationConfig = gen;
  return body;
}

/** The parts of one Gemini answer (or stream chunk), canonically. */
export function readParts(parts: UpstreamGeminiPart[], nextIndex: () => number): { text: string; reasoning: string; calls: (C.ToolCall & { index: number })[] } {
  let text = '';
  let reasoning = '';
  const calls: (C.ToolCall & { index: number })[] = [];
  for (const p of parts) {
    if (p.functionCall) {
      calls.push({
        index: nextIndex(),
        id: p.functionCall.id ?? newId('call_', 12),
        name: p.functionCall.name,
        arguments: JSON.stringify(p.functionCall.args ?? {}),
        ...(p.thoughtSignature && { signature: p.thoughtSignature }),
      });
    } else if (typeof p.text === 'string') {
      if (p.thought) reasoning += p.text;
      else text += p.text;
    }
  }
  return { text, reasoning, calls };
}

/** A generateContent body from an upstream, canonically. */
export function geminiBodyToCanonical(body: UpstreamGeminiAnswer): C.Response {
  const blocked = blockedPrompt(body);
  if (blocked) throw blocked;
  const candidate = body.candidates?.[0];
  if (!candidate) throw new GatewayError('upstream_error', 'The upstream answered with no candidates.');
  let n = 0;
  const { text, reasoning, calls } = readParts(candidate.content?.parts ?? [], () => n++);
  return {
    id: body.responseId,
    model: body.modelVersion,
    text,
    reasoning: reasoning || undefined,
    toolCalls: calls.map(({ index: _index, ...call }) => call),
    finishReason: readFinishReason(candidate.finishReason, calls.length),
    usage: readGeminiUsage(body.usageMetadata),
  };
}

/** Canonical parts of an answer as Gemini parts; call ids are kept so clients can echo them. */
export function writeAnswerParts(text: string, reasoning: string | undefined, calls: C.ToolCall[]): GeminiPart[] {
  const parts: GeminiPart[] = [];
  if (reasoning) parts.push({ text: reasoning, thought: true });
  if (text) parts.push({ text });
  for (const c of calls) {
    let args: unknown = {};
    try {
      args = JSON.parse(c.arguments || '{}');
    } catch {
      args = { arguments: c.arguments };
    }
    parts.push({ functionCall: { id: c.id, name: c.name, args }, ...(c.signature && { thoughtSignature: c.signature }) });
  }
  return parts;
}

/** A canonical answer as a generateContent body for the client. */
export function canonicalToGeminiBody(res: C.Response, ex: Exchange): GeminiAnswer {
  return {
    candidates: [
      {
        content: { role: 'model', parts: writeAnswerParts(res.text, res.reasoning, res.toolCalls) },
        finishReason: writeFinishReason(res.finishReason),
        index: 0,
      },
    ],
    ...(res.usage && { usageMetadata: writeGeminiUsage(res.usage) }),
    modelVersion: ex.modelId,
    responseId: newId('', 12),
  };
}
