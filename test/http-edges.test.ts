/**
 * HTTP at the edges, over raw sockets: request framing, the key checked before any body byte is
 * read, the body budget, pipelining, the exclusive bind, and what uWebSockets.js itself does with
 * requests it cannot parse. None of it may crash, hang or take memory without bound.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { uwsVersion } from '../src/uws.js';
import { startStack, startTestGateway } from './helpers.js';

interface RawAnswer {
  text: string;
  /** The server closed the connection before the wait was over. */
  closed: boolean;
}

/** Writes `bytes` to the gateway and collects what comes back until it closes or `waitMs` passes. */
function raw(port: number, bytes: string | Buffer, waitMs = 1500, until?: (text: string) => boolean): Promise<RawAnswer> {
  return new Promise((resolve) => {
    const socket = connect(port, '127.0.0.1');
    let text = '';
    const finish = (closed: boolean) => {
      clearTimeout(timer);
      socket.destroy();
      resolve({ text, closed });
    };
    const timer = setTimeout(() => finish(false), waitMs);
    socket.on('data', (d) => {
      text += d.toString('latin1');
      if (until?.(text)) finish(false);
    });
    socket.on('close', () => finish(true));
    socket.on('error', () => {});
    socket.write(bytes);
  });
}

const status = (text: string) => Number(/^HTTP\/1\.1 (\d{3})/.exec(text)?.[1] ?? 0);
const post = (path: string, headers: string[], body = '') => `POST ${path} HTTP/1.1\r\nHost: x\r\n${headers.map((h) => `${h}\r\n`).join('')}\r\n${body}`;
const generatePaths = ['/v1/chat/completions', '/v1/responses', '/v1beta/models/sim-gemini:generateContent'];

const { gw } = await startStack(
  (url) => `
upstreams:
  sim: { kind: openai-chat, baseUrl: ${url}/v1 }
models:
  - { id: sim-chat, upstream: sim }
`,
  { maxBodyBytes: 65536, maxInFlightBodyBytes: 100000 },
);
const port = Number(new URL(gw.url).port);
const healthy = async () => (await fetch(`${gw.url}/healthz`)).status === 200;

t.test('a bad Content-Length is refused before anything is allocated, on every POST path, with or without a key', async (t) => {
  for (const path of [...generatePaths, '/admin/keys']) {
    // uWebSockets.js's parser closes these connections itself once the handler returns, so the
    // 400 Sluice writes may not leave; what matters is no crash, no allocation and no hang.
    for (const header of ['Content-Length: -1', 'Content-Length: 12abc', 'Content-Length: 99999999999999999999']) {
      const answer = await raw(port, post(path, [header], '{}'), 1500, (text) => text.includes('\r\n\r\n'));
      t.ok(status(answer.text) === 400 || (answer.closed && answer.text === ''), `${path} ${header}: 400 or closed`);
    }
    const large = await raw(port, post(path, ['Content-Length: 10000000']), 1500, (text) => text.includes('\r\n\r\n'));
    t.equal(status(large.text), 413, `${path}: larger than the limit`);
    const twice = await raw(port, post(path, ['Content-Length: 2', 'Content-Length: 2'], '{}'), 1500, (text) => text.includes('\r\n\r\n'));
    t.equal(status(twice.text), 400, `${path}: two Content-Length headers`);
  }
  t.ok(await healthy(), 'the gateway still serves');
});

/** The JSON body of a raw answer (its first one), once it has all arrived. */
const jsonOf = (text: string) => JSON.parse(text.slice(text.indexOf('\r\n\r\n') + 4).replace(/^[0-9a-f]+\r\n/i, ''));
const complete = (text: string) => text.includes('\r\n\r\n') && /}\s*(\r\n0\r\n\r\n)?$/.test(text);

