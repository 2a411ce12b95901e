/**
 * The four stream writers write a text delta through a template (src/json-template.ts), not by
 * serialising the event object (docs/architecture.md, "Translated streams, eighth pass"). Every
 * frame they write must still be exactly what `JSON.stringify` makes of its own parse (no stray
 * space, the same escaping), with a delta's fields in the order the provider sends them. Random
 * text (any code unit, lone surrogates and controls included) goes through each writer; each frame
 * is checked that way, and the text read back from the frames is the text written.
 */
import fc from 'fast-check';
import t from 'tap';
import type { Event, StreamWriter } from '../src/canonical.js';
import { Exchange } from '../src/exchange.js';
import { HOLE, jsonTemplate } from '../src/json-template.js';
import { defaultRequestCaps } from '../src/request-caps.js';
import { chatStreamWriter } from '../plugins/codecs/chat/stream.js';
import { family as chatFamily } from '../plugins/codecs/chat/family.js';
import { geminiStreamWriter, sseMode } from '../plugins/codecs/gemini/stream.js';
import { family as geminiFamily } from '../plugins/codecs/gemini/family.js';
import { messagesFamily } from '../plugins/codecs/messages/family.js';
import { messagesStreamWriter } from '../plugins/codecs/messages/stream.js';
import { openAiErrorBody } from '../plugins/codecs/openai-common.js';
import { family as responsesFamily } from '../plugins/codecs/responses/family.js';
import { responsesStreamWriter } from '../plugins/codecs/responses/stream.js';

function exchange(family: object, request: Record<string, unknown>, modelId: string): Exchange {
  const ex = new Exchange(family as never, { method: 'post', path: '/', kind: 'generate' }, 'POST', '/', '', {}, []);
  ex.request = request;
  ex.modelId = modelId;
  return ex;
}

interface Writer {
  name: string;
  make(modelId: string): StreamWriter;
  /** The JSON payloads of a stream's frames. */
  payloads(stream: string): string[];
  /** The text and the reasoning a payload carries. */
  read(payload: any): { text: string; reasoning: string };
  /** For a payload that carries a delta, its objects with their fields in the order the provider sends them. */
  order(payload: any): [object, string[]][];
}

const sseData = (stream: string) =>
  stream
    .split('\n\n')
    .filter(Boolean)
    .map((frame) => frame.slice(frame.indexOf('data: ') + 'data: '.length))
    .filter((data) => data !== '[DONE]');

const none = { text: '', reasoning: '' };
const geminiRead = (p: any) => {
  const parts: any[] = p.candidates?.[0]?.content?.parts ?? [];
  return { text: parts.filter((x) => !x.thought).map((x) => x.text ?? '').join(''), reasoning: parts.filter((x) => x.thought).map((x) => x.text).join('') };
};

const geminiOrder = (p: any): [object, string[]][] => {
  const candidate = p.candidates?.[0];
  if (!candidate) return [];
  return [
    [p, ['candidates', ...(p.usageMetadata ? ['usageMetadata'] : []), 'modelVersion', 'responseId']],
    [candidate, ['content', ...(candidate.finishReason ? ['finishReason'] : []), 'index']],
    [candidate.content, ['role', 'parts']],
  ];
};

