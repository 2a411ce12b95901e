/**
 * Issue 21, items 6 and 8: what a chat passthrough client gets from an upstream that lies.
 * A 200 whose body is cut short is a 502 naming the upstream, not a success; a stream event that
 * is not JSON (or one cut short) ends the stream with the chat failure frame, not `[DONE]`, and the
 * usage record says it failed. An upstream that accepts `stream_options.include_usage` and never
 * sends usage still gives a client that asked a final usage chunk, estimated; one that did not ask
 * sees no trace of the usage Sluice asked for (not even spaces). Honest streams and
 * answers still go through byte for byte. The liar is a small HTTP server on 127.0.0.1; the honest
 * upstream is a simulator process.
 */
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import OpenAI from 'openai';
import t from 'tap';
import { looksLikeJsonObject } from '../src/json-body.js';
import { fieldStartsWith, firstMalformedFrame, holdsArray } from '../src/sse.js';
import { eventually, simulatorUpstreams, startStack } from './helpers.js';

const chunk = (model: string, delta: object, finish: string | null = null) =>
  `data: ${JSON.stringify({ id: 'chatcmpl-liar', object: 'chat.completion.chunk', created: 1767225600, model, choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;
const opening = (model: string) => chunk(model, { role: 'assistant', content: '' }) + chunk(model, { content: 'hi' });
const closing = (model: string) => chunk(model, { content: ' there' }) + chunk(model, {}, 'stop') + 'data: [DONE]\n\n';

/** What the liar sends for each model: a whole body, or stream pieces written apart. */
const answers: Record<string, { stream?: string[]; body?: string }> = {
  'lie-truncated': { body: '{"id":"x","object":"chat.completion","created":1,"model":"lie-truncated","choices":[{"index":0,"message":{"role":"assistant","content":"hi"' },
  'lie-html': { body: '<html><body>502 Bad Gateway</body></html>' },
  'honest-body': { body: '\n{"id":"x","object":"chat.completion","created":1,"model":"honest-body","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}\n' },
  // The whole stream in one chunk, a line of text among the events.
  'lie-event': { stream: [opening('lie-event') + 'data: this is not json\n\n' + closing('lie-event')] },
  // Each event in a chunk of its own.
  'lie-event-apart': { stream: [chunk('lie-event-apart', { role: 'assistant', content: '' }), chunk('lie-event-apart', { content: 'hi' }), 'data: <html>oops</html>\n\n', closing('lie-event-apart')] },
  // The connection ends in the middle of an event.
  'lie-cut': { stream: [opening('lie-cut'), 'data: {"id":"chatcmpl-liar","choices":[{"index":0,"delta":{"content":" the'] },
  // Comments, an event line, CRLF-free but spaced JSON, [DONE]: all fine.
  'honest-stream': { stream: [': keep-alive\n\n' + opening('honest-stream'), 'event: message\ndata: {"id":"chatcmpl-liar","choices":[]} \n\n', closing('honest-stream')] },
};

const liar = createServer((req, res) => {
  let raw = '';
  req.on('data', (d) => (raw += d));
  req.on('end', async () => {
    // The other families' upstreams (their model is in the path for Gemini) are always cut short.
    const answer = answers[JSON.parse(raw).model] ?? { body: '{"id":"x","type":"message","content":[{"type":"text","text":"hi"' };
    if (answer.body !== undefined) {
      res.writeHead(200, { 'content-type': 'application/json' });
      return res.end(answer.body);
    }
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    for (const piece of answer.stream!) {
      res.write(piece);
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    res.end();
  });
});
await new Promise<void>((resolve) => liar.listen(0, '127.0.0.1', resolve));
t.teardown(() => {
  liar.closeAllConnections();
  return new Promise((resolve) => liar.close(resolve));
});
const liarUrl = `http://127.0.0.1:${(liar.address() as AddressInfo).port}`;

