/**
 * The Responses WebSocket channel on native Responses upstreams that write their JSON otherwise than
 * OpenAI does: spaced (`"type": "response.completed"`, as Python's json.dumps writes it) or with
 * `type` as the last key. Their responses can be chained from like any other (before, the socket
 * looked for the terminal event only as `"type":"…"` near an event's start: the client saw
 * response.completed, and the next turn got previous_response_not_found).
 */
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import t from 'tap';
import WebSocket from 'ws';
import { eventually, startTestGateway } from './helpers.js';

type Json = Record<string, unknown>;
const writers: Record<string, (event: Json) => string> = {
  spaced: (event) => JSON.stringify(event, null, 1).replace(/\n\s*/g, ' '),
  'type-last': ({ type, ...rest }) => JSON.stringify({ ...rest, type }),
};

/** The input of each request the upstream got, in order. */
const inputs: unknown[] = [];
let responses = 0;
/** A native Responses upstream that writes every event with the writer its model names. */
const upstream = createServer((req, res) => {
  let body = '';
  req.on('data', (chunk) => (body += chunk));
  req.on('end', () => {
    const request = JSON.parse(body);
    inputs.push(request.input);
    const write = writers[request.model]!;
    const response = { id: `resp_up${++responses}`, object: 'response', status: 'in_progress', model: request.model, output: [] as Json[], previous_response_id: null };
    const message = { type: 'message', id: `msg_${responses}`, status: 'completed', role: 'assistant', content: [{ type: 'output_text', text: `answer ${responses}`, annotations: [] }] };
    const events: Json[] = [
      { type: 'response.created', sequence_number: 0, response },
      { type: 'response.output_item.done', sequence_number: 1, output_index: 0, item: message },
      { type: 'response.completed', sequence_number: 2, response: { ...response, status: 'completed', output: [message], usage: { input_tokens: 5, output_tokens: 2, total_tokens: 7 } } },
    ];
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.end(events.map((e) => `event: ${e.type}\ndata: ${write(e)}\n\n`).join(''));
  });
});
await new Promise<void>((resolve) => upstream.listen(0, '127.0.0.1', resolve));
const upstreamUrl = `http://127.0.0.1:${(upstream.address() as AddressInfo).port}/v1`;
const gw = await startTestGateway(
  (dataDir) => `
dataDir: ${dataDir}
server: { shutdownTimeoutMs: 2000 }
upstreams:
  native: { kind: openai-responses, baseUrl: "${upstreamUrl}" }
models:
${Object.keys(writers)
  .map((model) => `  - { id: ${model}, upstream: native }`)
  .join('\n')}
`,
);
t.teardown(async () => {
  await gw.stop();
  upstream.close();
});

t.test('a response written spaced or with its type last can be chained from', async (t) => {
  const ws = new WebSocket(`${gw.url.replace('http', 'ws')}/v1/responses`, { headers: { authorization: `Bearer ${gw.key}` } });
  const events: any[] = [];
  ws.on('message', (m) => events.push(JSON.parse(m.toString())));
  await new Promise((resolve, reject) => (ws.once('open', resolve), ws.once('error', reject)));
  t.teardown(() => ws.close());
  const turn = async (event: Json) => {
    const from = events.length;
    ws.send(JSON.stringify({ type: 'response.create', ...event }));
    return eventually(() => events.slice(from).find((e) => e.type === 'response.completed' || e.type === 'error'), 'the turn to end');
  };
  for (const model of Object.keys(writers)) {
    const first = await turn({ model, input: 'Hello' });
    t.equal(first.type, 'response.completed', `${model}: the first turn completes`);
    const second = await turn({ model, previous_response_id: first.response.id, input: 'And then?' });
    t.match(second, { type: 'response.completed', response: { previous_response_id: first.response.id } }, `${model}: the next turn chains from it`);
    t.match(inputs.at(-1), [{ content: 'Hello' }, { content: [{ text: first.response.output[0].content[0].text }] }, { content: 'And then?' }], `${model}: with the conversation resent`);
  }
});
