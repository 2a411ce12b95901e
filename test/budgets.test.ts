/**
 * Budgets hold: a request is admitted only when its own worst case (its prompt, bounded from above,
 * plus its output ceiling, at the model's prices) fits in what the budget has left after what is
 * spent and what requests in flight reserved. Through the real gateway against the simulator as its
 * own process, with the memory limiter and with the Redis limiter.
 */
import t from 'tap';
import { eventually, simulatorUpstreams, startStack, type TestGateway } from './helpers.js';
import { startRedis } from './servers.js';

t.setTimeout(240_000);

const redis = await startRedis();
t.teardown(() => redis.stop());

// The simulator's demo prices of its Responses model (per million tokens), and one where the
// prompt costs as much as the output, so a prompt counted short would show.
const routing = (limiter: string) => (simUrl: string) => `${simulatorUpstreams(simUrl)}${limiter}
models:
  - { id: sim-pricey, upstream: chat, upstreamModel: sim-chat, maxOutputTokens: { default: 1024, max: 8192, overMax: clamp }, prices: { input: 1.25, cachedInput: 0.125, output: 10 } }
  - { id: sim-flat, upstream: chat, upstreamModel: sim-chat, maxOutputTokens: { default: 1024, max: 8192, overMax: clamp }, prices: { input: 10, output: 10 } }
  - { id: sim-responses, upstream: responses, maxOutputTokens: { default: 1024, max: 8192, overMax: clamp }, prices: { input: 1.25, cachedInput: 0.125, output: 10 } }
`;

const stacks: [string, string][] = [
  ['memory limiter', ''],
  ['Redis limiter', `limiter: { kind: redis, url: "${redis.url}", failMode: closed }`],
];

