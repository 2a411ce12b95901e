/**
 * An upstream that has no such URL (a `baseUrl` without its `/v1`, say) is the gateway's
 * misconfiguration, not the client's mistake: a 502 in the client's family that names the
 * upstream, the URL called and the option to check, and nothing of the upstream's credentials.
 * A 404 in which the provider speaks about the request (a model it does not know) still reaches
 * the client as before.
 */
import { createServer, type IncomingHttpHeaders } from 'node:http';
import type { AddressInfo } from 'node:net';
import t, { type Test } from 'tap';
import { routeMissing } from '../src/http-upstream.js';
import { startTestGateway } from './helpers.js';

const SECRET = 'upstream-secret-404-abcdef';
const seen: { path: string; headers: IncomingHttpHeaders }[] = [];

/** Answers 404 to everything: a provider's own JSON error under /v1, an OpenAI-shaped "Invalid URL" under /openai-shaped, plain text elsewhere. */
const upstream = createServer((req, res) => {
  req.resume();
  req.on('end', () => {
    seen.push({ path: req.url!, headers: req.headers });
    if (req.url!.startsWith('/v1/')) {
      res.writeHead(404, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ error: { message: 'The model `gone-model` does not exist or you do not have access to it.', type: 'invalid_request_error', param: null, code: 'model_not_found' } }));
    } else if (req.url!.startsWith('/openai-shaped/')) {
      res.writeHead(404, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ error: { message: `Invalid URL (${req.method} ${req.url})`, type: 'invalid_request_error', param: null, code: null } }));
    } else {
      res.writeHead(404, { 'content-type': 'text/plain' });
      res.end('404 page not found');
    }
  });
});
await new Promise<void>((resolve) => upstream.listen(0, '127.0.0.1', resolve));
const base = `http://127.0.0.1:${(upstream.address() as AddressInfo).port}`;

const gw = await startTestGateway(
  (dataDir) => `
dataDir: ${dataDir}
server: { shutdownTimeoutMs: 2000 }
upstreams:
  nov1: { kind: openai-chat, baseUrl: "${base}", apiKey: ${SECRET}, headers: { x-team-secret: hidden-header-value }, breaker: { failures: 100 } }
  invalid-url: { kind: openai-chat, baseUrl: "${base}/openai-shaped/", apiKey: ${SECRET} }
  with-v1: { kind: openai-chat, baseUrl: "${base}/v1", apiKey: ${SECRET} }
  gem: { kind: gemini, baseUrl: "${base}", apiKey: ${SECRET} }
models:
  - { id: m-nov1, upstream: nov1 }
  - { id: m-invalid-url, upstream: invalid-url }
  - { id: m-gone, upstream: with-v1, upstreamModel: gone-model }
  - { id: m-gem, upstream: gem }
`,
);
t.teardown(async () => {
  await gw.stop();
  await new Promise((resolve) => upstream.close(resolve));
});

const chat = (model: string, extra: Record<string, unknown> = {}) =>
  fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${gw.key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model, messages: [{ role: 'user', content: 'hi' }], ...extra }),
  });

/** Nothing of what the gateway sends the upstream to prove who it is. */
function leaksNothing(t: Test, text: string): void {
  t.notMatch(text, SECRET, 'not the upstream API key');
  t.notMatch(text, 'hidden-header-value', 'not the upstream headers');
  t.notMatch(text, /authorization|bearer/i, 'no auth header');
}

t.test('a baseUrl without /v1: a 502 that names the upstream, the URL and the fix', async (t) => {
  const res = await chat('m-nov1');
  t.equal(res.status, 502);
  const text = await res.text();
  leaksNothing(t, text);
  const { error } = JSON.parse(text);
  t.match(error, { type: 'upstream_error', code: 'upstream_error' });
  t.equal(
    error.message,
    `Upstream \`nov1\` has no POST ${base}/chat/completions (it answered 404). Check upstreams.nov1.baseUrl, now ${base}: does it need /v1 at the end?`,
  );
  t.equal(seen.at(-1)!.headers.authorization, `Bearer ${SECRET}`, 'the upstream did get the key (so not sending it is a choice)');
});

t.test('a stream asked for gets the same error, before any event', async (t) => {
  const res = await chat('m-nov1', { stream: true });
  t.equal(res.status, 502);
  t.match(res.headers.get('content-type'), /application\/json/);
  const { error } = (await res.json()) as any;
  t.match(error.message, /^Upstream `nov1` has no POST .*\/chat\/completions/);
});

