/**
 * GET /metrics (plugins/metrics) on a real gateway in front of the simulator process: known traffic
 * on two families (streamed and not, an upstream failure, a limiter refusal, an unknown model, no
 * key), then a scrape whose numbers must be exactly what was sent and what the usage records say.
 * Also: W3C traceparent reaching an upstream (a small HTTP server that records what it receives)
 * and the access log; the metrics of two worker threads reported whole by either; the separate
 * listener; the Grafana dashboard reading only metrics that exist.
 */
import { readFileSync } from 'node:fs';
import { createServer, type IncomingHttpHeaders } from 'node:http';
import { join } from 'node:path';
import t from 'tap';
import { Agent } from 'undici';
import { defaultPlugins } from '../src/config/defaults.js';
import { parseTraceparent } from '../src/trace.js';
import { distRoot, eventually, fixedCompletion, startStack, startTestGateway } from './helpers.js';
import { call, keyIn } from './scale.js';

// Gateways with worker threads, a simulator process and scrapes: it took over 90 s on two busy
// cores. Waits follow readiness; this bounds only a hang.
t.setTimeout(180_000);

/** An OpenAI-compatible upstream that answers every completion alike and keeps the headers it got. */
const received: IncomingHttpHeaders[] = [];
const recorder = createServer((req, res) => {
  received.push(req.headers);
  req.resume().on('end', () => {
    res.writeHead(200, { 'content-type': 'application/json' }).end(fixedCompletion('chatcmpl-recorded', 'recorded'));
  });
});
await new Promise<void>((resolve) => recorder.listen(0, '127.0.0.1', resolve));
const recorderUrl = `http://127.0.0.1:${(recorder.address() as { port: number }).port}`;
t.teardown(() => new Promise<void>((resolve) => recorder.close(() => resolve())));

const plugins = defaultPlugins.map((name) => (name === 'metrics' ? `{ name: metrics, options: { listen: "127.0.0.1:0" } }` : name));
const routing = (simUrl: string) => `log: { level: info }
plugins: [${plugins.join(', ')}]
upstreams:
  chat: { kind: openai-chat, baseUrl: "${simUrl}/v1" }
  messages: { kind: anthropic, baseUrl: "${simUrl}/v1", apiKey: messages-upstream-key }
  flaky: { kind: openai-chat, baseUrl: "${simUrl}/v1", breaker: { failures: 1, coolDownSeconds: 600 } }
  narrow: { kind: openai-chat, baseUrl: "${simUrl}/v1", connections: 1 }
  recorder: { kind: openai-chat, baseUrl: "${recorderUrl}/v1" }
models:
  - { id: sim-chat, upstream: chat }
  - { id: sim-messages, upstream: messages }
  - { id: sim-flaky, upstream: flaky, upstreamModel: sim-chat }
  - { id: sim-narrow, upstream: narrow, upstreamModel: sim-chat }
  - { id: rec-chat, upstream: recorder, upstreamModel: recorded }
`;
const { sim, gw } = await startStack(routing);

interface Series {
  name: string;
  labels: Record<string, string>;
  value: number;
}

/** The Prometheus text format, sample lines only. */
function parse(text: string): Series[] {
  const out: Series[] = [];
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    if (!m) throw new Error(`not a sample line: ${line}`);
    const labels: Record<string, string> = {};
    for (const [, name, value] of (m[2] ?? '').matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[name!] = value!.replace(/\\(.)/g, (_, c) => (c === 'n' ? '\n' : c));
    out.push({ name: m[1]!, labels, value: Number(m[3]) });
  }
  return out;
}

/** The sum of the samples of `name` whose labels include `match`. */
const total = (series: Series[], name: string, match: Record<string, string> = {}) =>
  series.filter((s) => s.name === name && Object.entries(match).every(([k, v]) => s.labels[k] === v)).reduce((sum, s) => sum + s.value, 0);

async function scrape(url: string, token: string | null = gw.adminToken): Promise<{ status: number; type: string | null; text: string; series: Series[] }> {
  // A connection of its own: with worker threads, any of them may take it.
  const dispatcher = new Agent({ connections: 1 });
  try {
    // @ts-expect-error undici's fetch takes a dispatcher
    const res = await fetch(`${url}/metrics`, { headers: token ? { authorization: `Bearer ${token}` } : {}, dispatcher });
    const text = await res.text();
    return { status: res.status, type: res.headers.get('content-type'), text, series: res.status === 200 ? parse(text) : [] };
  } finally {
    await dispatcher.close();
  }
}