t.test('a POST without Content-Length or Transfer-Encoding has an empty body (RFC 9112 §6.3), on every route', async (t) => {
  // What `curl -X POST URL -H "Authorization: Bearer …"` sends.
  const reload = await raw(port, post('/admin/reload', [`Authorization: Bearer ${gw.adminToken}`]), 3000, complete);
  t.equal(status(reload.text), 200, `POST /admin/reload: ${reload.text.split('\r\n')[0]}`);
  t.match(jsonOf(reload.text), { applied: true });

  const shapes: [string, string[], (body: any) => unknown][] = [
    ['/v1/chat/completions', [`Authorization: Bearer ${gw.key}`], (b) => t.match(b, { error: { type: 'invalid_request_error', code: 'invalid_request' } })],
    ['/v1/responses', [`Authorization: Bearer ${gw.key}`], (b) => t.match(b, { error: { type: 'invalid_request_error', code: 'invalid_request' } })],
    ['/v1beta/models/sim-chat:generateContent', [`x-goog-api-key: ${gw.key}`], (b) => t.match(b, { error: { code: 400, status: 'INVALID_ARGUMENT' } })],
    ['/v1/messages', [`x-api-key: ${gw.key}`, 'anthropic-version: 2023-06-01'], (b) => t.match(b, { type: 'error', error: { type: 'invalid_request_error' } })],
  ];
  for (const [path, headers, shape] of shapes) {
    const answer = await raw(port, post(path, headers), 3000, complete);
    t.equal(status(answer.text), 400, `${path}: 400, not 411`);
    const body = jsonOf(answer.text);
    shape(body);
    t.match(body.error.message, /request body is empty.*JSON object/i, `${path} says what is missing: ${body.error.message}`);
  }
});

t.test('a bodyless POST leaves the connection in step: the next request on it is answered', async (t) => {
  const get = `GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n`;
  const answer = await raw(port, post('/v1/chat/completions', [`Authorization: Bearer ${gw.key}`]) + get, 3000, (text) => text.includes('"status":"ok"'));
  t.equal(status(answer.text), 400);
  t.match(answer.text, /HTTP\/1\.1 200[\s\S]*"status":"ok"/, 'the pipelined GET after it is answered');
});

t.test('chunked bodies are still read, and still capped', async (t) => {
  const body = JSON.stringify({ model: 'sim-chat', messages: [{ role: 'user', content: 'hi' }] });
  const chunked = `${body.length.toString(16)}\r\n${body}\r\n0\r\n\r\n`;
  const ok = await raw(port, post('/v1/chat/completions', [`Authorization: Bearer ${gw.key}`, 'Content-Type: application/json', 'Transfer-Encoding: chunked'], chunked), 3000, complete);
  t.equal(status(ok.text), 200, 'a chunked request is served');
  const big = 'x'.repeat(70_000);
  const tooBig = await raw(port, post('/v1/chat/completions', [`Authorization: Bearer ${gw.key}`, 'Transfer-Encoding: chunked'], `${big.length.toString(16)}\r\n${big}\r\n0\r\n\r\n`), 3000, complete);
  t.equal(status(tooBig.text), 413, 'a chunked body over maxBodyBytes is refused');
  t.ok(await healthy(), 'the gateway still serves');
});

t.test('a Transfer-Encoding other than chunked alone is refused and the connection closed (RFC 9112 §6.1)', async (t) => {
  const body = JSON.stringify({ model: 'sim-chat', messages: [{ role: 'user', content: 'hi' }] });
  const chunked = `${body.length.toString(16)}\r\n${body}\r\n0\r\n\r\n`;
  for (const [coding, expected] of [
    ['xchunked', 400],
    ['chunked, identity', 400],
    ['gzip, chunked', 501],
    ['CHUNKED', 200],
  ] as const) {
    const answer = await raw(port, post('/v1/chat/completions', [`Authorization: Bearer ${gw.key}`, 'Content-Type: application/json', `Transfer-Encoding: ${coding}`], chunked), 3000, complete);
    t.equal(status(answer.text), expected, coding);
    if (expected !== 200) t.match(answer.text, /send Transfer-Encoding: chunked/, 'the message says what to send');
  }
  t.ok(await healthy(), 'the gateway still serves');
});

