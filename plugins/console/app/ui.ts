/** Shared pieces of every page: headings, cards, notices, badges, dialogs, toasts. */
import { ApiError } from './api.js';
import { h, icon, icons, replace, uid, type Child } from './dom.js';

export function errorText(err: unknown): string {
  if (err instanceof ApiError) return err.message;
  if (err instanceof Error) return err.message;
  return String(err);
}

/** Aborted loads (the page was left) are not errors worth showing. */
export function isAbort(err: unknown): boolean {
  return err instanceof DOMException && err.name === 'AbortError';
}

export function pageHead(title: string, description: string, ...actions: Child[]): HTMLElement {
  return h(
    'div',
    { class: 'page-head' },
    h('div', null, h('h1', null, title), h('p', { class: 'muted' }, description)),
    actions.length ? h('div', { class: 'page-actions' }, actions) : null,
  );
}

export function card(title: Child, body: Child, extra?: { actions?: Child; class?: string; label?: string }): HTMLElement {
  return h(
    'section',
    { class: ['card', extra?.class].filter(Boolean).join(' '), 'aria-label': extra?.label },
    title || extra?.actions ? h('div', { class: 'card-head' }, title ? h('h2', null, title) : h('span'), extra?.actions) : null,
    body,
  );
}

type Tone = 'ok' | 'warn' | 'bad' | 'info' | 'neutral' | 'muted';

export function badge(text: string, tone: Tone = 'neutral', title?: string): HTMLElement {
  return h('span', { class: `badge badge-${tone}`, title }, text);
}

export function chip(text: string, title?: string): HTMLElement {
  return h('span', { class: 'chip', title }, text);
}

/** A form value the API would refuse; the form shows the message and focuses the field. */
export class FieldError extends Error {
  constructor(
    message: string,
    readonly input: HTMLElement,
  ) {
    super(message);
  }
}

/**
 * A form whose submit runs `save`: what it throws is shown in `notice`, and a FieldError's input
 * gets the focus. The browser's own validation is off: the gateway's messages are the ones shown.
 */
export function submitForm(notice: Notice, save: () => Promise<void>, ...children: Child[]): HTMLFormElement {
  const onsubmit = async (ev: SubmitEvent) => {
    ev.preventDefault();
    notice.clear();
    try {
      await save();
    } catch (err) {
      notice.error(err);
      if (err instanceof FieldError) err.input.focus();
    }
  };
  return h('form', { class: 'form', novalidate: true, onsubmit }, ...children);
}

/** A place for an error (or success) message under a form or above a table. */
export class Notice {
  readonly el = h('div', { class: 'notice-slot', 'aria-live': 'polite' });

  error(err: unknown): void {
    this.show('error', errorText(err));
  }

  success(text: string): void {
    this.show('success', text);
  }

  /** `details` are listed under the text (a refused reload's reasons). */
  show(kind: 'error' | 'success' | 'info', text: string, details: string[] = []): void {
    replace(
      this.el,
      h(
        'div',
        { class: `notice notice-${kind}`, role: kind === 'error' ? 'alert' : 'status' },
        icon(kind === 'error' ? icons.alert : icons.check),
        h('div', null, h('span', null, text), details.length ? h('ul', { class: 'notice-list' }, details.map((d) => h('li', null, d))) : null),
      ),
    );
  }

  clear(): void {
    replace(this.el);
  }
}

export function empty(title: string, text: string, action?: Child): HTMLElement {
  return h('div', { class: 'empty' }, h('p', { class: 'empty-title' }, title), h('p', { class: 'muted' }, text), action);
}

export function loading(text = 'Loading…'): HTMLElement {
  return h('div', { class: 'loading', role: 'status' }, h('span', { class: 'spinner', 'aria-hidden': 'true' }), text);
}

export function button(label: Child, onclick: (ev: MouseEvent) => void, opts: { kind?: 'primary' | 'danger' | 'ghost' | 'secondary'; small?: boolean; title?: string; type?: 'button' | 'submit'; label?: string } = {}): HTMLButtonElement {
  return h(
    'button',
    {
      type: opts.type ?? 'button',
      class: ['btn', `btn-${opts.kind ?? 'secondary'}`, opts.small ? 'btn-sm' : ''].filter(Boolean).join(' '),
      title: opts.title,
      'aria-label': opts.label,
      onclick,
    },
    label,
  );
}

/** Runs `action` with `btn` disabled, so a double click cannot send it twice. */
export async function busy<T>(btn: HTMLButtonElement | null, action: () => Promise<T>): Promise<T> {
  if (btn) {
    btn.disabled = true;
    btn.setAttribute('aria-busy', 'true');
  }
  try {
    return await action();
  } finally {
    if (btn) {
      btn.disabled = false;
      btn.removeAttribute('aria-busy');
    }
  }
}

/** A labelled form control. */
export function field(label: string, control: HTMLElement, hint?: string): HTMLElement {
  const id = control.id || uid();
  control.id = id;
  return h('div', { class: 'field' }, h('label', { for: id }, label), control, hint ? h('p', { class: 'hint' }, hint) : null);
}

