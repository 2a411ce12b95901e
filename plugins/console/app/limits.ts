/** Limits and budgets of groups and keys: how they read in a table, and the fields that edit them. */
import { h, icon, icons, replace, uid } from './dom.js';
import { compact, dateTime, money } from './format.js';
import type { Budget, BudgetPeriod, Limits, Model, Spend } from './types.js';
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

/**
 * The configured models a grant (model ids, or `*`) lets a key use that have no prices. A budget
 * counts only cost, so requests to these are never counted against it nor refused by it.
 */
export function unpricedModels(granted: readonly string[], models: readonly Model[]): string[] {
  const all = granted.includes('*');
  return models.filter((m) => !m.prices && (all || granted.includes(m.id))).map((m) => m.id);
}

/** "a, b, c and 2 more" */
function someNames(names: string[], max = 3): string {
  if (names.length <= max) return names.length > 1 ? `${names.slice(0, -1).join(', ')} and ${names.at(-1)}` : names[0] ?? '';
  return `${names.slice(0, max).join(', ')} and ${names.length - max} more`;
}

/** Under a budget in a table: which granted models it does not count (all of them on hover). */
export function unpricedWarning(unpriced: string[]): HTMLElement | null {
  if (!unpriced.length) return null;
  return h(
    'div',
    { class: 'budget-warning', title: `No prices, so this budget does not count them: ${unpriced.join(', ')}` },
    icon(icons.alert),
    h('span', null, `Not counted (no prices): ${someNames(unpriced)}`),
  );
}

/** In a budget form: the full warning, every unpriced model named. */
function unpricedNotice(unpriced: string[]): HTMLElement {
  return h(
    'div',
    { class: 'notice notice-warn budget-warning-form', role: 'status' },
    icon(icons.alert),
    h(
      'div',
      null,
      h('strong', null, unpriced.length === 1 ? 'A model has no prices: ' : `${unpriced.length} models have no prices: `),
      unpriced.map((m, i) => [i ? ' ' : null, h('code', null, m)]),
      h('p', null, "This budget counts only cost, so requests to them are neither counted nor refused. Give them prices in the config's models to count them."),
    ),
  );
}

/**
 * Fields for a budget: an amount (empty for none) and its period; shows the current spend.
 * `unpriced` names the granted models without prices: while an amount is set, the fields warn
 * that the budget does not count them; call `check()` when the grant changes.
 */
export function budgetFields(current: Budget | null | undefined, spend?: Spend | null, unpriced?: () => string[]) {
  const amount = h('input', { type: 'number', min: '0', step: 'any', inputmode: 'decimal', placeholder: 'no budget', value: current ? String(current.amount) : '' });
  const period = h(
    'select',
    null,
    (['day', 'month', 'total'] as BudgetPeriod[]).map((p) => h('option', { value: p, selected: (current?.period ?? 'month') === p }, periodText[p])),
  );
  const hintId = uid('hint');
  amount.setAttribute('aria-describedby', hintId);
  const warning = h('div', { class: 'notice-slot', 'aria-live': 'polite' });
  const check = () => {
    const names = amount.value.trim() && unpriced ? unpriced() : [];
    if (names.length) replace(warning, unpricedNotice(names));
    else replace(warning);
  };
  amount.addEventListener('input', check);
  check();
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
    warning,
  );
  const read = (): Budget | null => {
    const raw = amount.value.trim();
    if (!raw) return null;
    const n = Number(raw);
    if (!Number.isFinite(n) || n < 0) throw new FieldError('Budget amount: a number of at least 0, or empty for no budget.', amount);
    return { amount: n, period: period.value as BudgetPeriod };
  };
  return { el, read, check };
}
