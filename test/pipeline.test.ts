/** The phase runner: order, sync and async plugins, local replies, and done exactly once. */
import t from 'tap';
import { ChannelTable } from '../src/channels/table.js';
import type { ClientFamily, Plugin } from '../src/contracts.js';
import { GatewayError } from '../src/errors.js';
import { Exchange } from '../src/exchange.js';
import { createLogger } from '../src/log.js';
import type { ClientResponse } from '../src/client-response.js';
import { Pipeline } from '../src/pipeline.js';

const family = { name: 'test', errorBody: (e: GatewayError) => JSON.stringify({ code: e.code }) } as unknown as ClientFamily;

function run(plugins: Plugin[]) {
  const replies: { status: number; body: string }[] = [];
  let finished!: () => void;
  const done = new Promise<void>((resolve) => (finished = resolve));
  const res: ClientResponse = {
    reply: (status, _h, body) => replies.push({ status, body: body.toString() }),
    startStream() {},
    write: () => true,
    onWritable() {},
    end() {},
    finished: () => finished(),
  };
  const ex = new Exchange(family, { method: 'post', path: '/x', kind: 'generate' }, 'POST', '/x', '', {}, []);
  const pipeline = new Pipeline({ plugins, routing: { models: new Map(), upstreams: new Map(), channels: new ChannelTable([], {}, new Map()) }, dialects: new Map(), log: createLogger('silent') });
  pipeline.accept(ex, res);
  return { done, replies, ex };
}

t.test('plugins run in order; an async local reply stops the rest; done runs once', async (t) => {
  const seen: string[] = [];
  let doneCount = 0;
  const { done, replies, ex } = run([
    { name: 'a', request: () => void seen.push('a') },
    { name: 'b', request: async () => (seen.push('b'), new GatewayError('rate_limit_exceeded', 'slow down')) },
    { name: 'c', request: () => void seen.push('c') },
    { name: 'd', done: () => void doneCount++ },
  ]);
  await done;
  t.same(seen, ['a', 'b']);
  t.same(replies, [{ status: 429, body: '{"code":"rate_limit_exceeded"}' }]);
  t.equal(ex.outcome, 'error');
  t.equal(doneCount, 1);
});

t.test('a throwing plugin becomes a 500, and a throwing done plugin does not stop the others', async (t) => {
  const doneSeen: string[] = [];
  const { done, replies } = run([
    { name: 'boom', request: () => { throw new Error('bug'); } },
    { name: 'd1', done: () => { throw new Error('also a bug'); } },
    { name: 'd2', done: () => void doneSeen.push('d2') },
  ]);
  await done;
  t.same(replies, [{ status: 500, body: '{"code":"internal_error"}' }]);
  t.same(doneSeen, ['d2']);
});
