/**
 * Recorded upstream streams replayed through the translation path, whole and split at random
 * chunk boundaries: chat streams through the bridge into Responses events, and Responses streams
 * into chat chunks. The output must follow each family's rules and carry the same answer.
 */
import { readFileSync } from 'node:fs';
import t, { type Test } from 'tap';
import { collect, type Event, type StreamReader, type StreamWriter } from '../src/canonical.js';
import { Exchange } from '../src/exchange.js';
import { SseSplitter, frameData } from '../src/sse.js';
import { chatStreamReader, chatStreamWriter } from '../plugins/codecs/chat/stream.js';
import { openAiErrorBody } from '../plugins/codecs/openai-common.js';
import { responsesStreamReader, responsesStreamWriter } from '../plugins/codecs/responses/stream.js';
import { geminiStreamReader } from '../plugins/codecs/gemini/stream.js';

const fixture = (name: string) => readFileSync(new URL(`../../test/fixtures/${name}`, import.meta.url));

function exchange(request: Record<string, unknown>): Exchange {
  const ex = new Exchange({} as never, { method: 'post', path: '/', kind: 'generate' }, 'POST', '/', '', {}, []);
  ex.request = request;
  ex.modelId = 'client-model';
  return ex;
}

/** Random cut points, reproducible per seed. */
function splitAt(bytes: Buffer, seed: number): Buffer[] {
  const pieces: Buffer[] = [];
  let state = seed;
  for (let at = 0; at < bytes.length; ) {
    state = (state * 1103515245 + 12345) % 2 ** 31;
    const size = 1 + (state % 97);
    pieces.push(bytes.subarray(at, at + size));
    at += size;
  }
  return pieces;
}

/** Replays upstream bytes through reader → writer; returns the client's text and the events. */
function replay(pieces: Buffer[], reader: StreamReader, writer: StreamWriter) {
  const splitter = new SseSplitter();
  const events: Event[] = [];
  let out = '';
  const visit = (frame: Buffer) => {
    const data = frameData(frame);
    if (data !== null) for (const e of reader.frame(data)) (events.push(e), (out += writer.event(e)));
    return false;
  };
  for (const piece of pieces) splitter.push(piece, visit, () => {});
  for (const e of reader.end()) (events.push(e), (out += writer.event(e)));
  return { out: out + writer.end(), events };
}

/** Checks a Responses event stream the way the official SDK's accumulator does (2.9). */
function checkResponsesStream(t: Test, text: string) {
  const frames = text.trim().split('\n\n');
  const events = frames.map((f) => {
    const [eventLine, dataLine] = f.split('\n');
    const data = JSON.parse(dataLine!.slice('data: '.length));
    if (eventLine !== `event: ${data.type}`) throw new Error(`event line ${eventLine} for ${data.type}`);
    return data;
  });
  const problems: string[] = [];
  events.forEach((e, i) => e.sequence_number !== i && problems.push(`sequence ${e.sequence_number} at ${i}`));
  if (events[0].type !== 'response.created' || events[1].type !== 'response.in_progress') problems.push('does not open with created, in_progress');
  const terminal = events.filter((e) => /^response\.(completed|incomplete|failed)$/.test(e.type));
  if (terminal.length !== 1 || terminal[0] !== events.at(-1)) problems.push('not exactly one terminal event, last');
  const items: any[] = [];
  const ids = new Set<string>();
  for (const e of events) {
    if (e.type === 'response.output_item.added') {
      if (e.output_index !== items.length) problems.push(`output_index ${e.output_index} added when ${items.length} exist`);
      if (ids.has(e.item.id)) problems.push(`duplicate id ${e.item.id}`);
      ids.add(e.item.id);
      items.push({ ...e.item, text: '', args: '' });
    } else if (e.item_id !== undefined) {
      const item = items[e.output_index];
      if (!item || item.id !== e.item_id) problems.push(`${e.type} for unknown item ${e.item_id}`);
      else if (e.type === 'response.output_text.delta') item.text += e.delta;
      else if (e.type === 'response.function_call_arguments.delta') item.args += e.delta;
      else if (e.type === 'response.output_text.done' && e.text !== item.text) problems.push('text done differs from deltas');
      else if (e.type === 'response.function_call_arguments.done' && e.arguments !== item.args) problems.push('arguments done differ from deltas');
    } else if (e.type === 'response.output_item.done') {
      items[e.output_index] = { ...items[e.output_index], done: e.item };
    }
  }
  const final = terminal[0]?.response;
  if (items.some((i) => !i.done)) problems.push('an item was never done');
  t.same(problems, [], 'the stream follows the Responses rules');
  t.same(final?.output, items.map((i) => i.done), 'the final response holds every done item');
  return { events, final };
}

