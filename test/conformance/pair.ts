/**
 * The shared conformance suite for a wire format's client family and upstream dialect (a codec
 * plugin that adds both under one name). Whatever the dialect writes, the family must read back
 * the same, and the other way round: requests (dialect → family), answers, streams (whole and split
 * at random chunk boundaries), mid-stream failures and error bodies (family → dialect). A pair that
 * disagrees with itself breaks every translation through it. docs/plugins.md explains its use.
 */
import type { Test } from 'tap';
import { collect, textOf, type Event, type Request, type Response, type StreamReader } from '../../src/canonical.js';
import { loadConfig } from '../../src/config/load.js';
import type { ModelConfig } from '../../src/config/types.js';
import type { BootContext, ClientFamily, PluginFactory, UpstreamDialect, UpstreamRequest } from '../../src/contracts.js';
import { GatewayError, codeForStatus } from '../../src/errors.js';
import { Exchange } from '../../src/exchange.js';
import { createLogger } from '../../src/log.js';
import { SseSplitter, frameData } from '../../src/sse.js';

export interface Pair {
  family: ClientFamily;
  dialect: UpstreamDialect;
}

/** Runs a codec plugin's factory as the gateway would (embedded default config) and keeps what it adds. */
export async function loadPairs(plugin: PluginFactory): Promise<Pair[]> {
  const families: ClientFamily[] = [];
  const dialects: UpstreamDialect[] = [];
  const refuse = () => {
    throw new Error('a codec plugin adds families and dialects only');
  };
  const ctx = {
    config: loadConfig(),
    log: createLogger('silent'),
    options: {},
    addFamily: (f: ClientFamily) => families.push(f),
    addDialect: (d: UpstreamDialect) => dialects.push(d),
    addUpstreamKind: refuse,
    addRoute: refuse,
  } as unknown as BootContext;
  await plugin(ctx);
  return families.flatMap((family) => dialects.filter((d) => d.family === family.name).map((dialect) => ({ family, dialect })));
}

/** A model that can do everything the cases ask for. */
const model: ModelConfig = loadConfig().models.find((m) => m.id === 'sim-chat')!;

const weatherTool = {
  name: 'get_weather',
  description: 'The weather in a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
};

/** A conversation with a system prompt, a tool round trip and sampling settings. */
function conversation(stream: boolean): Request {
  return {
    model: 'conformance-model',
    messages: [
      { role: 'system', content: [{ type: 'text', text: 'Answer briefly.' }] },
      { role: 'user', content: [{ type: 'text', text: 'What is the weather in Paris?' }] },
      { role: 'assistant', content: [], toolCalls: [{ id: 'call_1', name: 'get_weather', arguments: '{"city":"Paris"}' }] },
      { role: 'tool', toolCallId: 'call_1', name: 'get_weather', content: [{ type: 'text', text: '{"celsius":21}' }] },
      { role: 'assistant', content: [{ type: 'text', text: 'It is 21 °C.' }], toolCalls: [] },
      { role: 'user', content: [{ type: 'text', text: 'And in Lyon?' }] },
    ],
    tools: [weatherTool],
    toolChoice: 'auto',
    maxOutputTokens: 300,
    temperature: 0.5,
    topP: 0.9,
    stop: ['END'],
    stream,
  };
}

const usage = { inputTokens: 31, outputTokens: 12 };
const answers: Record<string, Response> = {
  text: { text: 'Sunny, 24 °C.', toolCalls: [], finishReason: 'stop', usage },
  'cut short': { text: 'Sunny and', toolCalls: [], finishReason: 'length', usage },
  'tool call': { text: '', toolCalls: [{ id: 'call_7', name: 'get_weather', arguments: '{"city":"Lyon"}' }], finishReason: 'tool_calls', usage },
};