for (const [name, limiter] of stacks) {
  t.test(name, async (t) => {
    const { gw } = await startStack(routing(limiter));

    t.test('a request whose worst case exceeds what is left is refused with 429 insufficient_quota, before it spends', async (t) => {
      const { key, id } = await keyIn(gw, { budget: { amount: 0.01, period: 'total' } });
      // 8192 output tokens at 10 per million: 0.08192 at worst, eight times the budget.
      const streamed = await chat(gw, key, 'sim-pricey', 'Write a long story. [[sim tokens=8192]]', { stream: true, max_tokens: 8192 });
      t.equal(streamed.status, 429, 'the streamed request is refused');
      const body = streamed.status === 429 ? JSON.parse(streamed.text) : { error: {} };
      t.match(body.error, { type: 'insufficient_quota', code: 'insufficient_quota' });
      t.match(body.error.message, /0\.01/, `the message says the budget (${body.error.message})`);
      t.match(body.error.message, /left/, 'and what is left');
      t.match(body.error.message, /max_tokens|output tokens/, 'and what to do');

      const responses = await settle(
        fetch(`${gw.url}/v1/responses`, {
          method: 'POST',
          headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
          body: JSON.stringify({ model: 'sim-responses', stream: true, input: 'Long [[sim tokens=8192]]', max_output_tokens: 8192 }),
        }),
      );
      t.equal(responses.status, 429, 'on the Responses route too');
      t.match(JSON.parse(responses.text).error, { code: 'insufficient_quota' });

      // The advice holds: the ceiling it names fits, and the stream runs to it, right up to the budget.
      const advised = Number(/Lower max_tokens to (\d+) or less/.exec(body.error.message)?.[1]);
      t.ok(advised > 100 && advised < 1000, `a ceiling that fits is named (${advised})`);
      const fits = await chat(gw, key, 'sim-pricey', 'Write a long story. [[sim tokens=8192]]', { stream: true, max_tokens: advised });
      t.equal(fits.status, 200, 'a request with the advised ceiling is served');
      t.match(fits.text, /data: \[DONE\]/, 'to its end');
      const spent = await spendOf(gw, id, 1);
      t.ok(spent > 0.0099 && spent <= 0.01, `spent ${spent} of 0.01`);
      const more = await chat(gw, key, 'sim-pricey', 'Short [[sim tokens=20]]', { stream: true, max_tokens: 100 });
      t.equal(more.status, 429, 'then even a small ceiling does not fit in what is left');
      t.equal(await spendOf(gw, id, 1), spent, 'and nothing more is spent');
    });

    t.test('a renamed group keeps its spend: its budget does not start afresh', async (t) => {
      const { key, id } = await keyIn(gw, { budget: { amount: 0.001, period: 'total' } });
      let served = 0;
      while (served < 100 && (await chat(gw, key, 'sim-flat', 'Hello [[sim tokens=8]]', { max_tokens: 8 })).status === 200) served++;
      const spent = await spendOf(gw, id, served);
      t.ok(served > 0 && spent <= 0.001, `${served} served, ${spent} spent, then refused`);
      const group = ((await gw.admin('GET', '/admin/keys')).body.data as { id: string; group: string }[]).find((k) => k.id === id)!.group;
      const renamed = await gw.admin('PATCH', `/admin/groups/${group}`, { name: `${group}-renamed` });
      // Before, the spend was summed from records under the old name: 0, and a whole budget again.
      t.equal(renamed.body.spend.spent, spent, 'the renamed group shows the same spend');
      t.equal((await chat(gw, key, 'sim-flat', 'Hello [[sim tokens=8]]', { max_tokens: 8 })).status, 429, 'and its key is still refused');
      const records = (await gw.admin('GET', `/admin/requests?group=${group}-renamed&limit=1000`)).body.data as unknown[];
      t.ok(records.length >= served, 'its records moved with it');
    });

    t.test("a new group given a deleted group's name does not start with that group's spend", async (t) => {
      const { key, id } = await keyIn(gw, { budget: { amount: 0.001, period: 'total' } });
      let served = 0;
      while (served < 100 && (await chat(gw, key, 'sim-flat', 'Hello [[sim tokens=8]]', { max_tokens: 8 })).status === 200) served++;
      await spendOf(gw, id, served);
      const group = ((await gw.admin('GET', '/admin/keys')).body.data as { id: string; group: string }[]).find((k) => k.id === id)!.group;
      t.equal((await gw.admin('DELETE', `/admin/keys/${id}`)).status, 200);
      t.equal((await gw.admin('DELETE', `/admin/groups/${group}`)).status, 200);
      const again = await gw.admin('POST', '/admin/groups', { name: group, models: ['*'], families: ['chat'], budget: { amount: 0.001, period: 'total' } });
      // Before, its spend was summed from the deleted group's records: spent, and every request refused.
      t.equal(again.body.spend.spent, 0, 'the new group has spent nothing');
      const fresh = await gw.admin('POST', '/admin/keys', { group });
      t.equal((await chat(gw, fresh.body.key, 'sim-flat', 'Hello [[sim tokens=8]]', { max_tokens: 8 })).status, 200, 'and its key is served');
    });

    t.test('50 small requests at once, burst after burst: the spend never passes the budget', async (t) => {
      const amount = 0.003;
      const { key, id } = await keyIn(gw, { budget: { amount, period: 'total' } });
      let served = 0;
      let refused = 0;
      for (let burst = 0; burst < 12; burst++) {
        const all = await Promise.all(
          Array.from({ length: 50 }, (_, i) =>
            chat(gw, key, 'sim-flat', `Hello number ${i}, tell me something. [[sim tokens=8]]`, { max_tokens: 8 }, [
              { role: 'system', content: 'You are terse.' },
              { role: 'user', content: 'Earlier question.' },
              { role: 'assistant', content: 'Earlier answer.' },
            ]),
          ),
        );
        const ok = all.filter((r) => r.status === 200).length;
        for (const r of all.filter((r) => r.status !== 200)) {
          t.equal(r.status, 429, 'only budget refusals');
          if (r.status === 429) t.match(JSON.parse(r.text).error, { code: 'insufficient_quota' });
        }
        served += ok;
        refused += all.length - ok;
        const spent = await spendOf(gw, id, served);
        t.ok(spent <= amount, `burst ${burst}: ${ok} served, spent ${spent} of ${amount}`);
        if (ok === 0) break;
      }
      t.ok(refused > 0, `the budget stopped the bursts (${served} served, ${refused} refused)`);
      const spent = await spendOf(gw, id, served);
      t.ok(spent <= amount, `spent ${spent} <= ${amount}`);
      t.ok(spent >= amount / 2, `most of the budget could be used (${spent})`);
    });
  });
}

/** A new group with `fields`, and a key in it. */
async function keyIn(gw: TestGateway, fields: Record<string, unknown>): Promise<{ key: string; id: string }> {
  const group = `g${Math.random().toString(36).slice(2, 10)}`;
  const created = await gw.admin('POST', '/admin/groups', { name: group, models: ['*'], families: ['chat', 'responses', 'gemini', 'messages'], ...fields });
  if (created.status !== 201) throw new Error(JSON.stringify(created.body));
  const key = await gw.admin('POST', '/admin/keys', { group });
  return { key: key.body.key, id: key.body.id };
}

const settle = async (res: Promise<Response>) => {
  const r = await res;
  return { status: r.status, text: await r.text() };
};

const chat = (gw: TestGateway, key: string, model: string, content: string, extra: Record<string, unknown> = {}, before: unknown[] = []) =>
  settle(
    fetch(`${gw.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model, messages: [...before, { role: 'user', content }], ...extra }),
    }),
  );

/** The group's spend once the usage records of `served` requests are stored. */
async function spendOf(gw: TestGateway, keyId: string, served: number): Promise<number> {
  await eventually(async () => {
    const r = (await gw.admin('GET', `/admin/requests?key=${keyId}&limit=1000`)).body.data as { status: number }[];
    return r.filter((record) => record.status === 200).length >= served;
  }, `${served} usage records`);
  const groups = (await gw.admin('GET', '/admin/groups')).body.data as any[];
  const key = ((await gw.admin('GET', '/admin/keys')).body.data as any[]).find((k) => k.id === keyId);
  const group = groups.find((g) => g.name === key.group);
  return group.spend.spent as number;
}
