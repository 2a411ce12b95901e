/**
 * Limits and budgets: at admission, one limiter decision over every scope the exchange falls under
 * (its key, with the group's limits as defaults; its group's budget; its model's own limits).
 * Tokens are reserved then (the prompt estimated with the tokenizer, plus the output ceiling), and
 * so is the worst case of the spend (the prompt bounded from above, plus the output ceiling, at the
 * dearest prices); both are reconciled with the real usage in the done phase, whatever the ending.
 * A budget admits a request only when that worst case fits in what is left, so a stream needs no
 * cutting: it cannot pass the output ceiling the upstream was told and the reservation covered.
 * Every answer of a limited exchange carries its windows in the headers its family's clients read
 * (`ClientFamily.rateLimitHeaders`; OpenAI's `x-ratelimit-*` for a family that names none).
 */
import {
  type Amounts,
  budgetPeriod,
  type Decision,
  definePlugin,
  estimateTokens,
  type Exchange,
  GatewayError,
  limitRefusal,
  type LimitScope,
  StateKey,
  type RateLimitWindows,
  type RateWindow,
  type WindowStatus,
  worstCaseCost,
} from '../../src/plugin-api.js';

/** What an output ceiling is taken to be when neither the client nor the model sets one. */
const UNKNOWN_CEILING = 4096;

/**
 * The prompt tokens reserved against a budget, from the o200k estimate of the prompt text: an
 * upstream counts more than the text (a few tokens of framing per message, its own tokenizer), so
 * a quarter more, plus PER_LINE for every line of the prompt text (each message, tool call and
 * tool list is at least one), plus FIXED for the reply's priming.
 */
const INPUT_MARGIN = 1.25;
const PER_LINE = 4;
const FIXED = 16;

/** Where each family asks for its output ceiling, for the refusal's advice. */
const CEILING_FIELD: Record<string, string> = { chat: 'max_tokens', responses: 'max_output_tokens', gemini: 'generationConfig.maxOutputTokens', messages: 'max_tokens' };

/** The lease a granted exchange holds until its done phase. */
const held = new StateKey<{ lease: unknown }>('limiter lease');

/** What was reserved against a budget, to explain a refusal. */
interface WorstCase {
  cost: number;
  inputTokens: number;
  outputTokens: number;
  /** The price of one more output token, and the cost of the prompt alone. */
  outputPrice: number;
  inputCost: number;
}

