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
