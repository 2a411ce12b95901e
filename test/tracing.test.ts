/**
 * OTLP trace export (plugins/tracing) against a receiver started here: the span tree of an
 * exchange (the client's span → the gateway's server span → one client span per upstream call),
 * the GenAI attributes and the error of a failed attempt, over protobuf (from the config) and
 * JSON (from the standard OTEL_* variables); and nothing at all when it is off.
 */
import { createServer, type IncomingHttpHeaders } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import t from 'tap';
import { defaultPlugins } from '../src/config/defaults.js';
import { loadConfig } from '../src/config/load.js';
import type { BootContext } from '../src/contracts.js';
import { createLogger } from '../src/log.js';
import { parseTraceparent } from '../src/trace.js';
import { eventually, fixedCompletion, startTestGateway, type TestGateway } from './helpers.js';
import { SPAN_KIND, STATUS, startOtlpReceiver, type ReceivedSpan } from './otlp-receiver.js';

const models = `upstreams:
  sim: { kind: simulator }
  down: { kind: openai-chat, baseUrl: "http://127.0.0.1:9/v1", retry: { attempts: 2, backoffMs: 1 } }
models:
  - { id: m, upstream: sim, upstreamModel: sim-chat, prices: { input: 1000000, output: 1000000 } }
  # Priority puts the refusing channel first: every exchange fails over once.
  - id: flaky
    channels: [{ upstream: down, upstreamModel: sim-chat, priority: 0 }, { upstream: sim, upstreamModel: sim-chat, priority: 1 }]
`;

const CLIENT_TRACE = '4bf92f3577b34da6a3ce929d0e0e4736';
const CLIENT_SPAN = '00f067aa0ba902b7';

async function chat(gw: TestGateway, model: string, traceparent?: string) {
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${gw.key}`, 'content-type': 'application/json', ...(traceparent && { traceparent }) },
    body: JSON.stringify({ model, messages: [{ role: 'user', content: 'Hello [[sim tokens=7 cached=2]]' }] }),
  });
  return { status: res.status, id: res.headers.get('x-request-id')!, body: (await res.json()) as { usage: { prompt_tokens: number; completion_tokens: number } } };
}

/** A chat exchange cut short by its output ceiling (finish reason `length`), streamed or not; the answer's text as it came. */
async function cutShort(gw: TestGateway, model: string, stream: boolean, traceparent: string): Promise<{ status: number; text: string }> {
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${gw.key}`, 'content-type': 'application/json', traceparent },
    body: JSON.stringify({ model, stream, max_tokens: 3, messages: [{ role: 'user', content: 'Tell me more [[sim tokens=40]]' }] }),
  });
  return { status: res.status, text: await res.text() };
}