async function chat(key: string | undefined, body: Record<string, unknown>, headers: Record<string, string> = {}) {
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(key && { authorization: `Bearer ${key}` }), ...headers },
    body: JSON.stringify(body),
  });
  return { status: res.status, id: res.headers.get('x-request-id'), headers: res.headers, text: await res.text() };
}

async function messages(key: string, body: Record<string, unknown>) {
  const res = await fetch(`${gw.url}/v1/messages`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-api-key': key, 'anthropic-version': '2023-06-01' },
    body: JSON.stringify({ max_tokens: 256, ...body }),
  });
  return { status: res.status, text: await res.text() };
}

const say = (content: string) => [{ role: 'user', content }];

/** What each exchange sent should be counted as. */
interface Sent {
  family: string;
  model: string;
  status: number;
  stream: boolean;
}

t.test('a scrape counts exactly what was sent, and its tokens are the usage records’', async (t) => {
  const sent: Sent[] = [];
  const key = gw.key;
  for (let i = 0; i < 3; i++) {
    const r = await chat(key, { model: 'sim-chat', messages: say(`one ${i} [[sim tokens=5]]`) });
    sent.push({ family: 'chat', model: 'sim-chat', status: r.status, stream: false });
  }
  for (let i = 0; i < 2; i++) {
    const r = await chat(key, { model: 'sim-chat', messages: say(`streamed ${i} [[sim tokens=7 cached=2]]`), stream: true });
    t.match(r.text, /\[DONE\]/);
    sent.push({ family: 'chat', model: 'sim-chat', status: r.status, stream: true });
  }
  for (const stream of [false, true]) {
    const r = await messages(key, { model: 'sim-messages', messages: say('hello [[sim tokens=4 cached=3 cache_write=1]]'), stream });
    sent.push({ family: 'messages', model: 'sim-messages', status: r.status, stream });
  }
  const failed = await chat(key, { model: 'sim-flaky', messages: say('fail [[sim error=500]]') });
  t.equal(failed.status, 502, 'the upstream failure');
  sent.push({ family: 'chat', model: 'sim-flaky', status: 502, stream: false });
  const limited = await keyIn({ urls: [gw.url], admin: gw.admin }, { limits: { rpm: 1 } });
  for (let i = 0; i < 2; i++) {
    const r = await chat(limited.key, { model: 'sim-chat', messages: say('limited [[sim tokens=3]]') });
    sent.push({ family: 'chat', model: 'sim-chat', status: r.status, stream: false });
  }
  t.same(sent.slice(-2).map((s) => s.status), [200, 429], 'the second call of a one-per-minute key is refused');
  const unknown = await chat(key, { model: 'no-such-model', messages: say('hi') });
  t.equal(unknown.status, 400);
  sent.push({ family: 'chat', model: 'unknown', status: unknown.status, stream: false });
  const anonymous = await chat(undefined, { model: 'sim-chat', messages: say('hi') });
  t.equal(anonymous.status, 401);
  sent.push({ family: 'chat', model: '', status: 401, stream: false });
  t.ok(sent.every((s) => s.status !== 0));

  const records = await eventually(async () => {
    const got = (await gw.admin('GET', '/admin/requests?limit=1000')).body.data as any[];
    return got.length === sent.length && got;
  }, 'a usage record per exchange');

  t.equal((await scrape(gw.url, null)).status, 401, 'no token, no metrics');
  t.equal((await scrape(gw.url, 'not-the-admin-token')).status, 401, 'a wrong token, no metrics');
  const { status, type, series } = await scrape(gw.url);
  t.equal(status, 200);
  t.match(type, /^text\/plain; version=0\.0\.4/);

  t.equal(total(series, 'sluice_requests_total'), sent.length, 'one count per exchange');
  const groups = new Map<string, number>();
  for (const s of sent) groups.set(JSON.stringify([s.family, s.model, String(s.status)]), (groups.get(JSON.stringify([s.family, s.model, String(s.status)])) ?? 0) + 1);
  for (const [group, count] of groups) {
    const [family, model, status] = JSON.parse(group) as string[];
    t.equal(total(series, 'sluice_requests_total', { sluice_family: family!, gen_ai_request_model: model!, http_status: status! }), count, `requests ${group}`);
  }
  t.equal(total(series, 'sluice_requests_total', { gen_ai_request_model: 'sim-flaky', sluice_upstream: 'flaky', sluice_channel: 'flaky', error_type: 'upstream_error' }), 1);
  t.equal(total(series, 'sluice_requests_total', { gen_ai_request_model: 'unknown', error_type: 'model_not_found' }), 1);
  t.notOk(series.some((s) => Object.values(s.labels).includes('no-such-model')), 'a client-sent model name is never a label');
  t.equal(total(series, 'sluice_limiter_rejections_total'), 1);
  t.equal(total(series, 'sluice_limiter_rejections_total', { reason: 'requests' }), 1);

  for (const model of ['sim-chat', 'sim-messages', 'sim-flaky']) {
    const mine = sent.filter((s) => s.model === model);
    const ok = mine.filter((s) => s.status === 200);
    const labels = { gen_ai_operation_name: 'chat', gen_ai_request_model: model };
    t.equal(total(series, 'gen_ai_server_request_duration_seconds_count', labels), mine.length, `${model}: a duration per request`);
    t.equal(total(series, 'gen_ai_server_request_duration_seconds_count', { ...labels, sluice_stream: 'true' }), mine.filter((s) => s.stream).length);
    t.equal(total(series, 'gen_ai_server_time_to_first_token_seconds_count', labels), ok.filter((s) => s.stream).length, `${model}: a first token per stream`);
    const theirs = records.filter((r) => r.model === model);
    const used = (field: string) => theirs.reduce((sum, r) => sum + (r[field] ?? 0), 0);
    t.equal(used('promptTokens') > 0 && used('completionTokens') > 0, ok.length > 0, `${model}: tokens were used if answered`);
    t.equal(total(series, 'sluice_tokens_total', { ...labels, type: 'input' }), used('promptTokens'), `${model}: input tokens`);
    t.equal(total(series, 'sluice_tokens_total', { ...labels, type: 'output' }), used('completionTokens'), `${model}: output tokens`);
    t.equal(total(series, 'sluice_tokens_total', { ...labels, type: 'cached_input' }), used('cachedInputTokens'), `${model}: cached input tokens`);
    t.equal(total(series, 'sluice_tokens_total', { ...labels, type: 'cache_write' }), used('cacheWriteTokens'), `${model}: cache writes`);
    t.equal(total(series, 'gen_ai_client_token_usage_sum', { ...labels, gen_ai_token_type: 'input' }), used('promptTokens'));
    t.equal(total(series, 'gen_ai_client_token_usage_sum', { ...labels, gen_ai_token_type: 'output' }), used('completionTokens'));
    t.equal(total(series, 'gen_ai_client_token_usage_count', { ...labels, gen_ai_token_type: 'output' }), ok.length, `${model}: one usage per answered request`);
  }
  t.equal(total(series, 'sluice_tokens_total', { gen_ai_request_model: 'sim-chat', type: 'cached_input' }), 4, 'two streams, two cached tokens each');

  t.equal(total(series, 'sluice_in_flight'), 0);
  t.equal(total(series, 'sluice_breaker_state', { gen_ai_request_model: 'sim-flaky', sluice_upstream: 'flaky' }), 2, 'the failed channel is open');
  t.equal(total(series, 'sluice_breaker_state', { gen_ai_request_model: 'sim-chat', sluice_channel: 'chat' }), 0, 'the others are closed');
  t.ok(series.some((s) => s.name === 'sluice_usage_journal_pending'));
  t.equal(total(series, 'sluice_upstream_connections', { sluice_upstream: 'chat' }), 256);
  t.equal(total(series, 'sluice_upstream_connections_busy'), 0);
  t.ok(series.some((s) => s.name === 'process_cpu_user_seconds_total'), 'process metrics');
});

