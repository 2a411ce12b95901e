/**
 * Prompt-cache affinity through the real gateway: two channels, each an in-process simulator with
 * a prompt cache of its own (`promptCache: true`, so a conversation that moves starts cold), and
 * agent-like conversations that resend a growing history every turn. With affinity (the default)
 * each conversation stays on one channel and every later turn reads its prefix from the cache;
 * without it, turns scatter and miss. Also: the session headers agents send and a configured
 * header key a conversation, and a conversation whose channel failed is pinned where it was served.
 */
import t from 'tap';
import { eventually, startTestGateway, type TestGateway } from './helpers.js';

const upstreams = `upstreams:
  east: { kind: simulator, promptCache: true }
  west: { kind: simulator, promptCache: true }
`;
const twoChannels = (affinity: string) => (dataDir: string) => `dataDir: ${dataDir}
${affinity}
${upstreams}models:
  - id: m
    channels: [{ upstream: east, upstreamModel: sim-chat }, { upstream: west, upstreamModel: sim-chat }]
`;

interface Turn {
  requestId: string;
  prompt: number;
  cached: number;
}

type ChatMessage = { role: string; content: string };

async function chat(gw: TestGateway, messages: ChatMessage[], headers: Record<string, string> = {}): Promise<Turn & { reply: string }> {
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${gw.key}`, 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ model: 'm', messages, max_tokens: 12 }),
  });
  if (res.status !== 200) throw new Error(`${res.status}: ${await res.text()}`);
  const body = (await res.json()) as { choices: { message: { content: string } }[]; usage: { prompt_tokens: number; prompt_tokens_details?: { cached_tokens?: number } } };
  return {
    requestId: res.headers.get('x-request-id')!,
    reply: body.choices[0]!.message.content,
    prompt: body.usage.prompt_tokens,
    cached: body.usage.prompt_tokens_details?.cached_tokens ?? 0,
  };
}

/** `conversations` agent-like sessions of `turns` turns each, one after another: every turn resends the whole history. */
async function agentWorkload(gw: TestGateway, conversations: number, turns: number): Promise<Turn[][]> {
  const all: Turn[][] = [];
  for (let c = 0; c < conversations; c++) {
    const messages: ChatMessage[] = [
      { role: 'system', content: `You are coding agent ${c}. Follow the repository's conventions and explain each change briefly.` },
      { role: 'user', content: `Task ${c}: find why the build of module ${c} fails and fix it.` },
    ];
    const done: Turn[] = [];
    for (let i = 0; i < turns; i++) {
      const turn = await chat(gw, messages);
      done.push(turn);
      messages.push({ role: 'assistant', content: turn.reply }, { role: 'user', content: `Step ${i + 1} of task ${c}: go on.` });
    }
    all.push(done);
  }
  return all;
}

/** The channel that served each request, from the usage records. */
async function channelsOf(gw: TestGateway, count: number): Promise<Map<string, string>> {
  const records = await eventually(async () => {
    const data = (await gw.admin('GET', '/admin/requests?model=m&limit=1000')).body.data as { requestId: string; channel: string }[];
    return data.length >= count && data;
  }, `${count} usage records`);
  return new Map(records.map((r) => [r.requestId, r.channel]));
}

/** Of every turn after a conversation's first, the share of prompt tokens read from the cache. */
function cachedShare(conversations: Turn[][]): number {
  const later = conversations.flatMap((turns) => turns.slice(1));
  return later.reduce((sum, t) => sum + t.cached, 0) / later.reduce((sum, t) => sum + t.prompt, 0);
}

const CONVERSATIONS = 12;
const TURNS = 4;