t.test("in the client's own family shape", async (t) => {
  const messages = await fetch(`${gw.url}/v1/messages`, {
    method: 'POST',
    headers: { 'x-api-key': gw.key, 'anthropic-version': '2023-06-01', 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'm-nov1', max_tokens: 10, messages: [{ role: 'user', content: 'hi' }] }),
  });
  t.equal(messages.status, 502);
  const mText = await messages.text();
  leaksNothing(t, mText);
  t.match(JSON.parse(mText), { type: 'error', error: { type: 'api_error', message: /Upstream `nov1` has no POST .*baseUrl/ } });

  const gemini = await fetch(`${gw.url}/v1beta/models/m-gem:generateContent`, {
    method: 'POST',
    headers: { 'x-goog-api-key': gw.key, 'content-type': 'application/json' },
    body: JSON.stringify({ contents: [{ parts: [{ text: 'hi' }] }] }),
  });
  t.equal(gemini.status, 502);
  const gText = await gemini.text();
  leaksNothing(t, gText);
  t.notMatch(gText, 'key=', 'no key in the URL shown');
  const { error } = JSON.parse(gText);
  t.match(error, { code: 502 });
  t.equal(
    error.message,
    `Upstream \`gem\` has no POST ${base}/models/m-gem:generateContent (it answered 404). Check upstreams.gem.baseUrl, now ${base}: does it need /v1beta at the end?`,
  );
});

t.test("OpenAI's own answer to a wrong URL (JSON \"Invalid URL\") is recognised too", async (t) => {
  const res = await chat('m-invalid-url');
  t.equal(res.status, 502);
  const { error } = (await res.json()) as any;
  t.match(error.message, `Upstream \`invalid-url\` has no POST ${base}/openai-shaped/chat/completions (it answered 404)`);
});

t.test("a provider's 404 about the request itself (an unknown model) still reaches the client as it was", async (t) => {
  const res = await chat('m-gone');
  t.equal(res.status, 404);
  t.match(await res.json(), { error: { code: 'model_not_found', message: /gone-model/ } });
});

t.test('which 404 bodies say the URL is missing, from the providers Sluice speaks to', async (t) => {
  const missing: [string, string][] = [
    ['OpenAI, wrong path', '{"error":{"message":"Invalid URL (POST /chat/completions)","type":"invalid_request_error","param":null,"code":null}}'],
    ['Anthropic, wrong path', '{"type":"error","error":{"type":"not_found_error","message":"Not Found"}}'],
    ['vLLM / FastAPI, wrong path', '{"detail":"Not Found"}'],
    ['Ollama / Go, wrong path', '404 page not found'],
    ['llama.cpp, wrong path', 'File Not Found'],
    ['Azure, wrong path or api-version', '{"error":{"code":"404","message":"Resource not found"}}'],
    ['Express', '<!DOCTYPE html><html><body><pre>Cannot POST /chat/completions</pre></body></html>'],
    ['Google front end, wrong path', '<!DOCTYPE html><html lang=en><title>Error 404 (Not Found)!!1</title>'],
    ['nginx', '<html><head><title>404 Not Found</title></head></html>'],
    ['empty', ''],
  ];
  for (const [who, body] of missing) t.ok(routeMissing(Buffer.from(body)), `${who}: the URL is missing`);
  const aboutTheRequest: [string, string][] = [
    ['OpenAI, unknown model', '{"error":{"message":"The model `gpt-9` does not exist or you do not have access to it.","type":"invalid_request_error","param":null,"code":"model_not_found"}}'],
    ['OpenAI, unknown previous response', `{"error":{"message":"Previous response with id 'resp_123' not found.","type":"invalid_request_error","param":"previous_response_id","code":"previous_response_not_found"}}`],
    ['Anthropic, unknown model', '{"type":"error","error":{"type":"not_found_error","message":"model: claude-9"}}'],
    ['Gemini, unknown model', '{"error":{"code":404,"message":"models/gemini-9 is not found for API version v1beta, or is not supported for generateContent.","status":"NOT_FOUND"}}'],
    ['Azure, unknown deployment', '{"error":{"code":"DeploymentNotFound","message":"The API deployment for this resource does not exist."}}'],
    ['vLLM, unknown model', '{"object":"error","message":"The model `x` does not exist.","type":"NotFoundError","param":null,"code":404}'],
    ['Ollama, unknown model', '{"error":{"message":"model \\"x\\" not found, try pulling it first","type":"api_error","param":null,"code":null}}'],
  ];
  for (const [who, body] of aboutTheRequest) t.notOk(routeMissing(Buffer.from(body)), `${who}: passed on to the client`);
});
