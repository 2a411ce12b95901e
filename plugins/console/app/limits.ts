/** Limits and budgets of groups and keys: how they read in a table, and the fields that edit them. */
import { h, uid } from './dom.js';
import { compact, dateTime, money } from './format.js';
import type { Budget, BudgetPeriod, Limits, Spend } from './types.js';
import { field, FieldError } from './ui.js';

const limitFields: { key: keyof Limits; label: string; unit: string }[] = [
  { key: 'rpm', label: 'Requests per minute', unit: 'rpm' },
  { key: 'tpm', label: 'Tokens per minute', unit: 'tpm' },
  { key: 'concurrency', label: 'Concurrent requests', unit: 'at once' },
];

export const periodText: Record<BudgetPeriod, string> = { day: 'per day', month: 'per month', total: 'in total' };

/** "60 rpm · 100K tpm · 4 at once", one per line; a key's limits inherited from its group are muted. */
export function limitsCell(own: Limits | null | undefined, inherited?: Limits | null): HTMLElement {
  const lines = limitFields.flatMap(({ key, unit }) => {
    const mine = own?.[key];
    const group = inherited?.[key];
    if (mine !== undefined) return [h('div', null, `${compact(mine)} ${unit}`)];
    if (group !== undefined) return [h('div', { class: 'muted', title: 'From the group' }, `${compact(group)} ${unit}`, h('span', { class: 'small' }, ' · group'))];
    return [];
  });
  return h('div', { class: 'limits' }, lines.length ? lines : h('span', { class: 'muted' }, 'Unlimited'));
}

/** What the budget's period has spent, with a meter and what is left. */
export function budgetCell(budget: Budget | null, spend: Spend | null, none = 'No budget'): HTMLElement {
  if (!budget) return h('span', { class: 'muted' }, none);
  const spent = spend?.spent ?? 0;
  const remaining = spend?.remaining ?? budget.amount;
  const share = budget.amount > 0 ? Math.min(1, spent / budget.amount) : 1;
  const tone = remaining <= 0 ? 'bad' : share >= 0.8 ? 'warn' : 'ok';
  const bar = h('span');
  bar.style.width = `${(share * 100).toFixed(1)}%`;
  return h(
    'div',
    { class: 'budget', title: spend ? `Spent since ${dateTime(Date.parse(spend.since))}${spend.until ? `; the period ends ${dateTime(Date.parse(spend.until))}` : ''}` : undefined },
    h('div', { class: 'nowrap' }, h('strong', null, money(spent)), h('span', { class: 'muted' }, ` of ${money(budget.amount)} ${periodText[budget.period]}`)),
    h('div', { class: `meter meter-${tone}`, role: 'meter', 'aria-label': 'Budget spent', 'aria-valuemin': '0', 'aria-valuemax': String(budget.amount), 'aria-valuenow': String(spent) }, bar),
    h('div', { class: `sub${remaining <= 0 ? ' text-bad' : ''}` }, remaining <= 0 ? 'Exhausted: requests get 429' : `${money(remaining)} left`),
  );
}

/**
 * Fields for rpm, tpm and concurrency. Empty is unlimited; on a key (`inherited` given) empty
 * means the group's limit applies, shown as the placeholder.
 */
export function limitsFields(current: Limits | null | undefined, inherited?: Limits | null) {
  const inputs = limitFields.map((f) =>
    h('input', {
      type: 'number',
      min: '1',
      step: '1',
      inputmode: 'numeric',
      value: current?.[f.key] !== undefined ? String(current[f.key]) : '',
      placeholder: inherited === undefined ? 'unlimited' : inherited?.[f.key] !== undefined ? `group: ${inherited[f.key]}` : 'unlimited',
    }),
  );
  const el = h(
    'fieldset',
    { class: 'checks' },
    h('legend', null, 'Limits'),
    h('p', { class: 'hint' }, inherited === undefined ? 'Defaults for every key of the group. Empty is unlimited.' : "Overrides of the group's limits. Empty keeps the group's."),
    h('div', { class: 'field-row' }, limitFields.map((f, i) => field(f.label, inputs[i]!))),
  );
  const read = (): Limits | null => {
    const limits: Limits = {};
    limitFields.forEach((f, i) => {
      const raw = inputs[i]!.value.trim();
      if (!raw) return;
      const n = Number(raw);
      if (!Number.isInteger(n) || n < 1) throw new FieldError(`${f.label}: a whole number of at least 1, or empty for no limit.`, inputs[i]!);
      limits[f.key] = n;
    });
    return Object.keys(limits).length ? limits : null;
  };
  return { el, read };
}

/** Fields for a budget: an amount (empty for none) and its period; shows the current spend. */
export function budgetFields(current: Budget | null | undefined, spend?: Spend | null) {
  const amount = h('input', { type: 'number', min: '0', step: 'any', inputmode: 'decimal', placeholder: 'no budget', value: current ? String(current.amount) : '' });
  const period = h(
    'select',
    null,
    (['day', 'month', 'total'] as BudgetPeriod[]).map((p) => h('option', { value: p, selected: (current?.period ?? 'month') === p }, periodText[p])),
  );
  const hintId = uid('hint');
  amount.setAttribute('aria-describedby', hintId);
  const el = h(
    'fieldset',
    { class: 'checks' },
    h('legend', null, 'Budget'),
    h(
      'p',
      { class: 'hint', id: hintId },
      "In the currency of the models' prices. Empty is no budget. A day or month starts at midnight UTC; once spent, requests get 429.",
    ),
    h('div', { class: 'field-row' }, field('Budget amount', amount), field('Budget period', period)),
    current && spend ? h('p', { class: 'small' }, `Spent ${money(spend.spent)} ${spend.period === 'total' ? 'in total' : `since ${dateTime(Date.parse(spend.since))}`}; ${money(spend.remaining)} left.`) : null,
  );
  const read = (): Budget | null => {
    const raw = amount.value.trim();
    if (!raw) return null;
    const n = Number(raw);
    if (!Number.isFinite(n) || n < 0) throw new FieldError('Budget amount: a number of at least 0, or empty for no budget.', amount);
    return { amount: n, period: period.value as BudgetPeriod };
  };
  return { el, read };
}
