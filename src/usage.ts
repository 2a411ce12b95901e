/**
 * Token usage, the one measure every family, dialect, limit, price and record shares. A leaf module
 * (it imports nothing): the canonical form, the contracts and the exchange all name it.
 */

/**
 * Token usage in family-neutral terms, counted as OpenAI counts it: input tokens include those read
 * from and written to the prompt cache, output tokens include reasoning tokens.
 */
export interface Usage {
  inputTokens: number;
  outputTokens: number;
  /** Of the input tokens, those read from the prompt cache. */
  cachedTokens?: number;
  /** Of the input tokens, those written to the prompt cache (Anthropic's cache_creation_input_tokens). */
  cacheWriteTokens?: number;
  reasoningTokens?: number;
  /** True when counted locally with a tokenizer because the upstream never reported it. */
  estimated?: boolean;
}

/**
 * The most tokens one exchange can count: ten times the largest context window on offer today
 * (10 million). Above it a count is not a count, whatever the upstream says.
 */
export const MAX_EXCHANGE_TOKENS = 100_000_000;

const REQUIRED_COUNTS = ['inputTokens', 'outputTokens'] as const;
const OPTIONAL_COUNTS = ['cachedTokens', 'cacheWriteTokens', 'reasoningTokens'] as const;
const isCount = (n: unknown) => Number.isSafeInteger(n) && (n as number) >= 0 && (n as number) <= MAX_EXCHANGE_TOKENS;

/**
 * The first count in `usage` that no upstream could have made (negative, fractional, not a number,
 * above MAX_EXCHANGE_TOKENS, alone or with input and output together), named with its value;
 * undefined when each could be real. Billing an upstream's negative count would refund a budget,
 * and a huge one would exhaust it for good.
 */
export function implausibleCount(usage: Usage): string | undefined {
  for (const field of REQUIRED_COUNTS) if (!isCount(usage[field])) return `${field}: ${String(usage[field])}`;
  for (const field of OPTIONAL_COUNTS) {
    const n = usage[field];
    if (n !== undefined && n !== null && !isCount(n)) return `${field}: ${String(n)}`;
  }
  if (usage.inputTokens + usage.outputTokens > MAX_EXCHANGE_TOKENS) return `inputTokens + outputTokens: ${usage.inputTokens + usage.outputTokens}`;
  return undefined;
}