/** A chat stream of about 40 KB, written at once, whose last content chunk finishes with `length`. */
function bigStream(): string {
  const chunk = (delta: object, finish: string | null) =>
    `data: ${JSON.stringify({ id: 'chatcmpl-big', object: 'chat.completion.chunk', created: 1, model: 'recorded', choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;
  let out = chunk({ role: 'assistant', content: '' }, null);
  for (let i = 0; i < 400; i++) out += chunk({ content: `word ${i} ` }, null);
  return `${out}${chunk({}, 'length')}data: [DONE]\n\n`;
}

/**
 * An OpenAI-compatible upstream over HTTP that keeps the headers of every call: under `/fail` it
 * answers 500 (a channel to fail over from), elsewhere a short answer.
 */
async function startRecorder() {
  const received: IncomingHttpHeaders[] = [];
  const server = createServer((req, res) => {
    received.push(req.headers);
    req.resume().on('end', () => {
      if (req.url?.startsWith('/fail/')) return void res.writeHead(500, { 'content-type': 'application/json' }).end('{"error":{"message":"down for the test"}}');
      if (req.url?.startsWith('/big/')) return void res.writeHead(200, { 'content-type': 'text/event-stream' }).end(bigStream());
      res.writeHead(200, { 'content-type': 'application/json' }).end(fixedCompletion('chatcmpl-recorded', 'recorded'));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, received, close: () => server.close() };
}

/** The exchange's server span and its client spans, once exported. */
async function treeOf(spans: ReceivedSpan[], traceId: string): Promise<{ server: ReceivedSpan; clients: ReceivedSpan[] }> {
  return eventually(() => {
    const server = spans.find((s) => s.traceId === traceId && s.kind === SPAN_KIND.SERVER);
    return server && { server, clients: spans.filter((s) => s.parentSpanId === server.spanId).sort((a, b) => Number(a.attributes['sluice.attempt']) - Number(b.attributes['sluice.attempt'])) };
  }, `the spans of trace ${traceId}`);
}

t.test('over http/protobuf, from the config: the span tree and its GenAI attributes', async (t) => {
  const receiver = await startOtlpReceiver();
  t.teardown(() => receiver.close());
  const gw = await startTestGateway((dataDir) => `dataDir: ${dataDir}\ntracing: { endpoint: "${receiver.url}/v1/traces", serviceName: sluice-test }\n${models}`);
  let stopped = false;
  t.teardown(() => (stopped ? undefined : gw.stop()));

  const served = await chat(gw, 'm', `00-${CLIENT_TRACE}-${CLIENT_SPAN}-01`);
  t.equal(served.status, 200);
  const failedOver = await chat(gw, 'flaky');
  t.equal(failedOver.status, 200);
  // Shutting down flushes what is batched.
  await gw.stop();
  stopped = true;

  t.ok(receiver.contentTypes.every((c) => c.startsWith('application/x-protobuf')), 'protobuf, the default protocol');
  const one = await treeOf(receiver.spans, CLIENT_TRACE);
  t.equal(one.server.parentSpanId, CLIENT_SPAN, "the gateway's span is a child of the client's");
  t.equal(one.server.service, 'sluice-test');
  t.equal(one.server.name, 'chat m');
  t.match(one.server.attributes, {
    'gen_ai.operation.name': 'chat',
    'gen_ai.provider.name': 'openai',
    'gen_ai.system': 'openai',
    'gen_ai.request.model': 'm',
    'gen_ai.response.model': 'sim-chat',
    'gen_ai.usage.input_tokens': served.body.usage.prompt_tokens,
    'gen_ai.usage.output_tokens': 7,
    'gen_ai.usage.cache_read.input_tokens': 2,
    'sluice.channel': 'sim',
    'sluice.attempts': 1,
    'http.response.status_code': 200,
  });
  t.ok(Number(one.server.attributes['sluice.cost']) > 0, 'the cost at the model prices');
  t.equal(one.clients.length, 1, 'one upstream call');
  t.match(one.clients[0], { kind: SPAN_KIND.CLIENT, name: 'chat sim-chat', attributes: { 'sluice.upstream': 'sim', 'sluice.attempt': 1 } });
  t.ok(one.clients[0]!.startMs >= one.server.startMs && one.clients[0]!.endMs <= one.server.endMs, 'inside the server span');

  // The second exchange started its own trace: the gateway's span is its root.
  const roots = receiver.spans.filter((s) => s.kind === SPAN_KIND.SERVER && s.parentSpanId === '');
  t.equal(roots.length, 1, 'one root: the exchange without a client trace');
  const two = await treeOf(receiver.spans, roots[0]!.traceId);
  t.match(two.server.attributes, { 'gen_ai.request.model': 'flaky', 'sluice.attempts': 2, 'sluice.channel': 'sim' });
  t.same(two.clients.map((c) => c.attributes['sluice.upstream']), ['down', 'sim'], 'a client span per attempt, in order');
  t.equal(two.clients[0]!.status.code, STATUS.ERROR, 'the failed attempt is an error');
  t.match(two.clients[0]!.status.message, /unreachable|refused/i);
  t.not(two.server.status.code, STATUS.ERROR, 'the exchange itself succeeded');
});

t.test("each upstream call's traceparent names that call's client span, sampled when the trace is recorded", async (t) => {
  const recorder = await startRecorder();
  t.teardown(() => recorder.close());
  const receiver = await startOtlpReceiver();
  t.teardown(() => receiver.close());
  const gw = await startTestGateway(
    (dataDir) => `dataDir: ${dataDir}
tracing: { endpoint: "${receiver.url}/v1/traces" }
upstreams:
  ok: { kind: openai-chat, baseUrl: "${recorder.url}/ok/v1" }
  failing: { kind: openai-chat, baseUrl: "${recorder.url}/fail/v1", retry: { attempts: 2, backoffMs: 1 } }
models:
  - { id: rec, upstream: ok, upstreamModel: recorded }
  - id: rec-flaky
    channels: [{ upstream: failing, upstreamModel: recorded, priority: 0 }, { upstream: ok, upstreamModel: recorded, priority: 1 }]
`,
  );
  let stopped = false;
  t.teardown(() => (stopped ? undefined : gw.stop()));

  t.equal((await chat(gw, 'rec-flaky', `00-${CLIENT_TRACE}-${CLIENT_SPAN}-01`)).status, 200, 'served after a failover');
  t.equal((await chat(gw, 'rec')).status, 200, 'a trace the gateway starts');
  const notSampled = '0af7651916cd43dd8448eb211c80319c';
  t.equal((await chat(gw, 'rec', `00-${notSampled}-b7ad6b7169203331-00`)).status, 200, 'a client trace not recorded');
  await gw.stop();
  stopped = true;

  const sent = recorder.received.map((h) => parseTraceparent(h.traceparent as string));
  t.equal(sent.length, 4, 'two attempts, then one call each');
  const failedOver = await treeOf(receiver.spans, CLIENT_TRACE);
  t.equal(failedOver.clients.length, 2);
  t.same(
    sent.slice(0, 2).map((p) => p?.parentId),
    failedOver.clients.map((c) => c.spanId),
    "each attempt's traceparent names its own client span, not the server span",
  );
  t.ok(sent.slice(0, 2).every((p) => p?.traceId === CLIENT_TRACE && p.sampled), "in the client's trace, sampled as it came");

  const root = receiver.spans.find((s) => s.kind === SPAN_KIND.SERVER && s.parentSpanId === '');
  t.ok(root, 'the gateway started a trace and recorded it');
  const started = await treeOf(receiver.spans, root!.traceId);
  t.match(sent[2], { traceId: root!.traceId, parentId: started.clients[0]!.spanId });
  t.equal(sent[2]?.sampled, true, 'a trace the gateway starts and records goes upstream sampled (flags 01)');

  t.equal(sent[3]?.traceId, notSampled);
  t.equal(sent[3]?.sampled, false, "an unsampled client trace's flags are honoured");
  t.notOk(receiver.spans.some((s) => s.traceId === notSampled), 'and nothing of it is recorded');
});

t.test('gen_ai.response.finish_reasons on the server span and the answering attempt, streamed or not, relayed or translated', async (t) => {
  const receiver = await startOtlpReceiver();
  t.teardown(() => receiver.close());
  const recorder = await startRecorder();
  t.teardown(() => recorder.close());
  const gw = await startTestGateway(
    (dataDir) => `dataDir: ${dataDir}
tracing: { endpoint: "${receiver.url}/v1/traces" }
upstreams:
  sim: { kind: simulator }
  sim-messages: { kind: simulator, family: messages }
  big: { kind: openai-chat, baseUrl: "${recorder.url}/big/v1" }
models:
  - { id: relayed, upstream: sim, upstreamModel: sim-chat }
  - { id: translated, upstream: sim-messages, upstreamModel: sim-messages }
  # A relayed stream whose frames arrive in one large run: its finish is read from the run's end.
  - { id: relayed-at-once, upstream: big, upstreamModel: recorded }
`,
  );
  let stopped = false;
  t.teardown(() => (stopped ? undefined : gw.stop()));
  const cases = [
    { model: 'relayed', stream: false },
    { model: 'relayed', stream: true },
    { model: 'translated', stream: false },
    { model: 'translated', stream: true },
    { model: 'relayed-at-once', stream: true },
  ];
  const traces: string[] = [];
  for (const [i, c] of cases.entries()) {
    const traceId = `${'ab'.repeat(15)}0${i + 1}`;
    traces.push(traceId);
    const answer = await cutShort(gw, c.model, c.stream, `00-${traceId}-${CLIENT_SPAN}-01`);
    t.equal(answer.status, 200);
    t.match(answer.text, /"finish_reason":"length"/, `${c.model}, stream ${c.stream}: the client saw the output ceiling`);
  }
  await gw.stop();
  stopped = true;
  for (const [i, c] of cases.entries()) {
    const { server, clients } = await treeOf(receiver.spans, traces[i]!);
    t.same(server.attributes['gen_ai.response.finish_reasons'], ['length'], `${c.model}, stream ${c.stream}: on the server span`);
    t.same(clients.at(-1)!.attributes['gen_ai.response.finish_reasons'], ['length'], `${c.model}, stream ${c.stream}: on the attempt that answered`);
  }
});

t.test('over http/json, from the OTEL_* variables; a client that does not record its trace is not recorded', async (t) => {
  const receiver = await startOtlpReceiver();
  t.teardown(() => receiver.close());
  const saved = { ...process.env };
  Object.assign(process.env, { OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url, OTEL_EXPORTER_OTLP_PROTOCOL: 'http/json', OTEL_SERVICE_NAME: 'from-env' });
  t.teardown(() => {
    for (const k of ['OTEL_EXPORTER_OTLP_ENDPOINT', 'OTEL_EXPORTER_OTLP_PROTOCOL', 'OTEL_SERVICE_NAME']) delete process.env[k];
    Object.assign(process.env, saved);
  });
  const gw = await startTestGateway((dataDir) => `dataDir: ${dataDir}\n${models}`);
  const notSampled = '0af7651916cd43dd8448eb211c80319c';
  t.equal((await chat(gw, 'm', `00-${notSampled}-b7ad6b7169203331-00`)).status, 200);
  t.equal((await chat(gw, 'm', `00-${CLIENT_TRACE}-${CLIENT_SPAN}-01`)).status, 200);
  await gw.stop();
  t.ok(receiver.contentTypes.length > 0 && receiver.contentTypes.every((c) => c.startsWith('application/json')), 'JSON, as OTEL_EXPORTER_OTLP_PROTOCOL says');
  const { server } = await treeOf(receiver.spans, CLIENT_TRACE);
  t.match(server, { service: 'from-env', parentSpanId: CLIENT_SPAN, attributes: { 'gen_ai.request.model': 'm' } });
  t.notOk(receiver.spans.some((s) => s.traceId === notSampled), "the unsampled client trace's exchange exported nothing");
});

t.test('off by default: nothing is exported and the plugin joins no phase', async (t) => {
  const receiver = await startOtlpReceiver();
  t.teardown(() => receiver.close());
  const gw = await startTestGateway((dataDir) => `dataDir: ${dataDir}\n${models}`);
  t.equal((await chat(gw, 'm')).status, 200);
  // The plugin as the gateway loaded it from the default list, given the same config.
  const factory = (await import('../plugins/tracing/index.js')).default;
  const plugin = await factory({ config: loadConfig({ path: join(gw.dataDir, 'sluice.yaml'), env: {} }), log: createLogger('silent') } as unknown as BootContext);
  t.same(Object.keys(plugin), ['name'], 'with no phase: nothing runs per exchange');
  t.ok(defaultPlugins.includes('tracing'), 'it is in the default list');
  await gw.stop();
  t.equal(receiver.contentTypes.length, 0, 'nothing was sent');
});

t.test('an unsupported OTEL_EXPORTER_OTLP_PROTOCOL fails the start, naming what to set', async (t) => {
  const { exportSettings } = await import('../plugins/tracing/index.js');
  t.throws(() => exportSettings(undefined, { OTEL_EXPORTER_OTLP_ENDPOINT: 'http://127.0.0.1:4317', OTEL_EXPORTER_OTLP_PROTOCOL: 'grpc' }), /http\/protobuf or http\/json, not grpc/);
  t.equal(exportSettings(undefined, { OTEL_EXPORTER_OTLP_ENDPOINT: 'http://127.0.0.1:4318', OTEL_SDK_DISABLED: 'true' }), undefined, 'OTEL_SDK_DISABLED wins');
  t.match(exportSettings(undefined, { OTEL_EXPORTER_OTLP_ENDPOINT: 'http://127.0.0.1:4318/', OTEL_EXPORTER_OTLP_HEADERS: 'api-key=a%20b,x=1' }), {
    endpoint: 'http://127.0.0.1:4318/v1/traces',
    protocol: 'http/protobuf',
    headers: { 'api-key': 'a b', x: '1' },
  });
  t.match(exportSettings(undefined, { OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: 'http://127.0.0.1:9999/custom' }), { endpoint: 'http://127.0.0.1:9999/custom' }, 'the signal variable as it is');
});

t.test('OTEL_EXPORTER_OTLP_HEADERS that is not percent-encoded fails the start, naming the variable', async (t) => {
  const { exportSettings } = await import('../plugins/tracing/index.js');
  // Before, the start failed with a bare "URIError: URI malformed".
  t.throws(() => exportSettings(undefined, { OTEL_EXPORTER_OTLP_ENDPOINT: 'http://127.0.0.1:4318', OTEL_EXPORTER_OTLP_HEADERS: 'a=%zz' }), /OTEL_EXPORTER_OTLP_HEADERS: "%zz" is not percent-encoded/);
});

t.test("OTEL_TRACES_SAMPLER decides before the upstream call: a trace it drops goes upstream unsampled, and nothing is exported", async (t) => {
  const { samplerFromEnv } = await import('../plugins/tracing/index.js');
  const sdk = await import('@opentelemetry/sdk-trace-base');
  t.throws(() => samplerFromEnv(sdk, { OTEL_TRACES_SAMPLER: 'sometimes' }), /OTEL_TRACES_SAMPLER: "sometimes" is not a sampler.*traceidratio/);
  t.throws(() => samplerFromEnv(sdk, { OTEL_TRACES_SAMPLER: 'traceidratio', OTEL_TRACES_SAMPLER_ARG: '2' }), /OTEL_TRACES_SAMPLER_ARG: a ratio from 0 to 1/);
  t.doesNotThrow(() => samplerFromEnv(sdk, { OTEL_TRACES_SAMPLER: '' }), 'empty is unset');
  t.doesNotThrow(() => samplerFromEnv(sdk, { OTEL_TRACES_SAMPLER: 'always_on', OTEL_TRACES_SAMPLER_ARG: 'endpoint=x' }), "another sampler's argument is ignored");

  const recorder = await startRecorder();
  t.teardown(() => recorder.close());
  const receiver = await startOtlpReceiver();
  t.teardown(() => receiver.close());
  const saved = { ...process.env };
  Object.assign(process.env, { OTEL_TRACES_SAMPLER: 'traceidratio', OTEL_TRACES_SAMPLER_ARG: '0' });
  t.teardown(() => {
    delete process.env.OTEL_TRACES_SAMPLER;
    delete process.env.OTEL_TRACES_SAMPLER_ARG;
    Object.assign(process.env, saved);
  });
  const gw = await startTestGateway(
    (dataDir) => `dataDir: ${dataDir}
tracing: { endpoint: "${receiver.url}/v1/traces" }
upstreams:
  ok: { kind: openai-chat, baseUrl: "${recorder.url}/ok/v1" }
models:
  - { id: rec, upstream: ok, upstreamModel: recorded }
`,
  );
  t.equal((await chat(gw, 'rec')).status, 200);
  await gw.stop();
  const sent = parseTraceparent(recorder.received[0]!.traceparent as string);
  // Before, the upstream was told 01 (sampled), naming a parent span that was never exported.
  t.equal(sent?.sampled, false, 'the upstream is told the trace is not recorded');
  t.equal(receiver.spans.length, 0, 'and nothing was exported');
});
