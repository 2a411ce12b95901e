/**
 * The chat completions family (OpenAI shape): its client side (family.ts) and its upstream dialect
 * (dialect.ts). Same-family requests go upstream as the client's own bytes, with a minimal splice when
 * Sluice must add something (the upstream model name, a default output ceiling, a usage request).
 */
import { definePlugin } from '../../../src/plugin-api.js';
import { chatDialect } from './dialect.js';
import { decode, family } from './family.js';

export default definePlugin((ctx) => {
  ctx.addFamily({ ...family, decode: (ex) => decode(ex, ctx.config.server.requestCaps) });
  ctx.addDialect(chatDialect);
  return { name: 'codecs/chat' };
});
