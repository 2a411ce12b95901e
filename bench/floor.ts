/**
 * The runtime's floor: the least a Node reverse proxy on Sluice's own libraries pays, uWebSockets.js
 * towards the client and an undici pool towards the upstream, with no gateway logic (no keys,
 * routing, parsing, limits or logs). bench/versus.ts measures it beside nginx and Sluice, so the
 * gap between nginx and Sluice splits into the runtime's share and Sluice's.
 *
 *   node dist/bench/floor.js --upstream http://127.0.0.1:PORT
 */
import { STATUS_CODES } from 'node:http';
import { parseArgs } from 'node:util';
import { Pool, type Dispatcher } from 'undici';
import { loadUws, type HttpResponse } from '../src/uws.js';

const { values } = parseArgs({ options: { upstream: { type: 'string' } } });
if (!values.upstream) throw new Error('usage: node dist/bench/floor.js --upstream http://127.0.0.1:PORT');
// Sluice's settings for an upstream (src/http-upstream.ts).
const pool = new Pool(new URL(values.upstream).origin, { connections: 256, keepAliveTimeout: 30_000 });

/** The request headers the simulator reads; the rest, as any proxy would, stay behind. */
const FORWARDED = ['content-type', 'authorization', 'x-goog-api-key'];

function forward(res: HttpResponse, method: string, path: string, headers: Record<string, string>, body: Buffer | undefined, client: { aborted: boolean; controller?: Dispatcher.DispatchController }): void {
  // Written with the first chunk, in its cork: one syscall for the head and the first bytes.
  let head: string | undefined;
  let contentType = '';
  let headSent = false;
  // Bytes of a declared length still to come: the chunk that completes it ends the answer in its own cork.
  let remaining = -1;
  let ended = false;
  const writeHead = () => {
    if (headSent) return;
    headSent = true;
    res.writeStatus(head!);
    if (contentType) res.writeHeader('content-type', contentType);
  };
  pool.dispatch(
    { method, path, headers, body },
    {
      onRequestStart(c) {
        client.controller = c;
        if (client.aborted) c.abort(new Error('client left'));
      },
      onResponseStart(_c, status, upstreamHeaders) {
        head = `${status} ${STATUS_CODES[status] ?? ''}`;
        contentType = String(upstreamHeaders['content-type'] ?? '');
        const length = upstreamHeaders['content-length'];
        if (typeof length === 'string') remaining = Number(length);
      },
      onResponseData(c, chunk) {
        if (client.aborted) return;
        let ok = true;
        remaining -= chunk.length;
        ended = remaining === 0;
        res.cork(() => {
          writeHead();
          if (ended) res.end(chunk);
          else ok = res.write(chunk);
        });
        if (!ok) {
          // uWS has taken the chunk; the upstream waits until the client has read it.
          c.pause();
          res.onWritable(() => {
            c.resume();
            return true;
          });
        }
      },
      onResponseEnd() {
        if (!client.aborted && !ended) res.cork(() => (writeHead(), res.end()));
      },
      onResponseError(_c, err) {
        if (client.aborted || ended) return;
        // Mid-answer there is no status left to send: the client sees the connection close.
        if (headSent) return void res.close();
        res.cork(() => res.writeStatus('502 Bad Gateway').writeHeader('content-type', 'text/plain').end(`upstream failed: ${err.message}\n`));
      },
    },
  );
}

const uWS = loadUws();
uWS
  .App()
  .any('/*', (res, req) => {
    // uWS's request object lives only in this callback.
    const method = req.getMethod().toUpperCase();
    const query = req.getQuery();
    const path = query ? `${req.getUrl()}?${query}` : req.getUrl();
    const headers: Record<string, string> = {};
    for (const name of FORWARDED) {
      const value = req.getHeader(name);
      if (value) headers[name] = value;
    }
    const length = req.getHeader('content-length');
    const hasBody = length ? length !== '0' : req.getHeader('transfer-encoding') !== '';
    const client: { aborted: boolean; controller?: Dispatcher.DispatchController } = { aborted: false };
    res.onAborted(() => {
      client.aborted = true;
      client.controller?.abort(new Error('client left'));
    });
    if (!hasBody) return forward(res, method, path, headers, undefined, client);
    const chunks: Buffer[] = [];
    res.onData((chunk, isLast) => {
      // uWS reuses the chunk's memory once this callback returns.
      chunks.push(Buffer.from(chunk.slice(0)));
      if (isLast) forward(res, method, path, headers, chunks.length === 1 ? chunks[0] : Buffer.concat(chunks), client);
    });
  })
  .listen('127.0.0.1', 0, (socket) => {
    if (!socket) throw new Error('floor: cannot listen on 127.0.0.1');
    console.log(`floor listening on http://127.0.0.1:${uWS.us_socket_local_port(socket)}`);
  });
// Exit 0 when the bench stops it, as the gateway and the simulator do.
process.once('SIGTERM', () => process.exit(0));
