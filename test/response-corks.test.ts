/**
 * What UwsResponse hands to uWS, cork by cork (each cork leaves in one syscall when it fits uWS's
 * 16 KB cork buffer): the writes of a response's first turn go out together, with the end when it
 * comes in the same turn, and a response that ends with its first bytes is never paused. An answer
 * an upstream gave leaves only after the turn's commits (the usage journal's append). uWS's
 * response is a recording stand-in here; the real server's behaviour is covered by the slow-client
 * and edge tests.
 */
import t from 'tap';
import { Exchange } from '../src/exchange.js';
import { LiveSet } from '../src/live-set.js';
import type { ServerContext } from '../src/server/context.js';
import { UwsResponse } from '../src/server/response.js';
import { commitAtTurnEnd } from '../src/turn-end.js';
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

/** A generation's response; `upstreamCalls` is how many calls its exchange made (none: the gateway answers it itself). */
function generationResponse(res: HttpResponse, upstreamCalls = 0): UwsResponse {
  const context = { writers: new LiveSet(), overheadHeader: false, writeStallMs: 60_000, pipeline: {} } as unknown as ServerContext;
  const ex = new Exchange({} as never, { method: 'get', path: '/', kind: 'generate' }, 'GET', '/', '', {}, []);
  ex.attempts = upstreamCalls;
  return new UwsResponse(res, context, ex, { length: 0 });
}

function streamResponse(res: HttpResponse, upstreamCalls = 0): UwsResponse {
  const out = generationResponse(res, upstreamCalls);
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

t.test('an answer an upstream gave leaves after the commits of its turn, even those made after it', async (t) => {
  const { res, corks } = recordingResponse();
  const out = generationResponse(res, 1);
  out.reply(200, { 'content-type': 'application/json' }, '{"usage":{}}');
  // As the usage plugin's done does, after the reply: the journal's append for this turn.
  commitAtTurnEnd(() => corks.push(['commit']));
  t.same(corks, [], 'nothing reaches uWS during the turn');
  await turn();
  t.same(corks, [['commit'], ['status 200 OK', 'header x-request-id', 'header content-type', 'end 12']]);

  const streamed = recordingResponse();
  const stream = streamResponse(streamed.res, 1);
  stream.write(frames(100));
  stream.end('data: [DONE]\n\n');
  commitAtTurnEnd(() => streamed.corks.push(['commit']));
  await turn();
  t.same(streamed.corks, [['commit'], ['status 200 OK', 'header x-request-id', 'header content-type', 'write 100', 'end 14']], "a stream's last bytes too");
});

t.test("a refusal the gateway made itself leaves at once (it may be inside uWS's handler, before a pipelined request)", async (t) => {
  const { res, corks } = recordingResponse();
  generationResponse(res, 0).reply(401, { 'content-type': 'application/json' }, '{}');
  t.same(corks, [['status 401 Unauthorized', 'header x-request-id', 'header content-type', 'end 2']]);
});

t.test('an answer whose client left before the end of the turn is not sent', async (t) => {
  const { res, corks } = recordingResponse();
  let aborted: (() => void) | undefined;
  (res as unknown as { onAborted: (cb: () => void) => void }).onAborted = (cb) => void (aborted = cb);
  const context = { writers: new LiveSet(), overheadHeader: false, writeStallMs: 60_000, pipeline: { interrupt() {} } } as unknown as ServerContext;
  const ex = new Exchange({} as never, { method: 'get', path: '/', kind: 'generate' }, 'GET', '/', '', {}, []);
  ex.attempts = 1;
  const out = new UwsResponse(res, context, ex, { length: 0 });
  out.reply(200, { 'content-type': 'application/json' }, '{}');
  aborted!();
  await turn();
  t.same(corks, [], 'uWS is not touched after it reported the connection gone');
});
