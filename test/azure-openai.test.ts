/**
 * The plugin guide's worked example, the `azure-openai` upstream kind, end to end: the official
 * openai SDK → Sluice → an Azure-shaped HTTP server on 127.0.0.1. The server refuses anything but
 * the deployment path, the api-version query and the `api-key` header, and answers with the
 * simulator's own chat rendering, so what it returns is what OpenAI's wire looks like.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { createServer, type IncomingHttpHeaders } from 'node:http';
import type { AddressInfo } from 'node:net';
import OpenAI from 'openai';
import t from 'tap';
import type { BootContext, UpstreamFactory } from '../src/contracts.js';
import azurePlugin, { DEFAULT_API_VERSION } from '../plugins/upstreams/azure-openai/index.js';
import { chatCompletion } from '../plugins/upstreams/simulator/chat.js';
import { playReply } from '../plugins/upstreams/simulator/index.js';
import { distRoot, startTestGateway } from './helpers.js';

const KEY = 'azure-secret-123';
const PREVIEW = '2025-01-01-preview';

interface Seen {
  method: string;
  path: string;
  query: URLSearchParams;
  headers: IncomingHttpHeaders;
  body: any;
}
const seen: Seen[] = [];

/** Azure's data plane as far as a chat deployment goes, with Azure's own refusals. */
const azure = createServer((req, res) => {
  const chunks: Buffer[] = [];
  req.on('data', (c: Buffer) => chunks.push(c));
  req.on('end', () => {
    const body = Buffer.concat(chunks);
    const url = new URL(req.url!, 'http://azure.invalid');
    seen.push({ method: req.method!, path: url.pathname, query: url.searchParams, headers: req.headers, body: JSON.parse(body.toString() || 'null') });
    const refuse = (status: number, code: string, message: string) => {
      res.writeHead(status, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ error: { code, message } }));
    };
    if (req.headers['api-key'] !== KEY) return refuse(401, '401', 'Access denied due to invalid subscription key or wrong API endpoint.');
    const version = url.searchParams.get('api-version');
    if (version !== DEFAULT_API_VERSION && version !== PREVIEW) return refuse(404, '404', 'Resource not found');
    if (req.method !== 'POST' || !/^(\/prefix)?\/openai\/deployments\/[^/]+\/chat\/completions$/.test(url.pathname)) return refuse(404, '404', 'Resource not found');
    const call = playReply(chatCompletion(body), {
      start: (status, headers) => res.writeHead(status, headers),
      data: (bytes) => res.write(bytes),
      finish: (cut) => (cut ? res.destroy() : res.end()),
    });
    res.on('drain', () => call.resume());
    res.on('close', () => call.abort());
  });
});
await new Promise<void>((resolve) => azure.listen(0, '127.0.0.1', resolve));
const azureUrl = `http://127.0.0.1:${(azure.address() as AddressInfo).port}`;

const gw = await startTestGateway(
  (dataDir) => `
dataDir: ${dataDir}
server: { shutdownTimeoutMs: 2000 }
plugins: [auth, grant, codecs/chat, codecs/responses, codecs/gemini, upstreams/azure-openai, usage]
upstreams:
  azure: { kind: azure-openai, baseUrl: "${azureUrl}", apiKey: ${KEY} }
  azure-preview: { kind: azure-openai, baseUrl: "${azureUrl}/prefix/", apiKey: ${KEY}, apiVersion: ${PREVIEW} }
  azure-wrong-key: { kind: azure-openai, baseUrl: "${azureUrl}", apiKey: not-the-key }
models:
  - { id: azure-chat, upstream: azure, upstreamModel: team-gpt-4o }
  - { id: azure-preview, upstream: azure-preview, upstreamModel: "preview deployment" }
  - { id: azure-wrong-key, upstream: azure-wrong-key }
`,
);
t.teardown(async () => {
  await gw.stop();
  await new Promise((resolve) => azure.close(resolve));
});

const openai = new OpenAI({ apiKey: gw.key, baseURL: `${gw.url}/v1`, maxRetries: 0 });
const user = (content: string) => [{ role: 'user' as const, content }];
const last = () => seen.at(-1)!;

