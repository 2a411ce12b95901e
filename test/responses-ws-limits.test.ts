/**
 * The Responses WebSocket channel held to what HTTP holds a request to. A chained turn resends
 * the whole conversation it continues: past `server.maxBodyBytes` it is refused with
 * `request_too_large`, and the chain stays at the response before it (over HTTP such a body is a
 * 413; before, a socket could chain past any limit and hold its history in memory). What a
 * socket's lanes keep for chaining is held to `server.maxBodyBytes` together: the oldest chain is
 * dropped first, and chaining to it is refused saying why (before, 8 lanes of 15 MB warm-ups made
 * a socket hold 135 MB for its life, and some 33 such sockets ran the gateway out of memory). A
 * `response.create` whose `input` or `previous_response_id` has the wrong type is refused naming
 * the field, as the schema refuses it over HTTP. An error event's type is the one HTTP gives the
 * same failure: an upstream's failure is not reported as the client's mistake. A turn refused before
 * it runs is recorded under the key that opened the socket (before, with no key and no group).
 */
import t from 'tap';
import WebSocket from 'ws';
import { eventually, simulatorUpstreams, startStack } from './helpers.js';

const MAX_BODY_BYTES = 16 * 1024;
const { gw } = await startStack(
  (simUrl) => `${simulatorUpstreams(simUrl)}models:
  - { id: sim-chat, upstream: chat }
  - { id: sim-responses, upstream: responses }
`,
  { maxBodyBytes: MAX_BODY_BYTES },
);

const terminal = (e: any) => /^(response\.(completed|incomplete|failed)|error)$/.test(e.type);

/** A socket whose turns are sent one at a time: `turn` resolves with the turn's terminal event. */
async function socket() {
  const ws = new WebSocket(`${gw.url.replace('http', 'ws')}/v1/responses`, { headers: { authorization: `Bearer ${gw.key}` } });
  const events: any[] = [];
  ws.on('message', (m) => events.push(JSON.parse(m.toString())));
  await new Promise((resolve, reject) => (ws.once('open', resolve), ws.once('error', reject)));
  t.teardown(() => ws.close());
  /** A `response.create` with these fields, or a message sent as it is (a Buffer as a binary frame). */
  const turn = async (event: Record<string, unknown> | string | Buffer) => {
    const from = events.length;
    ws.send(typeof event === 'string' || Buffer.isBuffer(event) ? event : JSON.stringify({ type: 'response.create', ...event }));
    return eventually(() => events.slice(from).find(terminal), 'the turn to end');
  };
  return turn;
}

t.test('a chained turn past server.maxBodyBytes is refused, and the chain stays where it was', async (t) => {
  for (const model of ['sim-chat', 'sim-responses']) {
    const turn = await socket();
    const words = 'word '.repeat(1200); // 6,000 bytes a turn, with 8 tokens of answer
    const first = await turn({ model, input: `${words} [[sim tokens=8]]` });
    t.equal(first.type, 'response.completed', `${model}: the first turn`);
    const second = await turn({ model, previous_response_id: first.response.id, input: `${words} [[sim tokens=8]]` });
    t.equal(second.type, 'response.completed', `${model}: the second turn, about 12 KB with its history`);
    const third = await turn({ model, previous_response_id: second.response.id, input: `${words} [[sim tokens=8]]` });
    t.match(
      third,
      { type: 'error', status: 413, error: { type: 'invalid_request_error', code: 'request_too_large', message: new RegExp(`over the limit of ${MAX_BODY_BYTES} bytes \\(server\\.maxBodyBytes\\)`) } },
      `${model}: the third, about 12 KB of history and 6 KB new, is refused`,
    );
    const shorter = await turn({ model, previous_response_id: second.response.id, input: 'And in short? [[sim tokens=3]]' });
    t.match(shorter, { type: 'response.completed', response: { usage: { output_tokens: 3 } } }, `${model}: a shorter turn still chains from the second`);
  }
});

