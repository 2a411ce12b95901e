/**
 * Upstreams that lie, in every family: through translation (a client of one family on an upstream
 * of another), in passthrough, and in what is billed. A stream cut before its end (no
 * finish_reason or [DONE], no response.completed, no finishReason, no message_stop) ends with the
 * client family's failure, not a finish, and is recorded as failed; so does a passthrough event
 * that is not JSON (Responses, Gemini as SSE and as its JSON array, Messages, as chat already did),
 * and a line that is not SSE at all (bare JSON), which never reaches the client. An error frame without a
 * type is an error too; a 200 that carries an error is the channel failing (another channel
 * answers when there is one), and so is one whose JSON is no answer of its family (`{}`), in every
 * pairing, streamed or not; a failure event ends the client's stream and the upstream call at
 * once, even when the upstream then stays silent, and an overloaded one is overloaded in the
 * client's family too; and a token count no upstream could make
 * (negative, fractional, past any context), or none at all, is estimated from the answer's text.
 * The liar is a small HTTP server on 127.0.0.1; the healthy channel is a simulator process.
 */
import { createServer, type IncomingMessage } from 'node:http';
import type { AddressInfo } from 'node:net';
import fc from 'fast-check';
import OpenAI from 'openai';
import t from 'tap';
import { firstFrameToStopAt, firstMalformedFrame } from '../src/sse.js';
import { eventually, simulatorUpstreams, startStack } from './helpers.js';

const chunk = (delta: object, finish: string | null = null, usage?: object) =>
  `data: ${JSON.stringify({ id: 'chatcmpl-liar', object: 'chat.completion.chunk', created: 1767225600, model: 'liar', choices: [{ index: 0, delta, finish_reason: finish }], ...(usage && { usage }) })}\n\n`;
const completion = (usage: object) =>
  JSON.stringify({ id: 'chatcmpl-liar', object: 'chat.completion', created: 1767225600, model: 'liar', choices: [{ index: 0, message: { role: 'assistant', content: 'Four words of answer.' }, finish_reason: 'stop' }], usage });
const responsesEvent = (type: string, fields: object = {}) => `event: ${type}\ndata: ${JSON.stringify({ type, ...fields })}\n\n`;
const RESPONSE_CREATED = responsesEvent('response.created', { response: { id: 'resp_liar', model: 'liar', created_at: 1767225600, status: 'in_progress' } });
const geminiChunk = (text: string, finishReason?: string) => `data: ${JSON.stringify({ candidates: [{ content: { role: 'model', parts: [{ text }] }, ...(finishReason && { finishReason }), index: 0 }] })}\n\n`;
const MESSAGE_START = `event: message_start\ndata: ${JSON.stringify({ type: 'message_start', message: { id: 'msg_liar', type: 'message', role: 'assistant', model: 'liar', content: [], stop_reason: null, usage: { input_tokens: 3, output_tokens: 1 } } })}\n\n`;

const RAW_ERROR = JSON.stringify({ error: { message: 'quota exceeded', type: 'insufficient_quota' } });

const NEGATIVE = { prompt_tokens: -5, completion_tokens: -3, total_tokens: -8 };
const HUGE = { prompt_tokens: 1e20, completion_tokens: 9007199254740993, total_tokens: 1e20 };
/** Each count within one exchange's bound, their sum past it. */
const HUGE_TOGETHER = { prompt_tokens: 99_000_000, completion_tokens: 99_000_000, total_tokens: 198_000_000 };
const FRACTIONAL = { prompt_tokens: 1.5, completion_tokens: 2.7, total_tokens: 4.2 };

/**
 * What the liar answers for each upstream model: a whole body, or stream pieces; `hold` leaves the
 * stream open; `whole` answers with the body even when a stream was asked for.
 */
