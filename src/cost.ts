/**
 * What an exchange cost, from its usage and its model's prices (per million tokens). Output tokens
 * include reasoning tokens, and input tokens include cached ones, as OpenAI's usage counts them;
 * each part is priced once.
 */
import type { Prices } from './config/types.js';
import type { Usage } from './usage.js';

export function costOf(usage: Usage, prices: Prices): number {
  const cached = Math.min(usage.cachedTokens ?? 0, usage.inputTokens);
  const written = Math.min(usage.cacheWriteTokens ?? 0, usage.inputTokens - cached);
  const reasoning = Math.min(usage.reasoningTokens ?? 0, usage.outputTokens);
  const micro =
    (usage.inputTokens - cached - written) * prices.input +
    cached * prices.cachedInput +
    written * prices.cacheWrite +
    (usage.outputTokens - reasoning) * prices.output +
    reasoning * prices.reasoning;
  // Rounded to a billionth so sums of many records do not drift in binary fractions.
  return Math.round(micro / 1e-3) / 1e9;
}

/**
 * The most `inputTokens` and `outputTokens` can cost at these prices, whatever the upstream says
 * of them later: every input token at the dearest input price (plain, cached or written to the
 * cache), every output token at the dearer of plain and reasoning. Rounded up to a billionth, so
 * it is never less than the costOf of any usage within those counts.
 */
export function worstCaseCost(inputTokens: number, outputTokens: number, prices: Prices): number {
  const micro = inputTokens * Math.max(prices.input, prices.cachedInput, prices.cacheWrite) + outputTokens * Math.max(prices.output, prices.reasoning);
  return Math.ceil(micro / 1e-3) / 1e9;
}
