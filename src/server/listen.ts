/**
 * Listening and draining: the port taken exclusively (or shared by worker threads), the operating
 * system's reason when it cannot be, and the drain at shutdown that lets exchanges finish, ends the
 * rest with their family's failure, and closes every socket.
 */
import { createServer } from 'node:net';
import type { OpenSockets } from '../socket.js';
import { loadUws, type TemplatedApp, type us_listen_socket } from '../uws.js';
import type { ServerContext } from './context.js';

export interface RunningServer {
  port: number;
  /**
   * Stops accepting, lets in-flight exchanges finish until the timeout, then ends each remaining
   * one with its family's failure (outcome `shutdown`) and closes the sockets.
   */
  drain(timeoutMs: number): Promise<void>;
}

/** What a drain stops: the server's exchanges and sockets, and its probe timer. */
export interface Serving {
  context: ServerContext;
  sockets: OpenSockets;
  prober: NodeJS.Timeout;
}

export function listen(app: TemplatedApp, options: { host: string; port: number; sharedPort?: boolean }, server: Serving): Promise<RunningServer> {
  const uWS = loadUws();
  return new Promise((resolve, reject) => {
    // Exclusive: a second Sluice on the same port fails here instead of silently taking half the
    // traffic. Worker threads share theirs (the primary thread checked the port was free).
    // Not in the 20.30 type declarations, but in the binary.
    const exclusive = (uWS as unknown as { LIBUS_LISTEN_EXCLUSIVE_PORT: number }).LIBUS_LISTEN_EXCLUSIVE_PORT;
    const listen = app.listen as unknown as (host: string, port: number, options: number, done: (socket: us_listen_socket | false) => void) => void;
    listen.call(app, options.host, options.port, options.sharedPort ? 0 : exclusive, (socket) => {
      if (!socket) {
        clearInterval(server.prober);
        return void whyCannotListen(options.host, options.port).then((reason) => reject(new Error(`cannot listen on ${options.host}:${options.port}: ${reason}`)));
      }
      resolve({
        port: uWS.us_socket_local_port(socket),
        async drain(timeoutMs) {
          server.context.draining = true;
          uWS.us_listen_socket_close(socket);
          const deadline = Date.now() + timeoutMs;
          while (server.context.pipeline.inFlight.size > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 25));
          server.context.pipeline.interruptAll();
          // Let the failure events leave before the sockets close.
          await new Promise((r) => setTimeout(r, 50));
          for (const socket of server.sockets) socket.close(1001, 'the gateway is shutting down');
          clearInterval(server.prober);
          // Idle keep-alive connections too (in the binary, not in the 20.30 declarations): uWS
          // would hold them, and a worker thread's event loop with them, for its 10 s idle timeout.
          (app as unknown as { close(): void }).close();
        },
      });
    });
  });
}

/** uWS says only that listening failed; the operating system says why. */
function whyCannotListen(host: string, port: number): Promise<string> {
  return new Promise((resolve) => {
    const probe = createServer();
    probe.once('error', (err: NodeJS.ErrnoException) => {
      const reasons: Record<string, string> = {
        EADDRINUSE: 'the address is already in use (is another Sluice running?)',
        EACCES: 'permission denied (ports below 1024 need privileges)',
        EADDRNOTAVAIL: 'the address is not available on this machine',
      };
      resolve(reasons[err.code ?? ''] ?? `${err.message}`);
    });
    probe.listen({ host, port, exclusive: true }, () => probe.close(() => resolve('uWebSockets.js refused the address')));
  });
}
