/** Groups: which models and families a group's keys may use, their limits and their budget. */
import * as api from './api.js';
import { append, h, icon, icons, replace } from './dom.js';
import { familyInfo, familyLabel } from './families.js';
import { ago, dateTime, plural } from './format.js';
import { budgetCell, budgetFields, limitsCell, limitsFields, unpricedModels, unpricedWarning } from './limits.js';
import type { Page } from './page.js';
import type { Group, Key, ModelsResponse } from './types.js';
import { busy, button, card, checkboxes, chip, confirmDialog, empty, errorText, field, FieldError, isAbort, loadFailed, loading, Notice, pageHead, submitForm, table, toast, when } from './ui.js';

export const groupsPage: Page = (ctx) => {
  const notice = new Notice();
  const formSlot = h('div', { class: 'slot' });
  const listSlot = h('div', null, card('All groups', loading()));
  let groups: Group[] = [];
  let keys: Key[] | null = null;
  let models: ModelsResponse | null = null;

  const newBtn = button([icon(icons.plus), 'New group'], () => openForm(), { kind: 'primary' });
  append(
    ctx.root,
    pageHead('Groups', 'Every key belongs to a group. A group decides which models and API families its keys may use, how fast and how much.', newBtn),
    notice.el,
    formSlot,
    listSlot,
  );

  async function load(): Promise<void> {
    try {
      const [g, m, k] = await Promise.all([
        api.listGroups(ctx.signal),
        api.listModels(ctx.signal),
        api.listKeys(ctx.signal).catch(() => null),
      ]);
      if (ctx.signal.aborted) return;
      groups = g.sort((a, b) => a.name.localeCompare(b.name));
      models = m;
      keys = k;
      renderList();
    } catch (err) {
      if (isAbort(err) || ctx.signal.aborted) return;
      replace(listSlot, card('All groups', loadFailed(err, load)));
    }
  }

  function keyCount(name: string): number | null {
    return keys ? keys.filter((k) => k.group === name).length : null;
  }

  function renderList(): void {
    if (groups.length === 0) {
      replace(
        listSlot,
        card(
          'All groups',
          empty('No groups yet', 'Create a group first, then give it keys.', button([icon(icons.plus), 'Create a group'], () => openForm(), { kind: 'primary' })),
        ),
      );
      return;
    }
    const rows = groups.map((g) => {
      const count = keyCount(g.name);
      return h(
        'tr',
        { 'data-group': g.name },
        h('td', null, h('strong', null, g.name)),
        h('td', null, h('div', { class: 'chips' }, g.models.length === 0 ? h('span', { class: 'muted' }, 'none') : g.models.map((m) => (m === '*' ? chip('All models (*)') : chip(m))))),
        h('td', null, h('div', { class: 'chips' }, g.families.length === 0 ? h('span', { class: 'muted' }, 'none') : g.families.map((f) => chip(f, familyLabel(f))))),
        h('td', null, limitsCell(g.limits)),
        h('td', null, budgetCell(g.budget, g.spend), g.budget && models ? unpricedWarning(unpricedModels(g.models, models.data)) : null),
        h('td', { class: 'num' }, count === null ? '–' : h('a', { href: `#/keys?group=${encodeURIComponent(g.name)}`, title: `Keys of ${g.name}` }, String(count))),
        h('td', null, when(g.createdAt, ago, dateTime)),
        h(
          'td',
          { class: 'row-actions' },
          button('Edit', () => openForm(g), { small: true, label: `Edit group ${g.name}` }),
          button('Delete', (ev) => remove(g, ev.currentTarget as HTMLButtonElement), { small: true, kind: 'danger', label: `Delete group ${g.name}` }),
        ),
      );
    });
    replace(
      listSlot,
      card(`All groups`, table(['Name', 'Models', 'Families', 'Limits', 'Budget', { label: 'Keys', class: 'num' }, 'Created', { label: '', class: 'row-actions' }], rows, 'Groups'), {
        actions: h('span', { class: 'muted small' }, plural(groups.length, 'group')),
      }),
    );
  }

  async function remove(g: Group, btn: HTMLButtonElement): Promise<void> {
    notice.clear();
    const count = keyCount(g.name);
    const ok = await confirmDialog({
      title: `Delete group “${g.name}”?`,
      message: h(
        'p',
        null,
        count
          ? `It still has ${plural(count, 'key')}. Sluice refuses to delete a group with keys: move or delete them first.`
          : 'Its grants are removed. This cannot be undone.',
      ),
      confirm: 'Delete group',
      danger: true,
    });
    if (!ok) return;
    try {
      await busy(btn, () => api.deleteGroup(g.name));
      toast(`Group “${g.name}” deleted`);
      await load();
    } catch (err) {
      notice.error(`Could not delete “${g.name}”: ${errorText(err)}`);
    }
  }

  function openForm(existing?: Group): void {
    notice.clear();
    if (!models) return;
    const form = groupForm(models, existing, {
      cancel: () => replace(formSlot),
      saved: async (g) => {
        replace(formSlot);
        toast(existing ? `Group “${g.name}” saved` : `Group “${g.name}” created`);
        await load();
      },
    });
    replace(formSlot, form);
    form.scrollIntoView({ block: 'nearest' });
    form.querySelector('input')?.focus();
  }

  void load();
};

