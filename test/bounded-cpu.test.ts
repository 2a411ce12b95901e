/**
 * Token estimation never holds the event loop: 2 MB prompts without a space (one huge "word" for
 * the BPE tokenizer) go through the gateway to the in-process simulator of every family, streamed
 * and not, and through an aborted stream whose usage must be estimated, while /healthz keeps
 * answering. The worst event-loop delay seen is reported, not asserted. Also the estimator's own
 * contract: exact on ordinary text within its budget, deterministic, close beyond it.
 */
import { monitorEventLoopDelay } from 'node:perf_hooks';
import fc from 'fast-check';
import { countTokens } from 'gpt-tokenizer';
import t from 'tap';
import { EXACT_BYTES, PIECE_CHARS, estimateTokens } from '../src/tokens.js';
import { eventually, startTestGateway } from './helpers.js';

const PROMPT_CHARS = 2 * 1024 * 1024;
const plain = (text: string) => countTokens(text, { disallowedSpecial: new Set() });

/** Deterministic pseudo-random lowercase letters: no spaces, and no chunk repeats (no cache helps). */
function letters(length: number, seed = 1): string {
  const out = Buffer.alloc(length);
  let state = seed;
  for (let i = 0; i < length; i++) {
    state = (Math.imul(state, 1103515245) + 12345) >>> 0;
    out[i] = 97 + (state >>> 16) % 26;
  }
  return out.toString('latin1');
}

t.test('estimator: exactly countTokens on ordinary text within the budget', async (t) => {
  const word = fc.oneof(
    fc.stringMatching(/^[A-Za-z]{1,12}$/),
    fc.stringMatching(/^[0-9]{1,6}$/),
    fc.constantFrom(' ', '  ', '\n', '\n\n', '\t', ', ', '. ', "'s", '!?', '<|endoftext|>', 'é', '日本語', '👋🏽', '\r\n'),
  );
  const text = fc.array(word, { maxLength: 300 }).map((w) => w.join(''));
  fc.assert(
    fc.property(text, (s) => Buffer.byteLength(s) > EXACT_BYTES || estimateTokens(s) === plain(s)),
    { numRuns: 300 },
  );
  const texts = fc.array(text, { maxLength: 6 });
  fc.assert(
    fc.property(texts, (list) => Buffer.byteLength(list.join('')) > EXACT_BYTES || estimateTokens(list) === list.reduce((n, s) => n + plain(s), 0)),
    { numRuns: 100 },
  );
  t.equal(estimateTokens(''), 0);
  t.equal(estimateTokens([]), 0);
  t.equal(estimateTokens('Describe <|endoftext|> these.'), plain('Describe <|endoftext|> these.'), 'special-token markup is plain text');
});

t.test('estimator: long inputs are deterministic and close to the exact count', async (t) => {
  const prose = 'The quick brown fox jumps over the lazy dog near the river bank, and 42 owls watch. ';
  const cases: [string, string][] = [
    ['prose', prose.repeat(3000)],
    ['words', 'word '.repeat(100_000)],
    ['one long word', letters(40_000)],
    ['digits', '1234567890'.repeat(5000)],
    ['CJK', '日本語のテキスト、'.repeat(3000)],
  ];
  for (const [name, text] of cases) {
    const estimate = estimateTokens(text);
    t.equal(estimateTokens(text), estimate, `${name}: the same text, the same count`);
    // The exact count of a long piece is what chunking approximates: count it in small exact pieces.
    let exact = 0;
    for (let i = 0; i < text.length; i += 4096) exact += plain(text.slice(i, i + 4096));
    t.ok(Math.abs(estimate - exact) <= exact * 0.05, `${name}: estimate ${estimate} within 5% of ${exact}`);
  }
  const parts = [prose.repeat(200), letters(PIECE_CHARS * 3, 7), prose.repeat(200)];
  t.equal(estimateTokens(parts), estimateTokens([...parts]), 'a list is counted the same way each time');
  t.ok(estimateTokens(parts) > estimateTokens(parts.slice(0, 2)), 'every text of a list counts');
});

const gw = await startTestGateway(
  (dataDir) => `
dataDir: ${dataDir}
server: { shutdownTimeoutMs: 2000 }
upstreams:
  chat: { kind: simulator }
  responses: { kind: simulator, family: responses }
  gemini: { kind: simulator, family: gemini }
models:
  - { id: sim-chat, upstream: chat }
  - { id: sim-responses, upstream: responses }
  - { id: sim-gemini, upstream: gemini }
`,
);
t.teardown(() => gw.stop());

