/**
 * Keys: create (the secret is shown once), rename, move, set an expiry, limits and a budget,
 * disable/enable, delete.
 */
import * as api from './api.js';
import { append, h, icon, icons, replace } from './dom.js';
import { ago, dateTime, plural } from './format.js';
import { budgetCell, budgetFields, limitsCell, limitsFields, unpricedModels, unpricedWarning } from './limits.js';
import type { Page } from './page.js';
import type { CreatedKey, Group, Key, Model } from './types.js';
import { badge, busy, button, card, confirmDialog, empty, errorText, field, isAbort, loadFailed, loading, Notice, pageHead, submitForm, table, toast, when } from './ui.js';

export const keysPage: Page = (ctx) => {
  const notice = new Notice();
  const secretSlot = h('div', { class: 'slot' });
  const formSlot = h('div', { class: 'slot' });
  const listSlot = h('div', null, card('All keys', loading()));
  let keys: Key[] = [];
  let groups: Group[] = [];
  /** Null when they could not be read: the page works without them, minus the price warnings. */
  let models: Model[] | null = null;
  let groupFilter = ctx.params.get('group') ?? '';

  const newBtn = button([icon(icons.plus), 'New key'], () => openForm(), { kind: 'primary' });
  // The form picks a group: until the groups are read (renderList), a click would open nothing.
  newBtn.disabled = true;
  append(
    ctx.root,
    pageHead('Keys', 'Applications call the gateway with a key. Its group decides what it may use; a key may have its own limits and budget.', newBtn),
    notice.el,
    secretSlot,
    formSlot,
    listSlot,
  );

  async function load(): Promise<void> {
    try {
      const [k, g, m] = await Promise.all([api.listKeys(ctx.signal), api.listGroups(ctx.signal), api.listModels(ctx.signal).catch(() => null)]);
      if (ctx.signal.aborted) return;
      models = m?.data ?? null;
      keys = k.sort((a, b) => b.createdAt - a.createdAt);
      groups = g.sort((a, b) => a.name.localeCompare(b.name));
      renderList();
    } catch (err) {
      if (isAbort(err) || ctx.signal.aborted) return;
      replace(listSlot, card('All keys', loadFailed(err, load)));
    }
  }

  /** The models key `k` may use (its group's) that have no prices, so its budget cannot count them. */
  function unpricedFor(k: Key): string[] {
    const group = groups.find((g) => g.name === k.group);
    return group && models ? unpricedModels(group.models, models) : [];
  }

  function groupSelect(selected: string, extra: Partial<Record<string, unknown>> = {}): HTMLSelectElement {
    const names = groups.map((g) => g.name);
    if (selected && !names.includes(selected)) names.push(selected);
    return h('select', extra, names.map((n) => h('option', { value: n, selected: n === selected }, n)));
  }

  function renderList(): void {
    newBtn.disabled = groups.length === 0;
    if (groups.length === 0 && keys.length === 0) {
      replace(
        listSlot,
        card('All keys', empty('No groups yet', 'A key belongs to a group: create a group first.', h('a', { class: 'btn btn-primary', href: '#/groups' }, 'Go to Groups'))),
      );
      return;
    }
    if (keys.length === 0) {
      replace(listSlot, card('All keys', empty('No keys yet', 'Create a key for each application that calls the gateway.', button([icon(icons.plus), 'Create a key'], () => openForm(), { kind: 'primary' }))));
      return;
    }
    const filter = h(
      'select',
      {
        'aria-label': 'Show keys of group',
        class: 'select-sm',
        onchange: (ev: Event) => {
          groupFilter = (ev.target as HTMLSelectElement).value;
          renderList();
        },
      },
      h('option', { value: '' }, 'All groups'),
      groups.map((g) => h('option', { value: g.name, selected: g.name === groupFilter }, g.name)),
    );
    const shown = groupFilter ? keys.filter((k) => k.group === groupFilter) : keys;
    const rows = shown.map(keyRow);
    const list = rows.length
      ? table(['Name / ID / prefix', 'Group', 'Status', 'Limits & budget', 'Expires (UTC)', 'Last used', { label: '', class: 'row-actions' }], rows, 'Keys')
      : null;
    list?.classList.add('table-compact');
    replace(
      listSlot,
      card(
        'All keys',
        list ?? empty('No keys in this group', `Group “${groupFilter}” has no keys yet.`),
        { actions: h('div', { class: 'inline' }, h('span', { class: 'muted small' }, plural(shown.length, 'key')), filter) },
      ),
    );
  }

  function keyRow(k: Key): HTMLTableRowElement {
    const label = k.name ?? k.id;
    const nameSlot = h('div');
    const nameCell = h(
      'td',
      { class: 'key-name' },
      nameSlot,
      h('div', { class: 'sub mono', title: 'Key id' }, k.id),
      h('div', { class: 'sub' }, h('code', { title: 'How the secret starts' }, `${k.prefix}…`)),
    );
    const showName = () => replace(nameSlot, k.name ? h('strong', null, k.name) : h('span', { class: 'muted' }, 'unnamed'));
    showName();

    const move = groupSelect(k.group, {
      'aria-label': `Group of key ${label}`,
      class: 'select-sm',
      onchange: async () => {
        const to = move.value;
        move.disabled = true;
        try {
          await api.updateKey(k.id, { group: to });
          k.group = to;
          toast(`Key “${label}” moved to ${to}`);
        } catch (err) {
          move.value = k.group;
          notice.error(`Could not move “${label}”: ${errorText(err)}`);
        }
        move.disabled = false;
      },
    });

    // A date picker: the key expires at the start of that day, UTC; empty means never.
    const expiry = h('input', {
      type: 'date',
      class: 'input-sm input-date',
      value: k.expiresAt ? k.expiresAt.slice(0, 10) : '',
      'aria-label': `Expiry of key ${label}`,
      onchange: async () => {
        expiry.disabled = true;
        try {
          const updated = await api.updateKey(k.id, { expiresAt: expiryFromDate(expiry.value) });
          k.expiresAt = updated.expiresAt;
          toast(k.expiresAt ? `Key “${label}” expires ${k.expiresAt.slice(0, 10)}` : `Key “${label}” never expires`);
          renderList();
        } catch (err) {
          expiry.value = k.expiresAt ? k.expiresAt.slice(0, 10) : '';
          notice.error(`Could not set the expiry of “${label}”: ${errorText(err)}`);
          expiry.disabled = false;
        }
      },
    });
    const expired = k.expiresAt !== null && Date.parse(k.expiresAt) <= Date.now();

    const rename = (btn: HTMLButtonElement) => {
      const input = h('input', { type: 'text', value: k.name ?? '', maxlength: '128', 'aria-label': `New name for key ${label}`, class: 'input-sm', placeholder: 'unnamed' });
      const save = async () => {
        const name = input.value.trim() || null;
        try {
          const updated = await busy(saveBtn, () => api.updateKey(k.id, { name }));
          k.name = updated.name;
          toast('Key renamed');
          renderList();
        } catch (err) {
          notice.error(`Could not rename: ${errorText(err)}`);
        }
      };
      const saveBtn = button('Save', save, { small: true, kind: 'primary' });
      input.addEventListener('keydown', (ev) => {
        if (ev.key === 'Enter') void save();
        if (ev.key === 'Escape') {
          showName();
          btn.disabled = false;
        }
      });
      replace(nameSlot, h('div', { class: 'inline' }, input, saveBtn, button('Cancel', () => { showName(); btn.disabled = false; }, { small: true, kind: 'ghost' })));
      btn.disabled = true;
      input.focus();
      input.select();
    };

    const toggle = async (btn: HTMLButtonElement) => {
      notice.clear();
      try {
        const updated = await busy(btn, () => api.updateKey(k.id, { disabled: !k.disabled }));
        k.disabled = updated.disabled;
        toast(k.disabled ? `Key “${label}” disabled` : `Key “${label}” enabled`);
        renderList();
      } catch (err) {
        notice.error(`Could not ${k.disabled ? 'enable' : 'disable'} “${label}”: ${errorText(err)}`);
      }
    };

    const remove = async (btn: HTMLButtonElement) => {
      notice.clear();
      const ok = await confirmDialog({
        title: `Delete key “${label}”?`,
        message: h('p', null, 'Applications using it get 401 at once. Its usage records stay. This cannot be undone.'),
        confirm: 'Delete key',
        danger: true,
      });
      if (!ok) return;
      try {
        await busy(btn, () => api.deleteKey(k.id));
        toast(`Key “${label}” deleted`);
        await load();
      } catch (err) {
        notice.error(`Could not delete “${label}”: ${errorText(err)}`);
      }
    };

    return h(
      'tr',
      { 'data-key': k.id, class: k.disabled ? 'is-disabled' : undefined },
      nameCell,
      h('td', null, move),
      h('td', null, k.disabled ? badge('Disabled', 'bad') : expired ? badge('Expired', 'bad') : badge('Active', 'ok')),
      h(
        'td',
        null,
        h(
          'div',
          { class: 'key-limits' },
          limitsCell(k.limits, groups.find((g) => g.name === k.group)?.limits ?? null),
          budgetCell(k.budget, k.spend, 'No own budget'),
          k.budget ? unpricedWarning(unpricedFor(k)) : null,
          button('Edit', () => openLimits(k), { small: true, label: `Limits and budget of key ${label}` }),
        ),
      ),
      h('td', { class: 'nowrap', title: k.expiresAt ?? 'never expires' }, expiry),
      h(
        'td',
        { class: 'nowrap' },
        k.lastUsedAt === null
          ? when(null, ago, dateTime)
          : h('a', { href: `#/usage?key=${encodeURIComponent(k.id)}`, title: `${dateTime(k.lastUsedAt)}: see this key's usage` }, ago(k.lastUsedAt)),
        h('div', { class: 'sub' }, 'created ', when(k.createdAt, ago, dateTime)),
      ),
      h(
        'td',
        { class: 'row-actions' },
        // Stacked: the row is three lines tall anyway, and the table stays narrow enough for 1280 px.
        h(
          'div',
          { class: 'action-stack' },
          button('Rename', (ev) => rename(ev.currentTarget as HTMLButtonElement), { small: true, label: `Rename key ${label}` }),
          button(k.disabled ? 'Enable' : 'Disable', (ev) => toggle(ev.currentTarget as HTMLButtonElement), { small: true, label: `${k.disabled ? 'Enable' : 'Disable'} key ${label}` }),
          button('Delete', (ev) => remove(ev.currentTarget as HTMLButtonElement), { small: true, kind: 'danger', label: `Delete key ${label}` }),
        ),
      ),
    );
  }

  function openForm(): void {
    notice.clear();
    if (groups.length === 0) return;
    const formNotice = new Notice();
    const name = h('input', { type: 'text', maxlength: '128', autocomplete: 'off', placeholder: 'ci-bot' });
    const group = groupSelect(groupFilter || groups[0]!.name);
    const expires = h('input', { type: 'date' });
    const submit = h('button', { type: 'submit', class: 'btn btn-primary' }, 'Create key');
    const form = submitForm(
      formNotice,
      async () => {
        const n = name.value.trim();
        const expiresAt = expiryFromDate(expires.value);
        const created = await busy(submit, () => api.createKey({ group: group.value, ...(n ? { name: n } : {}), ...(expiresAt ? { expiresAt } : {}) }));
        replace(formSlot);
        showSecret(created);
        await load();
      },
      h(
        'div',
        { class: 'form-grid form-grid-2' },
        field('Name', name, 'Optional: who or what uses it.'),
        field('Group', group, 'Decides the models and families it may use.'),
        field('Expires', expires, 'Optional: refused from the start of this day (UTC).'),
      ),
      formNotice.el,
      h('div', { class: 'form-actions' }, submit, button('Cancel', () => replace(formSlot), { kind: 'ghost' })),
    );
    replace(formSlot, card('New key', form, { class: 'card-form' }));
    name.focus();
  }

  /** A key's own limits (over its group's) and budget. */
  function openLimits(k: Key): void {
    notice.clear();
    const label = k.name ?? k.id;
    const formNotice = new Notice();
    const limits = limitsFields(k.limits, groups.find((g) => g.name === k.group)?.limits ?? null);
    const budget = budgetFields(k.budget, k.spend, () => unpricedFor(k));
    const submit = h('button', { type: 'submit', class: 'btn btn-primary' }, 'Save limits');
    const form = submitForm(
      formNotice,
      async () => {
        const patch = { limits: limits.read(), budget: budget.read() };
        await busy(submit, () => api.updateKey(k.id, patch));
        replace(formSlot);
        toast(`Limits of key “${label}” saved`);
        await load();
      },
      h('p', { class: 'muted' }, `Limits set here replace those of group “${k.group}” for this key alone. A budget here is checked besides the group's: a request needs room in both.`),
      h('div', { class: 'form-grid form-grid-2' }, limits.el, budget.el),
      formNotice.el,
      h('div', { class: 'form-actions' }, submit, button('Cancel', () => replace(formSlot), { kind: 'ghost' })),
    );
    const panel = card(`Limits and budget of key “${label}”`, form, { class: 'card-form' });
    replace(formSlot, panel);
    panel.scrollIntoView({ block: 'nearest' });
    panel.querySelector('input')?.focus();
  }

  /** The secret, shown once. It lives only in this panel: dismissing it drops it for good. */
  function showSecret(created: CreatedKey): void {
    const value = h('input', { type: 'text', readOnly: true, value: created.key, class: 'secret-value', 'aria-label': 'New key secret', spellcheck: 'false', autocomplete: 'off' });
    const status = h('span', { class: 'muted small', 'aria-live': 'polite' });
    const copyBtn = button([icon(icons.copy), 'Copy'], async () => {
      const copied = await copyText(value);
      status.textContent = copied ? 'Copied to the clipboard.' : 'Selected: press Ctrl+C (⌘C) to copy.';
      if (copied) copyBtn.classList.add('is-done');
    }, { kind: 'primary' });
    value.addEventListener('focus', () => value.select());
    const done = button("I've saved it — close", () => {
      value.value = '';
      replace(secretSlot);
      newBtn.focus();
    }, { kind: 'secondary' });
    const panel = h(
      'section',
      { class: 'secret-panel', role: 'region', 'aria-label': 'New key' },
      h('div', { class: 'secret-head' }, icon(icons.check, 'icon icon-ok'), h('h2', null, `Key “${created.name ?? created.id}” created in group ${created.group}`)),
      h('p', null, h('strong', null, 'Copy this secret now. You won’t see it again: '), 'Sluice keeps only a hash of it. If it is lost, create a new key.'),
      h('div', { class: 'secret-row' }, value, copyBtn),
      h('div', { class: 'secret-foot' }, status, done),
    );
    replace(secretSlot, panel);
    panel.scrollIntoView({ block: 'nearest' });
    value.focus();
  }

  void load();
};

/** A date input's value as the API's expiry: the start of that day, UTC; empty is never. */
function expiryFromDate(value: string): string | null {
  return value ? `${value}T00:00:00Z` : null;
}

/** Copies with the Clipboard API, else by selecting the text and the legacy copy command. */
async function copyText(input: HTMLInputElement): Promise<boolean> {
  try {
    if (navigator.clipboard && window.isSecureContext) {
      await navigator.clipboard.writeText(input.value);
      return true;
    }
  } catch {
    // fall through to selecting the text
  }
  input.focus();
  input.select();
  try {
    return document.execCommand('copy');
  } catch {
    return false;
  }
}
