/** The audit log: who changed what, and when (also failed sign-ins). */
import * as api from './api.js';
import { append, h, icon, icons, replace } from './dom.js';
import { dateTime, shortTime } from './format.js';
import type { Page } from './page.js';
import type { AuditEntry } from './types.js';
import { badge, button, card, empty, isAbort, loadFailed, loading, pageHead, table } from './ui.js';

const LIMIT = 200;

export const auditPage: Page = (ctx) => {
  const list = h('div', null, card('Latest actions', loading()));
  const refreshBtn = button([icon(icons.refresh), 'Refresh'], () => void load(), { kind: 'secondary' });
  append(ctx.root, pageHead('Audit', 'Every change to groups and keys, and every sign-in, from the API, this console and the CLI.', refreshBtn), list);

  async function load(): Promise<void> {
    try {
      const entries = await api.auditLog(LIMIT, ctx.signal);
      if (ctx.signal.aborted) return;
      const body = entries.length
        ? table(['Time', 'Actor', 'Action', 'Target', 'Detail'], entries.map(row), 'Audit log')
        : empty('Nothing yet', 'Changes made through the admin API, the console or the CLI show up here.');
      replace(list, card('Latest actions', body));
    } catch (err) {
      if (isAbort(err) || ctx.signal.aborted) return;
      replace(list, card('Latest actions', loadFailed(err, load)));
    }
  }

  void load();
};

function row(e: AuditEntry): HTMLTableRowElement {
  const tone = e.action.endsWith('_failed') ? 'bad' : e.action.endsWith('.delete') ? 'warn' : 'neutral';
  return h(
    'tr',
    { 'data-action': e.action },
    h('td', { class: 'nowrap' }, h('time', { datetime: new Date(e.time).toISOString(), title: dateTime(e.time) }, shortTime(e.time))),
    h('td', { class: 'mono nowrap' }, e.actor),
    h('td', null, badge(e.action, tone)),
    h('td', { class: 'mono nowrap' }, e.target ?? h('span', { class: 'muted' }, '–')),
    h('td', { class: 'audit-detail' }, e.detail ?? h('span', { class: 'muted' }, '–')),
  );
}