const answers: Record<string, { status?: number; body?: string; stream?: string[]; hold?: boolean; whole?: boolean }> = {
  'whole-for-stream': { body: completion({ prompt_tokens: 4, completion_tokens: 5, total_tokens: 9 }), whole: true },
  'error-200-for-stream': { body: JSON.stringify({ error: { message: 'upstream exploded', type: 'server_error' } }), whole: true },
  'negative-usage': { body: completion(NEGATIVE), stream: [chunk({ role: 'assistant', content: 'Four words' }), chunk({}, 'stop'), chunk({}, null, NEGATIVE), 'data: [DONE]\n\n'] },
  'huge-usage': { body: completion(HUGE) },
  'huge-together-usage': { body: completion(HUGE_TOGETHER) },
  'fractional-usage': { body: completion(FRACTIONAL) },
  'finish-without-done': { stream: [chunk({ role: 'assistant', content: 'Whole' }), chunk({}, 'stop')] },
  'empty-stream': { stream: [] },
  'cut-chat': { stream: [chunk({ role: 'assistant', content: '' }), chunk({ content: 'Half an ans' })] },
  // A chat client reads it translated, a Responses client as passthrough.
  'cut-responses': {
    stream: [
      RESPONSE_CREATED,
      responsesEvent('response.output_text.delta', { item_id: 'msg_1', output_index: 0, content_index: 0, delta: 'Half an ans' }),
    ],
  },
  'untyped-error': {
    stream: [
      RESPONSE_CREATED,
      `event: error\ndata: ${JSON.stringify({ error: { message: 'the model fell over', code: 'server_error' } })}\n\n`,
      responsesEvent('response.completed', { response: { id: 'resp_liar', status: 'completed', output: [] } }),
    ],
  },
  'cut-gemini': { stream: [geminiChunk('Half an ans')] },
  // Whole Gemini streams without a finishReason in their last event.
  'usage-after-finish-gemini': { stream: [geminiChunk('Whole', 'STOP'), `data: ${JSON.stringify({ usageMetadata: { promptTokenCount: 3, candidatesTokenCount: 1, totalTokenCount: 4 } })}\n\n`] },
  'blocked-gemini': { stream: [`data: ${JSON.stringify({ promptFeedback: { blockReason: 'SAFETY' }, usageMetadata: { promptTokenCount: 3, totalTokenCount: 3 } })}\n\n`] },
  'error-200': { body: JSON.stringify({ error: { message: 'upstream exploded', type: 'server_error' } }) },
  // JSON objects that are no family's answer, for a stream request too.
  'empty-200': { body: '{}', whole: true },
  'ok-200': { body: '{"ok":true}', whole: true },
  'no-usage': { body: JSON.stringify({ id: 'chatcmpl-liar', object: 'chat.completion', created: 1767225600, model: 'liar', choices: [{ index: 0, message: { role: 'assistant', content: 'An answer of some length, long enough to be counted as more than a token or two.' }, finish_reason: 'stop' }] }) },
  'malformed-responses-native': {
    stream: [
      RESPONSE_CREATED,
      'event: response.output_text.delta\ndata: {not json at all\n\n',
      responsesEvent('response.completed', { response: { id: 'resp_liar', status: 'completed', output: [] } }),
    ],
  },
  'malformed-gemini-native': {
    stream: [geminiChunk('Half'), 'data: {not json at all\n\n', geminiChunk('.', 'STOP')],
  },
  'cut-messages-native': {
    stream: [
      MESSAGE_START,
      `event: content_block_start\ndata: ${JSON.stringify({ type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } })}\n\n`,
      `event: content_block_delta\ndata: ${JSON.stringify({ type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: 'Half an ans' } })}\n\n`,
    ],
  },
  'malformed-messages-native': {
    stream: [
      MESSAGE_START,
      'event: content_block_delta\ndata: <html>oops</html>\n\n',
      `event: message_stop\ndata: ${JSON.stringify({ type: 'message_stop' })}\n\n`,
    ],
  },
  'error-chat-native': { stream: [chunk({ role: 'assistant', content: 'Half' }), `data: ${JSON.stringify({ error: { message: 'chat went wrong', type: 'server_error' } })}\n\n`] },
  'error-silent-chat-native': { stream: [chunk({ role: 'assistant', content: 'Half' }), `data: ${JSON.stringify({ error: { message: 'chat went quiet', type: 'server_error' } })}\n\n`], hold: true },
  'error-responses-native': {
    stream: [
      RESPONSE_CREATED,
      responsesEvent('error', { code: 'server_error', message: 'responses went wrong' }),
    ],
  },
  // A bare line of JSON, not an event, labelled as an event stream: alone, and after the first event.
  'raw-json-sse': { stream: [RAW_ERROR] },
  'raw-json-after-gemini': { stream: [geminiChunk('Half'), `${RAW_ERROR}\n`] },
  'raw-json-after-messages': { stream: [MESSAGE_START, `${RAW_ERROR}\n\n`] },
  'unavailable-gemini': { stream: [geminiChunk('Half'), `data: ${JSON.stringify({ error: { code: 503, message: 'gemini is overloaded', status: 'UNAVAILABLE' } })}\n\n`] },
  'error-gemini-native': { stream: [geminiChunk('Half'), `data: ${JSON.stringify({ error: { code: 500, message: 'gemini went wrong', status: 'INTERNAL' } })}\n\n`] },
  'error-messages-native': {
    stream: [
      MESSAGE_START,
      `event: error\ndata: ${JSON.stringify({ type: 'error', error: { type: 'overloaded_error', message: 'messages went wrong' } })}\n\n`,
    ],
  },
  // Upstreams that echo the request's credentials ($AUTH) in their errors.
  'echo-400': { status: 400, body: JSON.stringify({ error: { message: 'bad request for $AUTH', type: 'invalid_request_error' } }) },
  'echo-500': { status: 500, body: JSON.stringify({ error: { message: 'crashed serving $AUTH', type: 'server_error' } }) },
  // A page of text, not JSON: the key straddles where its words are cut (300 characters).
  'echo-500-cut': { status: 500, body: `${'x'.repeat(280)} $AUTH and more` },
  'echo-gemini-garbage': { stream: [geminiChunk('Half'), 'data: proxy error for key $AUTH\n\n'] },
  'echo-200-error': { body: JSON.stringify({ error: { message: 'refused $AUTH', type: 'server_error' } }) },
  'echo-stream-error': { stream: [chunk({ role: 'assistant', content: 'Half' }), `data: ${JSON.stringify({ error: { message: 'stream died for $AUTH', type: 'server_error' } })}\n\n`] },
  'error-then-silent': { stream: [chunk({ role: 'assistant', content: 'Half' }), `data: ${JSON.stringify({ error: { message: 'mid-stream boom', type: 'server_error' } })}\n\n`], hold: true },
};

/** Calls whose upstream connection the gateway closed, by upstream model. */
const closedByGateway = new Set<string>();