t.test('a chat client passes through to the deployment: path, api-version, api-key, model names', async (t) => {
  const answer = await openai.chat.completions.create({ model: 'azure-chat', messages: user('Hello [[sim tokens=4]]') });
  t.equal(answer.model, 'azure-chat', "the client's name for the model comes back");
  t.ok(answer.choices[0]!.message.content!.trim().length > 0);
  t.equal(answer.usage!.completion_tokens, 4);
  const req = last();
  t.equal(req.method, 'POST');
  t.equal(req.path, '/openai/deployments/team-gpt-4o/chat/completions');
  t.same([...req.query], [['api-version', DEFAULT_API_VERSION]]);
  t.equal(req.headers['api-key'], KEY);
  t.equal(req.headers.authorization, undefined, "the client's key never goes upstream");
  t.equal(req.body.model, 'team-gpt-4o');
});

t.test('a stream comes back with usage, asked of the upstream on the client’s behalf', async (t) => {
  const stream = await openai.chat.completions.create({ model: 'azure-chat', messages: user('Stream [[sim tokens=6]]'), stream: true, stream_options: { include_usage: true } });
  let text = '';
  let usage: OpenAI.CompletionUsage | undefined;
  for await (const chunk of stream) {
    text += chunk.choices[0]?.delta.content ?? '';
    usage = chunk.usage ?? usage;
  }
  t.ok(text.trim().length > 0);
  t.equal(usage?.completion_tokens, 6);
  t.equal(last().path, '/openai/deployments/team-gpt-4o/chat/completions');
  t.same(last().body.stream_options, { include_usage: true });
});

t.test('a Responses client is translated through the chat dialect to the same deployment', async (t) => {
  const answer = await openai.responses.create({ model: 'azure-chat', input: 'Hi there [[sim tokens=3]]' });
  t.equal(answer.status, 'completed');
  t.ok(answer.output_text.trim().length > 0);
  t.equal(answer.usage!.output_tokens, 3);
  t.equal(last().path, '/openai/deployments/team-gpt-4o/chat/completions');
  t.ok(Array.isArray(last().body.messages), 'the upstream got a chat request');
});

t.test('apiVersion and a base path are honoured; the deployment name is escaped', async (t) => {
  await openai.chat.completions.create({ model: 'azure-preview', messages: user('Hi') });
  t.equal(last().path, '/prefix/openai/deployments/preview%20deployment/chat/completions');
  t.equal(last().query.get('api-version'), PREVIEW);
});

t.test("Azure's refusal of the gateway's key is the gateway's failure, not the client's", async (t) => {
  const err = await openai.chat.completions.create({ model: 'azure-wrong-key', messages: user('Hi') }).catch((e: unknown) => e);
  t.ok(err instanceof OpenAI.APIError);
  t.equal((err as InstanceType<typeof OpenAI.APIError>).status, 502);
  t.match((err as Error).message, /rejected the gateway's credentials \(401\)/);
  t.equal(last().headers['api-key'], 'not-the-key');
});

t.test('a malformed apiVersion is refused when the upstream is built', async (t) => {
  let factory: UpstreamFactory | undefined;
  await azurePlugin({ addUpstreamKind: (_kind: string, make: UpstreamFactory) => (factory = make) } as unknown as BootContext);
  t.throws(() => factory!('az', { baseUrl: azureUrl, apiVersion: 'latest' }, {} as BootContext), /upstreams\.az\.apiVersion/);
});

t.test('the plugin guide shows this plugin as it is in the tree', async (t) => {
  const file = 'plugins/upstreams/azure-openai/index.ts';
  const guide = readFileSync(join(distRoot, '../docs/plugins.md'), 'utf8');
  const shown = new RegExp(`<!-- file: ${file} -->\\n\`\`\`ts\\n([\\s\\S]*?)\`\`\`\\n`).exec(guide)?.[1];
  t.equal(shown, readFileSync(join(distRoot, '..', file), 'utf8'));
});
