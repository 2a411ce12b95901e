/** Budget periods: `day` and `month` begin at midnight UTC and on the 1st; `total` never ends. */
import type { Budget } from './store/store.js';

export interface BudgetPeriod {
  amount: number;
  /** Unix milliseconds: spend from here on counts. */
  since: number;
  /** When the period ends and the budget is whole again; undefined for `total`. */
  until: number | undefined;
}

export function budgetPeriod(budget: Budget, now: number): BudgetPeriod {
  const d = new Date(now);
  const [y, m, day] = [d.getUTCFullYear(), d.getUTCMonth(), d.getUTCDate()];
  if (budget.period === 'day') return { amount: budget.amount, since: Date.UTC(y, m, day), until: Date.UTC(y, m, day + 1) };
  if (budget.period === 'month') return { amount: budget.amount, since: Date.UTC(y, m, 1), until: Date.UTC(y, m + 1, 1) };
  return { amount: budget.amount, since: 0, until: undefined };
}