function groupForm(models: ModelsResponse, existing: Group | undefined, on: { cancel(): void; saved(g: Group): void }): HTMLElement {
  const notice = new Notice();
  const name = h('input', {
    type: 'text',
    required: true,
    maxlength: '64',
    pattern: '[A-Za-z0-9][A-Za-z0-9._\\-]{0,63}',
    autocomplete: 'off',
    spellcheck: 'false',
    placeholder: 'team-a',
    value: existing?.name ?? '',
  });

  const current = existing?.models ?? [];
  const known = models.data.map((m) => m.id);
  // A group may still name a model the config no longer has: keep it selectable, so saving keeps it.
  const extra = current.filter((m) => m !== '*' && !known.includes(m));
  const all = h('input', { type: 'checkbox', value: '*', checked: current.includes('*'), 'aria-label': 'All models (*)' });
  const modelBoxes = checkboxes(
    'Models',
    [...models.data.map((m) => ({ value: m.id, label: m.id, hint: m.upstream })), ...extra.map((m) => ({ value: m, label: m, hint: 'not configured' }))],
    current,
  );
  modelBoxes.el
    .querySelector('.check-list')!
    .prepend(h('label', { class: 'check check-all' }, all, h('span', null, 'All models (*)'), h('span', { class: 'muted small' }, 'including ones added later')));
  const syncAll = () => {
    for (const b of modelBoxes.boxes) {
      b.disabled = all.checked;
      b.parentElement!.classList.toggle('is-disabled', all.checked);
    }
  };
  all.addEventListener('change', syncAll);
  syncAll();

  const familyBoxes = checkboxes(
    'Families',
    models.families.map((f) => ({ value: f, label: f, hint: familyInfo[f] ? `${familyInfo[f].label} · ${familyInfo[f].path}` : undefined })),
    existing?.families ?? [],
  );

  const mcpTools = h('input', {
    type: 'text',
    autocomplete: 'off',
    spellcheck: 'false',
    placeholder: 'everything/*, files/read_text_file',
    value: (existing?.mcpTools ?? []).join(', '),
  });
  const limits = limitsFields(existing?.limits);
  const budget = budgetFields(existing?.budget, existing?.spend, () => unpricedModels(all.checked ? ['*'] : modelBoxes.values(), models.data));
  all.addEventListener('change', budget.check);
  for (const b of modelBoxes.boxes) b.addEventListener('change', budget.check);

  const submit = h('button', { type: 'submit', class: 'btn btn-primary' }, existing ? 'Save changes' : 'Create group');
  const form = submitForm(
    notice,
    async () => {
      const newName = name.value.trim();
      if (!newName) throw new FieldError('Give the group a name.', name);
      if (!/^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/.test(newName)) {
        throw new FieldError('A group name starts with a letter or digit and has only letters, digits, “.”, “_” and “-” (64 at most).', name);
      }
      const grants = mcpTools.value.split(',').map((x) => x.trim()).filter(Boolean);
      const badGrant = grants.find((g) => !/^[A-Za-z0-9][A-Za-z0-9_-]{0,31}\/(\*|[A-Za-z0-9_.-]{1,128})$/.test(g));
      if (badGrant) throw new FieldError(`“${badGrant}” is not an MCP grant: write server/tool or server/*.`, mcpTools);
      const body = { name: newName, models: all.checked ? ['*'] : modelBoxes.values(), families: familyBoxes.values(), mcpTools: grants, limits: limits.read(), budget: budget.read() };
      const g = await busy(submit, () => {
        if (!existing) return api.createGroup(body);
        const patch: Partial<typeof body> = { models: body.models, families: body.families, mcpTools: body.mcpTools, limits: body.limits, budget: body.budget };
        if (newName !== existing.name) patch.name = newName;
        return api.updateGroup(existing.name, patch);
      });
      on.saved(g);
    },
    h('div', { class: 'form-grid' }, field('Name', name, 'Letters, digits, “.”, “_” and “-”.' + (existing ? ' Renaming moves its keys along.' : ''))),
    h(
      'div',
      { class: 'form-grid form-grid-2' },
      modelBoxes.el,
      familyBoxes.el,
      limits.el,
      budget.el,
    ),
    h('div', { class: 'form-grid' }, field('MCP tools', mcpTools, 'What its keys may call through /mcp: server/tool or server/*, separated by commas. None by default.')),
    notice.el,
    h('div', { class: 'form-actions' }, submit, button('Cancel', on.cancel, { kind: 'ghost' })),
  );
  return card(existing ? `Edit group “${existing.name}”` : 'New group', form, { class: 'card-form' });
}
