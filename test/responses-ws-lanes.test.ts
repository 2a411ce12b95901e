/**
 * The Responses WebSocket channel as Codex uses it: a warm-up (`generate: false`) that calls no
 * upstream and can be chained from; lanes (`stream_id`) that run side by side, each in order, with
 * every event echoing its lane; the channel switched off (426 at the upgrade, HTTP still served);
 * and the logs: one access line per turn (method WS, turn number, lane) and one line per error event.
 */
import OpenAI from 'openai';
import { ResponsesWS } from 'openai/resources/responses/ws';
import t from 'tap';
import WebSocket from 'ws';
import { eventually, startStack, startTestGateway } from './helpers.js';

const routing = (simUrl: string) => `
upstreams:
  chat-only: { kind: openai-chat, baseUrl: "${simUrl}/v1" }
  native: { kind: openai-responses, baseUrl: "${simUrl}/v1" }
models:
  - { id: sim-chat, upstream: chat-only }
  - { id: sim-responses, upstream: native }
`;
const { sim, gw } = await startStack(routing);

const simStats = async () => (await (await fetch(`${sim.url}/stats`)).json()) as { requests: number; lastRequest: any };
const terminal = (e: any) => /^(response\.(completed|incomplete|failed)|error)$/.test(e.type);

/** A raw socket with its messages gathered in order of arrival. */
async function rawSocket(url = gw.url, key = gw.key) {
  const ws = new WebSocket(`${url.replace('http', 'ws')}/v1/responses`, { headers: { authorization: `Bearer ${key}` } });
  const events: any[] = [];
  ws.on('message', (m) => events.push(JSON.parse(m.toString())));
  await new Promise((resolve, reject) => (ws.once('open', resolve), ws.once('error', reject)));
  const send = (event: Record<string, unknown>) => ws.send(JSON.stringify({ type: 'response.create', ...event }));
  /** The events of one lane ('' for none) from `from` up to its next terminal event. */
  const turn = (lane: string, from = 0) =>
    eventually(() => {
      const mine = events.slice(from).filter((e) => (e.stream_id ?? '') === lane);
      const end = mine.findIndex(terminal);
      return end >= 0 ? mine.slice(0, end + 1) : undefined;
    }, `a terminal event on lane '${lane}'`);
  return { ws, events, send, turn };
}

t.test('a warm-up calls no upstream, completes with zero usage, and the next turn chains from it', async (t) => {
  const client = new OpenAI({ apiKey: gw.key, baseURL: `${gw.url}/v1`, maxRetries: 0 });
  for (const model of ['sim-responses', 'sim-chat']) {
    const ws = new ResponsesWS(client);
    const events: any[] = [];
    ws.on('event', (e) => events.push(e));
    const before = (await simStats()).requests;
    ws.send({ type: 'response.create', model, generate: false, instructions: 'Be brief.', input: 'The code word is PAPAYA.' } as any);
    const warm = await eventually(() => (events.some(terminal) ? [...events] : undefined), 'the warm-up');
    t.same(warm.map((e) => e.type), ['response.created', 'response.completed'], `${model}: created, then completed`);
    const done = warm[1].response;
    t.match(done, { status: 'completed', output: [], usage: { input_tokens: 0, output_tokens: 0, total_tokens: 0 } });
    t.match(done.id, /^resp_/);
    t.equal((await simStats()).requests, before, `${model}: no upstream call`);

    ws.send({ type: 'response.create', model, previous_response_id: done.id, input: 'What is the code word? [[sim tokens=4]]' });
    const answer = await eventually(() => events.slice(2).find(terminal), 'the chained turn');
    t.equal(answer.type, 'response.completed');
    t.equal(answer.response.usage.output_tokens, 4);
    const sent = JSON.stringify((await simStats()).lastRequest);
    t.match(sent, /The code word is PAPAYA/, `${model}: the warm-up's input is in the chain`);
    t.match(sent, /What is the code word\?/);
    t.notMatch(sent, /"generate"/, 'generate is not sent upstream');
    ws.close();
  }
});

t.test('lanes run side by side, each in order, and every event echoes its stream_id', async (t) => {
  const { ws, events, send, turn } = await rawSocket();
  send({ stream_id: 'a', model: 'sim-chat', input: 'a1 [[sim tokens=30 tps=100]]' });
  send({ stream_id: 'a', model: 'sim-chat', input: 'a2 [[sim tokens=2]]' });
  send({ stream_id: 'b', model: 'sim-responses', input: 'b1 [[sim tokens=3]]' });
  const a1 = await turn('a');
  const b1 = await turn('b');
  t.equal(a1.at(-1).response.usage.output_tokens, 30);
  t.equal(b1.at(-1).response.usage.output_tokens, 3);
  t.ok(events.indexOf(b1.at(-1)) < events.indexOf(a1.at(-1)), "lane b finished while lane a's long turn was still streaming");
  const a2 = await turn('a', events.indexOf(a1.at(-1)) + 1);
  t.equal(a2.at(-1).response.usage.output_tokens, 2, 'lane a ran its second turn after its first');
  t.ok(events.indexOf(a2[0]) > events.indexOf(a1.at(-1)), 'and did not start before the first ended');
  for (const [lane, events] of [['a', a1], ['a', a2], ['b', b1]] as const) {
    t.ok(events.every((e) => e.stream_id === lane), `every event of lane ${lane} echoes it`);
    t.same(events.map((e) => e.sequence_number), events.map((_, i) => i), `lane ${lane}: sequence numbers from 0`);
  }

  // Each lane keeps its own chain; a warm-up on a lane echoes it too.
  send({ stream_id: 'b', model: 'sim-chat', previous_response_id: b1.at(-1).response.id, input: 'b2 [[sim tokens=2]]' });
  const from = events.length;
  const b2 = await turn('b', from);
  t.equal(b2.at(-1).type, 'response.completed', 'lane b chains from its own last response');
  send({ stream_id: 'a', model: 'sim-chat', previous_response_id: b2.at(-1).response.id, input: 'x' });
  const cross = await turn('a', events.length);
  t.match(cross.at(-1), { type: 'error', stream_id: 'a', error: { code: 'previous_response_not_found' } }, "another lane's response is not on this one");
  send({ stream_id: 'c', model: 'sim-chat', generate: false, input: 'warm' });
  const warm = await turn('c', events.length);
  t.same(warm.map((e) => [e.type, e.stream_id]), [['response.created', 'c'], ['response.completed', 'c']]);
  ws.close();
});

