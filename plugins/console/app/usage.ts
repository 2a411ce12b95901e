/** Usage: filters, totals and cost, charts over time (spend per group among them), the latest records and a CSV export. */
import * as api from './api.js';
import { bucketFor, bucketTimes, chart, type Chart } from './charts.js';
import { append, h, icon, icons, replace } from './dom.js';
import { compact, dateTime, duration, fromLocalInput, money, num, shortTime, toLocalInput } from './format.js';
import type { Page } from './page.js';
import type { Group, Key, Model, SeriesPoint, SeriesResponse, UsageFilter, UsageRecord, UsageResponse } from './types.js';
import { badge, button, card, empty, errorText, isAbort, keyCell, keyNames, loading, Notice, pageHead, table, type KeyNames } from './ui.js';

type Preset = '1h' | '24h' | '7d' | '30d' | 'custom';
const presets: { id: Exclude<Preset, 'custom'>; label: string; ms: number; text: string }[] = [
  { id: '1h', label: '1 h', ms: 3_600_000, text: 'in the last hour' },
  { id: '24h', label: '24 h', ms: 86_400_000, text: 'in the last 24 hours' },
  { id: '7d', label: '7 days', ms: 7 * 86_400_000, text: 'in the last 7 days' },
  { id: '30d', label: '30 days', ms: 30 * 86_400_000, text: 'in the last 30 days' },
];

const LIMIT = 200;

/**
 * Kept across visits to the page (in memory only). Until the operator picks a range, `fitted`
 * holds and the range follows the data (see fittedPreset).
 */
const state: { key: string; group: string; model: string; preset: Preset; fitted: boolean; from?: number; to?: number } = {
  key: '',
  group: '',
  model: '',
  preset: '24h',
  fitted: true,
};

/**
 * The shortest preset that holds every request the longest one does, from each preset's request
 * count (shortest first): an install whose traffic all came in the last hour sees that hour in
 * one-minute buckets, not a week with a sliver at its right edge. No traffic at all: 24 hours.
 */
export function fitPreset(counts: number[]): Exclude<Preset, 'custom'> {
  const all = counts[counts.length - 1] ?? 0;
  if (all === 0) return '24h';
  return presets[counts.findIndex((c) => c >= all)]?.id ?? '30d';
}

const colors = { requests: '#2563eb', prompt: '#7c3aed', completion: '#0d9488', errors: '#dc2626', avg: '#0891b2', max: '#d97706' };
/** One line per group in the spend chart; the groups that spent most get a line each. */
const groupColors = ['#2563eb', '#d97706', '#0d9488', '#db2777', '#7c3aed', '#65a30d', '#0891b2', '#dc2626'];

/** A group's cost over time, from the series filtered to it. */
interface GroupSpend {
  group: string;
  points: SeriesPoint[];
  total: number;
}