const { gw } = await startStack(
  (simUrl) => `${simulatorUpstreams(simUrl)}  liar: { kind: openai-chat, baseUrl: "${liarUrl}", breaker: { failures: 1000 } }
  liar-responses: { kind: openai-responses, baseUrl: "${liarUrl}/v1" }
  liar-gemini: { kind: gemini, baseUrl: "${liarUrl}/v1beta", apiKey: k }
  liar-messages: { kind: anthropic, baseUrl: "${liarUrl}/v1", apiKey: k }
models:
  - { id: cut-responses, upstream: liar-responses }
  - { id: cut-gemini, upstream: liar-gemini }
  - { id: cut-messages, upstream: liar-messages }
  - { id: sim-chat, upstream: chat }
  - { id: team-chat, upstream: chat, upstreamModel: sim-chat }
${Object.keys(answers).map((id) => `  - { id: ${id}, upstream: liar }`).join('\n')}
`,
);

const openai = new OpenAI({ apiKey: gw.key, baseURL: `${gw.url}/v1`, maxRetries: 0 });

const post = (body: Record<string, unknown>) =>
  fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${gw.key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], ...body }),
  });

async function usageRecord(res: Response): Promise<any> {
  const id = res.headers.get('x-request-id');
  return eventually(async () => (await gw.admin('GET', '/admin/usage')).body.records.find((r: any) => r.requestId === id), 'usage record');
}

/** The data of each event of a chat stream as the client read it. */
const events = (text: string) => text.split('\n\n').filter(Boolean).map((frame) => frame.replace(/^data: /, ''));

