/**
 * Usage counted locally when an upstream never reported it: the prompt and the output delivered,
 * with the o200k tokenizer in bounded time (tokens.ts). Streams keep only a bounded sample of what
 * they delivered and how much more there was (relay.ts).
 */
import type { Response } from './canonical.js';
import type { Usage } from './usage.js';
import { StateKey } from './state-key.js';
import type { ExchangeView } from './contracts.js';
import { estimateTokens } from './tokens.js';

/** Delivered output kept per stream for a usage estimate; the rest is only counted. */
export const SAMPLE_BYTES = 16 * 1024;

/** A bounded sample of the output text delivered to the client, for a tokenizer estimate when usage never came. */
export const deliveredOutput = new StateKey<() => string>('delivered output');
/** How many times larger the whole delivered output was than its sample (1 when it was all kept). */
export const deliveredScale = new StateKey<() => number>('delivered output scale');

/**
 * Usage counted locally (and marked estimated) for an answer whose upstream reported none: the
 * prompt, and the output delivered (by default the stream's bounded sample, scaled up).
 */
export function estimateUsage(ex: ExchangeView, output = ex.get(deliveredOutput)?.() ?? '', scale = ex.get(deliveredScale)?.() ?? 1): Usage {
  return { inputTokens: estimateTokens(ex.clientFamily.promptText(ex)), outputTokens: Math.round(estimateTokens(output) * scale), estimated: true };
}

/** The output delivered so far, counted with the tokenizer (for a stream cut before its final usage). */
export function estimateDeliveredOutput(ex: ExchangeView): number {
  return Math.round(estimateTokens(ex.get(deliveredOutput)?.() ?? '') * (ex.get(deliveredScale)?.() ?? 1));
}

/** The output text of a complete answer, for an estimate. */
export function answerText(answer: Response): string {
  let text = (answer.reasoning ?? '') + answer.text;
  for (const call of answer.toolCalls) text += call.name + call.arguments;
  return text;
}
