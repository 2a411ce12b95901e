/**
 * The Anthropic Messages family: its client side (family.ts) and its upstream dialect (dialect.ts).
 * Same-family requests go upstream as the client's own bytes, `anthropic-version` and
 * `anthropic-beta` included; other families reach Messages upstreams, and Messages clients reach
 * other upstreams, through the canonical pivot.
 */
import { definePlugin } from '../../../src/plugin-api.js';
import { messagesDialect } from './dialect.js';
import { messagesFamily } from './family.js';

export default definePlugin((ctx) => {
  ctx.addFamily(messagesFamily(ctx.config.server.requestCaps));
  ctx.addDialect(messagesDialect);
  return { name: 'codecs/messages' };
});
