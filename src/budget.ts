/** Budget periods: `day` and `month` begin at midnight UTC and on the 1st; `total` never ends. */
import { groupAllowsModel, type ApiKey, type Budget, type Group } from './store/store.js';

export interface BudgetPeriod {
  amount: number;
  /** Unix milliseconds: spend from here on counts. */
  since: number;
  /** When the period ends and the budget is whole again; undefined for `total`. */
  until: number | undefined;
}

/**
 * The current period of `budget`, counted from `createdAt` at the earliest: a group's spend is
 * summed from the usage records by its name, and a new group given a deleted one's name must not
 * start with what that one spent.
 */
export function budgetPeriod(budget: Budget, now: number, createdAt = 0): BudgetPeriod {
  const d = new Date(now);
  const [y, m, day] = [d.getUTCFullYear(), d.getUTCMonth(), d.getUTCDate()];
  const from = (since: number) => Math.max(since, createdAt);
  if (budget.period === 'day') return { amount: budget.amount, since: from(Date.UTC(y, m, day)), until: Date.UTC(y, m, day + 1) };
  if (budget.period === 'month') return { amount: budget.amount, since: from(Date.UTC(y, m, 1)), until: Date.UTC(y, m + 1, 1) };
  return { amount: budget.amount, since: from(0), until: undefined };
}

/**
 * Why budgets would not hold: each group or key with a budget whose group may use models that
 * have no prices. Their usage costs nothing, so the budget never stops it; said at every start.
 */
export function unpricedBudgetWarnings(groups: readonly Group[], keys: readonly ApiKey[], models: readonly { id: string; prices?: unknown }[]): string[] {
  const unpriced = (group: Group) => models.filter((m) => !m.prices && groupAllowsModel(group, m.id)).map((m) => m.id);
  const byName = new Map(groups.map((g) => [g.name, g]));
  const holders = [
    ...groups.filter((g) => g.budget).map((g) => ({ who: `group "${g.name}"`, group: g })),
    ...keys.filter((k) => k.budget && byName.has(k.group)).map((k) => ({ who: `key ${k.id}${k.name ? ` ("${k.name}")` : ''}`, group: byName.get(k.group)! })),
  ];
  return holders.flatMap(({ who, group }) => {
    const free = unpriced(group);
    return free.length === 0 ? [] : [`the budget of ${who} does not limit ${free.join(', ')}: these models have no prices, so their usage costs nothing (set models[].prices)`];
  });
}
