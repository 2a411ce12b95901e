/**
 * Limits and budgets: at admission, one limiter decision over every scope the exchange falls under
 * (its key, with the group's limits as defaults; its group's budget; its model's own limits).
 * Tokens and spend are reserved then (the prompt estimated with the tokenizer, plus the output
 * ceiling) and reconciled with the real usage in the done phase, whatever the ending.
 * Every answer of a limited exchange carries OpenAI's `x-ratelimit-*` headers.
 */
import { definePlugin } from '../../src/contracts.js';
import { costOf } from '../../src/cost.js';
import { GatewayError } from '../../src/errors.js';
import { StateKey, type Exchange } from '../../src/exchange.js';
import { limitRefusal, type Amounts, type Decision, type LimitScope, type WindowStatus } from '../../src/limiter.js';
import { budgetPeriod } from '../../src/budget.js';
import { estimateTokens } from '../../src/tokens.js';

/** What an output ceiling is taken to be when neither the client nor the model sets one. */
const UNKNOWN_CEILING = 4096;

/** The lease a granted exchange holds until its done phase. */
const held = new StateKey<{ lease: unknown }>('limiter lease');

export default definePlugin(({ limiter, log }) => {
  /** The scopes an exchange is counted in; empty when nothing limits it. */
  const scopesOf = (ex: Exchange, now: number): LimitScope[] => {
    const { key, group } = ex.principal!;
    const scopes: LimitScope[] = [];
    const keyLimits = { ...group.limits, ...key.limits };
    if (Object.keys(keyLimits).length > 0 || key.budget) {
      scopes.push({ id: `key:${key.id}`, limits: keyLimits, ...(key.budget && { budget: budgetPeriod(key.budget, now) }) });
    }
    if (group.budget) scopes.push({ id: `group:${group.name}`, budget: budgetPeriod(group.budget, now) });
    const modelLimits = ex.model!.limits;
    if (modelLimits) scopes.push({ id: `model:${ex.model!.id}`, limits: modelLimits });
    return scopes;
  };

  /** Prompt tokens by the tokenizer plus the output ceiling; priced when the model has prices. */
  const reservation = (ex: Exchange, scopes: LimitScope[]): Amounts => {
    const needsTokens = scopes.some((s) => s.limits?.tpm !== undefined);
    const prices = ex.model!.prices;
    const needsCost = prices !== undefined && scopes.some((s) => s.budget);
    if (!needsTokens && !needsCost) return { tokens: 0, cost: 0 };
    const input = estimateTokens(ex.clientFamily.promptText(ex));
    const ceiling = ex.model!.maxOutputTokens;
    const asked = ex.clientFamily.requestedOutputTokens?.(ex);
    // A model that clamps will not produce more than its max, whatever was asked.
    const clamped = asked !== undefined && ceiling.overMax === 'clamp' && ceiling.max !== undefined ? Math.min(asked, ceiling.max) : asked;
    const output = clamped ?? ceiling.default ?? ceiling.max ?? UNKNOWN_CEILING;
    return { tokens: input + output, cost: needsCost ? costOf({ inputTokens: input, outputTokens: output }, prices) : 0 };
  };

  const decided = (ex: Exchange, decision: Decision<unknown>): GatewayError | undefined => {
    if (decision.granted && ex.over) {
      // The client left while the decision waited: nothing ran, so nothing was used.
      void limiter.settle(decision.lease, { tokens: 0, cost: 0 });
      return;
    }
    const headers = rateLimitHeaders(decision.windows);
    if (headers) ex.responseHeaders = { ...ex.responseHeaders, ...headers };
    if (decision.granted) return void ex.set(held, { lease: decision.lease });
    ex.set(limitRefusal, decision.reason);
    const retryAfterSeconds = Math.max(1, Math.ceil(decision.retryAfterMs / 1000));
    // The shared limiter's store is away and its fail mode is closed: a 503, not a limit reached.
    const code = decision.reason === 'budget' ? 'insufficient_quota' : decision.reason === 'unavailable' ? 'overloaded' : 'rate_limit_exceeded';
    return new GatewayError(code, refusalMessage(decision, retryAfterSeconds), null, undefined, undefined, retryAfterSeconds);
  };

  return {
    name: 'limits',
    admit(ex) {
      if (ex.endpoint.kind !== 'generate' || !ex.principal) return;
      const now = Date.now();
      const scopes = scopesOf(ex, now);
      if (scopes.length === 0) return;
      const decision = limiter.acquire(scopes, reservation(ex, scopes), now);
      return decision instanceof Promise ? decision.then((d) => decided(ex, d)) : decided(ex, decision);
    },
    done(ex) {
      const lease = ex.get(held)?.lease;
      if (lease === undefined) return;
      const tokens = ex.usage ? ex.usage.inputTokens + ex.usage.outputTokens : 0;
      const settled = limiter.settle(lease, { tokens, cost: ex.cost ?? 0 });
      if (settled instanceof Promise) settled.catch((err) => log.error({ err, req: ex.id }, 'settling a limiter lease failed'));
    },
  };
});

/** Why a request was refused; "try again in Ns" is what Codex reads to time its retry. */
function refusalMessage({ reason, scope, limit }: Extract<Decision<unknown>, { granted: false }>, retryAfterSeconds: number): string {
  const wait = `Try again in ${retryAfterSeconds}s.`;
  switch (reason) {
    case 'budget':
      return `The budget of ${scope} (${limit}) is used up for this period.`;
    case 'concurrency':
      return `Concurrency limit reached for ${scope}: ${limit} requests at once. ${wait}`;
    case 'requests':
      return `Rate limit reached for ${scope}: ${limit} requests per minute. ${wait}`;
    case 'tokens':
      return `Rate limit reached for ${scope}: ${limit} tokens per minute. ${wait}`;
    case 'unavailable':
      return `Limits cannot be checked right now: the limiter's store is unavailable. ${wait}`;
    case 'too_large':
      return `Request too large for ${scope}: it may use more tokens (prompt plus output ceiling) than its limit of ${limit} per minute. Ask for fewer output tokens.`;
  }
}

/** OpenAI's headers, from the tightest request window and the tightest token window. */
function rateLimitHeaders(windows: WindowStatus[]): Record<string, string> | undefined {
  let requests: WindowStatus['requests'];
  let tokens: WindowStatus['tokens'];
  for (const w of windows) {
    if (w.requests && (!requests || w.requests.remaining < requests.remaining)) requests = w.requests;
    if (w.tokens && (!tokens || w.tokens.remaining < tokens.remaining)) tokens = w.tokens;
  }
  if (!requests && !tokens) return undefined;
  const headers: Record<string, string> = {};
  if (requests) {
    headers['x-ratelimit-limit-requests'] = String(requests.limit);
    headers['x-ratelimit-remaining-requests'] = String(requests.remaining);
    headers['x-ratelimit-reset-requests'] = duration(requests.resetMs);
  }
  if (tokens) {
    headers['x-ratelimit-limit-tokens'] = String(tokens.limit);
    headers['x-ratelimit-remaining-tokens'] = String(tokens.remaining);
    headers['x-ratelimit-reset-tokens'] = duration(tokens.resetMs);
  }
  return headers;
}

/** A duration as OpenAI writes it: `20ms`, `1.5s`, `1m0s`. */
export function duration(ms: number): string {
  if (ms < 1000) return `${Math.ceil(ms)}ms`;
  const seconds = Math.round(ms / 100) / 10;
  if (seconds < 60) return `${seconds}s`;
  return `${Math.floor(seconds / 60)}m${Math.round((seconds % 60) * 10) / 10}s`;
}
