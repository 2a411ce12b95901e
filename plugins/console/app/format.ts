/** Human-readable numbers and times. */

const numberFmt = new Intl.NumberFormat('en-US');
const compactFmt = new Intl.NumberFormat('en-US', { notation: 'compact', maximumFractionDigits: 1 });
const dateTimeFmt = new Intl.DateTimeFormat(undefined, {
  year: 'numeric',
  month: 'short',
  day: 'numeric',
  hour: '2-digit',
  minute: '2-digit',
});
const timeFmt = new Intl.DateTimeFormat(undefined, { hour: '2-digit', minute: '2-digit', second: '2-digit' });
const shortFmt = new Intl.DateTimeFormat(undefined, { month: 'short', day: 'numeric', hour: '2-digit', minute: '2-digit' });

export const num = (n: number) => numberFmt.format(n);
export const compact = (n: number) => (Math.abs(n) < 10_000 ? numberFmt.format(Math.round(n * 10) / 10) : compactFmt.format(n));

/** "Mar 4, 2026, 14:03" */
export const dateTime = (ms: number) => dateTimeFmt.format(ms);

/** Today: "14:03:22"; earlier: "Mar 4, 14:03". */
export function shortTime(ms: number, now = Date.now()): string {
  const d = new Date(ms);
  const today = new Date(now);
  return d.toDateString() === today.toDateString() ? timeFmt.format(d) : shortFmt.format(d);
}

/** "just now", "5 min ago", "3 h ago", "2 days ago", then a date. */
export function ago(ms: number, now = Date.now()): string {
  const s = Math.round((now - ms) / 1000);
  if (s < 0) return dateTime(ms);
  if (s < 45) return 'just now';
  const m = Math.round(s / 60);
  if (m < 60) return `${m} min ago`;
  const hr = Math.round(m / 60);
  if (hr < 24) return `${hr} h ago`;
  const d = Math.round(hr / 24);
  if (d < 30) return d === 1 ? 'yesterday' : `${d} days ago`;
  return dateTime(ms);
}

/** "< 1 ms", "840 ms", "1.24 s", "2 min 5 s". */
export function duration(ms: number): string {
  if (ms < 1) return '< 1 ms';
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(ms < 10_000 ? 2 : 1)} s`;
  const m = Math.floor(ms / 60_000);
  return `${m} min ${Math.round((ms % 60_000) / 1000)} s`;
}

/** A value for <input type="datetime-local"> in local time. */
export function toLocalInput(ms: number): string {
  const d = new Date(ms);
  const p = (n: number) => String(n).padStart(2, '0');
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())}T${p(d.getHours())}:${p(d.getMinutes())}`;
}

/** Parses <input type="datetime-local">; undefined when empty or invalid. */
export function fromLocalInput(value: string): number | undefined {
  if (!value) return undefined;
  const ms = new Date(value).getTime();
  return Number.isFinite(ms) ? ms : undefined;
}

export const plural = (n: number, one: string, many = `${one}s`) => `${num(n)} ${n === 1 ? one : many}`;

const moneyFmt = new Intl.NumberFormat('en-US', { minimumFractionDigits: 2, maximumFractionDigits: 2 });
const centsFmt = new Intl.NumberFormat('en-US', { maximumSignificantDigits: 2 });

/**
 * An amount in the prices' currency, without a symbol (the config does not name one): two
 * decimals, or two significant digits below a cent, where one request's cost usually lies.
 */
export const money = (n: number) => (n === 0 || Math.abs(n) >= 0.01 ? moneyFmt.format(n) : centsFmt.format(n));