t.test('a warm-up is checked like any turn: an unknown model is refused', async (t) => {
  const { ws, send, turn } = await rawSocket();
  send({ stream_id: 'w', model: 'no-such-model', generate: false, input: 'warm' });
  t.match(await turn('w'), [{ type: 'error', stream_id: 'w', error: { code: 'model_not_found' } }]);
  ws.close();
});

t.test('a socket opens at most 8 lanes; beyond, an error event on the refused lane', async (t) => {
  const { ws, events, send, turn } = await rawSocket();
  for (let i = 1; i <= 8; i++) send({ stream_id: `lane-${i}`, model: 'sim-chat', generate: false, input: 'warm' });
  for (let i = 1; i <= 8; i++) t.equal((await turn(`lane-${i}`)).at(-1).type, 'response.completed');
  send({ stream_id: 'lane-9', model: 'sim-chat', generate: false, input: 'warm' });
  const refused = await turn('lane-9', events.length - 1);
  t.match(refused, [{ type: 'error', status: 429, stream_id: 'lane-9', error: { code: 'rate_limit_exceeded', param: 'stream_id' } }]);
  send({ stream_id: 'lane-1', model: 'sim-chat', input: 'still here [[sim tokens=2]]' });
  t.equal((await turn('lane-1', events.length)).at(-1).type, 'response.completed', 'the open lanes still serve');
  ws.close();
});

t.test('each turn has its own access line (method WS, turn, lane); each error event a log line', async (t) => {
  const { ws, events, send, turn } = await rawSocket();
  send({ model: 'sim-chat', generate: false, input: 'warm' });
  const warm = await turn('');
  send({ model: 'sim-chat', previous_response_id: warm.at(-1).response.id, input: 'hi [[sim tokens=2]]' });
  await turn('', events.length);
  ws.send('not json');
  await turn('', events.length);
  send({ stream_id: 'L', model: 'nope', input: 'x' });
  await turn('L', events.length);

  const access = await eventually(() => {
    const socketLines = gw.logs.filter((l) => l.msg === 'request' && l.method === 'WS');
    const socket = socketLines.findLast((l) => l.turn === 1 && l.lane === undefined && l.status === 200)?.socket;
    const mine = socketLines.filter((l) => l.socket === socket);
    return mine.length === 4 ? mine : undefined;
  }, 'four access lines for the socket');
  t.same(
    access.map((l) => [l.turn, l.lane, l.status, l.path, (l.error as any)?.code]),
    [
      [1, undefined, 200, '/v1/responses', undefined],
      [2, undefined, 200, '/v1/responses', undefined],
      [3, undefined, 400, '/v1/responses', 'invalid_json'],
      [4, 'L', 400, '/v1/responses', 'model_not_found'],
    ],
  );
  const upgrade = gw.logs.find((l) => l.msg === 'request' && l.req === access[0]!.socket);
  t.match(upgrade, { method: 'GET', status: 101 }, 'the socket is named by its upgrade request');
  const errors = gw.logs.filter((l) => l.msg === 'websocket error' && l.socket === access[0]!.socket);
  t.same(
    errors.map((l) => [l.turn, l.lane, l.status, l.code]),
    [
      [3, undefined, 400, 'invalid_json'],
      [4, 'L', 400, 'model_not_found'],
    ],
  );
  ws.close();
});

t.test('switched off by config: the upgrade gets 426 and HTTP still serves', async (t) => {
  const off = await startTestGateway((dataDir) => `dataDir: ${dataDir}\nserver: { shutdownTimeoutMs: 2000, websocket: { enabled: false } }\n${routing(sim.url)}`);
  t.teardown(() => off.stop());
  const status = await new Promise<number>((resolve) => {
    const ws = new WebSocket(`${off.url.replace('http', 'ws')}/v1/responses`, { headers: { authorization: `Bearer ${off.key}` } });
    ws.on('unexpected-response', (req, res) => (resolve(res.statusCode ?? 0), req.destroy()));
    ws.on('open', () => (resolve(101), ws.close()));
  });
  t.equal(status, 426);
  t.match(off.logs.find((l) => l.msg === 'request' && l.status === 426), { method: 'GET', error: { code: 'invalid_request' } });
  const client = new OpenAI({ apiKey: off.key, baseURL: `${off.url}/v1`, maxRetries: 0 });
  const response = await client.responses.create({ model: 'sim-chat', input: 'over HTTP [[sim tokens=2]]' });
  t.equal(response.usage?.output_tokens, 2);
});
