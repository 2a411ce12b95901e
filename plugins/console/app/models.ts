/**
 * Models and their upstream channels as the gateway's config defines them, each channel with its
 * circuit breaker, latency average and calls under way; the config can be reloaded from here.
 */
import * as api from './api.js';
import { append, h, icon, icons, replace } from './dom.js';
import { familyLabel } from './families.js';
import { ago, compact, dateTime, duration, num, plural, shortTime } from './format.js';
import type { Page } from './page.js';
import type { BreakerState, Channel, ChannelState, Health, Model, ModelsResponse, ReloadChanges, Serving, Upstream, UpstreamBreakers } from './types.js';
import { badge, busy, button, card, chip, confirmDialog, empty, errorText, isAbort, loadFailed, loading, Notice, pageHead, table, when } from './ui.js';

const servingTone = { native: 'ok', bridge: 'info', translated: 'neutral' } as const;
const servingText: Record<Serving, string> = {
  native: 'the upstream speaks this family: bytes pass through',
  bridge: 'a Responses client on a chat-only upstream, through the bridge',
  translated: 'translated between families',
};
const healthTone = { ok: 'ok', degraded: 'warn', down: 'bad', idle: 'muted' } as const;
const healthText: Record<Health, string> = { ok: 'OK', degraded: 'Degraded', down: 'Down', idle: 'Idle' };
const breakerTone = { closed: 'ok', 'half-open': 'warn', open: 'bad' } as const;
const breakerText: Record<BreakerState, { label: string; means: string }> = {
  closed: { label: 'Closed', means: 'serving' },
  'half-open': { label: 'Half-open', means: 'a probe request decides whether it serves again' },
  open: { label: 'Open', means: 'skipped after failures until its cool-down ends' },
};

/** Live breaker states by model and channel; `failed` says why there are none. */
interface Breakers {
  byChannel: Map<string, ChannelState>;
  byUpstream: Map<string, ChannelState[]>;
  failed?: string;
}
const channelKey = (model: string, channel: string) => `${model}\u0000${channel}`;
/** Prices per million tokens are often fractions of a cent apart (0.075): keep every digit. */
const priceFmt = new Intl.NumberFormat('en-US', { minimumFractionDigits: 2, maximumFractionDigits: 6 });

const featureNames: [keyof Omit<Model['features'], 'serverTools'>, string][] = [
  ['tools', 'tools'],
  ['jsonSchema', 'JSON schema'],
  ['vision', 'vision'],
  ['temperature', 'temperature'],
  ['reasoning', 'reasoning'],
  ['streamUsage', 'stream usage'],
];

