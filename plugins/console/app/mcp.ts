/** MCP: the servers behind /mcp, their state and tools, and what each group is granted. */
import * as api from './api.js';
import { ApiError } from './api.js';
import { append, h, icon, icons, replace } from './dom.js';
import type { Page } from './page.js';
import type { McpReport, McpServer } from './types.js';
import { badge, button, card, chip, empty, isAbort, loadFailed, loading, pageHead, table } from './ui.js';

const stateTone = { ready: 'ok', starting: 'info', restarting: 'warn', failed: 'bad', stopped: 'muted' } as const;

export const mcpPage: Page = (ctx) => {
  const body = h('div', null, card('Servers', loading()));
  const refreshBtn = button([icon(icons.refresh), 'Refresh'], () => void load(), { kind: 'secondary' });
  append(
    ctx.root,
    pageHead('MCP', 'The MCP servers behind /mcp, from the config file (they change only at restart), and the tools each group may call.', refreshBtn),
    body,
  );

  async function load(): Promise<void> {
    try {
      const report = await api.mcpReport(ctx.signal);
      if (ctx.signal.aborted) return;
      replace(body, servers(report), grants(report));
    } catch (err) {
      if (isAbort(err) || ctx.signal.aborted) return;
      if (err instanceof ApiError && err.status === 404) {
        replace(body, card('Servers', empty('No MCP servers', 'Add servers to the mcp section of the config file and restart Sluice to serve them at /mcp.')));
        return;
      }
      replace(body, card('Servers', loadFailed(err, load)));
    }
  }

  void load();
};

function servers(report: McpReport): HTMLElement {
  const rows = report.servers.map((s) =>
    h(
      'tr',
      { 'data-server': s.name },
      h('td', { class: 'mono nowrap' }, s.name),
      h('td', null, badge(s.state, stateTone[s.state] ?? 'neutral', s.error ?? undefined), s.error ? h('div', { class: 'muted small' }, s.error) : null),
      h('td', { class: 'mono' }, s.transport === 'stdio' ? `stdio · ${s.command}` : `http · ${s.url}`),
      h('td', null, tools(s)),
      h('td', { class: 'nowrap' }, String(s.restarts)),
    ),
  );
  const summary = `${report.sessions} open session${report.sessions === 1 ? '' : 's'}, ${report.callsInFlight} call${report.callsInFlight === 1 ? '' : 's'} under way`;
  return card('Servers', rows.length ? table(['Server', 'State', 'Transport', 'Tools', 'Restarts'], rows, 'MCP servers') : empty('No MCP servers', 'The config file names none.'), {
    actions: h('span', { class: 'muted small' }, summary),
  });
}

function tools(s: McpServer): HTMLElement {
  if (s.tools.length === 0) return h('span', { class: 'muted' }, 'none');
  return h('div', { class: 'chips' }, s.tools.map((t) => chip(t.name, t.description)));
}

function grants(report: McpReport): HTMLElement {
  const rows = report.groups.map((g) =>
    h(
      'tr',
      { 'data-group': g.name },
      h('td', { class: 'mono nowrap' }, g.name),
      h('td', null, g.mcpTools.length ? h('div', { class: 'chips' }, g.mcpTools.map((x) => chip(x))) : h('span', { class: 'muted' }, 'none')),
      h('td', null, g.tools.length ? `${g.tools.length} tool${g.tools.length === 1 ? '' : 's'}` : h('span', { class: 'muted' }, 'none')),
    ),
  );
  return card('Grants', table(['Group', 'MCP grants', 'Reaches'], rows, 'MCP grants per group'));
}
