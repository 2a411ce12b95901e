/**
 * The error catalog: every failure Sluice reports has one code here, with its HTTP status and a
 * generic kind. Codecs turn a GatewayError into their family's body shape; nothing else builds
 * error bodies.
 */

export type ErrorKind =
  | 'invalid_request'
  | 'authentication'
  | 'permission'
  | 'not_found'
  | 'too_large'
  | 'rate_limit'
  | 'quota'
  | 'upstream'
  | 'unavailable'
  | 'timeout'
  | 'internal';

interface CatalogEntry {
  status: number;
  kind: ErrorKind;
}

export const catalog = {
  invalid_json: { status: 400, kind: 'invalid_request' },
  invalid_request: { status: 400, kind: 'invalid_request' },
  invalid_value: { status: 400, kind: 'invalid_request' },
  unsupported_parameter: { status: 400, kind: 'invalid_request' },
  model_not_found: { status: 400, kind: 'invalid_request' },
  prompt_blocked: { status: 400, kind: 'invalid_request' },
  missing_api_key: { status: 401, kind: 'authentication' },
  invalid_api_key: { status: 401, kind: 'authentication' },
  key_disabled: { status: 401, kind: 'authentication' },
  key_expired: { status: 401, kind: 'authentication' },
  model_not_permitted: { status: 403, kind: 'permission' },
  family_not_permitted: { status: 403, kind: 'permission' },
  not_found: { status: 404, kind: 'not_found' },
  method_not_allowed: { status: 405, kind: 'invalid_request' },
  request_too_large: { status: 413, kind: 'too_large' },
  unsupported_media_type: { status: 415, kind: 'invalid_request' },
  rate_limit_exceeded: { status: 429, kind: 'rate_limit' },
  insufficient_quota: { status: 429, kind: 'quota' },
  upstream_rate_limited: { status: 429, kind: 'rate_limit' },
  internal_error: { status: 500, kind: 'internal' },
  unsupported_transfer_encoding: { status: 501, kind: 'invalid_request' },
  upstream_error: { status: 502, kind: 'upstream' },
  upstream_unavailable: { status: 503, kind: 'unavailable' },
  shutting_down: { status: 503, kind: 'unavailable' },
  overloaded: { status: 503, kind: 'unavailable' },
  store_unavailable: { status: 503, kind: 'unavailable' },
  upstream_busy: { status: 503, kind: 'unavailable' },
  upstream_timeout: { status: 504, kind: 'timeout' },
} as const satisfies Record<string, CatalogEntry>;

export type ErrorCode = keyof typeof catalog;

export class GatewayError extends Error {
  readonly status: number;
  readonly kind: ErrorKind;

  constructor(
    readonly code: ErrorCode,
    message: string,
    readonly param: string | null = null,
    /** Set when the error is an upstream 4xx that should reach the client with its own status. */
    status?: number,
    /** The upstream's own error code, shown to the client instead of `code`. */
    readonly upstreamCode?: string,
    /** Seconds the client should wait before trying again, sent as `Retry-After`. */
    readonly retryAfterSeconds?: number,
  ) {
    super(message);
    this.status = status ?? catalog[code].status;
    this.kind = catalog[code].kind;
  }
}

/** The headers of an error reply: JSON, and the Retry-After the error carries, if any. */
export function errorHeaders(err: GatewayError): Record<string, string> {
  return err.retryAfterSeconds === undefined
    ? { 'content-type': 'application/json' }
    : { 'content-type': 'application/json', 'retry-after': String(err.retryAfterSeconds) };
}

/** `err` with a Retry-After of `seconds` (an upstream's, passed on to the client); `err` itself when there is none. */
export function withRetryAfter(err: GatewayError, seconds: number | undefined): GatewayError {
  if (seconds === undefined || err.retryAfterSeconds === seconds) return err;
  return new GatewayError(err.code, err.message, err.param, err.status, err.upstreamCode, seconds);
}

export function asGatewayError(err: unknown): GatewayError {
  if (err instanceof GatewayError) return err;
  return new GatewayError('internal_error', 'The gateway hit an unexpected error.');
}

/** The catalog code that best describes an upstream's HTTP error status. */
export function codeForStatus(status: number): ErrorCode {
  if (status === 404) return 'not_found';
  if (status === 413) return 'request_too_large';
  if (status === 429) return 'rate_limit_exceeded';
  if (status === 503) return 'upstream_unavailable';
  if (status === 504) return 'upstream_timeout';
  if (status >= 500) return 'upstream_error';
  return 'invalid_request';
}
