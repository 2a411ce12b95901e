/**
 * The Responses family (OpenAI shape): its client side (family.ts), its WebSocket mode (socket.ts)
 * and its upstream dialect (dialect.ts). Native upstreams get the client's bytes; a chat-only upstream
 * is served through the bridge (canonical pivot, see canonical.ts).
 */
import { definePlugin } from '../../../src/plugin-api.js';
import { responsesDialect } from './dialect.js';
import { decode, family } from './family.js';
import { responsesSocket } from './socket.js';

export default definePlugin((ctx) => {
  const caps = ctx.config.server.requestCaps;
  ctx.addFamily({ ...family, decode: (ex) => decode(ex, caps), socket: responsesSocket(caps) });
  ctx.addDialect(responsesDialect);
  return { name: 'codecs/responses' };
});