t.test('an exchange under way is in flight; a pool of one makes the second call wait', async (t) => {
  const controller = new AbortController();
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${gw.key}` },
    body: JSON.stringify({ model: 'sim-chat', messages: say('slow [[sim tokens=200 tps=20]]'), stream: true }),
    signal: controller.signal,
  });
  const reader = res.body!.getReader();
  await reader.read();
  const during = (await scrape(gw.url)).series;
  t.equal(total(during, 'sluice_in_flight'), 1);
  t.equal(total(during, 'sluice_upstream_connections_busy', { sluice_upstream: 'chat' }), 1);
  const before = total(during, 'sluice_requests_total', { sluice_outcome: 'aborted' });
  controller.abort();
  await reader.cancel().catch(() => {});
  const after = await eventually(async () => {
    const { series } = await scrape(gw.url);
    return total(series, 'sluice_in_flight') === 0 && series;
  }, 'the aborted stream to end');
  t.equal(total(after, 'sluice_requests_total', { sluice_outcome: 'aborted' }), before + 1);

  const both = await Promise.all([0, 1].map((i) => chat(gw.key, { model: 'sim-narrow', messages: say(`queued ${i} [[sim tokens=2 ttft_ms=300]]`) })));
  t.same(both.map((r) => r.status), [200, 200]);
  const { series } = await scrape(gw.url);
  const narrow = { sluice_upstream: 'narrow' };
  t.equal(total(series, 'sluice_upstream_connections', narrow), 1);
  t.equal(total(series, 'sluice_upstream_queue_waits_total', narrow), 1, 'one call waited for the connection');
  t.ok(total(series, 'sluice_upstream_queue_wait_seconds_total', narrow) > 0);
  t.equal(total(series, 'sluice_upstream_busy_total', narrow), 0);
});

t.test("the client's traceparent reaches the upstream with the gateway's span as parent, and the access log names the trace", async (t) => {
  const traceId = '4bf92f3577b34da6a3ce929d0e0e4736';
  const clientSpan = '00f067aa0ba902b7';
  const accessLine = (id: string | null) => eventually(() => gw.logs.find((l) => l.msg === 'request' && l.req === id), 'the access log line');

  const traced = await chat(gw.key, { model: 'rec-chat', messages: say('hi') }, { traceparent: `00-${traceId}-${clientSpan}-01`, tracestate: 'vendor=opaque' });
  t.equal(traced.status, 200);
  t.equal(traced.headers.get('traceparent'), null, 'nothing new is sent to the client');
  const upstream = received.at(-1)!;
  const sentOn = parseTraceparent(upstream.traceparent as string);
  t.equal(sentOn?.traceId, traceId, 'same trace');
  t.not(sentOn?.parentId, clientSpan, "the gateway's own span");
  t.equal(sentOn?.sampled, true, 'the sampled flag passes on');
  t.equal(upstream.tracestate, 'vendor=opaque');
  t.match(await accessLine(traced.id), { trace_id: traceId, span_id: sentOn?.parentId });

  const fresh = await chat(gw.key, { model: 'rec-chat', messages: say('hi') });
  const created = parseTraceparent(received.at(-1)!.traceparent as string);
  t.ok(created, 'a trace is created when the client sends none');
  t.not(created?.traceId, traceId);
  t.match(await accessLine(fresh.id), { trace_id: created?.traceId, span_id: created?.parentId });

  const invalid = await chat(gw.key, { model: 'rec-chat', messages: say('hi') }, { traceparent: `00-${'0'.repeat(32)}-${clientSpan}-01`, tracestate: 'vendor=opaque' });
  const replaced = parseTraceparent(received.at(-1)!.traceparent as string);
  t.ok(replaced && replaced.traceId !== '0'.repeat(32), 'an invalid traceparent starts a new trace');
  t.equal(received.at(-1)!.tracestate, undefined, 'and its tracestate is not passed on');
  t.match(await accessLine(invalid.id), { trace_id: replaced?.traceId });
  t.equal(received.length, 3);
});

t.test('the separate listener serves the same metrics without a token', async (t) => {
  const line = gw.logs.find((l) => l.msg === 'metrics listening');
  t.ok(line, 'it says where it listens');
  const url = String(line!.url);
  t.match(url, /^http:\/\/127\.0\.0\.1:\d+\/metrics$/);
  const res = await fetch(url);
  t.equal(res.status, 200);
  const apart = parse(await res.text());
  const { series } = await scrape(gw.url);
  t.equal(total(apart, 'sluice_requests_total'), total(series, 'sluice_requests_total'));
  t.equal((await fetch(url, { method: 'POST' })).status, 405);
  t.equal((await fetch(url.replace('/metrics', '/other'))).status, 404);
});

t.test('the Grafana dashboard reads only metrics /metrics exposes', async (t) => {
  const dashboard = JSON.parse(readFileSync(join(distRoot, '..', 'docs/grafana/sluice-dashboard.json'), 'utf8'));
  t.ok(dashboard.schemaVersion >= 36);
  const datasource = dashboard.templating.list.find((v: any) => v.type === 'datasource');
  t.match(datasource, { name: 'datasource', query: 'prometheus' }, 'a Prometheus data source variable');
  const exposed = new Set((await scrape(gw.url)).series.map((s) => s.name));
  const panels = dashboard.panels.filter((p: any) => p.type !== 'row');
  const used = new Set<string>();
  for (const panel of panels) {
    t.match(panel.datasource, { uid: '${datasource}' }, `${panel.title}: the chosen data source`);
    t.ok(panel.targets?.length > 0, `${panel.title}: has queries`);
    for (const { expr } of panel.targets) {
      const names = metricNames(expr);
      t.ok(names.length > 0, `${panel.title}: ${expr} reads a metric`);
      for (const name of names) {
        used.add(name);
        t.ok(exposed.has(name), `${panel.title}: ${name} is exposed`);
      }
    }
  }
  for (const name of [
    'sluice_requests_total',
    'gen_ai_server_request_duration_seconds_bucket',
    'gen_ai_server_time_to_first_token_seconds_bucket',
    'sluice_tokens_total',
    'sluice_in_flight',
    'sluice_limiter_rejections_total',
    'sluice_breaker_state',
    'sluice_usage_journal_pending',
  ]) {
    t.ok(used.has(name), `a panel shows ${name}`);
  }
});

/** The metric names a PromQL expression reads: what is left once strings, matchers, ranges, groupings and functions are gone. */
function metricNames(expr: string): string[] {
  const bare = expr
    .replace(/"(?:[^"\\]|\\.)*"/g, '')
    .replace(/\{[^}]*\}/g, ' ')
    .replace(/\[[^\]]*\]/g, ' ')
    .replace(/\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)/g, ' ');
  return [...bare.matchAll(/[a-zA-Z_:][\w:]*/g)]
    .filter((m) => !/^\s*\(/.test(bare.slice(m.index! + m[0].length)))
    .map((m) => m[0])
    .filter((name) => !/^(by|without|on|ignoring|bool|and|or|unless|offset)$/.test(name));
}

t.test('with two worker threads, a scrape taken by either reports the whole instance', async (t) => {
  const workers = await startTestGateway(
    (dataDir) => `dataDir: ${dataDir}
server: { workers: 2, shutdownTimeoutMs: 2000 }
log: { level: warn }
upstreams:
  chat: { kind: openai-chat, baseUrl: "${sim.url}/v1" }
models:
  - { id: sim-chat, upstream: chat }
`,
  );
  t.teardown(() => workers.stop());
  t.equal(workers.gateway.workers?.size, 2);
  // Each on a connection of its own: the kernel spreads them over both threads.
  const answers = await Promise.all(Array.from({ length: 24 }, (_, i) => call(workers.url, workers.key, { messages: say(`spread ${i} [[sim tokens=3]]`), stream: i % 2 === 0 })));
  t.ok(answers.every((a) => a.status === 200));
  const records = await eventually(async () => {
    const got = (await workers.admin('GET', '/admin/requests?limit=1000')).body.data as any[];
    return got.length === 24 && got;
  }, 'the usage records');
  const input = records.reduce((sum, r) => sum + r.promptTokens, 0);
  const output = records.reduce((sum, r) => sum + r.completionTokens, 0);

  t.equal((await scrape(workers.url, null)).status, 401);
  for (let i = 0; i < 6; i++) {
    const { status, text, series } = await scrape(workers.url, workers.adminToken);
    t.equal(status, 200);
    t.equal(total(series, 'sluice_requests_total', { gen_ai_request_model: 'sim-chat', http_status: '200' }), 24, `scrape ${i}: every request of both threads`);
    t.equal(total(series, 'gen_ai_server_time_to_first_token_seconds_count'), 12);
    t.equal(total(series, 'gen_ai_server_request_duration_seconds_count'), 24);
    t.equal(total(series, 'sluice_tokens_total', { type: 'input' }), input);
    t.equal(total(series, 'sluice_tokens_total', { type: 'output' }), output);
    t.equal(total(series, 'sluice_in_flight'), 0);
    t.equal(total(series, 'sluice_upstream_connections', { sluice_upstream: 'chat' }), 512, "both threads' pools");
    t.equal(total(series, 'sluice_breaker_state', { gen_ai_request_model: 'sim-chat' }), 0);
    t.equal(series.filter((s) => s.name === 'process_cpu_user_seconds_total').length, 1, 'process metrics once');
    t.equal(text.match(/^# TYPE sluice_requests_total /gm)?.length, 1);
  }
});