t.test('with affinity (the default) a conversation stays on one channel and its later turns hit the cache', async (t) => {
  const gw = await startTestGateway(twoChannels(''));
  t.teardown(() => gw.stop());
  const conversations = await agentWorkload(gw, CONVERSATIONS, TURNS);
  const served = await channelsOf(gw, CONVERSATIONS * TURNS);
  const channelsPerConversation = conversations.map((turns) => new Set(turns.map((turn) => served.get(turn.requestId))).size);
  t.same(channelsPerConversation, Array(CONVERSATIONS).fill(1), 'each conversation on one channel');
  const used = new Set(served.values());
  t.same([...used].sort(), ['east', 'west'], 'and the conversations spread over both');
  t.ok(conversations.every((turns) => turns.slice(1).every((turn) => turn.cached > 0)), 'every later turn read its prefix from the cache');
  const share = cachedShare(conversations);
  t.ok(share > 0.5, `cached share of later turns' prompts: ${(share * 100).toFixed(1)}%`);
  t.comment(`affinity on: ${(share * 100).toFixed(1)}% of later turns' prompt tokens cached`);
});

t.test('without affinity the turns scatter and miss the cache', async (t) => {
  const gw = await startTestGateway(twoChannels('affinity: { enabled: false }'));
  t.teardown(() => gw.stop());
  const conversations = await agentWorkload(gw, CONVERSATIONS, TURNS);
  const served = await channelsOf(gw, CONVERSATIONS * TURNS);
  const moved = conversations.filter((turns) => new Set(turns.map((turn) => served.get(turn.requestId))).size > 1).length;
  // Each later turn picks a channel at random: all 36 staying put has a chance of 2^-36.
  t.ok(moved > 0, `${moved} of ${CONVERSATIONS} conversations moved between channels`);
  t.ok(conversations.some((turns) => turns.slice(1).some((turn) => turn.cached === 0)), 'and some later turn started cold');
  t.comment(`affinity off: ${(cachedShare(conversations) * 100).toFixed(1)}% of later turns' prompt tokens cached`);
});

t.test("an agent's session header keys the conversation; a configured header comes first", async (t) => {
  const gw = await startTestGateway(twoChannels('affinity: { header: X-Conversation }'));
  t.teardown(() => gw.stop());
  const ids: string[][] = [];
  for (let s = 0; s < 8; s++) {
    // Every request of a session starts differently: only the header can tie them together.
    const session: string[] = [];
    for (let i = 0; i < 3; i++) {
      // Odd sessions: the configured header holds while the agent's session header changes.
      const headers: Record<string, string> = s % 2 === 0 ? { 'x-claude-code-session-id': `session-${s}` } : { 'session-id': `codex-${s}-${i}`, 'x-conversation': `named-${s}` };
      session.push((await chat(gw, [{ role: 'user', content: `Session ${s}, unrelated question ${i}` }], headers)).requestId);
    }
    ids.push(session);
  }
  const served = await channelsOf(gw, 24);
  t.same(ids.map((session) => new Set(session.map((id) => served.get(id))).size), Array(8).fill(1), 'each session on one channel');
  t.same([...new Set(served.values())].sort(), ['east', 'west'], 'sessions spread over both');
});

t.test("a conversation whose channel fails is served by the other and pinned there", async (t) => {
  // `down` refuses connections; its breaker needs many failures to open, so only the pin keeps
  // a conversation from trying it first again.
  const gw = await startTestGateway(
    (dataDir) => `dataDir: ${dataDir}
upstreams:
  up: { kind: simulator }
  down: { kind: openai-chat, baseUrl: "http://127.0.0.1:9/v1", retry: { attempts: 2, backoffMs: 1 }, breaker: { failures: 1000, minRequests: 1000 } }
models:
  - id: m
    channels: [{ upstream: up, upstreamModel: sim-chat }, { upstream: down, upstreamModel: sim-chat }]
`,
  );
  t.teardown(() => gw.stop());
  const attempts = async (requestId: string) =>
    eventually(async () => {
      const data = (await gw.admin('GET', '/admin/requests?model=m&limit=1000')).body.data as { requestId: string; attempts: number; channel: string }[];
      return data.find((r) => r.requestId === requestId);
    }, `the record of ${requestId}`);
  let failedOver = 0;
  for (let c = 0; c < 10; c++) {
    const messages = [{ role: 'user', content: `Conversation ${c}: hello` }];
    const first = await attempts((await chat(gw, messages)).requestId);
    t.equal(first.channel, 'up', 'served by the channel that works');
    if (first.attempts < 2) continue;
    failedOver++;
    // The same conversation's next turn: the pin sends it straight to `up`.
    const next = await attempts((await chat(gw, [...messages, { role: 'assistant', content: 'Hi' }, { role: 'user', content: 'And then?' }])).requestId);
    t.match(next, { channel: 'up', attempts: 1 }, `conversation ${c} went straight to its pinned channel`);
  }
  t.ok(failedOver > 0, `${failedOver} of 10 conversations ranked the failing channel first, failed over, and were pinned`);
});