t.test('item 6: a 200 whose body is cut short is a 502 that names the upstream', async (t) => {
  for (const model of ['lie-truncated', 'lie-html']) {
    const res = await post({ model });
    t.equal(res.status, 502, model);
    const { error } = (await res.json()) as any;
    t.match(error, { type: 'upstream_error', code: 'upstream_error', message: /^Upstream `liar` answered 200 with a body that is not JSON \(\d+ bytes\): "/ }, model);
    t.match(await usageRecord(res), { status: 502, outcome: 'error', error: /Upstream `liar` answered 200/ }, `${model}: recorded as failed`);
  }
  const honest = await post({ model: 'honest-body' });
  t.equal(honest.status, 200, 'JSON with whitespace around it is an answer');
  t.equal(await honest.text(), answers['honest-body']!.body, 'passed through as it came');
});

t.test('item 6: a stream event that is not JSON ends the stream with the chat failure frame', async (t) => {
  for (const model of ['lie-event', 'lie-event-apart']) {
    for (const includeUsage of [false, true]) {
      const res = await post({ model, stream: true, ...(includeUsage && { stream_options: { include_usage: true } }) });
      t.equal(res.status, 200);
      const got = events(await res.text());
      const what = `${model}, include_usage ${includeUsage}`;
      t.same(got.slice(0, 2).map((e) => JSON.parse(e).choices[0].delta), [{ role: 'assistant', content: '' }, { content: 'hi' }], `${what}: the events before it arrive`);
      t.equal(got.length, 3, `${what}: nothing after the failure`);
      t.match(JSON.parse(got[2]!), { error: { type: 'upstream_error', message: /^Upstream `liar` sent a stream event that is not JSON: "data: / } }, `${what}: ends with the error frame`);
      t.notOk(got.includes('[DONE]'), `${what}: no [DONE]`);
      t.match(await usageRecord(res), { outcome: 'error', error: /Upstream `liar` sent a stream event that is not JSON/ }, `${what}: recorded as failed`);
    }
  }
});

t.test('item 6: the openai SDK raises the failure', async (t) => {
  const stream = await openai.chat.completions.create({ model: 'lie-event', messages: [{ role: 'user', content: 'hi' }], stream: true });
  let text = '';
  const err = await (async () => {
    try {
      for await (const c of stream) text += c.choices[0]?.delta.content ?? '';
    } catch (e) {
      return e;
    }
  })();
  t.equal(text, 'hi');
  t.ok(err instanceof OpenAI.APIError, 'an APIError');
  t.match((err as Error).message, /Upstream `liar` sent a stream event that is not JSON/);
});

t.test('item 6: a stream cut in the middle of an event ends with the failure frame', async (t) => {
  const res = await post({ model: 'lie-cut', stream: true });
  const got = events(await res.text());
  t.equal(got.length, 3);
  t.match(JSON.parse(got[2]!), { error: { message: /^Upstream `liar` sent a stream event that is not JSON: "data: \{\\"id\\":\\"chatcmpl-liar\\"/ } });
  t.match(await usageRecord(res), { outcome: 'error' });
});

t.test('item 6: comments, event lines and spaced JSON are events like any other', async (t) => {
  const res = await post({ model: 'honest-stream', stream: true, stream_options: { include_usage: true } });
  const text = await res.text();
  const sent = answers['honest-stream']!.stream!.join('');
  // The client asked for usage and the liar sent none: an estimate goes before [DONE] (item 8).
  const usage = text.slice(sent.length - 'data: [DONE]\n\n'.length, -'data: [DONE]\n\n'.length);
  t.equal(text.slice(0, sent.length - 'data: [DONE]\n\n'.length), sent.slice(0, -'data: [DONE]\n\n'.length), "the upstream's bytes as they came");
  t.match(JSON.parse(events(usage)[0]!), { id: 'chatcmpl-liar', choices: [], usage: { prompt_tokens: Number } });
  t.ok(text.endsWith('data: [DONE]\n\n'));
  t.match(await usageRecord(res), { outcome: 'finished', status: 200, estimated: true });
});

t.test('item 8: an upstream asked for usage that sends none still gives the client an estimated usage chunk', async (t) => {
  for (const model of ['sim-chat', 'team-chat']) {
    const res = await post({ model, messages: [{ role: 'user', content: 'Tell me [[sim tokens=8 no_usage=1]]' }], stream: true, stream_options: { include_usage: true } });
    const got = events(await res.text());
    t.equal(got.at(-1), '[DONE]', `${model}: [DONE] last`);
    const usageChunk = JSON.parse(got.at(-2)!);
    t.same(usageChunk.choices, [], `${model}: the usage chunk right before it`);
    t.equal(usageChunk.model, model);
    t.ok(usageChunk.usage.prompt_tokens > 0);
    t.ok(usageChunk.usage.completion_tokens >= 6 && usageChunk.usage.completion_tokens <= 10, `${model}: estimated ${usageChunk.usage.completion_tokens} for 8`);
    t.equal(got.filter((e) => e.includes('"usage":{')).length, 1, `${model}: exactly one usage chunk`);
    t.equal(usageChunk.id, JSON.parse(got[0]!).id, `${model}: with the stream's id`);
    t.match(await usageRecord(res), { estimated: true, completionTokens: usageChunk.usage.completion_tokens, status: 200, outcome: 'finished' });
  }
});

t.test("item 8: the upstream's own usage is passed on, not estimated", async (t) => {
  const res = await post({ model: 'sim-chat', messages: [{ role: 'user', content: 'Tell me [[sim tokens=8]]' }], stream: true, stream_options: { include_usage: true } });
  const got = events(await res.text());
  t.equal(got.at(-1), '[DONE]');
  t.match(JSON.parse(got.at(-2)!), { choices: [], usage: { completion_tokens: 8 } });
  t.equal(got.filter((e) => e.includes('"usage":{')).length, 1);
  t.match(await usageRecord(res), { estimated: false, completionTokens: 8 });
});

t.test('item 8: usage Sluice asked for on the client\'s behalf leaves no trace in the chunks', async (t) => {
  const res = await post({ model: 'sim-chat', messages: [{ role: 'user', content: 'Tell me [[sim tokens=8]]' }], stream: true });
  const text = await res.text();
  const got = events(text);
  t.equal(got.at(-1), '[DONE]');
  t.ok(got.length >= 10, `${got.length} events`);
  t.notMatch(text, '"usage"', 'no usage field, not even null');
  t.notMatch(text, /\s{3}/, 'and no spaces where it was');
  for (const e of got.slice(0, -1)) t.ok(Array.isArray(JSON.parse(e).choices) && JSON.parse(e).choices.length === 1, 'each chunk is JSON with its choice');
  t.match(await usageRecord(res), { estimated: false, completionTokens: 8 }, "the upstream's usage was read all the same");
});

t.test('the outline checks', async (t) => {
  t.ok(looksLikeJsonObject(Buffer.from(' {"a":1}\r\n')));
  t.notOk(looksLikeJsonObject(Buffer.from('{"a":"b"')));
  t.notOk(looksLikeJsonObject(Buffer.from('')));
  t.notOk(looksLikeJsonObject(Buffer.from('{')));
  t.notOk(looksLikeJsonObject(Buffer.from('[{}]')));
  const check = (text: string) => firstMalformedFrame(Buffer.from(text), '[DONE]');
  t.equal(check('data: {"a":1}\n\ndata:{"b":2}\r\n\r\ndata: [DONE]\n\n'), -1);
  t.equal(check(': ping\n\nevent: x\ndata: {"a":\ndata: 1}\n\nretry: 5\n\n\n\n'), -1, 'comments, fields, data on two lines, blank-line runs');
  t.equal(check('data: {"a":1}\n\ndata: nope\n\ndata: {}\n\n'), 15);
  t.equal(check('data: {"a":1}\n\ndata: {"a":\n\n'), 15, 'cut short');
  t.equal(check('data: {"a":1}\r\n\r\ndata: [DONE]x\r\n\r\n'), 17);
  t.equal(check('data: {"a":1}\n\ndata: {"a"'), 15, 'an unterminated last frame');
  t.equal(check('data: {"a":1}\n\n{"error":{"message":"x"}}\n\n'), 15, 'a bare line of JSON, not SSE');
  t.equal(check('data: {"a":1}\n\ndata: {"b":2}\n{"error":{}}\n\n'), 15, 'after a data line');
  const choices = Buffer.from('"choices"');
  const holds = (json: string) => holdsArray(Buffer.from(json), choices);
  t.ok(holds('{"id":"x","choices":[{}]}'));
  t.ok(holds('{"id": "x", "choices" :\n [ ]}'), 'spaced');
  t.ok(holds('{"tags":["a"],"note":"[","choices":[{}]}'), 'another array first: the key is searched');
  t.notOk(holds('{"text":"\\"choices\\": [1]"}'), 'in a string');
  t.notOk(holds('{"choices":null,"data":[]}'));
  t.notOk(holds('{"ok":true}'));
  t.notOk(holds('{}'));
  const type = (json: string) => fieldStartsWith(Buffer.from(json), Buffer.from('"type"'), Buffer.from('"message"'));
  t.ok(type('{"content":[{"type":"text"}],"type": "message"}'));
  t.notOk(type('{"type":"message_start"}'));
});

t.test('the other families pass through a 200 cut short as a 502 too', async (t) => {
  const auth = { authorization: `Bearer ${gw.key}`, 'x-goog-api-key': gw.key, 'x-api-key': gw.key, 'anthropic-version': '2023-06-01', 'content-type': 'application/json' };
  const calls: [string, string, Record<string, unknown>][] = [
    ['responses', '/v1/responses', { model: 'cut-responses', input: 'hi' }],
    ['gemini', '/v1beta/models/cut-gemini:generateContent', { contents: [{ role: 'user', parts: [{ text: 'hi' }] }] }],
    ['messages', '/v1/messages', { model: 'cut-messages', max_tokens: 16, messages: [{ role: 'user', content: 'hi' }] }],
  ];
  for (const [family, path, body] of calls) {
    const res = await fetch(`${gw.url}${path}`, { method: 'POST', headers: auth, body: JSON.stringify(body) });
    t.equal(res.status, 502, `${family}: 502`);
    t.match(await res.text(), /Upstream `liar-\w+` answered 200 with a body that is not JSON/, `${family}: naming the upstream`);
    t.match(await usageRecord(res), { status: 502, outcome: 'error' }, `${family}: recorded as failed`);
  }
});
