/** What the two OpenAI families (chat completions and Responses) share: auth and error bodies. */
import { codeForStatus, type ErrorKind, type Exchange, GatewayError } from '../../src/plugin-api.js';

const errorTypes: Record<ErrorKind, string> = {
  invalid_request: 'invalid_request_error',
  authentication: 'invalid_request_error',
  permission: 'permission_error',
  not_found: 'invalid_request_error',
  too_large: 'invalid_request_error',
  rate_limit: 'rate_limit_exceeded',
  quota: 'insufficient_quota',
  upstream: 'upstream_error',
  unavailable: 'service_unavailable',
  timeout: 'timeout',
  internal: 'server_error',
};

/** `Authorization: Bearer KEY`: undefined when absent, '' when malformed. */
export function bearerCredential(ex: Exchange): string | undefined {
  const header = ex.headers.authorization;
  if (header === undefined) return undefined;
  const match = /^Bearer\s+(\S+)\s*$/i.exec(header);
  return match ? match[1] : '';
}

/** `{"error": {message, type, param, code}}`, as the official SDKs parse it. */
export function openAiErrorBody(err: GatewayError): string {
  return JSON.stringify({ error: { message: err.message, type: errorTypes[err.kind], param: err.param, code: err.upstreamCode ?? err.code } });
}

/** An upstream error body in the OpenAI shape, keeping the upstream's status and code. */
export function readOpenAiError(status: number, body: Buffer | string): GatewayError {
  let error: { message?: unknown; code?: unknown; param?: unknown } | undefined;
  try {
    const parsed = JSON.parse(body.toString());
    error = parsed?.error && typeof parsed.error === 'object' ? parsed.error : parsed;
  } catch {
    // Not JSON: the text itself is the best message there is.
  }
  const message = typeof error?.message === 'string' ? error.message : body.toString().slice(0, 300) || `Upstream answered ${status}.`;
  return new GatewayError(
    codeForStatus(status),
    message,
    typeof error?.param === 'string' ? error.param : null,
    status,
    typeof error?.code === 'string' ? error.code : undefined,
  );
}