const liar = createServer((req: IncomingMessage, res) => {
  let raw = '';
  req.on('data', (d) => (raw += d));
  req.on('end', async () => {
    const fromPath = /\/models\/([^:/]+):/.exec(req.url ?? '')?.[1];
    const model: string = fromPath ?? JSON.parse(raw).model;
    const known = answers[model];
    const auth = String(req.headers.authorization ?? req.headers['x-goog-api-key'] ?? '');
    const echo = (text: string) => text.replaceAll('$AUTH', auth);
    const answer = known && { ...known, body: known.body && echo(known.body), stream: known.stream?.map(echo) };
    if (!answer) {
      res.writeHead(404, { 'content-type': 'application/json' });
      return res.end(JSON.stringify({ error: { message: `no such model ${model}` } }));
    }
    const stream = fromPath ? req.url!.includes('streamGenerateContent') : JSON.parse(raw).stream === true;
    if (!stream || answer.whole || answer.status) {
      res.writeHead(answer.status ?? 200, { 'content-type': 'application/json' });
      return res.end(answer.body);
    }
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.on('close', () => {
      if (!res.writableFinished) closedByGateway.add(model);
    });
    for (const piece of answer.stream!) {
      res.write(piece);
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    if (!answer.hold) res.end();
  });
});
await new Promise<void>((resolve) => liar.listen(0, '127.0.0.1', resolve));
t.teardown(() => {
  liar.closeAllConnections();
  return new Promise((resolve) => liar.close(resolve));
});
const liarUrl = `http://127.0.0.1:${(liar.address() as AddressInfo).port}`;
const prices = '{ input: 1000000, output: 1000000 }';
/** The gateway's own key for the liar, which the echoing upstreams put in their errors. */
const LIAR_KEY = 'sk-upstream-secret-7f3a9c';

/** The upstream families, as the liar's and the simulator's upstreams are named. */
const UPSTREAMS = ['chat', 'responses', 'gemini', 'messages'] as const;
const NOT_ANSWERS = ['empty-200', 'ok-200'] as const;

const { gw } = await startStack(
  (simUrl) => `${simulatorUpstreams(simUrl)}  liar-chat: { kind: openai-chat, baseUrl: "${liarUrl}/v1", apiKey: ${LIAR_KEY}, breaker: { failures: 1000 } }
  liar-responses: { kind: openai-responses, baseUrl: "${liarUrl}/v1", breaker: { failures: 1000 } }
  liar-gemini: { kind: gemini, baseUrl: "${liarUrl}/v1beta", apiKey: ${LIAR_KEY}, breaker: { failures: 1000 } }
  liar-messages: { kind: anthropic, baseUrl: "${liarUrl}/v1", apiKey: k, breaker: { failures: 1000 } }
models:
  - { id: no-usage, upstream: liar-chat }
  - { id: whole-for-stream, upstream: liar-chat }
  - { id: error-200-for-stream, upstream: liar-chat }
  - { id: malformed-responses-native, upstream: liar-responses }
  - { id: malformed-gemini-native, upstream: liar-gemini }
  - { id: cut-messages-native, upstream: liar-messages }
  - { id: malformed-messages-native, upstream: liar-messages }
  - { id: error-chat-native, upstream: liar-chat }
  - { id: error-silent-chat-native, upstream: liar-chat }
  - { id: error-responses-native, upstream: liar-responses }
  - { id: error-gemini-native, upstream: liar-gemini }
  - { id: unavailable-gemini, upstream: liar-gemini }
  - { id: raw-json-after-gemini, upstream: liar-gemini }
  - { id: raw-json-after-messages, upstream: liar-messages }
${UPSTREAMS.map((u) => `  - { id: raw-json-sse-${u}, upstream: liar-${u}, upstreamModel: raw-json-sse }`).join('\n')}
  - { id: error-messages-native, upstream: liar-messages }
  - { id: negative-usage, upstream: liar-chat, prices: ${prices} }
  - { id: huge-usage, upstream: liar-chat, prices: ${prices} }
  - { id: huge-together-usage, upstream: liar-chat, prices: ${prices} }
  - { id: fractional-usage, upstream: liar-chat, prices: ${prices} }
  - { id: cut-chat, upstream: liar-chat }
  - { id: finish-without-done, upstream: liar-chat }
  - { id: empty-stream, upstream: liar-chat }
  - { id: cut-responses, upstream: liar-responses }
  - { id: untyped-error, upstream: liar-responses }
  - { id: cut-gemini, upstream: liar-gemini }
  - { id: usage-after-finish-gemini, upstream: liar-gemini }
  - { id: blocked-gemini, upstream: liar-gemini }
  - { id: error-200, upstream: liar-chat }
  - { id: error-then-silent, upstream: liar-chat }
  - { id: echo-400, upstream: liar-chat }
  - { id: echo-500, upstream: liar-chat }
  - { id: echo-500-cut, upstream: liar-chat }
  - { id: echo-gemini-garbage, upstream: liar-gemini }
  - { id: echo-200-error, upstream: liar-chat }
  - { id: echo-stream-error, upstream: liar-chat }
${NOT_ANSWERS.flatMap((a) => UPSTREAMS.map((u) => `  - { id: ${a}-${u}, upstream: liar-${u}, upstreamModel: ${a} }`)).join('\n')}
${UPSTREAMS.map((u) => `  - id: empty-200-then-healthy-${u}\n    channels: [{ upstream: liar-${u}, upstreamModel: empty-200 }, { upstream: ${u}, upstreamModel: sim-${u}, priority: 1 }]`).join('\n')}
  - id: error-200-then-healthy
    channels: [{ upstream: liar-chat, upstreamModel: error-200 }, { upstream: chat, upstreamModel: sim-chat, priority: 1 }]
`,
);

const chat = (body: Record<string, unknown>) =>
  fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${gw.key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], ...body }),
  });
