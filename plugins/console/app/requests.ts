/** The request log: the latest exchanges, each with its status, timings, tokens and error. */
import * as api from './api.js';
import { append, h, icon, icons, replace } from './dom.js';
import { compact, dateTime, duration, shortTime } from './format.js';
import type { Page } from './page.js';
import type { UsageRecord } from './types.js';
import { badge, button, card, empty, isAbort, keyCell, keyNames, loadFailed, loading, pageHead, table, type KeyNames } from './ui.js';

const LIMIT = 200;
const statusClasses = [
  { value: '', label: 'All statuses' },
  { value: '2xx', label: 'Succeeded (2xx)' },
  { value: '4xx', label: 'Refused (4xx)' },
  { value: '5xx', label: 'Failed (5xx)' },
];

export const requestsPage: Page = (ctx) => {
  let status = ctx.params.get('status') ?? '';
  const key = ctx.params.get('key') ?? undefined;
  const list = h('div', null, card('Latest requests', loading()));
  const select = h(
    'select',
    { id: 'requests-status', class: 'select-sm', onchange: () => { status = select.value; void load(); } },
    statusClasses.map((c) => h('option', { value: c.value, selected: c.value === status }, c.label)),
  );
  const refreshBtn = button([icon(icons.refresh), 'Refresh'], () => void load(), { kind: 'secondary' });
  append(ctx.root, pageHead('Requests', `The latest ${LIMIT} exchanges through the gateway, newest first, with what went wrong.`, refreshBtn), list);

  async function load(): Promise<void> {
    try {
      // Without the keys (a failed list), records still show, by key id.
      const [records, keys] = await Promise.all([api.requests({ key, status: status || undefined }, LIMIT, ctx.signal), api.listKeys(ctx.signal).catch(() => [])]);
      if (ctx.signal.aborted) return;
      const names = keyNames(keys);
      const filter = h('div', { class: 'inline' }, h('label', { for: 'requests-status', class: 'muted small' }, 'Status'), select);
      const body = records.length
        ? table(
            ['Time', 'Model', 'Key', 'Family', 'Status', { label: 'Tokens', class: 'num' }, { label: 'Latency', class: 'num' }, 'Error / notes'],
            records.map((r) => row(r, names)),
            'Requests',
          )
        : empty('No requests', status ? 'None with this status yet.' : 'Calls through the gateway show up here.');
      replace(list, card('Latest requests', body, { actions: filter }));
    } catch (err) {
      if (isAbort(err) || ctx.signal.aborted) return;
      replace(list, card('Latest requests', loadFailed(err, load)));
    }
  }

  void load();
};

function row(r: UsageRecord, names: KeyNames): HTMLTableRowElement {
  const tone = r.status >= 200 && r.status < 300 ? (r.outcome === 'finished' ? 'ok' : 'warn') : r.status >= 500 ? 'bad' : 'warn';
  const dash = () => h('span', { class: 'muted' }, '–');
  return h(
    'tr',
    { 'data-request': r.requestId },
    h('td', { class: 'nowrap' }, h('time', { datetime: new Date(r.time).toISOString(), title: dateTime(r.time) }, shortTime(r.time)), h('div', { class: 'sub mono' }, r.requestId)),
    h('td', { class: 'mono nowrap' }, r.model ?? dash()),
    keyCell(r.keyId, r.group, names),
    h('td', { class: 'nowrap' }, r.family, r.streamed ? h('span', { class: 'muted small' }, ' · stream') : null),
    h('td', null, badge(String(r.status), tone, r.outcome), r.outcome !== 'finished' ? h('div', { class: 'sub' }, r.outcome) : null),
    h('td', { class: 'num nowrap' }, `${compact(r.promptTokens)} → ${compact(r.completionTokens)}`, r.estimated ? h('span', { class: 'est', title: 'Estimated with a tokenizer' }, '≈') : null),
    h('td', { class: 'num nowrap' }, duration(r.latencyMs), h('div', { class: 'sub', title: 'Time to the first byte of the answer' }, r.ttfbMs === null ? 'no first byte' : `first byte ${duration(r.ttfbMs)}`)),
    h('td', { class: 'request-error' }, r.error ? h('div', { class: 'text-bad' }, r.error) : null, r.notes ? h('div', { class: 'muted small' }, r.notes) : null, !r.error && !r.notes ? dash() : null),
  );
}
