/**
 * Honest streams and usage from odd upstreams, and the client's name for the model everywhere:
 * SSE sent with a wrong content type is still a stream; a model whose upstream cannot send usage
 * in a stream still gives every client usage (estimated, and recorded as such); passthrough
 * answers carry the alias the client asked for, in the body and in every stream event.
 */
import { GoogleGenAI } from '@google/genai';
import OpenAI from 'openai';
import t from 'tap';
import { replaceStringField } from '../src/json-splice.js';
import { sniffEventStream } from '../src/sse.js';
import { eventually, simulatorUpstreams, startStack } from './helpers.js';

const { gw } = await startStack(
  (simUrl) => `
${simulatorUpstreams(simUrl)}models:
  - { id: sim-chat, upstream: chat }
  - { id: quiet-chat, upstream: chat, upstreamModel: sim-chat, features: { streamUsage: false } }
  - { id: team-chat, upstream: chat, upstreamModel: sim-chat }
  - { id: team-responses, upstream: responses, upstreamModel: sim-responses }
  - { id: team-gemini, upstream: gemini, upstreamModel: sim-gemini }
`,
);

const openai = new OpenAI({ apiKey: gw.key, baseURL: `${gw.url}/v1`, maxRetries: 0 });
const google = new GoogleGenAI({ apiKey: gw.key, httpOptions: { baseUrl: gw.url } });
const user = (content: string) => [{ role: 'user' as const, content }];

async function usageRecord(requestId: string | null | undefined): Promise<any> {
  return eventually(async () => (await gw.admin('GET', '/admin/usage')).body.records.find((r: any) => r.requestId === requestId), 'usage record');
}

/** The latest usage record of a model (the Gemini SDK does not expose response headers). */
async function latestRecord(model: string, after: number): Promise<any> {
  return eventually(async () => (await gw.admin('GET', '/admin/usage')).body.records.find((r: any) => r.model === model && r.family === 'gemini' && r.time >= after), `usage record of ${model}`);
}

t.test('an event stream is recognised by its first bytes, split anywhere', async (t) => {
  t.equal(sniffEventStream(Buffer.from('da')), undefined, 'too early to tell');
  t.equal(sniffEventStream(Buffer.from('data: {}\n\n')), true);
  t.equal(sniffEventStream(Buffer.from('\r\nevent: response.created\n')), true);
  t.equal(sniffEventStream(Buffer.from(': keep-alive\n\n')), true);
  t.equal(sniffEventStream(Buffer.from('{"id":"x"}')), false);
  t.equal(sniffEventStream(Buffer.from('database')), false);
  t.equal(sniffEventStream(Buffer.alloc(2000, 0x0a)), false, 'blank lines do not keep it undecided forever');
});

t.test('a string field is replaced in the bytes, the rest left as it was', async (t) => {
  const name = Buffer.from('"alias"');
  const key = Buffer.from('"model"');
  const splice = (json: string) => replaceStringField(Buffer.from(json), key, name).toString();
  t.equal(splice('{"id":"a","model":"sim-chat","x":1}'), '{"id":"a","model":"alias","x":1}');
  t.equal(splice('{"model" : "a \\"quoted\\" name", "model":"b"}'), '{"model" : "alias", "model":"b"}', 'only the first, escapes honoured');
  t.equal(splice('{"text":"the \\"model\\": \\"x\\"","model":"m"}'), '{"text":"the \\"model\\": \\"x\\"","model":"alias"}', 'never inside a string');
  t.equal(splice('{"type":"model","n":1}'), '{"type":"model","n":1}', 'a value is not a key');
  t.equal(splice('data: {"type":"response.created","response":{"id":"r","model":"up"}}\n\n'), 'data: {"type":"response.created","response":{"id":"r","model":"alias"}}\n\n', 'one object deep (Responses events), in an SSE frame');
  t.equal(
    splice('{"candidates":[{"content":{"parts":[{"functionCall":{"name":"f","args":{"model":"keep"}}}]}}],"model":"up"}'),
    '{"candidates":[{"content":{"parts":[{"functionCall":{"name":"f","args":{"model":"keep"}}}]}}],"model":"alias"}',
    'never inside an array (tool arguments)',
  );
  t.equal(splice('{"a":{"b":{"model":"deep"}},"model":"up"}'), '{"a":{"b":{"model":"deep"}},"model":"alias"}', 'not two objects deep');
  t.equal(splice('{"x\\"model":"v","model":"up"}'), '{"x\\"model":"v","model":"alias"}', 'a key ending in an escaped quote is not the key');
  t.equal(splice('{"model":\n\t"up"}'), '{"model":\n\t"alias"}', 'any JSON whitespace around the colon');
});

