/**
 * Prompt-cache affinity: the turns of one conversation go to the same channel (upstream and
 * credential), because a provider's prompt cache is per upstream and account, and an agent resends
 * a growing conversation every turn. Balancing each request on its own spreads a conversation over
 * N channels and its cache hits towards 1/N.
 *
 * A conversation is known by, in this order: the header the config names (`affinity.header`), the
 * session header a coding agent sends, or a digest of the conversation's start (its system prompt
 * and first user message, which later turns resend unchanged).
 *
 * The channel is chosen by weighted rendezvous hashing on that key: every thread and every
 * instance ranks a model's channels the same way for a conversation without sharing any state,
 * and over many conversations each channel gets its weight's share, as without affinity. Only
 * when the first-ranked channel cannot serve (its breaker is open, it is cooling down, or the call
 * failed) does another one serve, and the conversation is then pinned to it for a while, so it
 * does not move back and forth while the first one recovers. Pins are kept in this thread's memory
 * and, with the Redis limiter, told to every other instance and thread through its PinBus: each
 * keeps them all in its own map, so finding a conversation's pin never waits on Redis.
 */
import { createHash, type Hash } from 'node:crypto';
import type * as canonical from '../canonical.js';
import type { AffinityConfig } from '../config/types.js';
import type { PinBus } from '../limits/limiter.js';

/**
 * Session headers coding agents send on every request of a session, found by capturing their
 * requests through Sluice: Claude Code 2.1.330 `x-claude-code-session-id`, Codex 0.169.0
 * `session-id` (also `thread-id`, the same value). Gemini CLI 0.61.0 sends none: its
 * conversations are known by their start.
 */
export const AGENT_SESSION_HEADERS = ['x-claude-code-session-id', 'session-id'] as const;

/** What keys a conversation, and which of the three kinds of key it is. */
export interface ConversationKey {
  /** A 32-bit hash of the key, the rendezvous seed. */
  seed: number;
  /** The key as pins are kept under: the model, then a digest. */
  id: string;
  source: 'header' | 'session' | 'prefix';
}

/** Headers longer than this are not keys (a client's mistake, or an attempt to make pins large). */
const MAX_HEADER_KEY = 512;

export function conversationKey(modelId: string, headers: Record<string, string>, request: canonical.Request, settings: AffinityConfig): ConversationKey | undefined {
  const named = settings.header ? headers[settings.header] : undefined;
  if (named && named.length <= MAX_HEADER_KEY) return keyOf(modelId, 'h', named, 'header');
  for (const name of AGENT_SESSION_HEADERS) {
    const session = headers[name];
    if (session && session.length <= MAX_HEADER_KEY) return keyOf(modelId, 's', session, 'session');
  }
  return startKey(modelId, request);
}

/**
 * Of each string this much of its start and of its end is hashed, with its length: a prompt's cost
 * stays bounded however large it is (an agent's system prompt is tens of KB). Two conversations
 * that differ only in the middle of a long text get the same key, which only puts them on the same
 * channel.
 */
const SAMPLE = 2048;

function sampled(hash: Hash, text: string): void {
  hash.update(`${text.length}:`);
  if (text.length <= 2 * SAMPLE) hash.update(text);
  else hash.update(text.slice(0, SAMPLE)).update(text.slice(-SAMPLE));
}

/**
 * The key of the part of a conversation its later turns resend unchanged: the system messages
 * and the first user message. Undefined for a request without a user message (nothing to
 * recognise it by).
 */
function startKey(modelId: string, request: canonical.Request): ConversationKey | undefined {
  const hash = createHash('sha256').update(modelId).update('\0p\0');
  for (const message of request.messages) {
    hash.update(`\0${message.role}`);
    for (const part of message.content) {
      hash.update(`\0${part.type}`);
      if (part.type === 'text') sampled(hash, part.text);
      else if (part.type === 'image') sampled(hash, part.url);
      else if (part.type === 'file') sampled(hash, part.fileId ?? part.url ?? part.data ?? '');
      else sampled(hash, part.data);
    }
    if (message.role === 'user') return fromDigest(modelId, hash.digest(), 'prefix');
  }
  return undefined;
}