export const usagePage: Page = (ctx) => {
  for (const k of ['key', 'group', 'model'] as const) {
    const v = ctx.params.get(k);
    if (v !== null) state[k] = v;
  }

  const notice = new Notice();
  const csv = h('a', { class: 'btn btn-secondary', download: 'sluice-usage.csv', href: '#' }, icon(icons.download), 'Export CSV');
  const refreshBtn = button([icon(icons.refresh), 'Refresh'], () => void refresh(), { kind: 'secondary' });
  const filters = h('div', { class: 'filters' }, loading('Loading filters…'));
  const totals = h('div', { class: 'totals' });
  const chartsEl = h('div', { class: 'charts' });
  const records = h('div', null);
  append(
    ctx.root,
    pageHead('Usage', 'Requests, tokens and cost through the gateway, by key, group and model.', refreshBtn, csv),
    card(null, filters, { class: 'card-filters', label: 'Filters' }),
    notice.el,
    totals,
    chartsEl,
    records,
  );

  let keys: Key[] = [];
  /** Shows the chosen range on the preset buttons (set once the filters are built). */
  let syncPresets = () => {};
  let groupNames: string[] = [];
  let charts: Chart[] = [];
  let seq = 0;

  const destroyCharts = () => {
    for (const c of charts) c.destroy();
    charts = [];
  };

  function range(): [number, number] {
    if (state.preset === 'custom' && state.from !== undefined) return [state.from, state.to ?? Date.now()];
    const p = presets.find((x) => x.id === state.preset) ?? presets[1]!;
    const now = Date.now();
    return [now - p.ms, now];
  }

  function filter(r: [number, number]): UsageFilter {
    return { key: state.key || undefined, group: state.group || undefined, model: state.model || undefined, since: r[0], until: r[1] };
  }

  function buildFilters(groups: Group[], models: Model[]): void {
    const select = (label: string, all: string, options: { value: string; label: string }[], k: 'key' | 'group' | 'model') => {
      // A filter from a link (e.g. a deleted key) stays selectable.
      if (state[k] && !options.some((o) => o.value === state[k])) options.push({ value: state[k], label: state[k] });
      const el = h(
        'select',
        {
          onchange: () => {
            state[k] = el.value;
            void refresh();
          },
        },
        h('option', { value: '' }, all),
        options.map((o) => h('option', { value: o.value, selected: o.value === state[k] }, o.label)),
      );
      const id = `usage-${k}`;
      el.id = id;
      return h('div', { class: 'field' }, h('label', { for: id }, label), el);
    };

    const from = h('input', { type: 'datetime-local', 'aria-label': 'From' });
    const to = h('input', { type: 'datetime-local', 'aria-label': 'To' });
    const customNotice = h('span', { class: 'text-bad small', role: 'alert' });
    const custom = h(
      'div',
      { class: 'custom-range' },
      h('label', { class: 'inline-label' }, h('span', null, 'From'), from),
      h('label', { class: 'inline-label' }, h('span', null, 'To'), to),
      button('Apply', () => {
        const f = fromLocalInput(from.value);
        const t = fromLocalInput(to.value);
        if (f === undefined) return void (customNotice.textContent = 'Choose a start time.');
        if (t !== undefined && t <= f) return void (customNotice.textContent = 'The end must be after the start.');
        customNotice.textContent = '';
        state.from = f;
        state.to = t;
        state.preset = 'custom';
        state.fitted = false;
        syncPresets();
        void refresh();
      }, { kind: 'primary', small: true }),
      customNotice,
    );

    const presetButtons = [...presets.map((p) => ({ id: p.id, label: p.label })), { id: 'custom' as Preset, label: 'Custom' }].map((p) =>
      h(
        'button',
        {
          type: 'button',
          class: 'seg',
          'data-preset': p.id,
          onclick: () => {
            if (p.id === 'custom') {
              const [f, t] = range();
              from.value = toLocalInput(f);
              to.value = toLocalInput(t);
              custom.hidden = false;
              markPressed('custom');
              from.focus();
              return;
            }
            state.preset = p.id;
            state.fitted = false;
            syncPresets();
            void refresh();
          },
        },
        p.label,
      ),
    );
    const markPressed = (id: Preset) => {
      for (const b of presetButtons) b.setAttribute('aria-pressed', String(b.dataset.preset === id));
    };
    const fittedNote = h('span', { class: 'muted fitted-note', title: 'Until you pick a range, it is the shortest one that holds all recent requests' }, ' · fits the data');
    syncPresets = () => {
      markPressed(state.preset);
      fittedNote.hidden = !state.fitted;
      custom.hidden = state.preset !== 'custom';
      if (state.preset === 'custom' && state.from !== undefined) {
        from.value = toLocalInput(state.from);
        to.value = state.to !== undefined ? toLocalInput(state.to) : '';
      }
    };
    syncPresets();

    replace(
      filters,
      h(
        'div',
        { class: 'filter-row' },
        select(
          'Key',
          'All keys',
          keys.map((k) => ({ value: k.id, label: k.name ? `${k.name} (${k.prefix}…)` : `${k.id} (${k.prefix}…)` })),
          'key',
        ),
        select('Group', 'All groups', groups.map((g) => ({ value: g.name, label: g.name })), 'group'),
        select('Model', 'All models', models.map((m) => ({ value: m.id, label: m.id })), 'model'),
        h('div', { class: 'field' }, h('span', { class: 'label', id: 'range-label' }, 'Time range', fittedNote), h('div', { class: 'segmented', role: 'group', 'aria-labelledby': 'range-label' }, presetButtons)),
      ),
      custom,
    );
  }

  /** The preset that fits the data under the current filters (one cheap count per preset). */
  async function fittedPreset(): Promise<Exclude<Preset, 'custom'>> {
    const now = Date.now();
    const counts = await Promise.all(
      presets.map((p) => api.usage(filter([now - p.ms, now]), 1, ctx.signal).then((u) => u.totals.requests)),
    );
    return fitPreset(counts);
  }

  async function refresh(): Promise<void> {
    const mine = ++seq;
    notice.clear();
    refreshBtn.disabled = true;
    if (!totals.firstChild) replace(totals, loading());
    try {
      if (state.fitted) {
        const preset = await fittedPreset();
        if (ctx.signal.aborted || mine !== seq) return;
        state.preset = preset;
        syncPresets();
      }
      const r = range();
      const f = filter(r);
      csv.href = api.usageCsvUrl(f);
      const bucket = bucketFor(r[1] - r[0]);
      const [u, s, spend] = await Promise.all([api.usage(f, LIMIT, ctx.signal), api.usageSeries(f, bucket, ctx.signal), groupSpend(f, bucket)]);
      if (ctx.signal.aborted || mine !== seq) return;
      render(u, s, spend, r);
    } catch (err) {
      if (isAbort(err) || ctx.signal.aborted || mine !== seq) return;
      notice.error(`Could not load usage: ${errorText(err)}`);
      if (totals.querySelector('.loading')) replace(totals);
    } finally {
      if (mine === seq) refreshBtn.disabled = false;
    }
  }

  /** The series once per group (the API filters by one group at a time); groups that spent nothing are left out. */
  async function groupSpend(f: UsageFilter, bucket: number): Promise<GroupSpend[]> {
    const names = f.group ? [f.group] : groupNames;
    const series = await Promise.all(names.map((group) => api.usageSeries({ ...f, group }, bucket, ctx.signal)));
    return names
      .map((group, i) => ({ group, points: series[i]!.points, total: series[i]!.points.reduce((sum, p) => sum + p.cost, 0) }))
      .filter((g) => g.total > 0)
      .sort((a, b) => b.total - a.total);
  }

  function render(u: UsageResponse, s: SeriesResponse, spend: GroupSpend[], r: [number, number]): void {
    const t = u.totals;
    const errorRate = t.requests ? (t.errors / t.requests) * 100 : 0;
    replace(
      totals,
      stat('Requests', num(t.requests), rangeText()),
      stat('Prompt tokens', num(t.promptTokens), t.requests ? `${compact(t.promptTokens / t.requests)} per request on average` : undefined),
      stat('Completion tokens', num(t.completionTokens), t.requests ? `${compact(t.completionTokens / t.requests)} per request on average` : undefined),
      stat('Cost', money(t.cost), t.cost ? `${money(t.cost / t.requests)} per request on average` : 'Only models with prices cost anything'),
      stat('Errors', num(t.errors), t.requests ? `${errorRate === 0 || errorRate >= 10 ? Math.round(errorRate) : errorRate.toFixed(1)}% of requests` : undefined, t.errors > 0),
    );
    renderCharts(s, spend, r);
    renderRecords(u);
  }

  function rangeText(): string {
    if (state.preset === 'custom') {
      const [f, t] = range();
      return `${shortTime(f)} – ${state.to === undefined ? 'now' : shortTime(t)}`;
    }
    return presets.find((p) => p.id === state.preset)?.text ?? '';
  }

  function renderCharts(s: SeriesResponse, spend: GroupSpend[], r: [number, number]): void {
    destroyCharts();
    const bucketMs = s.bucketMs > 0 ? s.bucketMs : bucketFor(r[1] - r[0]);
    const byTime = new Map(s.points.map((p) => [p.t, p]));
    const times = bucketTimes(r, bucketMs, s.points.map((p) => p.t));
    const col = (f: (p: SeriesResponse['points'][number]) => number | null, missing: number | null) => times.map((tm) => {
      const p = byTime.get(tm);
      return p ? f(p) : missing;
    });
    const base = { times, range: r, bucketMs };
    const shownGroups = spend.slice(0, groupColors.length);
    const specs: { title: string; c: Chart; wide?: boolean; note?: string }[] = [
      {
        title: 'Spend by group',
        wide: true,
        note: spend.length > shownGroups.length ? `the ${shownGroups.length} groups that spent most` : undefined,
        c: chart({
          ...base,
          series: shownGroups.map((g, i) => {
            const cost = new Map(g.points.map((p) => [p.t, p.cost]));
            return { label: g.group, color: groupColors[i]!, kind: 'line' as const, values: times.map((tm) => cost.get(tm) ?? 0) };
          }),
          format: money,
          fractional: true,
          emptyText: 'No spend in this period',
        }),
      },
      { title: 'Requests', c: chart({ ...base, series: [{ label: 'Requests', color: colors.requests, kind: 'bars', values: col((p) => p.requests, 0) }], emptyText: 'No requests in this period' }) },
      {
        title: 'Tokens',
        c: chart({
          ...base,
          series: [
            { label: 'Prompt', color: colors.prompt, kind: 'area', values: col((p) => p.promptTokens, 0) },
            { label: 'Completion', color: colors.completion, kind: 'area', values: col((p) => p.completionTokens, 0) },
          ],
          emptyText: 'No tokens in this period',
        }),
      },
      { title: 'Errors', c: chart({ ...base, series: [{ label: 'Errors', color: colors.errors, kind: 'bars', values: col((p) => p.errors, 0) }], emptyText: 'No errors in this period' }) },
      {
        title: 'Latency',
        c: chart({
          ...base,
          series: [
            { label: 'Average', color: colors.avg, kind: 'line', values: col((p) => p.avgLatencyMs, null) },
            { label: 'Max', color: colors.max, kind: 'line', values: col((p) => p.maxLatencyMs, null) },
          ],
          format: (v) => duration(v),
          emptyText: 'No requests in this period',
        }),
      },
    ];
    charts = specs.map((x) => x.c);
    const per = bucketLabel(bucketMs);
    replace(
      chartsEl,
      specs.map(({ title, c, wide, note }) =>
        h(
          'section',
          { class: `card chart-card${wide ? ' chart-wide' : ''}`, 'aria-label': `${title} chart` },
          h('div', { class: 'card-head' }, h('h2', null, title), h('span', { class: 'muted small' }, note ? `${per}, ${note}` : per)),
          c.el,
        ),
      ),
    );
  }

  function renderRecords(u: UsageResponse): void {
    const names = keyNames(keys);
    const shown = u.records.length;
    const list = shown
      ? table(
          ['Time', 'Model', 'Key / group', 'Family', 'Status', { label: 'Prompt', class: 'num' }, { label: 'Completion', class: 'num' }, { label: 'Cost', class: 'num' }, { label: 'Latency', class: 'num' }, 'Outcome'],
          u.records.map((rec) => recordRow(rec, names)),
          'Usage records',
        )
      : null;
    list?.classList.add('table-scroll', 'table-compact');
    const note = u.totals.requests > shown ? `latest ${num(shown)} of ${num(u.totals.requests)}` : `${num(shown)} ${shown === 1 ? 'request' : 'requests'}`;
    replace(
      records,
      card(
        'Requests',
        list ??
          empty('No requests in this period', 'Calls made with a key show up here once the gateway records them. Try a wider time range or fewer filters.'),
        { actions: h('span', { class: 'muted small' }, note) },
      ),
    );
  }

  async function start(): Promise<void> {
    try {
      const [k, g, m] = await Promise.all([api.listKeys(ctx.signal), api.listGroups(ctx.signal), api.listModels(ctx.signal)]);
      if (ctx.signal.aborted) return;
      keys = k.sort((a, b) => (a.name ?? a.id).localeCompare(b.name ?? b.id));
      groupNames = g.map((x) => x.name);
      buildFilters(g.sort((a, b) => a.name.localeCompare(b.name)), m.data);
    } catch (err) {
      if (isAbort(err) || ctx.signal.aborted) return;
      replace(filters, h('p', { class: 'muted' }, `Filters unavailable: ${errorText(err)}`));
    }
    await refresh();
  }

  void start();
  return destroyCharts;
};