for (const name of ['chat-text.sse', 'chat-tool.sse', 'chat-parallel-tools.sse']) {
  t.test(`bridge: ${name} → Responses events`, async (t) => {
    const bytes = fixture(name);
    const whole = replay([bytes], chatStreamReader(), responsesStreamWriter(exchange({ model: 'client-model', input: 'x' })));
    const answer = collect(whole.events);
    const { final } = checkResponsesStream(t, whole.out);
    t.equal(final.status, 'completed');
    t.ok(final.usage.input_tokens > 0 && final.usage.output_tokens > 0, 'usage reached response.completed');
    const calls = final.output.filter((i: any) => i.type === 'function_call');
    t.same(calls.map((c: any) => [c.call_id, c.arguments]), answer.toolCalls.map((c) => [c.id, c.arguments]));
    calls.forEach((c: any) => t.doesNotThrow(() => JSON.parse(c.arguments), 'arguments are whole JSON'));
    const message = final.output.find((i: any) => i.type === 'message');
    t.equal(message?.content[0].text ?? '', answer.text);
    if (answer.reasoning) t.equal(final.output[0].type, 'reasoning', 'reasoning comes first');

    for (let seed = 1; seed <= 25; seed++) {
      const split = replay(splitAt(bytes, seed), chatStreamReader(), responsesStreamWriter(exchange({ model: 'client-model', input: 'x' })));
      const again = collect(split.events);
      if (JSON.stringify(again) !== JSON.stringify(answer)) {
        t.fail(`seed ${seed}: split replay differs`);
        return;
      }
    }
    t.pass('25 random splits give the same answer');
  });
}

t.test('bridge: parallel calls keep separate indexes and ids', async (t) => {
  const { events } = replay([fixture('chat-parallel-tools.sse')], chatStreamReader(), responsesStreamWriter(exchange({ model: 'm', input: 'x' })));
  const answer = collect(events);
  t.same(answer.toolCalls.map((c) => [c.id, JSON.parse(c.arguments).city]), [['call_oslo', 'Oslo'], ['call_rome', 'Rome']]);
  t.equal(answer.reasoning, 'Two cities need two calls.');
  t.same(answer.usage, { inputTokens: 31, outputTokens: 22, cachedTokens: undefined, reasoningTokens: 7 });
});

