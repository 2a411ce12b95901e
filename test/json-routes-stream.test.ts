/**
 * Streamed plain routes (`JsonReply.stream`): chunks are written as they come, all of them, with
 * the reply's status and headers, a slow reader holds the producer back, and a client that goes
 * away ends the producer's iteration and aborts the request's signal.
 */
import { request } from 'node:http';
import { fileURLToPath } from 'node:url';
import t from 'tap';
import { eventually, startTestGateway } from './helpers.js';
import { seen } from './fixtures/stream-route-plugin.js';

const module = fileURLToPath(new URL('./fixtures/stream-route-plugin.js', import.meta.url));
const gw = await startTestGateway(
  (dataDir) => `dataDir: ${dataDir}\nextraPlugins:\n  - { name: stream-route, module: ${JSON.stringify(module)} }\nupstreams:\n  sim: { kind: simulator }\nmodels:\n  - { id: m, upstream: sim }\n`,
);
t.teardown(() => gw.stop());

t.test('every chunk arrives, in order, with the status and headers', async (t) => {
  const res = await fetch(`${gw.url}/stream-test/big?chunks=40&size=100000`);
  t.equal(res.status, 200);
  t.equal(res.headers.get('content-type'), 'application/octet-stream');
  t.equal(res.headers.get('x-streamed'), 'yes');
  const body = Buffer.from(await res.arrayBuffer());
  t.equal(body.length, 40 * 100_000, 'all the bytes');
  t.equal(body[0], 97);
  t.equal(body[39 * 100_000], 97 + (39 % 26), 'the last chunk last');
});

t.test('a slow reader holds the producer back; leaving ends it', async (t) => {
  const before = { ...seen };
  await new Promise<void>((resolve, reject) => {
    const url = new URL(`${gw.url}/stream-test/endless`);
    const req = request({ host: url.hostname, port: url.port, path: url.pathname }, (res) => {
      t.equal(res.headers['content-type'], 'text/event-stream');
      res.once('data', () => {
        // The first event is here: leave.
        req.destroy();
        resolve();
      });
    });
    req.on('error', () => undefined);
    req.end();
    setTimeout(() => reject(new Error('no event')), 30_000).unref();
  });
  await eventually(() => seen.returned > before.returned, "the producer's iteration ended");
  t.equal(seen.aborted, before.aborted + 1, "the request's signal aborted");
  const produced = seen.produced;
  await new Promise((r) => setTimeout(r, 100));
  t.equal(seen.produced, produced, 'nothing more is produced');
});

t.test('a stream made after the client left is ended all the same', async (t) => {
  const before = { ...seen };
  const url = new URL(`${gw.url}/stream-test/late`);
  const req = request({ host: url.hostname, port: url.port, path: url.pathname });
  req.on('error', () => undefined);
  req.end();
  await eventually(() => seen.lateWaiting > before.lateWaiting, 'the handler is waiting');
  req.destroy();
  await eventually(() => seen.lateReturned > before.lateReturned, "the late stream's iteration ended");
  t.pass('ended');
});