t.test('an unauthenticated request gets its 401 without the body being read', async (t) => {
  // The headers promise 60 KB that never come: the answer must not wait for them.
  for (const path of generatePaths) {
    const answer = await raw(port, post(path, ['Content-Length: 60000', 'Content-Type: application/json']), 3000, (text) => text.includes('}'));
    t.equal(status(answer.text), 401, path);
    t.match(answer.text, /missing_api_key|UNAUTHENTICATED|API key/i);
  }
  const wrong = await raw(port, post('/v1/chat/completions', ['Content-Length: 60000', 'Authorization: Bearer sk-wrong-key-0000000000']), 3000, (text) => text.includes('}'));
  t.equal(status(wrong.text), 401, 'a wrong key too');
});

t.test('request bodies being received at once are capped process-wide: 503 with Retry-After', async (t) => {
  // Two authenticated uploads of 60,000 bytes each are under way (their bodies trickle); the
  // budget is 100,000 bytes, so the second is refused at once.
  const first = connect(port, '127.0.0.1');
  first.write(post('/v1/chat/completions', [`Authorization: Bearer ${gw.key}`, 'Content-Length: 60000'], '{"model":'));
  await new Promise((r) => setTimeout(r, 200));
  const second = await raw(port, post('/v1/chat/completions', [`Authorization: Bearer ${gw.key}`, 'Content-Length: 60000'], '{'), 3000, (text) => text.includes('}'));
  t.equal(status(second.text), 503);
  t.match(second.text, /retry-after: \d+/i);
  first.destroy();
  await new Promise((r) => setTimeout(r, 200));
  const after = await fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${gw.key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'sim-chat', messages: [{ role: 'user', content: 'hi' }] }),
  });
  t.equal(after.status, 200, 'the budget is released when an upload is abandoned');
});

t.test('no uWebSockets header on any response', async (t) => {
  for (const path of ['/healthz', '/v1/models', '/nowhere', '/admin/keys']) {
    const res = await fetch(gw.url + path, { headers: { authorization: `Bearer ${gw.key}` } });
    t.equal(res.headers.get('uwebsockets'), null, path);
    await res.arrayBuffer();
  }
});

t.test('a HEAD request gets the headers a GET would, and no body: the next response on the connection stays in step', async (t) => {
  // /metrics and /console/ are JSON routes: a HEAD there reported its length with no body, and
  // uWS 20.30 then closed the connection at the next request instead of answering it.
  // The model lists are GET routes of the families: a HEAD there was a 404.
  const admin = gw.adminToken;
  const cases = [['/healthz', 200, admin], ['/nowhere', 404, admin], ['/v1beta/models/x/y', 404, admin], ['/metrics', 200, admin], ['/console/', 200, admin],
    ['/v1/models', 200, gw.key], ['/v1/models/sim-chat', 200, gw.key], ['/v1/models/nope', 404, gw.key], ['/v1/models', 401, 'wrong'], ['/v1beta/models', 200, gw.key]] as const;
  for (const [path, code, token] of cases) {
    const { text } = await raw(port, `HEAD ${path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${token}\r\nx-goog-api-key: ${token}\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n`, 3000, (got) => got.endsWith('{"status":"ok"}'));
    const [head, rest] = [text.slice(0, text.indexOf('\r\n\r\n') + 4), text.slice(text.indexOf('\r\n\r\n') + 4)];
    t.equal(status(head), code, `HEAD ${path}: ${code}`);
    t.match(rest, /^HTTP\/1\.1 200 OK\r\n[^]*\r\n\r\n\{"status":"ok"\}$/, `HEAD ${path} (${code}): no body before the next response (before, a 404 body came first)`);
  }
  t.ok(await healthy(), 'and the gateway serves on');
});

t.test('pipelined requests that are answered at once come back in order', async (t) => {
  const get = (path: string) => `GET ${path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${gw.key}\r\n\r\n`;
  const answer = await raw(port, get('/healthz') + get('/v1/models') + get('/healthz'), 2000, (text) => text.split('HTTP/1.1 200').length === 4);
  const parts = answer.text.split('HTTP/1.1 ').slice(1);
  t.equal(parts.length, 3, 'three answers');
  t.match(parts[0], /"status":"ok"/);
  t.match(parts[1], /"object":"list"/);
  t.match(parts[2], /"status":"ok"/);
});

