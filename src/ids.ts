import { randomBytes } from 'node:crypto';

/** A random id in the style providers use, e.g. `newId('resp_')`. */
export function newId(prefix: string, bytes = 16): string {
  return prefix + randomBytes(bytes).toString('hex');
}

/** Unix seconds now. */
export const unixNow = () => Math.floor(Date.now() / 1000);