/** The events of a streamed answer with reasoning, text and a tool call whose arguments come in pieces. */
const streamed: Event[] = [
  { type: 'start', id: 'answer-1', model: 'conformance-model', created: 1767225600 },
  { type: 'reasoning', delta: 'The user wants ' },
  { type: 'reasoning', delta: 'the weather.' },
  { type: 'text', delta: 'Let me ' },
  { type: 'text', delta: 'check.' },
  { type: 'tool_call', index: 0, id: 'call_9', name: 'get_weather' },
  { type: 'tool_arguments', index: 0, delta: '{"city":' },
  { type: 'tool_arguments', index: 0, delta: '"Lyon"}' },
  { type: 'finish', reason: 'tool_calls' },
  { type: 'usage', usage },
];

/** Aligns an upstream path (relative to the API root) with the family's endpoint pattern, from the end: the route params. */
function routeParams(pattern: string, path: string): string[] {
  const want = pattern.split('/').filter(Boolean);
  const have = path.split('/').filter(Boolean);
  if (have.length > want.length) throw new Error(`upstream path ${path} is longer than the endpoint ${pattern}`);
  const tail = want.slice(want.length - have.length);
  const params: string[] = [];
  tail.forEach((segment, i) => {
    if (segment.startsWith(':')) params.push(have[i]!);
    else if (segment !== have[i]) throw new Error(`upstream path ${path} does not match the endpoint ${pattern}`);
  });
  return params;
}

/** An exchange on the dialect's side of a translation: the model is known, the client's request is another family's. */
function translating(pair: Pair): Exchange {
  const endpoint = pair.family.endpoints[0]!;
  const ex = new Exchange(pair.family, endpoint, 'POST', endpoint.path, '', {}, []);
  ex.model = model;
  ex.modelId = model.id;
  return ex;
}

/** What the dialect would send, received by the family as a client request: decoded and made canonical as the pipeline does. */
function received(pair: Pair, sent: UpstreamRequest): Exchange {
  const { family } = pair;
  const endpoint = family.endpoints.find((e) => e.kind === 'generate' && e.method === 'post');
  if (!endpoint) throw new Error(`the ${family.name} family has no generate endpoint`);
  const [path, query = ''] = sent.path.split('?', 2) as [string, string?];
  const ex = new Exchange(family, endpoint, sent.method, path, query, { 'content-type': 'application/json', ...sent.headers }, routeParams(endpoint.path, path));
  ex.body = Buffer.from(sent.body ?? '');
  family.decode(ex);
  ex.model = model;
  return ex;
}

const parsedOr = (text: string): unknown => {
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
};

/** What must survive a round trip, in terms every family can say: call ids may be renamed, but must still pair up. */
function essentials(req: Request) {
  const ids = new Map<string, number>();
  const callNumber = (id: string) => ids.get(id) ?? ids.set(id, ids.size).get(id)!;
  return {
    messages: req.messages.map((m) => ({
      role: m.role,
      text: m.role === 'tool' ? parsedOr(textOf(m.content)) : textOf(m.content),
      ...(m.role === 'assistant' && { calls: m.toolCalls.map((c) => ({ n: callNumber(c.id), name: c.name, arguments: parsedOr(c.arguments) })) }),
      ...(m.role === 'tool' && { answers: callNumber(m.toolCallId) }),
    })),
    tools: req.tools.map((t) => ({ name: t.name, description: t.description, parameters: t.parameters })),
    toolChoice: req.toolChoice,
    maxOutputTokens: req.maxOutputTokens,
    temperature: req.temperature,
    topP: req.topP,
    stop: req.stop,
    stream: req.stream,
  };
}

function answerEssentials(res: Response) {
  return {
    text: res.text,
    reasoning: res.reasoning || undefined,
    toolCalls: res.toolCalls.map((c) => ({ name: c.name, arguments: parsedOr(c.arguments) })),
    finishReason: res.finishReason,
    usage: res.usage && { inputTokens: res.usage.inputTokens, outputTokens: res.usage.outputTokens },
  };
}

/** Random cut points, reproducible per seed. */
function splitAt(bytes: Buffer, seed: number): Buffer[] {
  const pieces: Buffer[] = [];
  let state = seed;
  for (let at = 0; at < bytes.length; ) {
    state = (state * 1103515245 + 12345) % 2 ** 31;
    const size = 1 + (state % 61);
    pieces.push(bytes.subarray(at, at + size));
    at += size;
  }
  return pieces;
}

