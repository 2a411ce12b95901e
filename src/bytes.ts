/** Byte-level helpers shared by the SSE framing and the JSON splicing. */

export const LF = 0x0a;
export const CR = 0x0d;

/** Whether `bytes` occur in `buf` at `offset`: compared in place (a view and a native compare cost more for a few bytes). */
export function occursAt(buf: Buffer, bytes: Buffer, offset: number): boolean {
  if (offset < 0 || offset + bytes.length > buf.length) return false;
  for (let i = 0; i < bytes.length; i++) if (buf[offset + i] !== bytes[i]) return false;
  return true;
}