/** A set of checkboxes under a legend; `values()` reads the checked ones. */
export function checkboxes(legend: string, options: { value: string; label: string; hint?: string }[], checked: string[], hint?: string) {
  // The accessible name is the label alone; the hint describes it.
  const hintIds = options.map((o) => (o.hint ? uid('hint') : undefined));
  const boxes = options.map((o, i) =>
    h('input', { type: 'checkbox', value: o.value, checked: checked.includes(o.value), 'aria-label': o.label, 'aria-describedby': hintIds[i] }),
  );
  const el = h(
    'fieldset',
    { class: 'checks' },
    h('legend', null, legend),
    hint ? h('p', { class: 'hint' }, hint) : null,
    h(
      'div',
      { class: 'check-list' },
      options.map((o, i) => h('label', { class: 'check' }, boxes[i], h('span', null, o.label), o.hint ? h('span', { class: 'muted small', id: hintIds[i] }, o.hint) : null)),
    ),
  );
  return { el, boxes, values: () => boxes.filter((b) => b.checked).map((b) => b.value) };
}

/** A modal yes/no question. Resolves true only on the confirm button. */
export function confirmDialog(opts: { title: string; message: Child; confirm: string; danger?: boolean }): Promise<boolean> {
  return new Promise((resolve) => {
    const titleId = uid('dlg');
    const dialog = h('dialog', { class: 'dialog', 'aria-labelledby': titleId });
    let answer = false;
    const close = (yes: boolean) => {
      answer = yes;
      dialog.close();
    };
    // Escape, a button, or leaving the page: all end here.
    dialog.addEventListener('close', () => {
      dialog.remove();
      resolve(answer);
    });
    const ok = button(opts.confirm, () => close(true), { kind: opts.danger ? 'danger' : 'primary' });
    replace(
      dialog,
      h('h2', { id: titleId }, opts.title),
      h('div', { class: 'dialog-body' }, opts.message),
      h('div', { class: 'dialog-actions' }, button('Cancel', () => close(false), { kind: 'secondary' }), ok),
    );
    document.body.appendChild(dialog);
    dialog.showModal();
    ok.focus();
  });
}

let toastHost: HTMLElement | null = null;

/** A short confirmation in the corner ("Key disabled"). */
export function toast(text: string): void {
  if (!toastHost || !toastHost.isConnected) {
    toastHost = h('div', { class: 'toasts', role: 'status', 'aria-live': 'polite' });
    document.body.appendChild(toastHost);
  }
  const t = h('div', { class: 'toast' }, icon(icons.check), h('span', null, text));
  toastHost.appendChild(t);
  while (toastHost.children.length > 3) toastHost.firstElementChild!.remove();
  setTimeout(() => t.classList.add('toast-out'), 2600);
  setTimeout(() => t.remove(), 3000);
}

/**
 * A table with a header row; rows are built by the caller. A table wider than its card scrolls
 * inside its own box (never the page), with its row actions pinned to the right edge, and is
 * marked `overflows` so the pinned column shows where the rest slides under it.
 */
export function table(headers: (string | { label: string; class?: string })[], rows: HTMLTableRowElement[], label: string): HTMLElement {
  const el = h(
    'table',
    { 'aria-label': label },
    h('thead', null, h('tr', null, headers.map((c) => (typeof c === 'string' ? h('th', { scope: 'col' }, c) : h('th', { scope: 'col', class: c.class }, c.label))))),
    h('tbody', null, rows),
  );
  const wrap = h('div', { class: 'table-wrap' }, el);
  // Dropped with the elements when the table is replaced.
  const observer = new ResizeObserver(() => wrap.classList.toggle('overflows', wrap.scrollWidth > wrap.clientWidth + 1));
  observer.observe(wrap);
  observer.observe(el);
  return wrap;
}

/** A relative time with the exact one on hover. */
export function when(ms: number | null, ago: (ms: number) => string, exact: (ms: number) => string, never = 'never'): HTMLElement {
  if (ms === null) return h('span', { class: 'muted' }, never);
  return h('time', { datetime: new Date(ms).toISOString(), title: exact(ms) }, ago(ms));
}

/** A failed load, with a way to try again. */
export function loadFailed(err: unknown, retry: () => void): HTMLElement {
  return h(
    'div',
    { class: 'empty' },
    h('p', { class: 'empty-title' }, 'Could not load this page'),
    h('div', { class: 'notice notice-error', role: 'alert' }, icon(icons.alert), h('span', null, errorText(err))),
    button([icon(icons.refresh), 'Try again'], retry),
  );
}

/** Names of keys by id, for showing records made with them (null: the key has no name). */
export type KeyNames = Map<string, string | null>;

export function keyNames(keys: { id: string; name: string | null }[]): KeyNames {
  return new Map(keys.map((k) => [k.id, k.name]));
}

/**
 * The key of a record as operators know it: its name, with the id on hover; an unnamed or
 * deleted key by its id. The group, when given, goes beneath.
 */
export function keyCell(keyId: string | null, group: string | null, names: KeyNames): HTMLTableCellElement {
  if (keyId === null) return h('td', null, h('span', { class: 'muted' }, '–'), group ? h('div', { class: 'sub' }, group) : null);
  const known = names.has(keyId);
  const name = names.get(keyId);
  // A short name stays on one line; a long one wraps rather than widen the table.
  const label = name
    ? h('span', { class: ['key-ref', name.length <= 24 && 'nowrap'], title: `Key id ${keyId}`, 'data-key-id': keyId }, name)
    : h('span', { class: 'key-ref mono nowrap', title: known ? 'Key id: this key has no name' : 'Key id: this key was deleted', 'data-key-id': keyId }, keyId);
  return h('td', { class: 'key-cell' }, label, group ? h('div', { class: 'sub' }, group) : null);
}
