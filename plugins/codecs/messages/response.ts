/** Complete Messages answers to and from the canonical pivot. */
import { canonical as C, type Exchange, GatewayError, newId } from '../../../src/plugin-api.js';
import type { JsonTool } from './request.js';
import {
  type AnswerBlock,
  clientToolId,
  type MessagesAnswer,
  parsedInput,
  type RedactedThinkingBlock,
  readMessagesUsage,
  readStopReason,
  type ThinkingBlock,
  type ThinkingBlocks,
  thinkingSignature,
  type UpstreamMessagesAnswer,
  writeMessagesUsage,
  writeStopReason,
} from './wire.js';

/** The JSON answer a forced tool's input carries. */
export const jsonToolText = (input: unknown, tool: JsonTool) => JSON.stringify(tool.wrapped ? (input as { value?: unknown } | null | undefined)?.value : (input ?? {}));

/** A Messages body from an upstream, canonically; the input of the forced JSON tool becomes the answer's text. */
export function messagesResponseToCanonical(body: UpstreamMessagesAnswer, jsonTool: JsonTool | undefined): C.Response {
  // JSON that is not a message with its content (`{}`, `{"ok":true}`) is no answer: the channel failing, not an empty reply.
  if (body.type !== 'message' || !Array.isArray(body.content)) throw new GatewayError('upstream_error', 'The upstream answered with no message.');
  let text = '';
  let reasoning = '';
  let answeredByJsonTool = false;
  const thinking: ThinkingBlocks = [];
  const toolCalls: C.ToolCall[] = [];
  for (const b of body.content) {
    switch (b?.type) {
      case 'text':
        text += b.text ?? '';
        break;
      case 'thinking':
        reasoning += b.thinking ?? '';
        // Kept as the upstream wrote it: it goes back to one like it, which checks it.
        thinking.push(b as ThinkingBlock);
        break;
      case 'redacted_thinking':
        thinking.push(b as RedactedThinkingBlock);
        break;
      case 'tool_use':
        // A call's id and name are read as sent: an upstream that leaves them out gives the client what it gave.
        if (jsonTool && b.name === jsonTool.name) {
          text += jsonToolText(b.input, jsonTool);
          answeredByJsonTool = true;
        } else toolCalls.push({ id: b.id!, name: b.name!, arguments: JSON.stringify(b.input ?? {}) });
        break;
    }
  }
  if (toolCalls.length && thinking.length) toolCalls[0]!.signature = thinkingSignature(thinking);
  return {
    id: body.id,
    model: body.model,
    text,
    ...(reasoning && { reasoning }),
    toolCalls,
    finishReason: answeredByJsonTool && !toolCalls.length ? 'stop' : readStopReason(body.stop_reason),
    usage: readMessagesUsage(body.usage),
  };
}

/** A canonical answer as a Messages body for the client. */
export function canonicalToMessagesResponse(res: C.Response, ex: Exchange): MessagesAnswer {
  const content: AnswerBlock[] = [];
  // Unsigned: thinking from another family's upstream can only go back to one like it.
  if (res.reasoning) content.push({ type: 'thinking', thinking: res.reasoning, signature: '' });
  if (res.text) content.push({ type: 'text', text: res.text });
  for (const c of res.toolCalls) content.push({ type: 'tool_use', id: clientToolId(c.id, c.signature), name: c.name, input: parsedInput(c.arguments) });
  return {
    id: newId('msg_', 12),
    type: 'message',
    role: 'assistant',
    model: ex.modelId,
    content,
    stop_reason: writeStopReason(res.finishReason, res.toolCalls.length),
    stop_sequence: null,
    usage: writeMessagesUsage(res.usage ?? { inputTokens: 0, outputTokens: 0 }),
  };
}