t.test('keys, rendezvous and pins, unit by unit', async (t) => {
  const { AffinityPins, channelSeed, conversationKey, rendezvous } = await import('../src/channels/affinity.js');
  const settings = { enabled: true, header: 'x-conversation', pinTtlMs: 1000, maxPins: 2 };
  const request = (system: string, user: string) => ({
    model: 'm',
    stream: false,
    tools: [],
    messages: [
      { role: 'system' as const, content: [{ type: 'text' as const, text: system }] },
      { role: 'user' as const, content: [{ type: 'text' as const, text: user }] },
      { role: 'assistant' as const, content: [{ type: 'text' as const, text: 'later turns change this' }], toolCalls: [] },
    ],
  });
  const key = (headers: Record<string, string>, system = 'sys', user = 'task') => conversationKey('m', headers, request(system, user), settings)!;
  t.equal(key({ 'x-conversation': 'a', 'x-claude-code-session-id': 'b' }).source, 'header', 'the configured header first');
  t.equal(key({ 'x-claude-code-session-id': 'b', 'session-id': 'c' }).source, 'session');
  t.equal(key({}).source, 'prefix');
  t.equal(key({}).id, conversationKey('m', {}, { ...request('sys', 'task'), messages: request('sys', 'task').messages.slice(0, 2) }, settings)!.id, 'later turns do not change the start');
  t.not(key({}, 'sys', 'task').id, key({}, 'sys', 'other task').id, 'another first message, another conversation');
  t.not(key({}, 'a'.repeat(10_000)).id, key({}, 'a'.repeat(10_001)).id, 'a long text counts by its length too');
  t.equal(key({ 'x-conversation': 'x'.repeat(513) }).source, 'prefix', 'an oversized header is not a key');
  t.equal(conversationKey('m', {}, { model: 'm', stream: false, tools: [], messages: [] }, settings), undefined, 'no user message, no key');

  // Rendezvous: uniform enough that 2:1 weights split about 2:1 over many conversations.
  const a = channelSeed('east\0m');
  const b = channelSeed('west\0m');
  let first = 0;
  for (let c = 0; c < 20_000; c++) {
    const seed = (Math.imul(c, 2654435761) ^ 0x5bd1e995) >>> 0;
    if (-Math.log(rendezvous(seed, a)) / 2 < -Math.log(rendezvous(seed, b)) / 1) first++;
  }
  t.ok(first / 20_000 > 0.64 && first / 20_000 < 0.69, `weight 2 of 3 ranks first for ${((first / 200)).toFixed(1)}% of conversations`);

  const pins = new AffinityPins(settings);
  pins.served('k1', 'west', false, 0);
  t.equal(pins.channel('k1', 500), 'west', 'pinned where it was served');
  t.equal(pins.channel('k1', 1000), undefined, 'until the TTL after its last turn');
  pins.served('k1', 'west', false, 0);
  pins.served('k1', 'east', true, 10);
  t.equal(pins.channel('k1', 20), undefined, 'served by its first-ranked channel: no pin needed');
  pins.served('k2', 'west', false, 0);
  pins.served('k3', 'west', false, 0);
  pins.served('k4', 'west', false, 0);
  t.equal(pins.size, 2, 'at most maxPins');
  t.equal(pins.channel('k2', 1), undefined, 'the least recently used went first');
});