/** The build serving: what it answers to what it cannot parse differs (docs/runtimes.md, "Supported runtimes"). */
const build = uwsVersion();
const withHeaders = (n: number) => `GET /healthz HTTP/1.1\r\nHost: x\r\n${Array.from({ length: n }, (_, i) => `X-Header-${i}: v\r\n`).join('')}\r\n`;
const headEnd = (text: string) => text.includes('\r\n\r\n');

t.test(`what uWebSockets.js ${build} cannot parse never harms the gateway`, async (t) => {
  if (build === '20.30.0') {
    // 20.30 answers none of these: it leaves the connection silent, then closes it.
    const answers = await Promise.all([raw(port, 'GET /healthz HTTP/1.0\r\n\r\n', 500), raw(port, withHeaders(60), 500), raw(port, 'GARBAGE\r\n\r\n', 500)]);
    t.same(answers.map((a) => a.text), ['', '', ''], 'no answer to HTTP/1.0, 60 headers or a malformed request line');
    const big = await raw(port, `GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(100_000)}\r\n\r\n`, 10_000, headEnd);
    t.equal(status(big.text), 200, 'a 100 KB header is served');
  } else {
    // Bounds that only stop a hang: each answer is awaited, not timed.
    const v10 = await raw(port, 'GET /healthz HTTP/1.0\r\n\r\n', 10_000, headEnd);
    t.equal(status(v10.text), 505, 'HTTP/1.0 gets 505 HTTP Version Not Supported');
    const sixty = await raw(port, withHeaders(60), 10_000, headEnd);
    t.equal(status(sixty.text), 200, '60 headers are served');
    const tooMany = await raw(port, withHeaders(120), 10_000, headEnd);
    t.equal(status(tooMany.text), 431, 'past its header count: 431');
    const big = await raw(port, `GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(100_000)}\r\n\r\n`, 10_000, headEnd);
    t.equal(status(big.text), 431, 'a head over 4 KB: 431');
    // A malformed header line or request target is refused and the connection closed at once.
    const badHeader = await raw(port, 'GET /healthz HTTP/1.1\r\nHost x\r\n\r\n', 10_000);
    t.match(badHeader, { closed: true, text: /^HTTP\/1\.1 400 / }, 'a header line without a colon: 400, then closed');
    const badTarget = await raw(port, 'FOO BAR BAZ\r\n\r\n', 10_000);
    t.match(badTarget, { closed: true, text: /^HTTP\/1\.1 505 / }, 'three words that are no request line: 505, then closed');
    // A request line without spaces reads as one not yet complete: uWS waits for the rest, silent,
    // until its idle timeout (about 30 s, measured); that close is not waited for here.
    const garbage = await raw(port, 'GARBAGE\r\n\r\n', 500);
    t.equal(garbage.text, '', 'a line without spaces gets no answer');
  }
  t.ok(await healthy(), 'still serving');
});

t.test('a second gateway on a taken port fails with the reason, and keeps its first-start demo key for later', async (t) => {
  const dataDir = mkdtempSync(join(tmpdir(), 'sluice-taken-'));
  t.teardown(() => rmSync(dataDir, { recursive: true, force: true }));
  const yaml = (dir: string) => `dataDir: ${dir}\n`;
  const second = await startTestGateway(yaml, { port, dataDir }).catch((err: Error) => err);
  t.type(second, Error);
  t.match((second as Error).message, `cannot listen on 127.0.0.1:${port}: the address is already in use`);
  const third = await startTestGateway(yaml, { dataDir });
  try {
    t.match(third.key, /^sk-/, 'the failed start did not use up the demo key: the next successful start shows it');
    const res = await fetch(`${third.url}/v1/models`, { headers: { authorization: `Bearer ${third.key}` } });
    t.equal(res.status, 200, 'and it works');
  } finally {
    await third.gateway.shutdown();
  }
});