export const modelsPage: Page = (ctx) => {
  const notice = new Notice();
  const body = h('div', { class: 'stack' }, card('Upstreams', loading()));
  const reloadBtn = button([icon(icons.refresh), 'Reload config'], () => void reload(), { kind: 'secondary' });
  append(
    ctx.root,
    pageHead('Models', 'The models this gateway serves and the upstream channels behind them. They come from the config file; reloading it needs no restart.', reloadBtn),
    notice.el,
    body,
  );

  async function load(): Promise<void> {
    try {
      const [m, breakers] = await Promise.all([api.listModels(ctx.signal), loadBreakers()]);
      if (ctx.signal.aborted) return;
      render(m, breakers);
    } catch (err) {
      if (isAbort(err) || ctx.signal.aborted) return;
      replace(body, card('Models', loadFailed(err, load)));
    }
  }

  /** The page still shows the config when the breakers cannot be read. */
  async function loadBreakers(): Promise<Breakers> {
    const byChannel = new Map<string, ChannelState>();
    const byUpstream = new Map<string, ChannelState[]>();
    let upstreams: UpstreamBreakers[];
    try {
      upstreams = await api.upstreams(ctx.signal);
    } catch (err) {
      if (isAbort(err)) throw err;
      return { byChannel, byUpstream, failed: errorText(err) };
    }
    for (const u of upstreams) {
      byUpstream.set(u.name, u.channels);
      for (const c of u.channels) byChannel.set(channelKey(c.model, c.channel), c);
    }
    return { byChannel, byUpstream };
  }

  async function reload(): Promise<void> {
    notice.clear();
    const ok = await confirmDialog({
      title: 'Reload the config file?',
      message: h(
        'p',
        null,
        'Sluice reads the config file again and applies its upstreams, models, prices and limits. Requests under way finish on the config they started with. A file with errors is refused and the running config stays.',
      ),
      confirm: 'Reload config',
    });
    if (!ok) return;
    try {
      const result = await busy(reloadBtn, () => api.reloadConfig());
      const changes = describeChanges(result.changes);
      notice.show('success', changes.length ? 'Config reloaded. Changes:' : 'Config reloaded: nothing changed.', changes);
      await load();
    } catch (err) {
      const reasons = err instanceof api.ApiError && Array.isArray(err.detail?.reasons) ? (err.detail.reasons as unknown[]).map(String) : [];
      notice.show('error', reasons.length ? 'The config was not reloaded; the running one stays:' : `The config was not reloaded: ${errorText(err)}`, reasons);
    }
  }

  function render(m: ModelsResponse, breakers: Breakers): void {
    const models = table(['Model', 'Channels', 'Families', 'Features', 'Prices per 1M', 'Limits'], m.data.map((model) => modelRow(model, breakers)), 'Models');
    models.classList.add('table-compact');
    const refresh = button('Refresh', () => void load(), { small: true, title: 'Reload health, breakers and counts' });
    replace(
      body,
      card(
        'Upstreams',
        m.upstreams.length ? h('div', { class: 'upstreams' }, m.upstreams.map((u) => upstreamCard(u, breakers.byUpstream.get(u.name)))) : empty('No upstreams', 'The config defines no upstream.'),
        { actions: h('div', { class: 'inline' }, h('span', { class: 'muted small' }, 'Health from recent requests'), refresh) },
      ),
      card(
        'Models',
        m.data.length
          ? h(
              'div',
              null,
              breakers.failed ? h('p', { class: 'notice notice-info table-note' }, `Channel states are unavailable: ${breakers.failed}`) : null,
              models,
            )
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

/** "1 open · 2 closed" */
function breakerSummary(channels: ChannelState[] | undefined): HTMLElement | null {
  if (!channels?.length) return null;
  const counts = (['open', 'half-open', 'closed'] as BreakerState[]).map((s) => [s, channels.filter((c) => c.state === s).length] as const).filter(([, n]) => n > 0);
  return h(
    'p',
    { class: 'small' },
    h('span', { class: 'muted' }, 'Breakers '),
    counts.map(([s, n], i) => [i ? h('span', { class: 'muted' }, ' · ') : null, h('span', { class: s === 'closed' ? undefined : `text-${breakerTone[s]}` }, `${n} ${s}`)]),
  );
}

/** "models added: a, b" for each section and kind of change a reload made. */
function describeChanges(changes: ReloadChanges): string[] {
  return Object.entries(changes).flatMap(([section, c]) =>
    (['added', 'removed', 'changed'] as const).filter((kind) => c[kind].length).map((kind) => `${section} ${kind}: ${c[kind].join(', ')}`),
  );
}

function upstreamCard(u: Upstream, breakers: ChannelState[] | undefined): HTMLElement {
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
    breakerSummary(breakers),
    lastError ? h('div', { class: 'last-error', title: lastError }, h('p', null, h('span', { class: 'last-error-label' }, 'Last error'), lastError)) : null,
  );
}

/** One channel: where it goes, its order and share, and its breaker. */
function channelLine(m: Model, c: Channel, breakers: Breakers): HTMLElement {
  const s = breakers.byChannel.get(channelKey(m.id, c.name));
  const order = m.channels.length > 1 ? h('span', { class: 'muted small', title: 'Priority (lower first) and weight within it' }, ` · p${c.priority} w${c.weight}`) : null;
  const state = s
    ? badge(breakerText[s.state].label, breakerTone[s.state], `Breaker ${s.state}: ${breakerText[s.state].means}${s.openedAt ? `; opened ${dateTime(Date.parse(s.openedAt))}` : ''}${s.nextProbeAt ? `; next probe ${dateTime(Date.parse(s.nextProbeAt))}` : ''}`)
    : badge('Unknown', 'muted', breakers.failed ?? 'The gateway reports no state for this channel');
  return h(
    'div',
    { class: 'channel', 'data-channel': c.name, 'data-state': s?.state ?? 'unknown' },
    h('div', { class: 'inline channel-head' }, h('span', null, c.upstream), order, state),
    c.upstreamModel !== m.id ? h('div', { class: 'muted small mono', title: 'Model name sent upstream' }, `→ ${c.upstreamModel}`) : null,
    s ? loadLine(s) : null,
    s?.state === 'open' && s.nextProbeAt ? h('div', { class: 'sub' }, `Probed again at ${shortTime(Date.parse(s.nextProbeAt))}`) : null,
    s && s.recentRequests > 0 ? h('div', { class: `small${s.recentErrors ? ' text-bad' : ' muted'}` }, `${num(s.recentErrors)} of ${plural(s.recentRequests, 'recent request')} failed`) : null,
    s?.lastError ? h('div', { class: 'sub record-error', title: s.lastError }, s.lastError) : null,
  );
}

/** "Latency 840 ms · 2 in flight": what `strategy: least-latency` and `least-busy` choose by. */
function loadLine(s: ChannelState): HTMLElement {
  return h(
    'div',
    {
      class: 'muted small channel-load',
      'data-latency-ms': s.latencyMs === null ? '' : String(s.latencyMs),
      'data-in-flight': String(s.inFlight),
      title: "Latency: moving average of this channel's recent calls' wait for an answer (least-latency balances by it). In flight: its calls under way now (least-busy balances by it).",
    },
    `Latency ${s.latencyMs === null ? 'not measured yet' : duration(s.latencyMs)} · ${num(s.inFlight)} in flight`,
  );
}

function pricesCell(m: Model): HTMLElement {
  const p = m.prices;
  if (!p) return h('span', { class: 'muted', title: 'Usage of this model has no cost, and budgets do not count it' }, 'No prices');
  const line = (label: string, v: number) => h('div', null, h('span', { class: 'muted' }, `${label} `), priceFmt.format(v));
  return h(
    'div',
    { class: 'limits' },
    line('Input', p.input),
    p.cachedInput !== p.input ? line('Cached', p.cachedInput) : null,
    line('Output', p.output),
    p.reasoning !== p.output ? line('Reasoning', p.reasoning) : null,
  );
}

function modelRow(m: Model, breakers: Breakers): HTMLTableRowElement {
  const families = Object.entries(m.families).filter((e): e is [string, Serving] => !!e[1]);
  const off = featureNames.filter(([k]) => !m.features[k]);
  const on = featureNames.filter(([k]) => m.features[k]);
  const limits: HTMLElement[] = [];
  if (m.maxOutputTokens.default !== undefined) limits.push(h('div', null, h('span', { class: 'muted' }, 'Output default '), num(m.maxOutputTokens.default)));
  if (m.maxOutputTokens.max !== undefined) limits.push(h('div', null, h('span', { class: 'muted' }, 'Output max '), num(m.maxOutputTokens.max)));
  if (m.contextTokens) limits.push(h('div', null, h('span', { class: 'muted' }, 'Context '), num(m.contextTokens)));
  const across = "Across every key, to protect the upstream's own quota";
  if (m.limits?.rpm) limits.push(h('div', { title: across }, h('span', { class: 'muted' }, 'Requests/min '), num(m.limits.rpm)));
  if (m.limits?.tpm) limits.push(h('div', { title: across }, h('span', { class: 'muted' }, 'Tokens/min '), num(m.limits.tpm)));
  if (m.limits?.concurrency) limits.push(h('div', { title: across }, h('span', { class: 'muted' }, 'At once '), num(m.limits.concurrency)));
  return h(
    'tr',
    { 'data-model': m.id },
    h('td', { class: 'nowrap' }, h('strong', { class: 'mono' }, m.id)),
    h('td', null, h('div', { class: 'channels' }, m.channels.map((c) => channelLine(m, c, breakers)))),
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
    h('td', null, pricesCell(m)),
    h('td', { class: 'limits' }, limits.length ? limits : h('span', { class: 'muted' }, '—')),
  );
}