function keyOf(modelId: string, kind: string, value: string, source: ConversationKey['source']): ConversationKey {
  return fromDigest(modelId, createHash('sha256').update(modelId).update('\0').update(kind).update('\0').update(value).digest(), source);
}

function fromDigest(modelId: string, digest: Buffer, source: ConversationKey['source']): ConversationKey {
  return { seed: digest.readUInt32LE(0), id: `${modelId}\0${digest.toString('base64url', 0, 18)}`, source };
}

/** A channel's own 32-bit hash (FNV-1a of its identity), mixed with a conversation's seed. */
export function channelSeed(identity: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < identity.length; i++) h = Math.imul(h ^ identity.charCodeAt(i), 0x01000193);
  return h >>> 0;
}

/**
 * A uniform draw in (0, 1) fixed by the conversation and the channel: murmur3's finaliser over
 * both seeds, so a one-bit change in either changes about half the bits of the result.
 */
export function rendezvous(conversation: number, channel: number): number {
  let h = (conversation ^ Math.imul(channel, 0x9e3779b1)) >>> 0;
  h = Math.imul(h ^ (h >>> 16), 0x85ebca6b);
  h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35);
  h = (h ^ (h >>> 16)) >>> 0;
  return (h + 0.5) / 2 ** 32;
}

/** A conversation's pin: its channel, until when it lives here, and until when the others were last told it does. */
interface Pin {
  channel: string;
  until: number;
  sharedUntil: number;
}

/**
 * Conversations pinned to a channel other than their first-ranked one, with a sliding expiry.
 * With a bus, a pin made, moved or dropped here is published, and a pin served again is
 * republished once less than half its TTL is left elsewhere: a conversation's every turn renews it
 * here, but the others hear of it at most twice per TTL.
 */
export class AffinityPins {
  /** Least recently used first: a Map keeps insertion order, and a use re-inserts. */
  private readonly pins = new Map<string, Pin>();

  constructor(
    private settings: AffinityConfig,
    private readonly bus?: PinBus,
  ) {
    bus?.subscribe((key, channel, ttlMs) => this.heard(key, channel, ttlMs, Date.now()));
  }

  /** A reload's settings; the pins stay. */
  configure(settings: AffinityConfig): void {
    this.settings = settings;
  }

  get current(): AffinityConfig {
    return this.settings;
  }

  get size(): number {
    return this.pins.size;
  }

  /** The channel (its identity) a conversation is pinned to, if the pin is still alive. */
  channel(key: string, now: number): string | undefined {
    const pin = this.pins.get(key);
    if (!pin) return undefined;
    if (pin.until <= now) {
      this.pins.delete(key);
      return undefined;
    }
    return pin.channel;
  }

  /** The conversation was served by `channel`: pinned there, or its pin dropped when that is its first-ranked channel anyway. */
  served(key: string, channel: string, firstRanked: boolean, now: number): void {
    const pin = this.pins.get(key);
    this.pins.delete(key);
    const ttl = this.settings.pinTtlMs;
    if (firstRanked) {
      if (pin && pin.until > now) this.bus?.publish(key, undefined, ttl);
      return;
    }
    const until = now + ttl;
    let sharedUntil = until;
    if (pin && pin.channel === channel && pin.sharedUntil - now > ttl / 2) sharedUntil = pin.sharedUntil;
    else this.bus?.publish(key, channel, ttl);
    this.keep(key, { channel, until, sharedUntil });
  }

  /** Another instance or thread pinned a conversation (`channel`), or dropped its pin. */
  private heard(key: string, channel: string | undefined, ttlMs: number, now: number): void {
    this.pins.delete(key);
    if (channel !== undefined) this.keep(key, { channel, until: now + ttlMs, sharedUntil: now + ttlMs });
  }

  private keep(key: string, pin: Pin): void {
    this.pins.set(key, pin);
    for (const oldest of this.pins.keys()) {
      if (this.pins.size <= this.settings.maxPins) break;
      this.pins.delete(oldest);
    }
  }
}