const writers: Writer[] = [
  {
    name: 'chat',
    make: (model) => chatStreamWriter(exchange(chatFamily, { model, stream: true, stream_options: { include_usage: true } }, model), openAiErrorBody),
    payloads: sseData,
    read: (p) => ({ text: p.choices?.[0]?.delta?.content ?? '', reasoning: p.choices?.[0]?.delta?.reasoning_content ?? '' }),
    order: (p) => (p.choices?.length ? [[p, ['id', 'object', 'created', 'model', 'choices', 'usage']], [p.choices[0], ['index', 'delta', 'logprobs', 'finish_reason']]] : []),
  },
  {
    name: 'Gemini, SSE',
    make: (model) => {
      const ex = exchange(geminiFamily, { contents: [] }, model);
      ex.set(sseMode, true);
      return geminiStreamWriter(ex, (err) => JSON.stringify({ error: { message: err.message } }));
    },
    payloads: sseData,
    read: geminiRead,
    order: geminiOrder,
  },
  {
    name: 'Gemini, JSON array',
    make: (model) => geminiStreamWriter(exchange(geminiFamily, { contents: [] }, model), (err) => JSON.stringify({ error: { message: err.message } })),
    // The array's elements as written: `[`, then each element's JSON after `,\r\n`, then `]` (a raw
    // CR LF is never inside a JSON string, so the separators are the only ones).
    payloads: (stream) => {
      if (!stream.startsWith('[') || !stream.endsWith(']')) throw new Error(`not a JSON array: ${stream.slice(0, 40)}`);
      return stream.slice(1, -1).split(',\r\n');
    },
    read: geminiRead,
    order: geminiOrder,
  },
  {
    name: 'Responses',
    make: (model) => responsesStreamWriter(exchange(responsesFamily, { model, input: 'x', stream: true }, model)),
    payloads: sseData,
    read: (p) => ({
      text: p.type === 'response.output_text.delta' ? p.delta : '',
      reasoning: p.type === 'response.reasoning_summary_text.delta' ? p.delta : '',
    }),
    order: (p) =>
      p.type === 'response.output_text.delta'
        ? [[p, ['type', 'sequence_number', 'item_id', 'output_index', 'content_index', 'delta', 'logprobs']]]
        : p.type === 'response.reasoning_summary_text.delta'
          ? [[p, ['type', 'sequence_number', 'item_id', 'output_index', 'summary_index', 'delta']]]
          : [],
  },
  {
    name: 'Messages',
    make: (model) => messagesStreamWriter(exchange(messagesFamily(defaultRequestCaps), { model, max_tokens: 100, messages: [{ role: 'user', content: 'Hi' }] }, model)),
    payloads: sseData,
    read: (p) => (p.type === 'content_block_delta' ? { text: p.delta.text ?? '', reasoning: p.delta.thinking ?? '' } : none),
    order: (p) => (p.type === 'content_block_delta' ? [[p, ['type', 'index', 'delta']], [p.delta, ['type', p.delta.type === 'thinking_delta' ? 'thinking' : 'text']]] : []),
  },
];

/** Any UTF-16 text: lone surrogates, controls, quotes and backslashes included. */
const anyText = fc.string({ unit: fc.oneof(fc.constantFrom('"', '\\', '\n', '\u2028', '\u0000', '\ud800', '\udc00', '😀'), fc.integer({ min: 0, max: 0xffff }).map((c) => String.fromCharCode(c))), minLength: 1, maxLength: 12 });
const stream = fc.array(fc.record({ type: fc.constantFrom('text' as const, 'reasoning' as const), delta: anyText }), { minLength: 1, maxLength: 12 });
const modelId = fc.oneof(fc.constant('client-model'), anyText);

t.test('a template is the JSON cut at its holes, wherever they are', async (t) => {
  const pieces = jsonTemplate({ a: HOLE, b: { c: [1, HOLE] }, d: 'sluice:hole', e: '\u0000' });
  t.same(pieces, ['{"a":', ',"b":{"c":[1,', ']},"d":"sluice:hole","e":"\\u0000"}']);
  t.equal(pieces[0] + JSON.stringify('x"y') + pieces[1] + 7 + pieces[2], JSON.stringify({ a: 'x"y', b: { c: [1, 7] }, d: 'sluice:hole', e: '\u0000' }));
  t.same(jsonTemplate({ a: 1 }), ['{"a":1}'], 'no hole, one piece');
});

for (const writer of writers) {
  t.test(`${writer.name}: every frame is its own JSON.stringify, and the text comes back whole`, async (t) => {
    let frames = 0;
    fc.assert(
      fc.property(stream, modelId, (deltas, model) => {
        const w = writer.make(model);
        const events: Event[] = [{ type: 'start' }, ...deltas, { type: 'finish', reason: 'stop' }, { type: 'usage', usage: { inputTokens: 3, outputTokens: deltas.length } }];
        const written = events.map((e) => w.event(e)).join('') + w.end();
        let text = '';
        let reasoning = '';
        for (const payload of writer.payloads(written)) {
          const parsed = JSON.parse(payload);
          if (JSON.stringify(parsed) !== payload) throw new Error(`not as JSON.stringify writes it: ${payload}`);
          for (const [object, fields] of writer.order(parsed)) {
            if (Object.keys(object).join() !== fields.join()) throw new Error(`fields ${Object.keys(object).join()} where ${fields.join()} are sent: ${payload}`);
          }
          const read = writer.read(parsed);
          text += read.text;
          reasoning += read.reasoning;
          frames++;
        }
        const wanted = (type: 'text' | 'reasoning') =>
          deltas
            .filter((e) => e.type === type)
            .map((e) => e.delta)
            .join('');
        if (text !== wanted('text') || reasoning !== wanted('reasoning')) throw new Error(`read back ${JSON.stringify([text, reasoning])}`);
      }),
      { numRuns: 200 },
    );
    t.ok(frames > 200, `${frames} frames checked`);
  });
}
