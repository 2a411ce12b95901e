/**
 * One access line per request, and per WebSocket turn (method `WS`, with its socket, turn number
 * and lane), with its W3C trace and span ids. Never a credential: the key appears only as its id.
 */
import { definePlugin, socketTurn } from '../../src/plugin-api.js';

export default definePlugin(({ log }) => ({
  name: 'access-log',
  done(ex) {
    // Below the configured level the line is never written: not even its object is built.
    if (!log.isLevelEnabled('info')) return;
    const turn = ex.get(socketTurn);
    log.info(
      {
        req: ex.id,
        // W3C trace context: the client's trace (or a new one) and the gateway's span in it.
        trace_id: ex.trace.traceId,
        span_id: ex.trace.spanId,
        method: ex.method,
        path: ex.path,
        socket: turn?.socket,
        turn: turn?.turn,
        lane: turn?.lane,
        family: ex.family,
        keyId: ex.principal?.keyId,
        model: ex.modelId || undefined,
        upstream: ex.upstream?.name,
        // A plugin's own answer in place of the upstream's (a response cache hit).
        answeredBy: ex.answeredBy,
        status: ex.status || undefined,
        outcome: ex.outcome,
        stream: ex.stream || undefined,
        latencyMs: Math.round(ex.elapsedMs() * 100) / 100,
        ttfbMs: ex.ttfbMs === undefined ? undefined : Math.round(ex.ttfbMs * 100) / 100,
        tokens: ex.usage && { in: ex.usage.inputTokens, out: ex.usage.outputTokens, estimated: ex.usage.estimated || undefined },
        error: ex.error && { code: ex.error.code, message: ex.error.message },
      },
      'request',
    );
  },
}));
