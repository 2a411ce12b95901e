/**
 * What a config that leaves things out gets: the default plugin list, the parameters dropped by
 * default, and the embedded default (the in-process simulator and its models) when there is no
 * config file at all. The scalar defaults (port, limits, timeouts) are filled in by load.ts.
 */
import type { AffinityConfig, RawConfig, UpstreamConfig } from './types.js';

/**
 * Dropped by default: sampling hints that change nothing essential (Gemini CLI always sends
 * `topK`). What changes the meaning of an answer (`candidates`, `safetySettings`, `stop`) is refused.
 */
export const defaultDroppedParameters = ['topK', 'seed', 'presencePenalty', 'frequencyPenalty'];

/** Prompt-cache affinity when the config says nothing: on, pins kept an hour after a conversation's last turn. */
export const defaultAffinity: AffinityConfig = { enabled: true, pinTtlMs: 3_600_000, maxPins: 100_000 };

/** The response cache's bounds when the config says nothing (it serves only models and groups that opt in). */
export const defaultResponseCache = { maxBytes: 64 * 1024 * 1024, maxEntryBytes: 1024 * 1024, ttlMs: 3_600_000 };

/** The plugins a config without `plugins` runs, in this order (`extraPlugins` adds to them). */
export const defaultPlugins = [
  'auth',
  'grant',
  // Before the limits: a hit is answered without spending the caller's rate or budget.
  'response-cache',
  'limits',
  'codecs/chat',
  'codecs/responses',
  'codecs/gemini',
  'codecs/messages',
  'upstreams/openai-chat',
  'upstreams/openai-responses',
  'upstreams/gemini',
  'upstreams/anthropic',
  'upstreams/azure-openai',
  'upstreams/simulator',
  'usage',
  'access-log',
  'metrics',
  'tracing',
  'console',
  'mcp',
];

/** The embedded default: the in-process simulator and its models. */
export const embeddedDefault: { upstreams: Record<string, UpstreamConfig>; models: NonNullable<RawConfig['models']> } = {
  upstreams: {
    simulator: { kind: 'simulator' },
    'simulator-responses': { kind: 'simulator', family: 'responses' },
    'simulator-gemini': { kind: 'simulator', family: 'gemini' },
    'simulator-messages': { kind: 'simulator', family: 'messages' },
  },
  // Demo prices (per million tokens), so budgets and costs can be tried on the simulator.
  models: [
    // Bridged and translated models drop server-side tools (Codex always sends web_search).
    { id: 'sim-chat', upstream: 'simulator', prices: { input: 0.15, cachedInput: 0.075, output: 0.6 }, maxOutputTokens: { default: 1024, max: 8192, overMax: 'clamp' }, features: { unsupportedTools: 'drop' } },
    { id: 'sim-responses', upstream: 'simulator-responses', prices: { input: 1.25, cachedInput: 0.125, output: 10 }, maxOutputTokens: { default: 1024, max: 8192, overMax: 'clamp' }, features: { serverTools: ['web_search'] } },
    { id: 'sim-gemini', upstream: 'simulator-gemini', prices: { input: 0.3, cachedInput: 0.075, output: 2.5 }, maxOutputTokens: { default: 1024, max: 8192, overMax: 'clamp' }, features: { unsupportedTools: 'drop' } },
    { id: 'sim-messages', upstream: 'simulator-messages', prices: { input: 3, cachedInput: 0.3, cacheWrite: 3.75, output: 15 }, maxOutputTokens: { default: 1024, max: 8192, overMax: 'clamp' }, features: { unsupportedTools: 'drop' } },
    {
      id: 'sim-chat-basic',
      upstream: 'simulator',
      prices: { input: 0.05, output: 0.4 },
      maxOutputTokens: { default: 256, max: 1024, overMax: 'clamp' },
      features: { tools: false, jsonSchema: false, vision: false, temperature: false, reasoning: false, unsupportedTools: 'drop' },
    },
  ],
};