function stat(label: string, value: string, sub?: string, bad = false): HTMLElement {
  return h('div', { class: `stat${bad ? ' stat-bad' : ''}` }, h('div', { class: 'stat-label' }, label), h('div', { class: 'stat-value' }, value), sub ? h('div', { class: 'stat-sub muted small' }, sub) : null);
}

function bucketLabel(ms: number): string {
  if (ms % 86_400_000 === 0) return ms === 86_400_000 ? 'per day' : `per ${ms / 86_400_000} days`;
  if (ms % 3_600_000 === 0) return ms === 3_600_000 ? 'per hour' : `per ${ms / 3_600_000} h`;
  if (ms % 60_000 === 0) return ms === 60_000 ? 'per minute' : `per ${ms / 60_000} min`;
  return `per ${duration(ms)}`;
}

function recordRow(r: UsageRecord, names: KeyNames): HTMLTableRowElement {
  const ok = r.status >= 200 && r.status < 300;
  const outcomeTone = r.outcome === 'finished' ? 'ok' : r.outcome === 'aborted' ? 'warn' : 'bad';
  return h(
    'tr',
    { 'data-request': r.requestId },
    h('td', { class: 'nowrap' }, h('time', { datetime: new Date(r.time).toISOString(), title: `${dateTime(r.time)} · ${r.requestId}` }, shortTime(r.time))),
    h(
      'td',
      { class: 'mono nowrap' },
      r.model ?? h('span', { class: 'muted' }, '–'),
      r.attempts > 1 ? h('div', { class: 'sub', title: 'Upstream calls: the first channels failed before anything reached the client' }, `via ${r.channel ?? '?'} · ${r.attempts} attempts`) : null,
    ),
    keyCell(r.keyId, r.group, names),
    h('td', { class: 'nowrap' }, r.family, r.streamed ? h('span', { class: 'muted small', title: 'streamed' }, ' · stream') : null),
    h('td', null, badge(String(r.status), ok ? 'ok' : r.status >= 500 ? 'bad' : 'warn')),
    h('td', { class: 'num', title: r.cachedInputTokens ? `${num(r.cachedInputTokens)} of them from the upstream's cache` : undefined }, compact(r.promptTokens), r.estimated ? h('span', { class: 'est', title: 'Estimated with a tokenizer: the upstream reported no usage' }, '≈') : null),
    h('td', { class: 'num', title: r.reasoningTokens ? `${num(r.reasoningTokens)} of them reasoning` : undefined }, compact(r.completionTokens)),
    h('td', { class: 'num', title: r.cost === null ? 'The model has no prices' : String(r.cost) }, r.cost === null ? h('span', { class: 'muted' }, '–') : money(r.cost)),
    h('td', { class: 'num', title: r.ttfbMs !== null ? `first byte after ${duration(r.ttfbMs)}` : undefined }, duration(r.latencyMs)),
    h('td', null, badge(r.outcome, outcomeTone, r.error ?? undefined), r.error ? h('div', { class: 'sub record-error', title: r.error }, r.error) : null),
  );
}