t.test('item 6: SSE labelled text/plain reaches a chat client as a stream, with its usage', async (t) => {
  const { data: stream, response } = await openai.chat.completions
    .create({ model: 'sim-chat', messages: user('Hi [[sim tokens=6 content_type=text/plain]]'), stream: true, stream_options: { include_usage: true } })
    .withResponse();
  t.match(response.headers.get('content-type'), /^text\/event-stream/);
  let chunks = 0;
  let text = '';
  let usage: OpenAI.CompletionUsage | undefined;
  for await (const c of stream) {
    chunks++;
    text += c.choices[0]?.delta.content ?? '';
    if (c.usage) usage = c.usage;
  }
  t.ok(chunks >= 6, `${chunks} chunks, one per token`);
  t.ok(text.length > 0);
  t.equal(usage?.completion_tokens, 6, "the upstream's own usage");
  t.match(await usageRecord(response.headers.get('x-request-id')), { completionTokens: 6, estimated: false, streamed: true, outcome: 'finished' });
});

t.test('item 6: SSE labelled text/plain is translated for a Responses client (bridge)', async (t) => {
  const stream = openai.responses.stream({ model: 'sim-chat', input: 'Hi [[sim tokens=5 content_type=text/plain]]' });
  const types: string[] = [];
  for await (const e of stream) types.push(e.type);
  const final = await stream.finalResponse();
  t.equal(final.status, 'completed');
  t.ok(final.output_text.length > 0);
  t.ok(types.filter((x) => x === 'response.output_text.delta').length >= 4, 'streamed as deltas');
  t.equal(final.usage?.output_tokens, 5);
});

t.test('item 7: include_usage on a model whose upstream cannot stream usage gets an estimated usage chunk', async (t) => {
  const { data: stream, response } = await openai.chat.completions
    .create({ model: 'quiet-chat', messages: user('Tell me [[sim tokens=8]]'), stream: true, stream_options: { include_usage: true } })
    .withResponse();
  const chunks: OpenAI.ChatCompletionChunk[] = [];
  for await (const c of stream) chunks.push(c);
  const last = chunks.at(-1)!;
  t.same(last.choices, [], 'the usage chunk comes last, with no choices');
  t.ok(last.usage!.prompt_tokens > 0);
  t.ok(last.usage!.completion_tokens >= 6 && last.usage!.completion_tokens <= 10, `estimated ${last.usage!.completion_tokens} for 8`);
  t.equal(last.model, 'quiet-chat');
  t.equal(chunks.filter((c) => c.usage).length, 1, 'exactly one usage chunk');
  // The simulator sends usage whenever it is asked: an estimate proves the upstream was not asked.
  t.match(await usageRecord(response.headers.get('x-request-id')), { estimated: true, completionTokens: last.usage!.completion_tokens, status: 200 });
});

t.test('item 7: without include_usage no usage chunk is made up', async (t) => {
  const stream = await openai.chat.completions.create({ model: 'quiet-chat', messages: user('Tell me [[sim tokens=4]]'), stream: true });
  let usageChunks = 0;
  for await (const c of stream) if (c.usage) usageChunks++;
  t.equal(usageChunks, 0);
});

