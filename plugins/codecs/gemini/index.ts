/**
 * The content-generation family (Gemini shape): its client side (family.ts) and its upstream dialect
 * (dialect.ts). Same-family requests go upstream as the client's own bytes; other families reach
 * Gemini upstreams, and Gemini clients reach other upstreams, through the canonical pivot.
 */
import { definePlugin } from '../../../src/plugin-api.js';
import { geminiDialect } from './dialect.js';
import { decode, family } from './family.js';

export default definePlugin((ctx) => {
  const caps = ctx.config.server.requestCaps;
  ctx.addFamily({ ...family, decode: (ex) => decode(ex, caps) });
  ctx.addDialect(geminiDialect);
  return { name: 'codecs/gemini' };
});
