/**
 * A tool call's opaque signature (a Gemini thought signature) carried in the call's id, as a client
 * of another family sees it. Clients replay a tool call's id exactly, in the call and in its
 * result, but drop fields their API does not define; and Gemini 3 refuses a replayed call without
 * its signature. So the id is the only field that brings the signature back.
 */

/** Splits a client's tool id from the signature it carries (never made by any id sanitising). */
const SIGNATURE_MARK = '__sig__';

/** A tool call's id with its signature, if it has one, in URL-safe base64 (ids allow `-` and `_`). */
export function toolIdWithSignature(id: string, signature?: string): string {
  return signature ? `${id}${SIGNATURE_MARK}${Buffer.from(signature).toString('base64url')}` : id;
}

/**
 * Whether a signature is one the gateway made to carry another family's state through a call
 * (an Anthropic turn's thinking, plugins/codecs/messages/wire.ts): base64 of JSON whose key begins
 * `sluice.`. Such a signature is no thought signature of Gemini's, which would refuse it as
 * corrupted, and it holds Claude's thinking, which is not Google's to read.
 */
export function isGatewaySignature(signature: string): boolean {
  return Buffer.from(signature.slice(0, 16), 'base64').toString('latin1').startsWith('{"sluice.');
}

/** A client's tool id back as the call's own id and its signature. */
export function splitToolId(id: string): { id: string; signature?: string } {
  const at = id.indexOf(SIGNATURE_MARK);
  if (at < 0) return { id };
  return { id: id.slice(0, at), signature: Buffer.from(id.slice(at + SIGNATURE_MARK.length), 'base64url').toString() };
}