const messages = (body: Record<string, unknown>) =>
  fetch(`${gw.url}/v1/messages`, {
    method: 'POST',
    headers: { 'x-api-key': gw.key, 'anthropic-version': '2023-06-01', 'content-type': 'application/json' },
    body: JSON.stringify({ max_tokens: 100, messages: [{ role: 'user', content: 'hi' }], ...body }),
  });

async function usageRecord(res: Response): Promise<any> {
  const id = res.headers.get('x-request-id');
  return eventually(async () => (await gw.admin('GET', '/admin/usage')).body.records.find((r: any) => r.requestId === id), 'usage record');
}

/** The data of each event of a stream, parsed. */
const datas = (text: string) =>
  text
    .split('\n\n')
    .map((frame) => /^data: (.*)$/m.exec(frame)?.[1])
    .filter((d): d is string => d !== undefined && d !== '[DONE]')
    .map((d) => JSON.parse(d));

t.test('a token count no upstream could make is not billed: the estimate is, never below zero', async (t) => {
  const cases: [string, Promise<Response>][] = [
    ['negative, chat passthrough', chat({ model: 'negative-usage' })],
    ['negative, chat passthrough stream', chat({ model: 'negative-usage', stream: true, stream_options: { include_usage: true } })],
    ['negative, Messages on a chat upstream', messages({ model: 'negative-usage' })],
    ['past any context, chat passthrough', chat({ model: 'huge-usage' })],
    ['past any context, Messages on a chat upstream', messages({ model: 'huge-usage' })],
    ['each in bounds, past any context together', chat({ model: 'huge-together-usage' })],
    ['fractional, chat passthrough', chat({ model: 'fractional-usage' })],
  ];
  for (const [what, pending] of cases) {
    const res = await pending;
    t.equal(res.status, 200, `${what}: the answer still reaches the client`);
    await res.text();
    const record = await usageRecord(res);
    t.equal(record.estimated, true, `${what}: recorded as estimated`);
    for (const field of ['promptTokens', 'completionTokens'] as const) {
      t.ok(Number.isSafeInteger(record[field]) && record[field] >= 0 && record[field] < 1000, `${what}: ${field} ${record[field]} is a count`);
    }
    t.ok(record.completionTokens > 0, `${what}: the answer's text is counted`);
    t.equal(record.cost, record.promptTokens + record.completionTokens, `${what}: the cost is the estimate's (a unit a token)`);
  }
});