/** Reads stream bytes as the relay does: SSE frames, each frame's data to the reader. */
function read(pieces: Buffer[], reader: StreamReader): Event[] {
  const events: Event[] = [];
  const splitter = new SseSplitter();
  const visit = (frame: Buffer) => {
    const data = frameData(frame);
    if (data !== null) events.push(...reader.frame(data));
    return false;
  };
  for (const piece of pieces) splitter.push(piece, visit, () => {});
  const rest = splitter.flush();
  if (rest) visit(rest);
  events.push(...reader.end());
  return events;
}

/** The family's stream of `events` for a client exchange that asked for a stream. */
function written(pair: Pair, events: Event[], fail?: GatewayError): Buffer {
  const ex = received(pair, pair.dialect.fromCanonical(conversation(true), translating(pair)));
  pair.family.toCanonical(ex, pair.family.name);
  const writer = pair.family.streamWriter(ex);
  let out = '';
  for (const e of events) out += writer.event(e);
  out += fail ? writer.fail(fail) : writer.end();
  return Buffer.from(out);
}

/** Runs the conformance checks of one family and dialect pair as subtests of `t`. */
export function checkPair(t: Test, pair: Pair): void {
  const { family, dialect } = pair;

  t.test(`${family.name}: a request the dialect writes, the family reads back the same`, async (t) => {
    for (const stream of [false, true]) {
      const sent = conversation(stream);
      // What the dialect cannot send never reaches it (the model rules drop or refuse it first).
      for (const name of dialect.unsendable ?? []) delete sent[name];
      const ex = received(pair, dialect.fromCanonical(structuredClone(sent), translating(pair)));
      t.equal(ex.stream, stream, `stream: ${stream}`);
      t.same(essentials(family.toCanonical(ex, family.name)), essentials(sent), `stream: ${stream}`);
    }
  });

  t.test(`${family.name}: an answer the family writes, the dialect reads back the same`, async (t) => {
    for (const [name, answer] of Object.entries(answers)) {
      const ex = received(pair, dialect.fromCanonical(conversation(false), translating(pair)));
      family.toCanonical(ex, family.name);
      const body = Buffer.from(family.writeResponse(structuredClone(answer), ex));
      t.same(answerEssentials(dialect.readResponse(body, ex)), answerEssentials(answer), name);
    }
  });

  t.test(`${family.name}: a stream the family writes, the dialect reads back the same, however it is cut`, async (t) => {
    const bytes = written(pair, streamed);
    const expected = answerEssentials(collect(streamed));
    t.same(answerEssentials(collect(read([bytes], dialect.streamReader(translating(pair))))), expected, 'whole');
    for (let seed = 1; seed <= 20; seed++) {
      const events = read(splitAt(bytes, seed), dialect.streamReader(translating(pair)));
      t.same(answerEssentials(collect(events)), expected, `split with seed ${seed}`);
    }
  });

  t.test(`${family.name}: a failure the family writes midway, the dialect reads as a failure`, async (t) => {
    const bytes = written(pair, streamed.slice(0, 4), new GatewayError('upstream_error', 'The upstream went away midway.'));
    const events = read([bytes], dialect.streamReader(translating(pair)));
    // The relay stops reading at the first error event: it must come before any finish.
    const at = events.findIndex((e) => e.type === 'error' || e.type === 'finish');
    const failure = events[at];
    t.equal(failure?.type, 'error', 'an error event, before any finish');
    t.match(failure?.type === 'error' && failure.error.message, /went away midway/);
  });

  t.test(`${family.name}: an error body the family writes, the dialect reads with its status and message`, async (t) => {
    for (const status of [400, 401, 403, 404, 413, 429, 500, 503]) {
      const err = new GatewayError(codeForStatus(status), `Refused with ${status}.`, null, status);
      const read = dialect.readError(status, Buffer.from(family.errorBody(err)));
      t.equal(read.status, status, `status ${status}`);
      t.equal(read.message, err.message, `message of ${status}`);
    }
  });
}