const huge = letters(PROMPT_CHARS, 42);
// Paced answers keep each exchange in flight for a while after the prompt was read.
const DIRECTIVE = '[[sim tokens=30 tps=30]]';
const prompts = {
  chat: (stream: boolean) => ({
    path: '/v1/chat/completions',
    headers: { authorization: `Bearer ${gw.key}` },
    body: { model: 'sim-chat', stream, ...(stream ? { stream_options: { include_usage: true } } : {}), messages: [{ role: 'user', content: [{ type: 'text', text: huge }, { type: 'text', text: DIRECTIVE }] }] },
  }),
  responses: (stream: boolean) => ({
    path: '/v1/responses',
    headers: { authorization: `Bearer ${gw.key}` },
    body: { model: 'sim-responses', stream, input: [{ role: 'user', content: [{ type: 'input_text', text: huge }, { type: 'input_text', text: DIRECTIVE }] }] },
  }),
  gemini: (stream: boolean) => ({
    path: stream ? '/v1beta/models/sim-gemini:streamGenerateContent?alt=sse' : '/v1beta/models/sim-gemini:generateContent',
    headers: { 'x-goog-api-key': gw.key },
    body: { contents: [{ role: 'user', parts: [{ text: huge }, { text: DIRECTIVE }] }] },
  }),
};

let worstDelayMs = 0;

/** Runs `work` while /healthz is probed back to back; returns how many probes were answered meanwhile. */
async function whileProbing(work: Promise<unknown>): Promise<number> {
  let finished = false;
  const done = work.finally(() => (finished = true));
  let answered = 0;
  while (!finished) {
    const res = await fetch(`${gw.url}/healthz`);
    const health = (await res.json()) as { status: string };
    if (health.status === 'ok' && !finished) answered++;
  }
  await done;
  return answered;
}

function measured<T>(run: () => Promise<T>): Promise<T> {
  const histogram = monitorEventLoopDelay({ resolution: 1 });
  histogram.enable();
  return run().finally(() => {
    histogram.disable();
    worstDelayMs = Math.max(worstDelayMs, histogram.max / 1e6);
  });
}

for (const family of ['chat', 'responses', 'gemini'] as const) {
  for (const stream of [false, true]) {
    t.test(`${family}${stream ? ', streamed' : ''}: a 2 MB prompt without spaces leaves /healthz answering`, { timeout: 30_000 }, async (t) => {
      const { path, headers, body } = prompts[family](stream);
      const payload = JSON.stringify(body);
      const request = (async () => {
        const res = await fetch(gw.url + path, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: payload });
        return { status: res.status, text: await res.text() };
      })();
      const answered = await measured(() => whileProbing(request));
      const { status, text } = await request;
      t.equal(status, 200, text.slice(0, 300));
      t.ok(answered >= 3, `${answered} health probes answered while the request was in flight`);
      const usage = text.match(/"(prompt_tokens|input_tokens|promptTokenCount)":(\d+)/);
      t.ok(usage && Number(usage[2]) > PROMPT_CHARS / 8, `the simulator counted the prompt: ${usage?.[0]}`);
    });
  }
}

t.test('an aborted stream with a 2 MB prompt gets an estimate without holding the loop', { timeout: 30_000 }, async (t) => {
  const controller = new AbortController();
  const { path, headers, body } = prompts.chat(true);
  body.messages[0]!.content[1]!.text = '[[sim tokens=400 tps=20]]';
  let requestId: string | null = null;
  const aborted = (async () => {
    const res = await fetch(gw.url + path, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...headers },
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    requestId = res.headers.get('x-request-id');
    const reader = res.body!.getReader();
    await reader.read();
    controller.abort();
    await reader.read().catch(() => undefined);
  })();
  const record = (async () => {
    await aborted;
    return eventually(async () => {
      const { body } = await gw.admin('GET', '/admin/usage');
      return body.records.find((r: { requestId: string }) => r.requestId === requestId);
    }, 'the usage record of the aborted stream', 10_000);
  })();
  const answered = await measured(() => whileProbing(record));
  t.ok(answered >= 1, `${answered} health probes answered until the record was written`);
  const r = await record;
  t.match(r, { outcome: 'aborted', estimated: true, streamed: true });
  const expected = estimateTokens(huge);
  t.ok(Math.abs(r.promptTokens - expected) <= expected * 0.1, `prompt estimated at ${r.promptTokens} tokens (the text alone: ${expected})`);
});

t.test('report', async (t) => {
  t.comment(`worst event-loop delay while 2 MB prompts were served: ${worstDelayMs.toFixed(1)} ms`);
  t.pass();
});
