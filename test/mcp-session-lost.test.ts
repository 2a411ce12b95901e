/**
 * Which failed calls drop the upstream session they ran on (plugins/mcp/calls.ts): only a session
 * the server does not know (404, or 400) or a closed connection; a refusal of one POST fails that call alone.
 */
import t from 'tap';
import { StreamableHTTPError } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { ErrorCode, McpError } from '@modelcontextprotocol/sdk/types.js';
import { sessionLost } from '../plugins/mcp/calls.js';

t.test('a 404 or a closed connection loses the session', async (t) => {
  t.ok(sessionLost(new StreamableHTTPError(404, 'Session not found')), '404: the server expired it');
  t.ok(sessionLost(new StreamableHTTPError(400, 'Bad Request: No valid session ID provided')), '400: how servers built on the SDK examples say it');
  t.ok(sessionLost(new McpError(ErrorCode.ConnectionClosed, 'Connection closed')), 'the connection closed');
});

t.test('anything else keeps it for the calls beside it', async (t) => {
  for (const status of [413, 429, 500, 502, 503]) t.notOk(sessionLost(new StreamableHTTPError(status, 'Error POSTing to endpoint')), `HTTP ${status}`);
  t.notOk(sessionLost(new TypeError('fetch failed')), 'a brief network error on one POST');
  t.notOk(sessionLost(new McpError(ErrorCode.RequestTimeout, 'Request timed out')), 'a timeout');
  t.notOk(sessionLost(new McpError(ErrorCode.InvalidParams, 'bad')), "the server's own error");
});