t.test('the lanes of a socket keep at most server.maxBodyBytes of history together: the oldest chain goes first', async (t) => {
  const turn = await socket();
  const words = 'word '.repeat(1200); // 6,000 bytes a warm-up: three are over the 16 KB kept
  const warmUp = async (lane: string) => (await turn({ stream_id: lane, model: 'sim-chat', generate: false, input: words })).response.id;
  const [oldest, older, newest] = [await warmUp('a'), await warmUp('b'), await warmUp('c')];
  const dropped = await turn({ stream_id: 'a', model: 'sim-chat', previous_response_id: oldest, input: 'And then? [[sim tokens=2]]' });
  t.match(dropped, {
    type: 'error',
    status: 400,
    stream_id: 'a',
    error: { code: 'previous_response_not_found', param: 'previous_response_id', message: /no longer held on this connection.*server\.maxBodyBytes.*Send the whole conversation/ },
  });
  for (const [lane, id] of [['b', older], ['c', newest]]) {
    const chained = await turn({ stream_id: lane, model: 'sim-chat', previous_response_id: id, input: 'And then? [[sim tokens=2]]' });
    t.equal(chained.type, 'response.completed', `lane ${lane} still chains from its warm-up`);
  }
  const fresh = await turn({ stream_id: 'a', model: 'sim-chat', input: `${words} [[sim tokens=2]]` });
  t.equal(fresh.type, 'response.completed', 'the whole conversation resent works on the lane that lost its chain');
});

t.test('input and previous_response_id of the wrong type are refused, naming the field', async (t) => {
  const turn = await socket();
  for (const input of [5, true, { role: 'user' }]) {
    const refused = await turn({ model: 'sim-responses', input });
    t.match(refused, { type: 'error', status: 400, error: { param: 'input', message: /'input' must be a string or an array of items/ } }, `input ${JSON.stringify(input)}`);
  }
  const badId = await turn({ model: 'sim-responses', previous_response_id: { a: 1 }, input: 'hi' });
  t.match(badId, { type: 'error', status: 400, error: { param: 'previous_response_id', message: /must be a string/ } });
  const fine = await turn({ model: 'sim-responses', input: 'hi [[sim tokens=2]]' });
  t.equal(fine.type, 'response.completed', 'the socket stays usable');
});

t.test('a turn refused before it runs is recorded under the key that opened the socket, as over HTTP', async (t) => {
  const turn = await socket();
  const warm = await turn({ stream_id: 'identity', model: 'sim-chat', generate: false, input: 'word '.repeat(2000) });
  const refusals: [code: string, message: Record<string, unknown> | string | Buffer][] = [
    ['invalid_json', 'not json'],
    ['invalid_request', Buffer.from('{"type":"response.create"}')], // a binary frame
    ['invalid_request', JSON.stringify({ type: 'response.cancel' })],
    ['previous_response_not_found', { stream_id: 'identity', model: 'sim-chat', previous_response_id: 'resp_unknown', input: 'x' }],
    // 10 KB of history and 7 KB new: over the 16 KB a request may be.
    ['request_too_large', { stream_id: 'identity', model: 'sim-chat', previous_response_id: warm.response.id, input: 'word '.repeat(1400) }],
  ];
  for (const [code, message] of refusals) t.match(await turn(message), { type: 'error', error: { code } }, `refused: ${code}`);

  const turnIds = await eventually(() => {
    const lines = gw.logs.filter((l) => l.msg === 'request' && l.method === 'WS');
    const socket = lines.find((l) => l.lane === 'identity')?.socket;
    const mine = lines.filter((l) => l.socket === socket).map((l) => l.req as string);
    return mine.length === 1 + refusals.length ? mine : undefined;
  }, "every turn's access line");
  const records = await eventually(async () => {
    const { body } = await gw.admin('GET', '/admin/usage?limit=1000');
    const mine = (body.records as { requestId: string; keyId: string | null; group: string | null; status: number }[]).filter((r) => turnIds.includes(r.requestId));
    return mine.length === turnIds.length ? mine : undefined;
  }, "every turn's usage record");
  const keyId = records.find((r) => r.status === 200)?.keyId;
  t.ok(keyId, 'the warm-up is recorded under the key');
  t.same(
    records.filter((r) => r.status !== 200).map((r) => [r.keyId, r.group]),
    refusals.map(() => [keyId, 'default']),
    'and so is every refused turn',
  );
});

t.test("an error event's type is the one HTTP gives the same failure", async (t) => {
  const turn = await socket();
  for (const directive of ['[[sim error=500]]', '[[sim error=503]]']) {
    const http = await fetch(`${gw.url}/v1/responses`, {
      method: 'POST',
      headers: { authorization: `Bearer ${gw.key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'sim-chat', input: `fail ${directive}` }),
    });
    const overHttp = ((await http.json()) as any).error;
    t.ok(http.status >= 500 && overHttp.type !== 'invalid_request_error', `${directive}: over HTTP, ${http.status} ${overHttp.type}`);
    const overSocket = await turn({ model: 'sim-chat', input: `fail ${directive}` });
    t.match(overSocket, { type: 'error', status: http.status, error: { type: overHttp.type, code: overHttp.code } }, `${directive}: the same status, type and code over the socket`);
  }
});
