/** The sign-in screen: one field for the admin token. */
import { ApiError, login } from './api.js';
import { h, icon, icons, replace } from './dom.js';
import { errorText } from './ui.js';

/**
 * How long a console session lasts: the admin API's session lifetime (Sessions' ttlMs in
 * src/admin/sessions.ts). The sign-in page cannot ask before signing in; the console's e2e test
 * checks the two agree.
 */
export const SESSION_HOURS = 8;

export function loginScreen(opts: { message?: string; onSignedIn: () => void }): HTMLElement {
  const input = h('input', {
    id: 'admin-token',
    type: 'password',
    name: 'token',
    required: true,
    autocomplete: 'current-password',
    spellcheck: 'false',
    placeholder: 'sluice-admin-…',
  });
  const submit = h('button', { type: 'submit', class: 'btn btn-primary btn-block' }, 'Sign in');
  const message = h('div', { class: 'notice-slot', 'aria-live': 'polite' });
  let timer: ReturnType<typeof setInterval> | undefined;

  const show = (kind: 'error' | 'info', text: string) =>
    replace(message, h('div', { class: `notice notice-${kind}`, role: kind === 'error' ? 'alert' : 'status' }, icon(icons.alert), h('span', null, text)));

  /** After too many wrong tokens: count down, then allow another try. */
  const lockFor = (seconds: number) => {
    clearInterval(timer);
    let left = Math.ceil(seconds);
    submit.disabled = true;
    const tick = () => {
      if (left <= 0) {
        clearInterval(timer);
        submit.disabled = false;
        submit.textContent = 'Sign in';
        return;
      }
      submit.textContent = `Try again in ${left} s`;
      left -= 1;
    };
    tick();
    timer = setInterval(tick, 1000);
  };

  const form = h(
    'form',
    {
      class: 'login-form',
      novalidate: true,
      onsubmit: async (ev: SubmitEvent) => {
        ev.preventDefault();
        const token = input.value.trim();
        if (!token) {
          show('error', 'Enter the admin token.');
          input.focus();
          return;
        }
        submit.disabled = true;
        submit.setAttribute('aria-busy', 'true');
        replace(message);
        try {
          await login(token);
          clearInterval(timer);
          opts.onSignedIn();
          return;
        } catch (err) {
          if (err instanceof ApiError && err.status === 429) {
            const wait = err.retryAfter;
            show('error', `Too many failed attempts. ${wait ? `Wait ${Math.ceil(wait)} seconds, then try again.` : 'Wait a moment, then try again.'}`);
            submit.removeAttribute('aria-busy');
            if (wait) lockFor(wait);
            else submit.disabled = false;
            return;
          }
          if (err instanceof ApiError && err.status === 401) {
            show('error', 'That admin token is not valid. Check it and try again.');
          } else {
            show('error', errorText(err));
          }
          input.select();
        }
        submit.disabled = false;
        submit.removeAttribute('aria-busy');
      },
    },
    h('div', { class: 'field' }, h('label', { for: 'admin-token' }, 'Admin token'), input,
      h('p', { class: 'hint' }, 'Printed on first start and saved in the data directory as admin-token.')),
    message,
    submit,
  );

  if (opts.message) show('info', opts.message);

  const screen = h(
    'main',
    { class: 'login' },
    h(
      'div',
      { class: 'login-card' },
      h('div', { class: 'brand brand-lg' }, h('span', { class: 'logo', 'aria-hidden': 'true' }), h('span', null, 'Sluice ', h('span', { class: 'brand-sub' }, 'console'))),
      h('h1', null, 'Sign in'),
      h('p', { class: 'muted' }, 'Manage groups, keys, models and usage of this gateway.'),
      form,
    ),
    h('p', { class: 'login-foot muted small' }, `Your session lasts ${SESSION_HOURS} hours, or until you sign out.`),
  );
  queueMicrotask(() => input.focus());
  return screen;
}