for (const name of ['responses-reasoning-text.sse', 'responses-tool.sse']) {
  t.test(`translated: ${name} → chat chunks`, async (t) => {
    const bytes = fixture(name);
    const ex = exchange({ model: 'client-model', messages: [], stream: true, stream_options: { include_usage: true } });
    const whole = replay([bytes], responsesStreamReader(), chatStreamWriter(ex, openAiErrorBody));
    const answer = collect(whole.events);
    const frames = whole.out.trim().split('\n\n');
    t.equal(frames.at(-1), 'data: [DONE]');
    const chunks = frames.slice(0, -1).map((f) => JSON.parse(f.slice('data: '.length)));
    t.ok(chunks.every((c) => c.id === chunks[0].id && c.object === 'chat.completion.chunk'), 'one id for the stream');
    t.same(chunks[0].choices[0].delta, { role: 'assistant', content: '' });
    const usageChunk = chunks.at(-1);
    t.same(usageChunk.choices, []);
    t.equal(usageChunk.usage.completion_tokens, answer.usage?.outputTokens);
    const finish = chunks.map((c) => c.choices[0]?.finish_reason).filter(Boolean);
    t.same(finish, [answer.toolCalls.length ? 'tool_calls' : 'stop'], 'one finish reason');
    let text = '';
    const args: string[] = [];
    for (const c of chunks) {
      text += c.choices[0]?.delta.content ?? '';
      for (const d of c.choices[0]?.delta.tool_calls ?? []) args[d.index] = (args[d.index] ?? '') + (d.function?.arguments ?? '');
    }
    t.equal(text, answer.text);
    t.same(args, answer.toolCalls.map((c) => c.arguments));

    for (let seed = 1; seed <= 25; seed++) {
      const split = replay(splitAt(bytes, seed), responsesStreamReader(), chatStreamWriter(ex, openAiErrorBody));
      if (JSON.stringify(collect(split.events)) !== JSON.stringify(answer)) {
        t.fail(`seed ${seed}: split replay differs`);
        return;
      }
    }
    t.pass('25 random splits give the same answer');
  });
}

t.test('gemini: calls in separate chunks keep counting, usage is the last total, CRLF framing', async (t) => {
  const bytes = fixture('gemini-parallel-calls.sse');
  const ex = exchange({ model: 'm', messages: [], stream: true, stream_options: { include_usage: true } });
  const answer = collect(replay([bytes], geminiStreamReader(), chatStreamWriter(ex, openAiErrorBody)).events);
  t.same(answer.toolCalls.map((c) => [JSON.parse(c.arguments).city, c.signature]), [['Oslo', 'c2lnLTE='], ['Rome', undefined]]);
  t.not(answer.toolCalls[0]!.id, answer.toolCalls[1]!.id, 'synthesized ids are distinct');
  t.equal(answer.finishReason, 'tool_calls', 'STOP with calls is tool_calls');
  t.same(answer.usage, { inputTokens: 20, outputTokens: 16, cachedTokens: undefined, reasoningTokens: 4 });
  t.equal(answer.reasoning, 'Checking both.');
  const { out } = replay([bytes], geminiStreamReader(), chatStreamWriter(ex, openAiErrorBody));
  const indexes = out
    .split('\n\n')
    .filter((f) => f.startsWith('data: {'))
    .flatMap((f) => JSON.parse(f.slice(6)).choices[0]?.delta.tool_calls ?? [])
    .filter((d: any) => d.id)
    .map((d: any) => d.index);
  t.same(indexes, [0, 1], 'chat clients see two calls at indexes 0 and 1');
  for (let seed = 1; seed <= 25; seed++) {
    const again = collect(replay(splitAt(bytes, seed), geminiStreamReader(), chatStreamWriter(ex, openAiErrorBody)).events);
    if (JSON.stringify(again.toolCalls.map((c) => c.arguments)) !== JSON.stringify(answer.toolCalls.map((c) => c.arguments)) || again.usage?.outputTokens !== 16) {
      t.fail(`seed ${seed}: split replay differs`);
      return;
    }
  }
  t.pass('25 random splits give the same answer');
});

t.test('a failure midway ends a bridged stream with response.failed', async (t) => {
  const bytes = fixture('chat-text.sse');
  const writer = responsesStreamWriter(exchange({ model: 'm', input: 'x' }));
  const reader = chatStreamReader();
  let out = '';
  const frames = bytes.toString().split('\n\n').slice(0, 4);
  for (const f of frames) for (const e of reader.frame(frameData(Buffer.from(f + '\n\n'))!)) out += writer.event(e);
  const { GatewayError } = await import('../src/errors.js');
  out += writer.fail(new GatewayError('upstream_error', 'upstream closed the stream midway'));
  const { final } = checkResponsesStream(t, out);
  t.equal(final.status, 'failed');
  t.same(final.error, { code: 'upstream_error', message: 'upstream closed the stream midway' });
});
