/**
 * What UwsResponse hands to uWS, cork by cork (each cork leaves in one syscall when it fits uWS's
 * 16 KB cork buffer): the writes of a response's first turn go out together, with the end when it
 * comes in the same turn, and a response that ends with its first bytes is never paused. uWS's response is a
 * recording stand-in here; the real server's behaviour is covered by the slow-client and edge
 * tests.
 */
import t from 'tap';
import { Exchange } from '../src/exchange.js';
import { LiveSet } from '../src/live-set.js';
import type { ServerContext } from '../src/server/context.js';
import { UwsResponse } from '../src/server/response.js';
import type { HttpResponse } from '../src/uws.js';

type Call = string;

/** A uWS response that records each call, grouped by cork; `refuse` makes writes report backpressure. */
function recordingResponse(refuse = false) {
  const corks: Call[][] = [];
  const outside: Call[] = [];
  let current: Call[] | undefined;
  const log = (call: Call) => (current ?? outside).push(call);
  const res = {
    cork(cb: () => void) {
      if (current) return cb(), res;
      current = [];
      cb();
      corks.push(current);
      current = undefined;
      return res;
    },
    writeStatus: (s: string) => (log(`status ${s}`), res),
    writeHeader: (k: string) => (log(`header ${k}`), res),
    write: (b: string | Buffer) => (log(`write ${b.length}`), !refuse),
    end: (b?: string | Buffer) => (log(`end ${b?.length ?? 0}`), res),
    pause: () => log('pause'),
    resume: () => log('resume'),
    onWritable: () => res,
    onAborted: () => res,
    close: () => log('close'),
  };
  return { res: res as unknown as HttpResponse, corks, outside };
}

function streamResponse(res: HttpResponse): UwsResponse {
  const context = { writers: new LiveSet(), overheadHeader: false, writeStallMs: 60_000, pipeline: {} } as unknown as ServerContext;
  const ex = new Exchange({} as never, { method: 'get', path: '/', kind: 'generate' }, 'GET', '/', '', {}, []);
  const out = new UwsResponse(res, context, ex, { length: 0 });
  out.startStream(200, { 'content-type': 'text/event-stream' });
  return out;
}

const turn = () => new Promise<void>((resolve) => setImmediate(resolve));
const frames = (n: number) => 'x'.repeat(n);

t.test('a stream written and ended in one turn leaves in one cork, never paused', async (t) => {
  const { res, corks, outside } = recordingResponse();
  const out = streamResponse(res);
  t.equal(out.write(frames(9000)), true);
  t.equal(out.write(frames(14)), true);
  out.end('');
  await turn();
  // A large last piece after the head: the head goes first, as corkedWrite does.
  t.same(corks, [['status 200 OK', 'header x-request-id', 'header content-type'], ['write 9000', 'write 14', 'end 0']]);
  t.same(outside, [], 'no pause, no resume');
});

t.test('the first turn’s small writes leave together at its end; the socket is paused before them', async (t) => {
  const { res, corks, outside } = recordingResponse();
  const out = streamResponse(res);
  out.write(frames(100));
  out.write(frames(200));
  t.same(corks, [], 'nothing reaches uWS during the turn');
  await turn();
  t.same(corks, [['status 200 OK', 'header x-request-id', 'header content-type', 'write 100', 'write 200']]);
  t.same(outside, ['pause'], 'paused before the first bytes, since the response goes on');
  // Later turns write at once: a stream that arrives token by token would pay a microtask per token for nothing.
  out.write(frames(50));
  t.same(corks.slice(1), [['write 50']], 'a later turn’s write reaches uWS at once');
  out.end();
  t.same(corks.slice(2), [['resume', 'end 0']]);
});

t.test('a write that would overflow the cork sends the queue first, then goes in slices', async (t) => {
  const { res, corks } = recordingResponse();
  const out = streamResponse(res);
  out.write(frames(10_000));
  out.write(frames(40_000));
  t.equal(corks.length, 5, 'the head, the queue, and three slices of the large write');
  t.same(corks[1], ['write 10000']);
  t.same(corks.slice(2).map((c) => c[0]), ['write 16320', 'write 16320', 'write 7360']);
  out.end();
});

t.test('a refusal found at the end of the turn blocks the next write', async (t) => {
  const { res } = recordingResponse(true);
  const out = streamResponse(res);
  t.equal(out.write(frames(100)), true, 'queued: accepted for now');
  await turn();
  t.equal(out.write(frames(100)), false, 'the client is behind: the upstream waits');
  out.end();
});
