/**
 * The JSON-RPC errors `/mcp` answers with. The codes below -32000 are the SDK's (JSON-RPC's and
 * MCP's own); the rest are Sluice's, each with `data.code` naming it as the model routes do.
 */
import { ErrorCode } from '@modelcontextprotocol/sdk/types.js';

/** A tool or server the caller's group is not granted. */
export const NOT_GRANTED = -32003;
/** The key's rpm or concurrency for tool calls is used up; `data.retryAfterSeconds` says when to retry. */
export const RATE_LIMITED = -32029;
/** The arguments or the result are larger than `mcp.maxArgumentBytes` / `mcp.maxResultBytes`. */
export const TOO_LARGE = -32013;
/** The server behind the tool is not ready (starting, restarting, failed). */
export const SERVER_UNAVAILABLE = -32004;

/**
 * An error a request handler throws to answer with a JSON-RPC error: the SDK sends its `code`,
 * `message` and `data` as they are (its McpError would prefix the message with the code).
 */
export class RpcError extends Error {
  constructor(
    readonly code: number,
    message: string,
    readonly data?: Record<string, unknown>,
  ) {
    super(message);
  }
}

export { ErrorCode };

/** A JSON-RPC error body for a reply that is not part of a session (401, unknown session). */
export const jsonRpcError = (code: number, message: string, data?: Record<string, unknown>) => ({
  jsonrpc: '2.0',
  error: { code, message, ...(data && { data }) },
  id: null,
});