t.test('a translated stream cut before its end fails in the client family, and is recorded as failed', async (t) => {
  const cases: [string, () => Promise<Response>, (text: string) => void][] = [
    [
      'Messages client, chat upstream with no finish_reason or [DONE]',
      () => messages({ model: 'cut-chat', stream: true }),
      (text) => {
        t.match(text, /event: error\ndata: \{"type":"error","error":\{"type":"api_error","message":"[^"]*cut short/, 'ends with the Messages error event');
        t.notMatch(text, /message_stop/, 'no message_stop');
      },
    ],
    [
      'chat client, Responses upstream with no response.completed',
      () => chat({ model: 'cut-responses', stream: true }),
      (text) => {
        t.match(datas(text).at(-1), { error: { message: /response\.completed: it was cut short/ } }, 'ends with the chat error frame');
        t.notMatch(text, /\[DONE\]|"finish_reason":"stop"/, 'no finish, no [DONE]');
      },
    ],
    [
      'chat client, Gemini upstream with no finishReason',
      () => chat({ model: 'cut-gemini', stream: true }),
      (text) => {
        t.match(datas(text).at(-1), { error: { message: /finishReason: it was cut short/ } }, 'ends with the chat error frame');
        t.notMatch(text, /\[DONE\]|"finish_reason":"stop"/, 'no finish, no [DONE]');
      },
    ],
    [
      'chat client, Responses upstream sending an error with no type',
      () => chat({ model: 'untyped-error', stream: true }),
      (text) => {
        t.match(datas(text).at(-1), { error: { message: /the model fell over/ } }, 'ends with the chat error frame');
        t.notMatch(text, /\[DONE\]/, 'no [DONE]');
      },
    ],
  ];
  for (const [what, send, check] of cases) {
    const res = await send();
    t.equal(res.status, 200, `${what}: the stream had started`);
    check(await res.text());
    t.match(await usageRecord(res), { outcome: 'error' }, `${what}: recorded as failed`);
  }
});

t.test('a 200 that carries an error is the channel failing: 502, or the next channel answers', async (t) => {
  const res = await messages({ model: 'error-200' });
  t.equal(res.status, 502, 'a Messages client on a chat upstream gets a 502');
  t.match(await res.json(), { type: 'error', error: { message: /^Upstream `liar-chat` answered 200: The upstream answered with an error: upstream exploded/ } });
  t.match(await usageRecord(res), { outcome: 'error' }, 'recorded as failed');
  const passthrough = await chat({ model: 'error-200' });
  t.equal(passthrough.status, 502, 'a chat client on the chat upstream (passthrough) gets a 502 too');
  t.match(await passthrough.json(), { error: { type: 'upstream_error', message: /^Upstream `liar-chat` answered 200: The upstream answered with an error: upstream exploded/ } });
  t.match(await usageRecord(passthrough), { outcome: 'error' }, 'recorded as failed');
  const rescuedChat = await chat({ model: 'error-200-then-healthy' });
  t.equal(rescuedChat.status, 200, 'in passthrough too, the second channel answers');
  t.match(await rescuedChat.json(), { object: 'chat.completion' });
  const rescued = await messages({ model: 'error-200-then-healthy' });
  t.equal(rescued.status, 200, 'with a second channel, that channel answers');
  t.match(await rescued.json(), { type: 'message', content: [{ type: 'text' }] });
  t.match(await usageRecord(rescued), { outcome: 'finished', channel: /sim-chat|chat/, attempts: 2 }, 'the second attempt served it');
});

/** A request of each client family for `model`, streamed or not. */
function ask(family: (typeof UPSTREAMS)[number], model: string, stream: boolean): Promise<Response> {
  const auth = { authorization: `Bearer ${gw.key}`, 'x-goog-api-key': gw.key, 'x-api-key': gw.key, 'anthropic-version': '2023-06-01', 'content-type': 'application/json' };
  const post = (path: string, body: object) => fetch(`${gw.url}${path}`, { method: 'POST', headers: auth, body: JSON.stringify(body) });
  if (family === 'chat') return chat({ model, stream });
  if (family === 'messages') return messages({ model, stream });
  if (family === 'responses') return post('/v1/responses', { model, input: 'hi', stream });
  return post(`/v1beta/models/${model}:${stream ? 'streamGenerateContent?alt=sse' : 'generateContent'}`, { contents: [{ role: 'user', parts: [{ text: 'hi' }] }] });
}

/** A body as JSON, or as its text when it is not JSON (a stream). */
function bodyOf(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

/** Each client family's error body. */
const errorShape = (family: string, message: RegExp) =>
  family === 'messages' ? { type: 'error', error: { type: 'api_error', message } } : family === 'gemini' ? { error: { code: 502, status: 'INTERNAL', message } } : { error: { type: 'upstream_error', message } };

t.test('a 200 whose JSON is no answer of its family ({} or {"ok":true}) is the channel failing, in every pairing, streamed or not', async (t) => {
  for (const client of UPSTREAMS) {
    for (const upstream of UPSTREAMS) {
      for (const answer of NOT_ANSWERS) {
        for (const stream of [false, true]) {
          const what = `${client} client, ${upstream} upstream, ${answer}${stream ? ', stream' : ''}`;
          const res = await ask(client, `${answer}-${upstream}`, stream);
          t.equal(res.status, 502, `${what}: 502`);
          t.match(bodyOf(await res.text()), errorShape(client, new RegExp(`^Upstream \`liar-${upstream}\` answered 200`)), `${what}: the family's error, naming the upstream`);
          t.match(await usageRecord(res), { status: 502, outcome: 'error', error: /answered 200/ }, `${what}: recorded as failed`);
        }
      }
      for (const stream of [false, true]) {
        const what = `${client} client, ${upstream} upstream${stream ? ', stream' : ''}`;
        const res = await ask(client, `empty-200-then-healthy-${upstream}`, stream);
        t.equal(res.status, 200, `${what}: the next channel answers`);
        t.notMatch(await res.text(), /answered 200|"error":\{/, `${what}: with its answer`);
        t.match(await usageRecord(res), { outcome: 'finished', attempts: 2 }, `${what}: the second attempt served it`);
      }
    }
  }
});

t.test("an upstream's overloaded failure midway is overloaded in the client's family too, both ways", async (t) => {
  const gemini = (model: string) =>
    fetch(`${gw.url}/v1beta/models/${model}:streamGenerateContent?alt=sse`, { method: 'POST', headers: { 'x-goog-api-key': gw.key, 'content-type': 'application/json' }, body: JSON.stringify({ contents: [{ role: 'user', parts: [{ text: 'hi' }] }] }) });
  const cases: [string, () => Promise<Response>, RegExp][] = [
    ['Gemini UNAVAILABLE to a Messages client', () => messages({ model: 'unavailable-gemini', stream: true }), /event: error\ndata: \{"type":"error","error":\{"type":"overloaded_error","message":"[^"]*gemini is overloaded/],
    ['Gemini INTERNAL to a Messages client (not overloaded)', () => messages({ model: 'error-gemini-native', stream: true }), /event: error\ndata: \{"type":"error","error":\{"type":"api_error","message":"[^"]*gemini went wrong/],
    ['Anthropic overloaded_error to a Gemini client', () => gemini('error-messages-native'), /data: \{"error":\{"code":503,"message":"[^"]*messages went wrong","status":"UNAVAILABLE"/],
  ];
  for (const [what, send, failure] of cases) {
    const res = await send();
    t.equal(res.status, 200, `${what}: the stream had started`);
    t.match(await res.text(), failure, `${what}: the failure event says so`);
    t.match(await usageRecord(res), { outcome: 'error' }, `${what}: recorded as failed`);
  }
});

t.test('a line of an event stream that is not SSE (bare JSON) reaches no client: it gets only its family\'s failure', async (t) => {
  const failures = {
    chat: /^data: \{"error":\{/,
    responses: /^event: response\.failed\ndata: /,
    gemini: /^data: \{"error":\{"code":502/,
    messages: /^event: error\ndata: \{"type":"error"/,
  };
  const cases: [(typeof UPSTREAMS)[number], string][] = [
    ...UPSTREAMS.flatMap((client) => UPSTREAMS.map((upstream) => [client, `raw-json-sse-${upstream}`] as [(typeof UPSTREAMS)[number], string])),
    ['gemini', 'raw-json-after-gemini'],
    ['messages', 'raw-json-after-messages'],
  ];
  for (const [client, model] of cases) {
    const what = `${client} client, ${model}`;
    const res = await ask(client, model, true);
    t.equal(res.status, 200, `${what}: the stream had started`);
    const frames = (await res.text()).split(/\n\n/).filter(Boolean);
    t.notOk(frames.some((f) => !/^(data|event):/.test(f)), `${what}: every frame is an event, none the bare line`);
    t.match(frames.at(-1), failures[client], `${what}: ends with the family's failure`);
    t.match(await usageRecord(res), { outcome: 'error' }, `${what}: recorded as failed`);
  }
});

t.test('a failure event ends the client stream and the upstream call, though the upstream stays silent', async (t) => {
  const res = await messages({ model: 'error-then-silent', stream: true });
  t.equal(res.status, 200);
  // Before, the client waited for the upstream's idle deadline (120 s by default) after the error.
  const text = await res.text();
  t.match(text, /event: error\ndata: \{"type":"error","error":\{"type":"api_error","message":"[^"]*mid-stream boom/, 'the upstream error reaches the client');
  t.equal(text.match(/event: error/g)?.length, 1, 'one failure event, no second one for a timeout');
  await eventually(() => closedByGateway.has('error-then-silent'), 'the gateway closing the upstream call');
  t.match(await usageRecord(res), { outcome: 'error', error: /mid-stream boom/ }, 'recorded with the upstream error');
});

t.test('an answer without usage is billed by its text in passthrough too, not as no output', async (t) => {
  const passthrough = await chat({ model: 'no-usage' });
  const translated = await messages({ model: 'no-usage' });
  for (const [what, res] of [['chat passthrough', passthrough], ['Messages on a chat upstream', translated]] as const) {
    t.equal(res.status, 200, what);
    await res.text();
    const record = await usageRecord(res);
    t.equal(record.estimated, true, `${what}: estimated`);
    t.ok(record.completionTokens >= 10, `${what}: ${record.completionTokens} output tokens, counted from the answer`);
  }
});

t.test('a passthrough stream cut short, or with an event that is not JSON, fails in its family and is recorded as failed', async (t) => {
  const auth = { authorization: `Bearer ${gw.key}`, 'x-goog-api-key': gw.key, 'x-api-key': gw.key, 'anthropic-version': '2023-06-01', 'content-type': 'application/json' };
  const cases: [string, string, Record<string, unknown>, RegExp][] = [
    ['chat, cut', '/v1/chat/completions', { model: 'cut-chat', stream: true, messages: [{ role: 'user', content: 'hi' }] }, /data: \{"error":\{[^\n]*before \[DONE\] or a finish_reason: it was cut short/],
    ['chat, cut, usage asked for', '/v1/chat/completions', { model: 'cut-chat', stream: true, stream_options: { include_usage: true }, messages: [{ role: 'user', content: 'hi' }] }, /data: \{"error":\{[^\n]*cut short/],
    ['chat, no event at all', '/v1/chat/completions', { model: 'empty-stream', stream: true, messages: [{ role: 'user', content: 'hi' }] }, /data: \{"error":\{[^\n]*cut short/],
    ['Responses, cut', '/v1/responses', { model: 'cut-responses', input: 'hi', stream: true }, /event: response\.failed\ndata: \{"type":"response\.failed"[^\n]*cut short/],
    ['Responses, an event not JSON', '/v1/responses', { model: 'malformed-responses-native', input: 'hi', stream: true }, /event: response\.failed\ndata: [^\n]*not JSON/],
    ['Gemini, cut', '/v1beta/models/cut-gemini:streamGenerateContent?alt=sse', { contents: [{ role: 'user', parts: [{ text: 'hi' }] }] }, /data: \{"error":\{[^\n]*before a finishReason: it was cut short/],
    ['Gemini, an event not JSON', '/v1beta/models/malformed-gemini-native:streamGenerateContent?alt=sse', { contents: [{ role: 'user', parts: [{ text: 'hi' }] }] }, /data: \{"error":\{[^\n]*not JSON/],
    ['Messages, cut', '/v1/messages', { model: 'cut-messages-native', max_tokens: 16, stream: true, messages: [{ role: 'user', content: 'hi' }] }, /event: error\ndata: [^\n]*before message_stop/],
    ['Messages, an event not JSON', '/v1/messages', { model: 'malformed-messages-native', max_tokens: 16, stream: true, messages: [{ role: 'user', content: 'hi' }] }, /event: error\ndata: [^\n]*not JSON/],
  ];
  for (const [what, path, body, failure] of cases) {
    const res = await fetch(`${gw.url}${path}`, { method: 'POST', headers: auth, body: JSON.stringify(body) });
    t.equal(res.status, 200, `${what}: the stream had started`);
    const text = await res.text();
    t.match(text, failure, `${what}: ends with the family's failure`);
    t.notMatch(text, /^data: (?:\{not json|<html>|\[DONE\])|event: response\.completed|event: message_stop|"finishReason":"STOP"|"finish_reason":"stop"/m, `${what}: nothing of the lie, and no finish, after it`);
    t.match(await usageRecord(res), { outcome: 'error' }, `${what}: recorded as failed`);
  }
});

t.test("Gemini's JSON-array stream (no alt=sse) ends with its failure, in an array that parses, when cut or not JSON", async (t) => {
  const auth = { 'x-goog-api-key': gw.key, 'content-type': 'application/json' };
  const body = JSON.stringify({ contents: [{ role: 'user', parts: [{ text: 'hi' }] }] });
  for (const [model, failure] of [['cut-gemini', /cut short/], ['malformed-gemini-native', /not JSON/]] as const) {
    const res = await fetch(`${gw.url}/v1beta/models/${model}:streamGenerateContent`, { method: 'POST', headers: auth, body });
    const text = await res.text();
    let events: any[] = [];
    t.doesNotThrow(() => (events = JSON.parse(text)), `${model}: the array parses`);
    t.match(events[0], { candidates: [{ content: { parts: [{ text: /^Half/ } ] } }] }, `${model}: the events before the lie are relayed`);
    t.match(events.at(-1), { error: { status: 'INTERNAL', message: failure } }, `${model}: the last element is the failure`);
    t.notOk(events.some((e) => e.candidates?.[0]?.finishReason), `${model}: no finish after the lie`);
    t.match(await usageRecord(res), { outcome: 'error' }, `${model}: recorded as failed`);
  }
});

t.test('a Gemini stream is whole once an event said why it ends, wherever that event is', async (t) => {
  const auth = { 'x-goog-api-key': gw.key, 'content-type': 'application/json' };
  const body = JSON.stringify({ contents: [{ role: 'user', parts: [{ text: 'hi' }] }] });
  for (const model of ['usage-after-finish-gemini', 'blocked-gemini']) {
    for (const query of ['?alt=sse', '']) {
      const res = await fetch(`${gw.url}/v1beta/models/${model}:streamGenerateContent${query}`, { method: 'POST', headers: auth, body });
      const text = await res.text();
      t.notMatch(text, /"error"/, `${model}${query}: no failure added`);
      t.match(text, /"(finishReason|blockReason)":/, `${model}${query}: relayed as it came`);
      t.match(await usageRecord(res), { outcome: 'finished', promptTokens: 3 }, `${model}${query}: recorded whole, with the upstream's usage`);
    }
  }
});

t.test('a chat stream that ends with its finish_reason but no [DONE] is whole', async (t) => {
  const res = await chat({ model: 'finish-without-done', stream: true });
  const text = await res.text();
  t.match(text, /"finish_reason":"stop"/, 'relayed as it came');
  t.notMatch(text, /"error"/, 'no failure added');
  t.match(await usageRecord(res), { outcome: 'finished' });
});

t.test("a passthrough stream ends at the upstream's own failure event, as it came, and is recorded as failed", async (t) => {
  const auth = { authorization: `Bearer ${gw.key}`, 'x-goog-api-key': gw.key, 'x-api-key': gw.key, 'anthropic-version': '2023-06-01', 'content-type': 'application/json' };
  const cases: [string, string, Record<string, unknown>, string][] = [
    ['chat', '/v1/chat/completions', { model: 'error-chat-native', stream: true, stream_options: { include_usage: true }, messages: [{ role: 'user', content: 'hi' }] }, 'chat went wrong'],
    ['Responses', '/v1/responses', { model: 'error-responses-native', input: 'hi', stream: true }, 'responses went wrong'],
    ['Gemini', '/v1beta/models/error-gemini-native:streamGenerateContent?alt=sse', { contents: [{ role: 'user', parts: [{ text: 'hi' }] }] }, 'gemini went wrong'],
    ['Messages', '/v1/messages', { model: 'error-messages-native', max_tokens: 16, stream: true, messages: [{ role: 'user', content: 'hi' }] }, 'messages went wrong'],
  ];
  for (const [family, path, body, said] of cases) {
    const res = await fetch(`${gw.url}${path}`, { method: 'POST', headers: auth, body: JSON.stringify(body) });
    const text = await res.text();
    const frames = text.split(/\n\n/).filter(Boolean);
    t.match(frames.at(-1), new RegExp(said), `${family}: the upstream's failure event is the last thing the client gets`);
    t.equal(text.match(new RegExp(said, 'g'))?.length, 1, `${family}: once, with no failure of the gateway's own after it`);
    t.notMatch(text, /\[DONE\]|response\.failed/, `${family}: no [DONE] or second terminal event added`);
    t.match(await usageRecord(res), { outcome: 'error', error: new RegExp(`failed midway: ${said}`) }, `${family}: recorded as failed, with what the upstream said`);
  }
});

t.test('a passthrough failure event followed by silence ends the client stream and the upstream call', async (t) => {
  const res = await chat({ model: 'error-silent-chat-native', stream: true });
  // Before, the client waited for the upstream's idle deadline (120 s by default), then got a second failure.
  const text = await res.text();
  t.equal(text.match(/chat went quiet/g)?.length, 1, 'the failure event, once');
  t.notMatch(text, /sent nothing more/, 'no timeout failure after it');
  await eventually(() => closedByGateway.has('error-silent-chat-native'), 'the gateway closing the upstream call');
  t.match(await usageRecord(res), { outcome: 'error', error: /chat went quiet/ });
});

t.test('a stream asked for and answered whole is written as the stream the client asked for', async (t) => {
  const openai = new OpenAI({ apiKey: gw.key, baseURL: `${gw.url}/v1`, maxRetries: 0 });
  const chunks: any[] = [];
  for await (const c of await openai.chat.completions.create({ model: 'whole-for-stream', stream: true, stream_options: { include_usage: true }, messages: [{ role: 'user', content: 'hi' }] })) chunks.push(c);
  t.equal(chunks.map((c) => c.choices[0]?.delta?.content ?? '').join(''), 'Four words of answer.', 'the openai SDK reads the answer from the stream (chat passthrough)');
  t.equal(chunks.find((c) => c.choices[0]?.finish_reason)?.choices[0].finish_reason, 'stop');
  t.match(chunks.at(-1).usage, { prompt_tokens: 4, completion_tokens: 5 }, "the upstream's usage, in the usage chunk");
  const translated = await messages({ model: 'whole-for-stream', stream: true });
  const text = await translated.text();
  t.match(text, /event: message_start[\s\S]*"text":"Four words of answer\."[\s\S]*event: message_stop/, 'a Messages client on the chat upstream gets its event stream');
  t.match(await usageRecord(translated), { outcome: 'finished', promptTokens: 4, completionTokens: 5, streamed: true });
  const error = await chat({ model: 'error-200-for-stream', stream: true });
  t.equal(error.status, 502, 'an error answered whole to a stream request is a 502, before any stream');
  t.match(await error.json(), { error: { message: /answered 200: The upstream answered with an error: upstream exploded/ } });
});

t.test('the outline check reads a frame with an event line as one without, and finds failure events', async (t) => {
  const data = fc.oneof(
    fc.constantFrom('{"a":1}', '{}', '[DONE]', 'nope', '{"cut":', '', '{"error":{"message":"x"}}', '{"type":"error","message":"x"}', '{"type":"response.failed"}', '{"type":"errors"}'),
    fc.string({ maxLength: 6 }).filter((d) => !/[\r\n]/.test(d)),
  );
  const frame = fc.record({
    // A line: a field, or bare JSON, which is not SSE.
    event: fc.option(fc.constantFrom('event: x', 'event:response.completed', 'id: 7', 'event: error', 'event: response.failed', 'event: errors', '{"error":{}}'), { nil: undefined }),
    data: fc.option(data, { nil: undefined }),
    space: fc.boolean(),
    crlf: fc.boolean(),
  });
  fc.assert(
    fc.property(fc.array(frame, { maxLength: 6 }), (frames) => {
      const texts = frames.map((f) => {
        const nl = f.crlf ? '\r\n' : '\n';
        const lines = [f.event, f.data === undefined ? undefined : `data:${f.space ? ' ' : ''}${f.data}`].filter((l) => l !== undefined);
        // A frame has a line at least (a comment when nothing else): blank-line runs join the next frame.
        return (lines.length ? lines : [': ping']).join(nl) + nl + nl;
      });
      // The reference: each frame on its own, its joined data trimmed, neither the terminator nor
      // `{…}`; or, to stop at, the upstream's failure by its event name or its data's first key.
      let malformed = -1;
      let stop = -1;
      let at = 0;
      for (let i = 0; i < texts.length; i++) {
        const { event, data: raw } = frames[i]!;
        const d = raw?.trim();
        const bad = event === '{"error":{}}' || (d !== undefined && d !== '[DONE]' && !(d.startsWith('{') && d.endsWith('}')));
        const failure = (d !== undefined && /^\{"(?:error"|type":"(?:error|response\.failed)")/.test(d)) || event === 'event: error' || event === 'event: response.failed';
        if (bad && malformed < 0) malformed = at;
        if ((bad || failure) && stop < 0) stop = at;
        at += Buffer.byteLength(texts[i]!);
      }
      const bytes = Buffer.from(texts.join(''));
      return firstMalformedFrame(bytes, '[DONE]') === malformed && firstFrameToStopAt(bytes, '[DONE]') === stop;
    }),
    { numRuns: 3000 },
  );
  t.pass('3,000 random runs of frames agree with the frame-by-frame reading');
});

t.test("an upstream that echoes the gateway's credentials in its errors: the key reaches no client, log or record", async (t) => {
  const cases: [string, () => Promise<Response>, number][] = [
    ['a 400, chat passthrough', () => chat({ model: 'echo-400' }), 400],
    ['a 400, Messages translated', () => messages({ model: 'echo-400' }), 400],
    ['a 500', () => chat({ model: 'echo-500' }), 502],
    ['a 200 carrying an error', () => chat({ model: 'echo-200-error' }), 502],
    ['a 200 carrying an error, Messages translated', () => messages({ model: 'echo-200-error' }), 502],
    ['a 500 whose words are cut inside the key', () => chat({ model: 'echo-500-cut' }), 502],
    [
      "a Gemini JSON-array stream's event that is not JSON",
      () => fetch(`${gw.url}/v1beta/models/echo-gemini-garbage:streamGenerateContent`, { method: 'POST', headers: { 'x-goog-api-key': gw.key, 'content-type': 'application/json' }, body: JSON.stringify({ contents: [{ role: 'user', parts: [{ text: 'hi' }] }] }) }),
      200,
    ],
    ['a stream error event, chat passthrough', () => chat({ model: 'echo-stream-error', stream: true }), 200],
    ['a stream error event, Messages translated', () => messages({ model: 'echo-stream-error', stream: true }), 200],
  ];
  for (const [what, call, status] of cases) {
    const res = await call();
    t.equal(res.status, status, `${what}: ${status}`);
    const text = await res.text();
    t.notMatch(text, LIAR_KEY.slice(0, 10), `${what}: not in the answer, not even its start`);
    t.match(text, /\[redacted\]/, `${what}: the upstream's words, the key replaced`);
    const record = await usageRecord(res);
    t.notMatch(JSON.stringify(record), LIAR_KEY, `${what}: not in the usage record`);
  }
  t.notMatch(JSON.stringify(gw.logs), LIAR_KEY, 'not in the log');
});
