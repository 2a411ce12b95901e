/**
 * A budget does not limit models without prices (their usage costs nothing): every start says so
 * for each group or key whose budget such a model slips past; the embedded simulator models carry
 * demo prices, so budgets work on them out of the box.
 */
import t from 'tap';
import { unpricedBudgetWarnings } from '../src/budget.js';
import { loadConfig } from '../src/config/load.js';
import type { ApiKey, Group } from '../src/store/store.js';
import { startTestGateway } from './helpers.js';

const group = (name: string, models: string[], budget: Group['budget']): Group => ({ name, models, families: ['chat'], limits: null, budget, mcpTools: [], createdAt: 0 });
const key = (id: string, groupName: string, budget: ApiKey['budget']) =>
  ({ id, name: null, group: groupName, disabled: false, prefix: 'sk-x', createdAt: 0, lastUsedAt: null, expiresAt: null, limits: null, budget }) as ApiKey;

t.test('which budgets unpriced models slip past', async (t) => {
  const models = [{ id: 'priced', prices: { input: 1, output: 2 } }, { id: 'free' }, { id: 'also-free' }];
  const monthly = { amount: 10, period: 'month' as const };
  t.same(unpricedBudgetWarnings([group('a', ['priced'], monthly)], [], models), [], 'a budget on priced models only holds');
  t.same(unpricedBudgetWarnings([group('a', ['*'], null)], [], models), [], 'no budget, nothing to say');
  t.same(
    unpricedBudgetWarnings([group('a', ['*'], monthly)], [], models),
    ['the budget of group "a" does not limit free, also-free: these models have no prices, so their usage costs nothing (set models[].prices)'],
  );
  t.match(unpricedBudgetWarnings([group('b', ['free'], null)], [key('key_1', 'b', monthly)], models), [/^the budget of key key_1 does not limit free:/], "a key's budget over its group's models");
});

t.test('the embedded simulator models all have prices', async (t) => {
  const config = loadConfig({ env: {} });
  t.same(config.models.filter((m) => !m.prices).map((m) => m.id), [], 'every simulator model is priced');
});

t.test('a start warns of a budget over unpriced models', async (t) => {
  const yaml = (dataDir: string) => `dataDir: ${dataDir}
upstreams:
  sim: { kind: simulator }
models:
  - { id: priced, upstream: sim, prices: { input: 1, output: 2 } }
  - { id: unpriced, upstream: sim }
`;
  const first = await startTestGateway(yaml);
  t.notOk(first.logs.some((l) => /does not limit/.test(String(l.msg))), 'the default group has no budget: nothing to say');
  const created = await first.admin('POST', '/admin/groups', { name: 'capped', models: ['*'], families: ['chat'], budget: { amount: 1, period: 'day' } });
  t.equal(created.status, 201);
  await first.gateway.shutdown();
  const again = await startTestGateway(yaml, { dataDir: first.dataDir });
  t.teardown(() => again.stop());
  const warnings = again.logs.filter((l) => l.level === 40 && /does not limit/.test(String(l.msg)));
  t.same(
    warnings.map((l) => l.msg),
    ['the budget of group "capped" does not limit unpriced: these models have no prices, so their usage costs nothing (set models[].prices)'],
  );
});
