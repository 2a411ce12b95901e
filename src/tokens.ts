/**
 * Token estimates (o200k) in bounded time, for usage the upstream never reported and for the
 * simulator's counts. gpt-tokenizer's BPE costs up to about a microsecond per byte of text outside
 * its vocabulary and is quadratic in the length of one pre-tokenized piece (a "word"), so counting
 * a whole prompt on the event loop could hold it for minutes. Here the first EXACT_BYTES of a call
 * are counted exactly, pieces longer than PIECE_CHARS in chunks of that size, and whatever lies
 * beyond is extrapolated from small samples spread over it. Deterministic unless asked otherwise (see
 * EstimateOptions): the same texts always give the same count, and ordinary text within the budget
 * gets exactly countTokens' result.
 */
import { createRequire } from 'node:module';
import { O200K_TOKEN_SPLIT_REGEX } from 'gpt-tokenizer/encodingParams/constants';

type CountTokens = typeof import('gpt-tokenizer').countTokens;
let tokenizer: CountTokens | undefined;
/**
 * The o200k tables take 150–700 ms to load (the most of any module at start), and most exchanges
 * never need an estimate: they load on the first count, or from `warmTokenizer` once the gateway
 * is serving.
 */
function countTokens(text: string, options: typeof PLAIN): number {
  tokenizer ??= (createRequire(import.meta.url)('gpt-tokenizer') as typeof import('gpt-tokenizer')).countTokens;
  return tokenizer(text, options);
}

/**
 * Loads the tokenizer and compiles its paths for long pieces (some 20 ms, once) now rather than
 * during the first long prompt.
 */
export function warmTokenizer(): void {
  if (tokenizer) return;
  estimateTokens(['Warm-up: 1234, done.', Array.from({ length: 4 * PIECE_CHARS }, (_, i) => String.fromCharCode(97 + ((i * 7) % 26))).join('')]);
}

/** UTF-8 bytes counted exactly per call; with the samples, about 4 KB of BPE (up to about 0.7 µs a byte). */
export const EXACT_BYTES = 2048;
/** Longer pieces are counted in chunks of this many characters (at most 512 bytes, where BPE is still linear). */
export const PIECE_CHARS = 128;
/** Windows sampled from the text beyond the exact part; their tokens per character extrapolate it. */
const SAMPLES = 16;
const SAMPLE_BYTES = 128;
const SAMPLE_MARGIN = 32;
const GOLDEN = 0.6180339887498949;
/** User text may contain special-token markup like <|endoftext|>: it is counted as plain text. */
const PLAIN = { disallowedSpecial: new Set<string>() };
/** The tokenizer's own pre-tokenizer, as a private copy whose lastIndex only this module moves. */
const SPLIT = new RegExp(O200K_TOKEN_SPLIT_REGEX.source, 'gu');

interface Counted {
  tokens: number;
  /** Characters (UTF-16 units) the count covers. */
  chars: number;
  bytes: number;
}

export interface EstimateOptions {
  /**
   * Where the windows beyond the exact part fall in their strata: `fixed` (the default) gives the
   * same texts the same count every time, in every process (the simulator counts with it too);
   * `random` draws them per call, for a count an adversary must not steer. With fixed windows a
   * prompt made of cheap text (spaces) where the windows fall and dear text (rare CJK) everywhere
   * else was estimated at 1,677 tokens against 375,325, and passed limits and budgets by 100×
   * (both are now held to a floor, below).
   */
  sampling?: 'fixed' | 'random';
}

/** o200k tokens of `texts`, each counted on its own and summed (as countTokens on each would). */
export function estimateTokens(texts: string | readonly string[], options: EstimateOptions = {}): number {
  let tokens = 0;
  let budget = EXACT_BYTES;
  const rest: string[] = [];
  for (const text of typeof texts === 'string' ? [texts] : texts) {
    if (text === '') continue;
    const counted = budget > 0 ? countPrefix(text, budget) : { tokens: 0, chars: 0, bytes: 0 };
    tokens += counted.tokens;
    budget -= counted.bytes;
    if (counted.chars < text.length) rest.push(counted.chars === 0 ? text : text.slice(counted.chars));
  }
  if (rest.length === 0) return tokens;
  let chars = 0;
  for (const text of rest) chars += text.length;
  const estimated = extrapolate(rest, chars, options.sampling === 'random');
  // Windows can miss a dense block hidden in cheap text: fixed ones where a prompt is shaped around
  // them (an aborted stream's usage is estimated with them, and billed), drawn ones when a client
  // resends until they do. A rest that reads cheaper than any prose is held to a floor counted
  // from every character.
  return tokens + (estimated < CHEAP_TOKENS_PER_CHAR * chars ? Math.max(estimated, floorTokens(rest)) : estimated);
}

/** Fewer tokens per character than prose or code ever has (English runs about 0.25): a text this cheap is looked at whole. */
const CHEAP_TOKENS_PER_CHAR = 0.2;

/**
 * A floor under the o200k tokens of `texts`, from each character's kind (a run of one ASCII
 * character counts once): a printable ASCII one at
 * least a fifth of a token, a 2-byte one (Cyrillic, Greek, accented) a quarter, a 3-byte one (CJK,
 * kana) a half, a surrogate pair (rare scripts, emoji) one; whitespace nothing. Below the real
 * count for text of any script, so it only ever raises an estimate that missed dense text: rare
 * CJK (2 tokens a character) is held to within 4× of its count, not 100×.
 */
