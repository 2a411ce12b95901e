/**
 * The console's entry point: restores the session, shows the sign-in screen or the app, and
 * routes by hash (#/groups, #/keys, #/models, #/usage, #/requests, #/mcp, #/audit).
 */
import * as api from './api.js';
import { auditPage } from './audit.js';
import { h, icon, icons, replace } from './dom.js';
import { groupsPage } from './groups.js';
import { keysPage } from './keys.js';
import { loginScreen } from './login.js';
import { mcpPage } from './mcp.js';
import { modelsPage } from './models.js';
import type { Page } from './page.js';
import { requestsPage } from './requests.js';
import { dateTime } from './format.js';
import { errorText, toast } from './ui.js';
import { usagePage } from './usage.js';

interface Route {
  title: string;
  icon: string[];
  page: Page;
}

const routes: Record<string, Route> = {
  groups: { title: 'Groups', icon: icons.groups, page: groupsPage },
  keys: { title: 'Keys', icon: icons.keys, page: keysPage },
  models: { title: 'Models', icon: icons.models, page: modelsPage },
  usage: { title: 'Usage', icon: icons.usage, page: usagePage },
  requests: { title: 'Requests', icon: icons.requests, page: requestsPage },
  mcp: { title: 'MCP', icon: icons.mcp, page: mcpPage },
  audit: { title: 'Audit', icon: icons.audit, page: auditPage },
};

const app = document.getElementById('app')!;

interface Shell {
  outlet: HTMLElement;
  crumb: HTMLElement;
  links: Map<string, HTMLAnchorElement>;
}

let shell: Shell | null = null;
let current: { controller: AbortController; cleanup?: () => void } | null = null;

/** `#/usage?key=k1` → { name: 'usage', params: key=k1 } */
function parseHash(): { name: string; params: URLSearchParams } {
  const m = /^#\/([a-z]+)(?:\?(.*))?$/.exec(location.hash);
  if (m && routes[m[1]!]) return { name: m[1]!, params: new URLSearchParams(m[2] ?? '') };
  return { name: 'groups', params: new URLSearchParams() };
}

function leavePage(): void {
  if (!current) return;
  current.controller.abort();
  for (const d of document.querySelectorAll('dialog')) d.close();
  current.cleanup?.();
  current = null;
}

function buildShell(): Shell {
  const links = new Map<string, HTMLAnchorElement>();
  const nav = h(
    'nav',
    { class: 'sidebar', 'aria-label': 'Sections' },
    h(
      'ul',
      null,
      Object.entries(routes).map(([name, r]) => {
        const a = h('a', { href: `#/${name}` }, icon(r.icon), h('span', null, r.title));
        links.set(name, a);
        return h('li', null, a);
      }),
    ),
  );
  const crumb = h('span', { class: 'crumb' });
  const logoutBtn = h(
    'button',
    {
      type: 'button',
      class: 'btn btn-ghost',
      onclick: async () => {
        logoutBtn.disabled = true;
        try {
          await api.logout();
          showLogin('You have signed out.');
        } catch (err) {
          logoutBtn.disabled = false;
          toast(`Could not sign out: ${errorText(err)}`);
        }
      },
    },
    icon(icons.logout),
    h('span', null, 'Logout'),
  );
  const ends = api.sessionEndsAt();
  if (ends !== null) logoutBtn.title = `This session ends ${dateTime(ends)}`;
  const header = h(
    'header',
    { class: 'topbar' },
    h('a', { class: 'brand', href: '#/groups' }, h('span', { class: 'logo', 'aria-hidden': 'true' }), h('span', null, 'Sluice ', h('span', { class: 'brand-sub' }, 'console'))),
    h('span', { class: 'crumb-sep', 'aria-hidden': 'true' }, '/'),
    crumb,
    h('span', { class: 'spacer' }),
    logoutBtn,
  );
  const outlet = h('main', { class: 'content', id: 'content', tabindex: '-1' });
  // Standing warnings (an open gateway) stay above every page until the config changes.
  const warnings = api.warnings().map((w) => h('div', { class: 'notice notice-warn gateway-warning', role: 'alert' }, icon(icons.alert), h('div', null, w)));
  replace(
    app,
    h('a', { class: 'skip', href: '#content', onclick: (e: Event) => { e.preventDefault(); outlet.focus(); } }, 'Skip to content'),
    header,
    warnings,
    h('div', { class: 'layout' }, nav, outlet),
  );
  return { outlet, crumb, links };
}

function render(): void {
  if (!shell) return;
  const { name, params } = parseHash();
  const r = routes[name]!;
  leavePage();
  for (const [n, a] of shell.links) {
    if (n === name) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  shell.crumb.textContent = r.title;
  document.title = `${r.title} · Sluice console`;
  replace(shell.outlet);
  const controller = new AbortController();
  current = { controller };
  const cleanup = r.page({ root: shell.outlet, signal: controller.signal, params, navigate });
  if (current?.controller === controller && cleanup) current.cleanup = cleanup;
}

function navigate(hash: string): void {
  if (location.hash === hash) render();
  else location.hash = hash;
}

function showApp(): void {
  shell = buildShell();
  if (!location.hash) history.replaceState(null, '', '#/groups');
  render();
}

function showLogin(message?: string): void {
  leavePage();
  shell = null;
  document.title = 'Sign in · Sluice console';
  replace(app, loginScreen({ message, onSignedIn: showApp }));
}

window.addEventListener('hashchange', () => {
  if (shell && api.signedIn()) render();
});

api.onUnauthorized(() => {
  if (shell) showLogin('Your session has ended. Sign in again.');
});

api
  .restoreSession()
  .then((ok) => (ok ? showApp() : showLogin()))
  .catch((err) => showLogin(errorText(err)));
