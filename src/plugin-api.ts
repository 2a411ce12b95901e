/**
 * The public plugin API: everything a plugin may import from Sluice, and the only module the
 * plugins in `plugins/` import from the core (test/plugin-api.test.ts holds them to it). An
 * out-of-tree plugin imports it as `sluice/plugin-api` (docs/plugins.md, "Out of the tree").
 *
 * What is here is kept stable within a major version; what is not here is the core's own and may
 * change in any release.
 */

export type { JsonObject, JsonValue } from './json-value.js';

// The plugin contract: phases, families, dialects, upstreams, and what the gateway shows plugins.
export { LocalAnswer, definePlugin, socketTurn } from './contracts.js';
export type {
  BootContext,
  ClientFamily,
  ClientStream,
  FamilyPassthrough,
  Figure,
  Endpoint,
  GatewayView,
  JsonHandler,
  JsonReply,
  JsonRequest,
  PhaseResult,
  Plugin,
  PluginFactory,
  ResponseSink,
  SocketProtocol,
  Upstream,
  UpstreamCall,
  UpstreamDialect,
  UpstreamFactory,
  UpstreamRequest,
  UpstreamStats,
} from './contracts.js';
export type { Usage } from './usage.js';
export type { Config, McpConfig, McpServerConfig, ModelConfig, ResponseCacheConfig, TracingConfig } from './config/types.js';

// One exchange, its per-plugin state, and how it fails.
export { StateKey } from './state-key.js';
export type { ExchangeView as Exchange, UpstreamCallRecord } from './contracts.js';
export type { TraceContext } from './trace.js';
export { GatewayError, codeForStatus } from './errors.js';
export type { ErrorCode, ErrorKind } from './errors.js';

// The canonical form every family translates through.
export * as canonical from './canonical.js';
export { unreadableEvent } from './canonical.js';
export { isGatewaySignature, splitToolId, toolIdWithSignature } from './tool-call-ids.js';

// Reading and writing the wire: JSON bodies, request caps, server-sent events, bytes.
export { jsonOrUndefined, looksLikeJsonObject, parseRequestJson, parseUpstreamJson, positiveNumber, withFields } from './json-body.js';
export { removeNullFields } from './json-splice.js';
export { HOLE, jsonTemplate } from './json-template.js';
export { checkDepth, checkModelId, decodedParam, echoed, lengthOf, partsIn } from './request-caps.js';
export type { RequestCaps, RequestShape } from './request-caps.js';
export { ObjectKeyNeedle, dataFrame, eventFrame, fieldStartsWith, firstFrameToStopAt, firstMalformedFrame, frameData, frameJson, hasObjectField, holdsArray } from './sse.js';
export type { SparseScan } from './sse.js';
export { LF, occursAt } from './bytes.js';
export { compileValidator } from './validation.js';
export type { RequestValidator } from './validation.js';

// Upstreams over HTTP, and their secrets kept out of what is relayed and logged.
export { createHttpUpstream } from './http-upstream.js';
export type { HttpUpstreamKind, HttpUpstreamOptions, Timeouts } from './http-upstream.js';
export { REDACTED, scrubText, secretsOf } from './upstream-secrets.js';

// Tokens, usage estimates, prices and budgets.
export { estimateTokens } from './tokens.js';
export type { EstimateOptions } from './tokens.js';
export { estimateDeliveredOutput, estimateUsage } from './usage-estimate.js';
export { worstCaseCost } from './cost.js';
export { budgetPeriod } from './budget.js';
export { limitRefusal } from './limits/limiter.js';
export type { Amounts, Decision, Limiter, LimitScope, RateLimitWindows, RateWindow, WindowStatus } from './limits/limiter.js';
export { modelRuleNotes } from './model-rules.js';

// Keys, groups and the store, for plugins that authenticate and grant.
export { NO_TOKENS, StoreUnavailableError, groupAllowsModel } from './store/store.js';
export type { CachedStore, KeyLookup } from './store/cache.js';
export type { OpenTicket } from './store/store.js';
export { TrustedProxies } from './trusted-proxies.js';
export { newId, unixNow } from './ids.js';

// The admin surface's guards, for plugins that serve admin pages (the console).
export { AdminError } from './admin/service.js';
export { TooManyGuesses, bearerToken, checkAdminToken } from './admin/http.js';
export { GuessThrottle, SharedThrottleStorage, addressKey } from './admin/throttle.js';

// uWebSockets.js as Sluice loads it, for plugins that run a server of their own (the simulator).
export { loadUws } from './uws.js';
export type { HttpRequest, HttpResponse, TemplatedApp } from './uws.js';