t.test('item 8: a bridged Responses stream ends with usage when the upstream reported none', async (t) => {
  const { data: stream, response } = await openai.responses.create({ model: 'quiet-chat', input: 'Hi [[sim tokens=7]]', stream: true }).withResponse();
  let completed: OpenAI.Responses.Response | undefined;
  for await (const e of stream) if (e.type === 'response.completed') completed = e.response;
  t.ok(completed?.usage, 'usage is not null');
  t.ok(completed!.usage!.output_tokens >= 5 && completed!.usage!.output_tokens <= 9, `estimated ${completed!.usage!.output_tokens} for 7`);
  t.ok(completed!.usage!.input_tokens > 0);
  t.match(await usageRecord(response.headers.get('x-request-id')), { estimated: true, family: 'responses' });
});

t.test('item 8: a non-stream answer without usage is translated with an estimate', async (t) => {
  const r = await openai.responses.create({ model: 'sim-chat', input: 'Hi [[sim tokens=6 no_usage=1]]' });
  t.ok(r.usage && r.usage.output_tokens > 0, 'Responses body has usage');
  const g = await google.models.generateContent({ model: 'sim-chat', contents: 'Hi [[sim tokens=6 no_usage=1]]' });
  t.ok(g.usageMetadata?.candidatesTokenCount! > 0, 'Gemini body has usageMetadata');
  t.ok(g.usageMetadata?.promptTokenCount! > 0);
});

t.test('item 8: Gemini clients always get usageMetadata, translated or passed through', async (t) => {
  for (const [model, prompt] of [
    ['quiet-chat', 'Hi [[sim tokens=5]]'],
    ['team-gemini', 'Hi [[sim tokens=5 no_usage=1]]'],
  ] as const) {
    const since = Date.now();
    let last;
    let text = '';
    for await (const c of await google.models.generateContentStream({ model, contents: prompt })) {
      last = c;
      text += c.text ?? '';
    }
    t.ok(text.length > 0, `${model}: text arrived`);
    t.ok(last?.usageMetadata?.candidatesTokenCount! >= 3, `${model}: usage ${JSON.stringify(last?.usageMetadata)}`);
    t.match(await latestRecord(model, since), { estimated: true, streamed: true, status: 200 });
  }
});

t.test('item 9: a chat passthrough answers with the alias, in the body and every chunk', async (t) => {
  const r = await openai.chat.completions.create({ model: 'team-chat', messages: user('Hi [[sim tokens=3]]') });
  t.equal(r.model, 'team-chat');
  t.equal(r.usage?.completion_tokens, 3, 'the rest of the body is intact');
  const stream = await openai.chat.completions.create({ model: 'team-chat', messages: user('Hi [[sim tokens=5]]'), stream: true, stream_options: { include_usage: true } });
  const models = new Set<string>();
  let text = '';
  for await (const c of stream) {
    models.add(c.model);
    text += c.choices[0]?.delta.content ?? '';
  }
  t.same([...models], ['team-chat']);
  t.ok(text.length > 0);
  const plain = await openai.chat.completions.create({ model: 'sim-chat', messages: user('Hi') });
  t.equal(plain.model, 'sim-chat', 'the same name stays as it is');
});

t.test('item 9: a Responses passthrough answers with the alias, in the body and every event', async (t) => {
  const r = await openai.responses.create({ model: 'team-responses', input: 'Hi [[sim tokens=3]]' });
  t.equal(r.model, 'team-responses');
  t.ok(r.output_text.length > 0);
  const stream = await openai.responses.create({ model: 'team-responses', input: 'Hi [[sim tokens=4]]', stream: true });
  const models: string[] = [];
  for await (const e of stream) if ('response' in e) models.push(e.response.model);
  t.ok(models.length >= 3, 'created, in_progress, completed');
  t.same(new Set(models), new Set(['team-responses']));
});

t.test('item 9: a Gemini passthrough answers with the alias, in the body and every chunk', async (t) => {
  const r = await google.models.generateContent({ model: 'team-gemini', contents: 'Hi [[sim tokens=3]]' });
  t.equal(r.modelVersion, 'team-gemini');
  t.ok(r.text!.length > 0);
  const versions = new Set<string | undefined>();
  for await (const c of await google.models.generateContentStream({ model: 'team-gemini', contents: 'Hi [[sim tokens=4]]' })) versions.add(c.modelVersion);
  t.same([...versions], ['team-gemini']);
});
