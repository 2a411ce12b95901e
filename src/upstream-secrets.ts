/**
 * An upstream's secrets kept out of what the gateway shows and logs. Some upstreams (a proxy, a
 * self-hosted server) echo the request's Authorization header in their errors; the gateway relays
 * an upstream's error words to its client and writes them to its log and usage records, which would
 * hand the gateway's own upstream key to every client that can make the upstream fail. Only error
 * paths pass here: an answer's content is never searched.
 */
import { GatewayError } from './errors.js';

/** What replaces a secret. */
export const REDACTED = '[redacted]';
/** Shorter configured values (an API version date, a region) are not secrets worth a search; keys are longer. */
const MIN_SECRET_CHARS = 16;

/** The values of an upstream's key and configured headers that are long enough to be secrets. */
export function secretsOf(values: ReadonlyArray<string | undefined>): string[] {
  return [...new Set(values.filter((v): v is string => typeof v === 'string' && v.length >= MIN_SECRET_CHARS))];
}

/** A secret's start this long, cut off where an excerpt of the upstream's words ends, is redacted too. */
const MIN_CUT_CHARS = 6;

/**
 * `text` with each of `secrets` replaced, and a secret's start that runs to the end of `text` (an
 * error's words are cut at 80 to 300 characters, and a key may straddle the cut) or to `…`.
 */
export function scrubText(text: string, secrets: readonly string[] | undefined): string {
  if (!secrets) return text;
  for (const secret of secrets) {
    if (text.includes(secret)) text = text.replaceAll(secret, REDACTED);
    const at = text.lastIndexOf(secret.slice(0, MIN_CUT_CHARS));
    if (at < 0) continue;
    let end = at;
    while (end < text.length && end - at < secret.length && text[end] === secret[end - at]) end++;
    const tail = text.slice(end);
    if (tail === '' || /^…/.test(tail) || /^["'\s]*$/.test(tail)) text = text.slice(0, at) + REDACTED + tail;
  }
  return text;
}

/** `bytes` with each of `secrets` replaced; the same buffer when none occurs. */
export function scrubBytes(bytes: Buffer, secrets: readonly string[] | undefined): Buffer {
  if (!secrets || !secrets.some((secret) => bytes.includes(secret))) return bytes;
  return Buffer.from(scrubText(bytes.toString('utf8'), secrets));
}

/** `err` with its message scrubbed; the same error when there was nothing to scrub. */
export function scrubError(err: GatewayError, secrets: readonly string[] | undefined): GatewayError {
  const message = scrubText(err.message, secrets);
  return message === err.message ? err : new GatewayError(err.code, message, err.param, err.status, err.upstreamCode, err.retryAfterSeconds);
}