export default definePlugin(({ limiter, log }) => {
  /** The scopes an exchange is counted in; empty when nothing limits it. */
  const scopesOf = (ex: Exchange, now: number): LimitScope[] => {
    const scopes: LimitScope[] = [];
    // Without a caller (allowAnonymous and no authenticating plugin) only the model's own limits apply.
    if (ex.principal) {
      const { key, group } = ex.principal;
      const keyLimits = { ...group.limits, ...key.limits };
      if (Object.keys(keyLimits).length > 0 || key.budget) {
        scopes.push({ id: `key:${key.id}`, limits: keyLimits, ...(key.budget && { budget: budgetPeriod(key.budget, now) }) });
      }
      if (group.budget) scopes.push({ id: `group:${group.name}`, budget: budgetPeriod(group.budget, now, group.createdAt) });
    }
    const modelLimits = ex.model!.limits;
    if (modelLimits) scopes.push({ id: `model:${ex.model!.id}`, limits: modelLimits });
    return scopes;
  };

  /**
   * Tokens: the prompt by the tokenizer plus the output ceiling. Cost, when the model has prices
   * and a scope a budget: the worst case, the prompt's upper bound plus the output ceiling of every
   * candidate, at the dearest prices.
   */
  const reservation = (ex: Exchange, scopes: LimitScope[]): { ask: Amounts; worst?: WorstCase } => {
    const needsTokens = scopes.some((s) => s.limits?.tpm !== undefined);
    const prices = ex.model!.prices;
    const needsCost = prices !== undefined && scopes.some((s) => s.budget);
    if (!needsTokens && !needsCost) return { ask: { tokens: 0, cost: 0 } };
    const text = ex.clientFamily.promptText(ex);
    // Drawn windows: a prompt shaped around fixed ones would pass its limits (src/tokens.ts).
    const input = estimateTokens(text, { sampling: 'random' });
    const { max, default: byDefault } = ex.model!.maxOutputTokens;
    const asked = ex.clientFamily.requestedOutputTokens?.(ex);
    // Over the max, the model rules clamp it or refuse the request: either way no more than max runs.
    const output = (asked !== undefined && max !== undefined ? Math.min(asked, max) : asked) ?? byDefault ?? max ?? UNKNOWN_CEILING;
    // Each of `n` candidates may write up to the ceiling.
    const choices = candidates(ex);
    const outputBound = output * choices;
    const ask = { tokens: input + outputBound, cost: 0 };
    if (!needsCost) return { ask };
    const inputBound = Math.ceil(input * INPUT_MARGIN) + PER_LINE * (newlines(text) + 1) + FIXED;
    const worst: WorstCase = {
      cost: worstCaseCost(inputBound, outputBound, prices),
      inputTokens: inputBound,
      outputTokens: outputBound,
      outputPrice: worstCaseCost(0, choices, prices),
      inputCost: worstCaseCost(inputBound, 0, prices),
    };
    return { ask: { ...ask, cost: worst.cost }, worst };
  };

  const decided = (ex: Exchange, decision: Decision<unknown>, worst: WorstCase | undefined): GatewayError | undefined => {
    if (decision.granted && ex.over) {
      // The client left while the decision waited: nothing ran, so nothing was used.
      void limiter.settle(decision.lease, { tokens: 0, cost: 0 });
      return;
    }
    const windows = tightest(decision.windows);
    if (windows) {
      const headers = ex.clientFamily.rateLimitHeaders?.(windows, Date.now()) ?? openAiRateLimitHeaders(windows);
      ex.responseHeaders = { ...ex.responseHeaders, ...headers };
    }
    if (decision.granted) return void ex.set(held, { lease: decision.lease });
    ex.set(limitRefusal, decision.reason);
    const retryAfterSeconds = Math.max(1, Math.ceil(decision.retryAfterMs / 1000));
    // The shared limiter's store is away and its fail mode is closed: a 503, not a limit reached.
    const code = decision.reason === 'budget' ? 'insufficient_quota' : decision.reason === 'unavailable' ? 'overloaded' : 'rate_limit_exceeded';
    const message =
      decision.reason === 'budget' ? budgetMessage(decision, worst, CEILING_FIELD[ex.clientFamily.name] ?? 'max_tokens', retryAfterSeconds) : refusalMessage(decision, retryAfterSeconds);
    return new GatewayError(code, message, null, undefined, undefined, retryAfterSeconds);
  };

  return {
    name: 'limits',
    admit(ex) {
      if (ex.endpoint.kind !== 'generate') return;
      const now = Date.now();
      const scopes = scopesOf(ex, now);
      if (scopes.length === 0) return;
      const { ask, worst } = reservation(ex, scopes);
      const decision = limiter.acquire(scopes, ask, now);
      return decision instanceof Promise ? decision.then((d) => decided(ex, d, worst)) : decided(ex, decision, worst);
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

/** The newlines of a text, counted without splitting it. */
function newlines(text: string): number {
  let n = 0;
  for (let i = text.indexOf('\n'); i !== -1; i = text.indexOf('\n', i + 1)) n++;
  return n;
}

/** Choices generated at once (chat's `n`, Gemini's `candidateCount`): each may run to the ceiling. */
function candidates(ex: Exchange): number {
  const req = ex.request as { n?: unknown; generationConfig?: { candidateCount?: unknown } } | undefined;
  const n = Number(req?.n ?? req?.generationConfig?.candidateCount ?? 1);
  return Number.isInteger(n) && n > 1 ? n : 1;
}

/** A cost as people read it: at most six significant digits, no binary noise. */
const money = (x: number) => String(Number(Math.max(0, x).toPrecision(6)));

/** A budget refusal: what is left, what this request may cost, and what to do about it. */
function budgetMessage(decision: Extract<Decision<unknown>, { granted: false }>, worst: WorstCase | undefined, ceilingField: string, retryAfterSeconds: number): string {
  const { scope, limit, budget } = decision;
  // In billionths, as the limiter compares them: no binary remainders of settled reservations.
  const spent = budget && Math.round(budget.spent * 1e9) / 1e9;
  const reserved = Math.round((budget?.reserved ?? 0) * 1e9) / 1e9;
  if (spent === undefined || spent >= limit || !worst) {
    const used = spent === undefined ? '' : ` (${money(spent)} spent${reserved > 0 ? `, ${money(reserved)} reserved by requests in flight` : ''})`;
    return `The budget of ${scope} (${limit}) is used up for this period${used}. Raise the budget to go on.`;
  }
  const left = limit - spent - reserved;
  const held = reserved > 0 ? `, ${money(reserved)} reserved by requests in flight` : '';
  const fits = worst.outputPrice > 0 ? Math.floor((left - worst.inputCost) / worst.outputPrice) : 0;
  const lower = fits >= 1 ? `Lower ${ceilingField} to ${fits} or less` : `Shorten the prompt or lower ${ceilingField}`;
  const wait = reserved > 0 && retryAfterSeconds <= 1 ? ` or try again in ${retryAfterSeconds}s, when requests in flight have settled,` : '';
  return (
    `This request may cost up to ${money(worst.cost)} (about ${worst.inputTokens} prompt tokens and up to ${worst.outputTokens} output tokens at the model's prices), ` +
    `more than the budget of ${scope} has left: ${money(Math.max(0, left))} of ${limit} (${money(spent)} spent${held}). ${lower},${wait} or raise the budget.`
  );
}

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

/** The tightest request window and the tightest token window across the scopes; undefined when none limits. */
function tightest(windows: WindowStatus[]): RateLimitWindows | undefined {
  let requests: RateWindow | undefined;
  let tokens: RateWindow | undefined;
  for (const w of windows) {
    if (w.requests && (!requests || w.requests.remaining < requests.remaining)) requests = w.requests;
    if (w.tokens && (!tokens || w.tokens.remaining < tokens.remaining)) tokens = w.tokens;
  }
  if (!requests && !tokens) return undefined;
  return { ...(requests && { requests }), ...(tokens && { tokens }) };
}

/** OpenAI's names: what a family that names none of its own sends. */
function openAiRateLimitHeaders({ requests, tokens }: RateLimitWindows): Record<string, string> {
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
