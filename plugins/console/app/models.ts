/** Models and their upstream channels, as the gateway's config defines them (read only). */
import * as api from './api.js';
import { append, h, replace } from './dom.js';
import { familyLabel } from './families.js';
import { ago, compact, dateTime, num, plural } from './format.js';
import type { Page } from './page.js';
import type { Health, Model, ModelsResponse, Serving, Upstream } from './types.js';
import { badge, button, card, chip, empty, isAbort, loadFailed, loading, pageHead, table, when } from './ui.js';

const servingTone = { native: 'ok', bridge: 'info', translated: 'neutral' } as const;
const servingText: Record<Serving, string> = {
  native: 'the upstream speaks this family: bytes pass through',
  bridge: 'a Responses client on a chat-only upstream, through the bridge',
  translated: 'translated between families',
};
const healthTone = { ok: 'ok', degraded: 'warn', down: 'bad', idle: 'muted' } as const;
const healthText: Record<Health, string> = { ok: 'OK', degraded: 'Degraded', down: 'Down', idle: 'Idle' };

const featureNames: [keyof Omit<Model['features'], 'serverTools'>, string][] = [
  ['tools', 'tools'],
  ['jsonSchema', 'JSON schema'],
  ['vision', 'vision'],
  ['temperature', 'temperature'],
  ['reasoning', 'reasoning'],
  ['streamUsage', 'stream usage'],
];

export const modelsPage: Page = (ctx) => {
  const body = h('div', { class: 'stack' }, card('Upstream channels', loading()));
  append(ctx.root, pageHead('Models', 'The models this gateway serves and the upstream channels behind them. They come from the config file.'), body);

  async function load(): Promise<void> {
    try {
      const m = await api.listModels(ctx.signal);
      if (ctx.signal.aborted) return;
      render(m);
    } catch (err) {
      if (isAbort(err) || ctx.signal.aborted) return;
      replace(body, card('Models', loadFailed(err, load)));
    }
  }

  function render(m: ModelsResponse): void {
    const refresh = button('Refresh', () => void load(), { small: true, title: 'Reload health and counts' });
    replace(
      body,
      card(
        'Upstream channels',
        m.upstreams.length ? h('div', { class: 'upstreams' }, m.upstreams.map(upstreamCard)) : empty('No upstreams', 'The config defines no upstream channel.'),
        { actions: h('div', { class: 'inline' }, h('span', { class: 'muted small' }, 'Health from recent requests'), refresh) },
      ),
      card(
        'Models',
        m.data.length
          ? table(['Model', 'Upstream', 'Families', 'Features', 'Limits'], m.data.map(modelRow), 'Models')
          : empty('No models', 'The config defines no model.'),
        {
          actions: h(
            'div',
            { class: 'legend' },
            h('span', { class: 'muted small' }, plural(m.data.length, 'model')),
            (['native', 'bridge', 'translated'] as Serving[]).map((s) => badge(s, servingTone[s], servingText[s])),
          ),
        },
      ),
    );
  }

  void load();
};

function upstreamCard(u: Upstream): HTMLElement {
  const { status, requests, errors, lastError, lastSeen } = u.health;
  const rate = requests ? (errors / requests) * 100 : 0;
  return h(
    'article',
    { class: `upstream upstream-${status}`, 'aria-label': `Upstream ${u.name}` },
    h('div', { class: 'upstream-head' }, h('h3', null, u.name), badge(healthText[status] ?? status, healthTone[status] ?? 'muted')),
    h('p', { class: 'muted small' }, `${u.kind} · speaks ${u.family}`),
    h(
      'dl',
      { class: 'stats' },
      h('div', null, h('dt', null, 'Requests'), h('dd', null, compact(requests))),
      h('div', null, h('dt', null, 'Errors'), h('dd', { class: errors ? 'text-bad' : undefined }, compact(errors), errors ? h('span', { class: 'muted small' }, ` (${rate < 10 ? rate.toFixed(1) : Math.round(rate)}%)`) : null)),
      h('div', null, h('dt', null, 'Last seen'), h('dd', null, when(lastSeen, ago, dateTime, 'never'))),
    ),
    lastError ? h('div', { class: 'last-error', title: lastError }, h('p', null, h('span', { class: 'last-error-label' }, 'Last error'), lastError)) : null,
  );
}

function modelRow(m: Model): HTMLTableRowElement {
  const families = Object.entries(m.families).filter((e): e is [string, Serving] => !!e[1]);
  const off = featureNames.filter(([k]) => !m.features[k]);
  const on = featureNames.filter(([k]) => m.features[k]);
  const limits: HTMLElement[] = [];
  if (m.maxOutputTokens.default !== undefined) limits.push(h('div', null, h('span', { class: 'muted' }, 'Output default '), num(m.maxOutputTokens.default)));
  if (m.maxOutputTokens.max !== undefined) limits.push(h('div', null, h('span', { class: 'muted' }, 'Output max '), num(m.maxOutputTokens.max)));
  if (m.contextTokens) limits.push(h('div', null, h('span', { class: 'muted' }, 'Context '), num(m.contextTokens)));
  return h(
    'tr',
    { 'data-model': m.id },
    h('td', { class: 'nowrap' }, h('strong', { class: 'mono' }, m.id), m.upstreamModel && m.upstreamModel !== m.id ? h('div', { class: 'muted small mono', title: 'Model name sent upstream' }, `→ ${m.upstreamModel}`) : null),
    h('td', { class: 'nowrap' }, h('div', null, m.upstream), h('div', { class: 'muted small' }, m.upstreamKind)),
    h(
      'td',
      null,
      h(
        'div',
        { class: 'chips' },
        families.length ? families.map(([f, how]) => badge(`${f} · ${how}`, servingTone[how] ?? 'muted', `${familyLabel(f)}: ${servingText[how] ?? how}`)) : h('span', { class: 'muted' }, 'none'),
      ),
    ),
    h(
      'td',
      null,
      h(
        'div',
        { class: 'chips' },
        on.map(([, label]) => chip(label)),
        off.map(([, label]) => h('span', { class: 'chip chip-off', title: `${label}: not supported (requests using it get 400)` }, label)),
        (m.features.serverTools ?? []).map((t) => h('span', { class: 'chip chip-tool', title: 'Server-side tool run by the upstream' }, t)),
      ),
    ),
    h('td', { class: 'limits' }, limits.length ? limits : h('span', { class: 'muted' }, '—')),
  );
}
