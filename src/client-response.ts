/**
 * The client's side of one exchange, as the pipeline and the relay answer it: what the HTTP server
 * (server/response.ts) and the WebSocket channel (socket.ts) implement. A module of its own so that
 * the pipeline, the relay and the servers share it without importing each other.
 */
import type { GatewayError } from './errors.js';
import type { Exchange } from './exchange.js';

/** What the pipeline needs from the client's side of the connection to answer one exchange. */
export interface ClientResponse {
  /** A complete response. */
  reply(status: number, headers: Record<string, string>, body: string | Buffer): void;
  /** Status and headers of a stream; the body follows with write(). */
  startStream(status: number, headers: Record<string, string>): void;
  /** Returns false when the client's buffer is full: wait for onWritable before writing more. */
  write(bytes: string | Buffer): boolean;
  onWritable(resume: () => void): void;
  end(bytes?: string | Buffer): void;
  /**
   * Reads the request body, after the headers were accepted. Absent when the exchange arrives with
   * its body (a WebSocket message).
   */
  readBody?(onBody: (body: Buffer) => void, onRefused: (err: GatewayError) => void): void;
  /** Called once, after the done phase. */
  finished?(ex: Exchange): void;
}