function floorTokens(texts: readonly string[]): number {
  let floor = 0;
  for (const text of texts) {
    for (let i = 0; i < text.length; i++) {
      const c = text.charCodeAt(i);
      // A run of one ASCII character ("-----", "=====") packs many to a token: only its first counts.
      if (c > 0x20 && c < 0x7f) floor += c === text.charCodeAt(i - 1) ? 0 : 0.2;
      else if (c >= 0xd800 && c <= 0xdfff) floor += 0.5;
      else if (c >= 0x800) floor += 0.5;
      else if (c >= 0x80) floor += 0.25;
    }
  }
  return Math.round(floor);
}

/** Counts whole pieces from the start of `text` until `budget` bytes are spent. */
function countPrefix(text: string, budget: number): Counted {
  // A character is at least one byte, so the pieces that fit lie within the first `budget` characters.
  const window = text.length > budget ? text.slice(0, budget) : text;
  const truncated = window.length < text.length;
  let tokens = 0;
  let bytes = 0;
  let segment = 0;
  let end = 0;
  SPLIT.lastIndex = 0;
  for (let match = SPLIT.exec(window); match; match = SPLIT.exec(window)) {
    const piece = match[0];
    if (piece.length > PIECE_CHARS) {
      tokens += countSegment(window, segment, match.index);
      const chunks = countChunks(piece, budget - bytes);
      tokens += chunks.tokens;
      bytes += chunks.bytes;
      end = segment = match.index + chunks.chars;
      if (chunks.chars < piece.length) break;
      continue;
    }
    // The window's last piece may be cut short: leave it to the estimate of the rest.
    if (truncated && SPLIT.lastIndex === window.length) break;
    const size = Buffer.byteLength(piece);
    if (bytes + size > budget) break;
    bytes += size;
    end = match.index + piece.length;
  }
  tokens += countSegment(window, segment, end);
  return { tokens, chars: end, bytes };
}

function countSegment(text: string, start: number, end: number): number {
  return end > start ? countTokens(start === 0 && end === text.length ? text : text.slice(start, end), PLAIN) : 0;
}

/** Counts a long piece in chunks of PIECE_CHARS (never splitting a surrogate pair) within `budget` bytes. */
function countChunks(piece: string, budget: number): Counted {
  let tokens = 0;
  let bytes = 0;
  let start = 0;
  while (start < piece.length) {
    let end = Math.min(start + PIECE_CHARS, piece.length);
    if (end < piece.length && isLowSurrogate(piece.charCodeAt(end))) end--;
    const chunk = piece.slice(start, end);
    const size = Buffer.byteLength(chunk);
    if (bytes + size > budget) break;
    tokens += countTokens(chunk, PLAIN);
    bytes += size;
    start = end;
  }
  return { tokens, chars: start, bytes };
}

/**
 * The texts' tokens from SAMPLES small windows spread over them (as if they were one text),
 * scaled from the windows' characters to all characters.
 */
function extrapolate(texts: string[], total: number, random: boolean): number {
  let tokens = 0;
  let chars = 0;
  let index = 0;
  let before = 0;
  for (let k = 0; k < SAMPLES; k++) {
    // One window somewhere in each of SAMPLES equal strata; the fixed, irregular offsets keep
    // periodic text (a phrase repeated) from being seen at the same phase every time.
    const at = Math.floor(((k + (random ? Math.random() : (k * GOLDEN) % 1)) * total) / SAMPLES);
    while (at >= before + texts[index].length) before += texts[index++].length;
    const sample = countSample(texts[index], at - before);
    tokens += sample.tokens;
    chars += sample.chars;
  }
  return chars === 0 ? 0 : Math.round((tokens / chars) * total);
}

/**
 * Tokens of the pieces that start within the SAMPLE_BYTES of text from `at`, and the characters
 * that stretch spans. A piece is attributed to a window by where it starts, whatever its length:
 * dropping the pieces an edge cuts instead would keep short ones more often than long ones.
 */
function countSample(text: string, at: number): Counted {
  let start = at;
  if (start > 0 && isLowSurrogate(text.charCodeAt(start))) start--;
  let end = start;
  let bytes = 0;
  while (end < text.length && bytes < SAMPLE_BYTES) bytes += utf8Width(text.charCodeAt(end++));
  if (end < text.length && isLowSurrogate(text.charCodeAt(end))) bytes += utf8Width(text.charCodeAt(end++));
  // The margins let the pre-tokenizer find the pieces near the edges as it would in the whole text.
  const from = Math.max(0, start - SAMPLE_MARGIN);
  const window = text.slice(from, Math.min(text.length, end + SAMPLE_MARGIN));
  let first = -1;
  let last = -1;
  SPLIT.lastIndex = 0;
  for (let match = SPLIT.exec(window); match; match = SPLIT.exec(window)) {
    if (from + match.index < start) continue;
    if (from + match.index >= end) break;
    if (first < 0) first = match.index;
    last = match.index + match[0].length;
  }
  // Inside one long piece, no piece starts here: count the stretch itself.
  const span = first < 0 ? text.slice(start, end) : window.slice(first, last);
  return { tokens: countPrefix(span, Infinity).tokens, chars: end - start, bytes };
}

/** UTF-8 bytes of one UTF-16 unit (a surrogate pair's two halves make 4). */
function utf8Width(code: number): number {
  return code < 0x80 ? 1 : code < 0x800 || (code >= 0xd800 && code <= 0xdfff) ? 2 : 3;
}

function isLowSurrogate(code: number): boolean {
  return code >= 0xdc00 && code <= 0xdfff;
}
