/**
 * The Responses WebSocket channel with the official SDK's ResponsesWS: events as messages,
 * chaining with previous_response_id (native and bridged), ordering, errors, auth and aborts.
 */
import OpenAI from 'openai';
import { ResponsesWS } from 'openai/resources/responses/ws';
import t from 'tap';
import WebSocket from 'ws';
import { eventually, startStack } from './helpers.js';

const { sim, gw } = await startStack(
  (simUrl) => `
upstreams:
  chat-only: { kind: openai-chat, baseUrl: "${simUrl}/v1" }
  native: { kind: openai-responses, baseUrl: "${simUrl}/v1" }
models:
  - { id: sim-chat, upstream: chat-only }
  - { id: sim-responses, upstream: native }
`,
);

const client = new OpenAI({ apiKey: gw.key, baseURL: `${gw.url}/v1`, maxRetries: 0 });
const lastUpstreamRequest = async () => ((await (await fetch(`${sim.url}/stats`)).json()) as { lastRequest: any }).lastRequest;

/** A socket whose events are gathered per response, in order. */
function open() {
  const ws = new ResponsesWS(client);
  const events: any[] = [];
  const errors: any[] = [];
  ws.on('event', (e) => events.push(e));
  ws.on('error', (e) => errors.push(e));
  /** Resolves with the events from `from` up to and including the next terminal event. */
  const until = async (from: number) => {
    const end = await eventually(() => {
      const i = events.findIndex((e, k) => k >= from && /^response\.(completed|incomplete|failed)$/.test(e.type));
      return i >= 0 ? i + 1 : undefined;
    }, 'a terminal event');
    return events.slice(from, end);
  };
  return { ws, events, errors, until };
}

t.test('a response streams as messages; the next one chains with previous_response_id', async (t) => {
  for (const model of ['sim-responses', 'sim-chat']) {
    const { ws, events, until } = open();
    ws.send({ type: 'response.create', model, input: 'Hello there [[sim tokens=5]]' });
    const first = await until(0);
    t.equal(first[0].type, 'response.created');
    t.same(first.map((e) => e.sequence_number), first.map((_, i) => i), `${model}: sequence numbers from 0`);
    const done = first.at(-1);
    t.equal(done.type, 'response.completed');
    t.equal(done.response.usage.output_tokens, 5);

    ws.send({ type: 'response.create', model, previous_response_id: done.response.id, input: 'And then? [[sim tokens=3]]' });
    const second = await until(events.length);
    t.equal(second.at(-1).type, 'response.completed');
    const sent = await lastUpstreamRequest();
    const history = JSON.stringify(sent);
    t.match(history, /Hello there/, `${model}: the first turn was resent upstream`);
    t.ok(history.includes(JSON.stringify(done.response.output[0].content[0].text)), `${model}: with the first answer`);
    t.match(history, /And then\?/);
    ws.close();
  }
});

t.test('a tool round trip sends only the function_call_output', async (t) => {
  const { ws, events, until } = open();
  const tools = [{ type: 'function' as const, name: 'get_weather', strict: true, parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'], additionalProperties: false } }];
  ws.send({ type: 'response.create', model: 'sim-chat', input: 'Weather in Lima?', tools });
  const first = (await until(0)).at(-1);
  const call = first.response.output.find((i: any) => i.type === 'function_call');
  t.ok(call, 'a function call');
  ws.send({
    type: 'response.create',
    model: 'sim-chat',
    tools,
    previous_response_id: first.response.id,
    input: [{ type: 'function_call_output', call_id: call.call_id, output: 'Fog, 15 degrees' }],
  });
  const second = (await until(events.length)).at(-1);
  t.match(second.response.output.find((i: any) => i.type === 'message').content[0].text, /^The tool returned: Fog, 15 degrees/);
  ws.close();
});

t.test('errors arrive as error events and the socket stays usable; messages run in order', async (t) => {
  const { ws, events, errors, until } = open();
  ws.send({ type: 'response.create', model: 'sim-chat', previous_response_id: 'resp_unknown', input: 'x' });
  const notFound = await eventually(() => errors[0], 'an error event');
  t.equal(notFound.error?.error?.code, 'previous_response_not_found');
  t.equal(notFound.error?.status, 400);
  ws.send({ type: 'response.create', model: 'nope', input: 'x' } as any);
  const unknown = await eventually(() => errors[1], 'a second error event');
  t.equal(unknown.error?.error?.code, 'model_not_found');

  ws.send({ type: 'response.create', model: 'sim-chat', input: 'first [[sim tokens=20 tps=200]]' });
  ws.send({ type: 'response.create', model: 'sim-chat', input: 'second [[sim tokens=2]]' });
  const a = await until(0);
  const b = await until(events.indexOf(a.at(-1)) + 1);
  t.equal(a.at(-1).response.usage.output_tokens, 20, 'the first request finished first');
  t.equal(b.at(-1).response.usage.output_tokens, 2);
  t.ok(a.every((e) => !b.includes(e)), 'their events did not interleave');
  ws.close();
});

t.test('the upgrade is authenticated; a bad message is refused', async (t) => {
  const url = `${gw.url.replace('http', 'ws')}/v1/responses`;
  const status = await new Promise<number>((resolve) => {
    const ws = new WebSocket(url, { headers: { authorization: 'Bearer sk-wrong-wrong-wrong-wrong' } });
    ws.on('unexpected-response', (req, res) => (resolve(res.statusCode ?? 0), req.destroy()));
    ws.on('open', () => resolve(101));
  });
  t.equal(status, 401);

  const ws = new WebSocket(url, { headers: { authorization: `Bearer ${gw.key}` } });
  await new Promise((r) => ws.once('open', r));
  const reply = new Promise<any>((r) => ws.once('message', (m) => r(JSON.parse(m.toString()))));
  ws.send('not json');
  t.match(await reply, { type: 'error', status: 400, error: { code: 'invalid_json' } });
  ws.close();
});

t.test('closing the socket mid-stream aborts the upstream and records usage as aborted', async (t) => {
  const { ws, events } = open();
  ws.send({ type: 'response.create', model: 'sim-chat', input: 'slow [[sim tokens=400 tps=60]]' });
  await eventually(() => events.length > 5, 'some events');
  ws.close();
  const record = await eventually(async () => {
    const { body } = await gw.admin('GET', '/admin/usage');
    return body.records.find((r: any) => r.outcome === 'aborted' && r.family === 'responses');
  }, 'an aborted record');
  t.ok(record.completionTokens > 0 && record.completionTokens < 400, `${record.completionTokens} tokens estimated`);
});
