/**
 * The web console in a real browser: Debian's Chromium (driven by playwright-core) → /console on
 * a real gateway → the admin API, with chat calls through the simulator in its own process.
 * It also writes a screenshot of every page to test-output/console/ (and, with
 * SLUICE_UPDATE_SCREENSHOTS=1, to docs/console/, the pictures docs/operations.md shows).
 */
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium, type Page } from 'playwright-core';
import t, { type Test } from 'tap';
import { chatGatewayYaml, distRoot, eventually, startSimulatorProcess, startTestGateway } from './helpers.js';

// A real browser through every page, at two widths: it can take longer than the default minute under load.
t.setTimeout(180_000);

const chromiumPath = process.env.SLUICE_CHROMIUM ?? '/usr/bin/chromium';
if (!existsSync(chromiumPath)) throw new Error(`the console test needs Chromium at ${chromiumPath} (apt-get install chromium)`);
if (!existsSync(`${distRoot}console/app/main.js`)) throw new Error('the console is not built: run npm run build');

const shots = fileURLToPath(new URL(process.env.SLUICE_UPDATE_SCREENSHOTS ? '../../docs/console/' : '../../test-output/console/', import.meta.url));
mkdirSync(shots, { recursive: true });

const sim = await startSimulatorProcess();
// A priced model, one explicitly without prices (budgets cannot count it), and one whose first
// channel cannot be reached (its breaker has something to show).
const gw = await startTestGateway(
  chatGatewayYaml(
    sim.url,
    `  - id: sim-priced
    upstream: sim
    upstreamModel: sim-chat
    prices: { input: 2, cachedInput: 1, output: 8 }
    limits: { rpm: 600 }
  - { id: sim-unpriced, upstream: sim, upstreamModel: sim-chat }
  - id: sim-failover
    channels:
      - { upstream: unreachable, upstreamModel: sim-chat }
      - { upstream: sim, upstreamModel: sim-chat, priority: 1 }
`,
  ),
);
const browser = await chromium.launch({
  executablePath: chromiumPath,
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
t.teardown(async () => {
  await browser.close();
  await gw.stop();
  await sim.stop();
});

const context = await browser.newContext({ viewport: { width: 1280, height: 800 }, locale: 'en-US', timezoneId: 'UTC' });
await context.grantPermissions(['clipboard-read', 'clipboard-write'], { origin: gw.url });
const page = await context.newPage();
page.setDefaultTimeout(10_000);
const pageErrors: string[] = [];
page.on('pageerror', (err) => pageErrors.push(err.message));
// Nothing may leave 127.0.0.1: no CDN, fonts or telemetry.
const foreign: string[] = [];
page.on('request', (req) => {
  if (!req.url().startsWith(gw.url) && !req.url().startsWith('data:')) foreign.push(req.url());
});

const consoleUrl = `${gw.url}/console`;
const user = (content: string) => [{ role: 'user', content }];

function chat(key: string, model: string, content: string) {
  return fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model, messages: user(content) }),
  });
}

/** A full-page picture for the docs, without passing toasts, from the top (the sticky bar stays there). */
async function screenshot(p: Page, name: string): Promise<void> {
  await p.evaluate('window.scrollTo(0, 0)');
  await p.screenshot({ path: `${shots}${name}.png`, fullPage: true, animations: 'disabled', style: '.toasts { display: none !important; }' });
}

/** Where an element is, and whether a person can see and click it where it is. */
interface OnScreen {
  left: number;
  right: number;
  width: number;
  height: number;
  viewport: number;
  /** Ancestors that clip it (overflow other than visible) and that it pokes out of. */
  clippedBy: string[];
  /** Boxes that had to scroll sideways to show it. */
  scrolledSideways: string[];
  /** The element under its centre is it (or inside it): nothing covers it. */
  onTop: boolean;
}

/**
 * Scrolls the element into view as a person would (the page or a box scrolling down), notes any
 * box that had to scroll sideways for it, then measures it. It runs in the page; `any`: the test
 * is compiled without the DOM's types.
 */
async function onScreen(locator: ReturnType<Page['locator']>): Promise<OnScreen> {
  return locator.evaluate((el: any) => {
    const win = el.ownerDocument.defaultView;
    const boxes: any[] = [];
    for (let a = el.parentElement; a; a = a.parentElement) boxes.push(a);
    const left = boxes.map((a) => a.scrollLeft);
    el.scrollIntoView({ block: 'center', inline: 'nearest' });
    const scrolledSideways = boxes.filter((a, i) => a.scrollLeft !== left[i]).map((a) => a.className || a.tagName);
    const r = el.getBoundingClientRect();
    const clippedBy: string[] = [];
    for (let a = el.parentElement; a; a = a.parentElement) {
      const style = win.getComputedStyle(a);
      if (style.overflowX === 'visible' && style.overflowY === 'visible') continue;
      const c = a.getBoundingClientRect();
      if (r.left < c.left - 0.5 || r.right > c.right + 0.5 || r.top < c.top - 0.5 || r.bottom > c.bottom + 0.5) clippedBy.push(a.className || a.tagName);
    }
    const hit = el.ownerDocument.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
    // Put sideways scrolling back, so the next check starts where a person would.
    boxes.forEach((a, i) => (a.scrollLeft = left[i]));
    return { left: r.left, right: r.right, width: r.width, height: r.height, viewport: win.innerWidth, clippedBy, scrolledSideways, onTop: !!hit && (hit === el || el.contains(hit)) };
  });
}

/** Fails unless a person sees the whole element at once, uncovered, without scrolling sideways. */
async function checkOnScreen(t: Test, locator: ReturnType<Page['locator']>, what: string): Promise<void> {
  const at = await onScreen(locator);
  t.ok(at.width > 0 && at.height > 0, `${what}: rendered`);
  t.ok(at.left >= 0 && at.right <= at.viewport, `${what}: within the ${at.viewport} px window (${Math.round(at.left)}–${Math.round(at.right)} px)`);
  t.same(at.scrolledSideways, [], `${what}: in view without scrolling sideways`);
  t.same(at.clippedBy, [], `${what}: not cut off by a scrolling box`);
  t.ok(at.onTop, `${what}: nothing covers it`);
}

/** The table of a page needs no sideways scrolling: every column is in view. */
async function checkTableFits(t: Test, p: Page, label: string): Promise<void> {
  const { scrollWidth, clientWidth } = await p.getByRole('table', { name: label }).evaluate((el: any) => {
    const wrap = el.closest('.table-wrap');
    return { scrollWidth: wrap.scrollWidth as number, clientWidth: wrap.clientWidth as number };
  });
  t.ok(scrollWidth <= clientWidth, `${label}: the table is ${scrollWidth} px wide in ${clientWidth} px, no sideways scrolling`);
}

/** Follows a sidebar link and waits for the page's heading. */
async function open(p: Page, name: string): Promise<void> {
  await p.getByRole('navigation', { name: 'Sections' }).getByRole('link', { name }).click();
  await p.getByRole('heading', { level: 1, name }).waitFor();
}

let secret = '';
let requestId = '';
const keyName = 'console-e2e';

t.test('the page loads, small, from the gateway alone', async (t) => {
  const sizes: Promise<number>[] = [];
  page.on('requestfinished', function track(req) {
    if (req.url().startsWith(`${gw.url}/console`)) sizes.push(req.sizes().then((s) => s.responseBodySize));
  });
  await page.goto(consoleUrl);
  await page.getByLabel('Admin token').waitFor();
  await page.waitForLoadState('networkidle');
  page.removeAllListeners('requestfinished');
  const total = (await Promise.all(sizes)).reduce((a, b) => a + b, 0);
  t.ok(sizes.length >= 5, `page, styles, scripts and uPlot loaded (${sizes.length} files)`);
  t.ok(total > 0 && total < 200_000, `first load is ${total} bytes on the wire (under 200 KB)`);
  t.equal(await page.title(), 'Sign in · Sluice console');
  await screenshot(page, 'login');
});

t.test('a wrong token shows an error and keeps the login screen', async (t) => {
  await page.getByLabel('Admin token').fill('sluice-admin-not-the-token');
  await page.getByRole('button', { name: 'Sign in' }).click();
  const alert = page.getByRole('alert');
  await alert.waitFor();
  t.match(await alert.textContent(), /not valid/);
  t.ok(await page.getByLabel('Admin token').isVisible(), 'still on the login screen');
});

t.test('sign in and create a group', async (t) => {
  const promise = (await page.locator('.login-foot').textContent()) ?? '';
  await page.getByLabel('Admin token').fill(gw.adminToken);
  const signIn = page.waitForResponse((r) => r.url() === `${gw.url}/admin/session` && r.request().method() === 'POST' && r.status() === 200);
  await page.getByRole('button', { name: 'Sign in' }).click();
  // What the sign-in page promised is what the gateway gave: the session and its cookie.
  const response = await signIn;
  const { expiresAt } = (await response.json()) as { expiresAt: number };
  const hours = Math.round((expiresAt - Date.now()) / 3_600_000);
  const maxAge = Number(/Max-Age=(\d+)/.exec((await response.headerValue('set-cookie')) ?? '')?.[1]);
  t.equal(Math.round(maxAge / 3600), hours, `the cookie lasts as long as the session (${hours} h)`);
  t.match(promise, new RegExp(`\\b${hours} hours\\b`), `the sign-in page says the session lasts ${hours} hours`);
  t.match(promise, /until you sign out/);
  await page.getByRole('heading', { level: 1, name: 'Groups' }).waitFor();
  t.match(page.url(), /#\/groups$/);
  await page.getByRole('row', { name: /default/ }).waitFor();

  await page.getByRole('button', { name: 'New group' }).click();
  await page.getByLabel('Name', { exact: true }).fill('team-a');
  await page.getByLabel('sim-chat', { exact: true }).check();
  await page.getByLabel('chat', { exact: true }).check();
  await page.getByRole('button', { name: 'Create group' }).click();
  const row = page.getByRole('row', { name: /team-a/ });
  await row.waitFor();
  t.match(await row.textContent(), /sim-chat/);

  const { body } = await gw.admin('GET', '/admin/groups');
  t.match(
    body.data.find((g: { name: string }) => g.name === 'team-a'),
    { models: ['sim-chat'], families: ['chat'] },
    'the group has exactly what was ticked',
  );
  await screenshot(page, 'groups');
});

t.test('create a key: the secret is shown once and works', async (t) => {
  await open(page, 'Keys');
  await page.getByRole('button', { name: 'New key' }).click();
  await page.getByLabel('Name', { exact: true }).fill(keyName);
  await page.getByLabel('Group', { exact: true }).selectOption('team-a');
  await page.getByRole('button', { name: 'Create key' }).click();

  const value = page.getByLabel('New key secret');
  await value.waitFor();
  secret = await value.inputValue();
  t.match(secret, /^sk-\S{20,}$/, 'the secret is in the panel');
  t.match(await page.getByRole('region', { name: 'New key' }).textContent(), /won’t see it again/);
  await page.getByRole('row', { name: new RegExp(keyName) }).waitFor();
  await screenshot(page, 'keys');

  await page.getByRole('button', { name: 'Copy' }).click();
  await page.getByText('Copied to the clipboard.').waitFor();
  t.equal(await page.evaluate('navigator.clipboard.readText()'), secret, 'Copy puts the secret on the clipboard');

  const res = await chat(secret, 'sim-chat', 'Hello from the console test [[sim tokens=6]]');
  t.equal(res.status, 200, 'the new key calls the gateway');
  requestId = res.headers.get('x-request-id') ?? '';
  t.ok(requestId, 'the call has a request id');
  const reply = (await res.json()) as { usage: { completion_tokens: number } };
  t.equal(reply.usage.completion_tokens, 6);

  await page.getByRole('button', { name: /saved it/ }).click();
  t.equal(await page.getByLabel('New key secret').count(), 0, 'dismissed for good');
});

t.test('New key waits for the groups it offers: a click while they load opens the form once they are read', async (t) => {
  await open(page, 'Groups');
  let release!: () => void;
  const held = new Promise<void>((resolve) => (release = resolve));
  await page.route('**/admin/groups', async (route) => {
    await held;
    await route.continue();
  });
  t.teardown(() => page.unroute('**/admin/groups'));
  await open(page, 'Keys');
  const newKey = page.getByRole('button', { name: 'New key' });
  t.equal(await newKey.isDisabled(), true, 'disabled while the groups load');
  const clicked = newKey.click();
  release();
  await clicked;
  await page.getByLabel('Name', { exact: true }).waitFor();
  t.ok((await page.getByLabel('Group', { exact: true }).locator('option').allTextContents()).includes('team-a'), 'the form offers the groups');
  await page.getByRole('button', { name: 'Cancel' }).click();
});

t.test('usage shows the call, with charts and a CSV export', async (t) => {
  // More traffic for the charts: the demo key, and one upstream that cannot be reached.
  t.equal((await chat(gw.key, 'sim-basic', 'Hi [[sim tokens=12]]')).status, 200);
  t.equal((await chat(gw.key, 'sim-chat', 'Hi again [[sim tokens=30]]')).status, 200);
  t.equal((await chat(gw.key, 'sim-unreachable', 'Anyone there?')).status, 503);
  await eventually(async () => (await gw.admin('GET', '/admin/usage')).body.records.length >= 4, 'usage records written');

  await open(page, 'Usage');
  const row = page.locator(`tr[data-request="${requestId}"]`);
  await row.waitFor();
  // Every call came in the last minutes: the range is the last hour, in one-minute buckets.
  t.equal(await page.getByRole('button', { name: '1 h' }).getAttribute('aria-pressed'), 'true', 'the range fits fresh data: the last hour');
  t.equal(await page.getByRole('button', { name: '7 days' }).getAttribute('aria-pressed'), 'false');
  t.match(await page.locator('.chart-card', { hasText: 'Requests' }).first().locator('.card-head').textContent(), /per minute/, 'in one-minute buckets');
  t.match(await page.locator('.stat').first().textContent(), /in the last hour/);
  t.ok(await page.getByText('fits the data').isVisible(), 'the page says the range follows the data');
  const text = (await row.textContent()) ?? '';
  t.match(text, /sim-chat/, 'the model is in the table');
  t.match(text, new RegExp(keyName), 'the key is in the table, by name');
  t.match(text, /team-a/);
  const requests = page.locator('.stat').filter({ has: page.getByText('Requests', { exact: true }) }).locator('.stat-value');
  t.equal(await requests.textContent(), '4', 'the total counts every call');
  t.equal(await page.locator('.chart-card').count(), 5, 'five charts');
  t.equal(await page.locator('.chart-card canvas').count(), 5, 'each chart is drawn');
  await page.locator('.chart-card', { hasText: 'Errors' }).locator('canvas').waitFor();
  await screenshot(page, 'usage');

  // Filter to the new key: only its call is left.
  const keyId = ((await gw.admin('GET', '/admin/keys')).body.data as { id: string; name: string }[]).find((k) => k.name === keyName)!.id;
  await page.getByLabel('Key', { exact: true }).selectOption(keyId);
  await page.locator('tr[data-request]').first().waitFor();
  await eventually(async () => (await requests.textContent()) === '1', 'the filtered total');
  t.equal(await page.locator('tr[data-request]').count(), 1, 'one record for the key');

  const href = await page.getByRole('link', { name: 'Export CSV' }).getAttribute('href');
  t.match(href, new RegExp(`^/admin/usage\\.csv\\?key=${keyId}&`), 'the export follows the filters');
  const csv = await page.request.get(gw.url + href!);
  t.equal(csv.status(), 200, 'the session cookie goes with the download');
  t.match(await csv.text(), requestId);
});

t.test('a disabled key gets 401 on its next call', async (t) => {
  await open(page, 'Keys');
  const row = page.getByRole('row', { name: new RegExp(keyName) });
  await row.getByRole('button', { name: `Disable key ${keyName}` }).click();
  await row.getByRole('button', { name: `Enable key ${keyName}` }).waitFor();
  t.match(await row.textContent(), /Disabled/);
  const res = await chat(secret, 'sim-chat', 'Still there?');
  t.equal(res.status, 401);
  t.match(await res.json(), { error: { code: 'key_disabled' } });
});

t.test('the secret is not shown again after a reload', async (t) => {
  await page.reload();
  await page.getByRole('row', { name: new RegExp(keyName) }).waitFor();
  t.equal(await page.getByLabel('New key secret').count(), 0, 'no secret panel');
  t.notOk((await page.content()).includes(secret), 'the secret is nowhere in the page');
  t.ok((await page.locator('tr', { hasText: keyName }).textContent())?.includes(secret.slice(0, 6)), 'only its prefix is listed');
});

t.test('models and upstream channels', async (t) => {
  await open(page, 'Models');
  const row = page.locator('tr[data-model="sim-chat"]');
  await row.waitFor();
  t.match(await row.textContent(), /chat · native/);
  t.match(await row.textContent(), /responses · bridge/);
  const channel = page.getByRole('article', { name: 'Upstream sim' });
  await channel.waitFor();
  t.match(await channel.textContent(), /OK/);
  t.match(await page.getByRole('article', { name: 'Upstream unreachable' }).textContent(), /Down/);
  await screenshot(page, 'models');
});

t.test('a key created with an expiry shows it; the API has it', async (t) => {
  await open(page, 'Keys');
  await page.getByRole('button', { name: 'New key' }).click();
  await page.getByLabel('Name', { exact: true }).fill('expiring');
  await page.getByLabel('Expires', { exact: true }).fill('2031-03-15');
  await page.getByRole('button', { name: 'Create key' }).click();
  await page.getByLabel('New key secret').waitFor();
  await page.getByRole('button', { name: /saved it/ }).click();
  const expiry = page.getByLabel('Expiry of key expiring');
  await expiry.waitFor();
  t.equal(await expiry.inputValue(), '2031-03-15', 'shown in the list');
  const { body } = await gw.admin('GET', '/admin/keys');
  const key = body.data.find((k: { name: string }) => k.name === 'expiring');
  t.equal(key.expiresAt, '2031-03-15T00:00:00.000Z');

  await expiry.fill('2020-01-02');
  await page.getByRole('row', { name: /expiring/ }).getByText('Expired').waitFor();
  t.equal((await gw.admin('GET', `/admin/keys/${key.id}`)).body.expiresAt, '2020-01-02T00:00:00.000Z', 'edited in place');
});

t.test('the request log shows a failed call with its error', async (t) => {
  await open(page, 'Requests');
  const failed = page.locator('tr[data-request]', { hasText: 'sim-unreachable' }).first();
  await failed.waitFor();
  t.match(await failed.textContent(), /503.*upstream_unavailable: Upstream `unreachable` is unreachable/);
  // Keys by name, as on the Usage page, with the id on hover.
  const keyId = ((await gw.admin('GET', '/admin/keys')).body.data as { id: string; name: string }[]).find((k) => k.name === keyName)!.id;
  const mine = page.locator(`tr[data-request="${requestId}"] .key-ref`);
  t.equal(await mine.textContent(), keyName, 'the key by its name');
  t.match(await mine.getAttribute('title'), keyId, 'its id on hover');
  t.notMatch(await page.locator(`tr[data-request="${requestId}"]`).textContent(), keyId, 'not the id in the text');
  t.equal(await failed.locator('.key-ref').textContent(), 'demo', 'the demo key too');
  await page.getByLabel('Status').selectOption('2xx');
  // The successful call is in the list before and after the filter: wait for the failed one to go.
  await page.locator('tr[data-request]', { hasText: 'sim-unreachable' }).first().waitFor({ state: 'detached' });
  await page.locator(`tr[data-request="${requestId}"]`).waitFor();
  t.equal(await page.locator('tr[data-request]', { hasText: 'sim-unreachable' }).count(), 0, 'the status filter hides it');
  await screenshot(page, 'requests');
});

t.test('the audit page lists the actions just done, by this console session', async (t) => {
  await open(page, 'Audit');
  const rows = page.locator('tr[data-action]');
  await rows.first().waitFor();
  const text = (await rows.allTextContents()).join('\n');
  for (const action of ['session.sign_in_failed', 'session.sign_in', 'group.create', 'key.create', 'key.update']) t.match(text, action);
  t.match(text, /team-a/);
  t.match(await rows.filter({ hasText: 'group.create' }).first().textContent(), /console:[\w-]{8}@127\.0\.0\.1/);
  await screenshot(page, 'audit');
});

/** How the console shows an amount: two decimals, or two significant digits below a cent. */
const money = (n: number) =>
  n === 0 || Math.abs(n) >= 0.01
    ? new Intl.NumberFormat('en-US', { minimumFractionDigits: 2, maximumFractionDigits: 2 }).format(n)
    : new Intl.NumberFormat('en-US', { maximumSignificantDigits: 2 }).format(n);

t.test("a group's limits and budget are edited in the console and stored", async (t) => {
  await open(page, 'Groups');
  await page.getByRole('button', { name: 'Edit group team-a' }).click();
  await page.getByLabel('Requests per minute').fill('120');
  await page.getByLabel('Tokens per minute').fill('50000');
  await page.getByLabel('Concurrent requests').fill('3');
  await page.getByLabel('Budget amount').fill('10');
  await page.getByLabel('Budget period').selectOption('month');
  await page.getByRole('button', { name: 'Save changes' }).click();
  const row = page.locator('tr[data-group="team-a"]');
  await row.getByText('120 rpm').waitFor();
  t.match(await row.textContent(), /50K tpm.*3 at once/);
  t.match(await row.textContent(), /0\.00 of 10\.00 per month.*10\.00 left/);
  const team = async () => ((await gw.admin('GET', '/admin/groups')).body.data as { name: string }[]).find((g) => g.name === 'team-a') as Record<string, any>;
  t.same((await team()).limits, { rpm: 120, tpm: 50000, concurrency: 3 }, 'the API has the limits');
  t.same((await team()).budget, { amount: 10, period: 'month' }, 'and the budget');
  t.match((await team()).spend, { period: 'month', spent: 0, remaining: 10 });
  await screenshot(page, 'groups');

  // A fraction is refused in the page; an emptied field removes that limit.
  await page.getByRole('button', { name: 'Edit group team-a' }).click();
  t.equal(await page.getByLabel('Requests per minute').inputValue(), '120', 'the form shows the stored limits');
  await page.getByLabel('Requests per minute').fill('1.5');
  await page.getByRole('button', { name: 'Save changes' }).click();
  t.match(await page.getByRole('alert').textContent(), /Requests per minute: a whole number/);
  t.same((await team()).limits, { rpm: 120, tpm: 50000, concurrency: 3 }, 'nothing was sent');
  await page.getByLabel('Requests per minute').fill('120');
  await page.getByLabel('Tokens per minute').fill('');
  await page.getByRole('button', { name: 'Save changes' }).click();
  await eventually(async () => (await row.textContent())?.includes('tpm') === false, 'the tpm limit gone from the list');
  t.same((await team()).limits, { rpm: 120, concurrency: 3 }, 'tpm removed');
});

t.test("a key's own limits and budget override its group's", async (t) => {
  await open(page, 'Keys');
  await page.getByRole('button', { name: `Limits and budget of key ${keyName}` }).click();
  const rpm = page.getByLabel('Requests per minute');
  t.equal(await rpm.getAttribute('placeholder'), 'group: 120', "an empty field shows the group's limit it keeps");
  await rpm.fill('30');
  await page.getByLabel('Budget amount').fill('2.5');
  await page.getByLabel('Budget period').selectOption('day');
  await page.getByRole('button', { name: 'Save limits' }).click();
  const row = page.getByRole('row', { name: new RegExp(keyName) });
  await row.getByText('30 rpm').waitFor();
  t.match(await row.textContent(), /3 at once · group/, "the group's concurrency still applies");
  t.match(await row.textContent(), /of 2\.50 per day/);
  const key = ((await gw.admin('GET', '/admin/keys')).body.data as { name: string }[]).find((k) => k.name === keyName) as Record<string, any>;
  t.same(key.limits, { rpm: 30 });
  t.same(key.budget, { amount: 2.5, period: 'day' });
  t.match(key.spend, { period: 'day', spent: 0, remaining: 2.5 });
});

t.test('a budget over models without prices warns, naming them', async (t) => {
  const { body: models } = await gw.admin('GET', '/admin/models');
  const prices = new Map((models.data as { id: string; prices?: unknown }[]).map((m) => [m.id, m.prices]));
  t.notOk(prices.get('sim-unpriced'), 'the config gives sim-unpriced no prices');
  t.ok(prices.get('sim-priced'), 'and sim-priced some');
  for (const [name, granted] of [['budgeted', ['sim-priced', 'sim-unpriced']], ['priced-only', ['sim-priced']]] as const) {
    const res = await gw.admin('POST', '/admin/groups', { name, models: granted, families: ['chat'], budget: { amount: 5, period: 'month' } });
    t.equal(res.status, 201);
  }
  t.equal((await gw.admin('POST', '/admin/keys', { group: 'budgeted', name: 'budgeted-app', budget: { amount: 1, period: 'day' } })).status, 201);
  t.equal((await gw.admin('POST', '/admin/keys', { group: 'priced-only', name: 'priced-app', budget: { amount: 1, period: 'day' } })).status, 201);

  await open(page, 'Groups');
  const warning = page.locator('tr[data-group="budgeted"] .budget-warning');
  await warning.waitFor();
  t.ok(await warning.isVisible(), "the group's row warns");
  t.match(await warning.textContent(), /no prices.*sim-unpriced/i, 'naming the model without prices');
  t.notMatch(await warning.textContent(), /sim-priced/, 'and not the priced one');
  t.equal(await page.locator('tr[data-group="priced-only"] .budget-warning').count(), 0, 'no warning when every model has prices');

  // The form warns while a budget is set and an unpriced model is ticked.
  await page.getByRole('button', { name: 'Edit group budgeted' }).click();
  const formWarning = page.locator('.card-form .budget-warning-form');
  await formWarning.waitFor();
  t.match(await formWarning.textContent(), /sim-unpriced/);
  await screenshot(page, 'groups-budget-warning');
  await page.getByLabel('sim-unpriced', { exact: true }).uncheck();
  await formWarning.waitFor({ state: 'detached' });
  await page.getByLabel('sim-unpriced', { exact: true }).check();
  await formWarning.waitFor();
  await page.getByLabel('Budget amount').fill('');
  await formWarning.waitFor({ state: 'detached' });
  t.pass('the warning follows the ticked models and the amount');
  await page.getByRole('button', { name: 'Cancel' }).click();

  await open(page, 'Keys');
  const keyWarning = page.getByRole('row', { name: /budgeted-app/ }).locator('.budget-warning');
  await keyWarning.waitFor();
  t.ok(await keyWarning.isVisible(), "a key's own budget warns too");
  t.match(await keyWarning.textContent(), /sim-unpriced/);
  t.equal(await page.getByRole('row', { name: /priced-app/ }).locator('.budget-warning').count(), 0);
  await page.getByRole('button', { name: 'Limits and budget of key budgeted-app' }).click();
  t.match(await page.locator('.card-form .budget-warning-form').textContent(), /sim-unpriced/, "and the key's budget form");
  await page.getByRole('button', { name: 'Cancel' }).click();
});

t.test('usage shows the cost of traffic on a priced model, and a spend chart per group', async (t) => {
  // A second group that spends, so the chart has a line per group; its budget shows the spend.
  t.equal((await gw.admin('POST', '/admin/groups', { name: 'team-b', models: ['*'], families: ['chat'], budget: { amount: 1, period: 'day' } })).status, 201);
  const teamBKey = (await gw.admin('POST', '/admin/keys', { group: 'team-b', name: 'team-b-app' })).body.key as string;
  for (const [key, tokens] of [[gw.key, 20], [teamBKey, 50], [teamBKey, 10]] as const) {
    t.equal((await chat(key, 'sim-priced', `What does this cost? [[sim tokens=${tokens}]]`)).status, 200);
  }
  const priced = await eventually(async () => {
    const { body } = await gw.admin('GET', '/admin/usage?model=sim-priced');
    return body.records.length === 3 && body.records;
  }, 'the priced records');
  for (const r of priced) t.ok(r.cost > 0, `a cost at the model's prices (${r.cost})`);
  const total = (await gw.admin('GET', '/admin/usage')).body.totals.cost as number;

  await open(page, 'Usage');
  const row = page.locator(`tr[data-request="${priced[0].requestId}"]`);
  await row.waitFor();
  // Columns: time, model, key / group, family, status, prompt, completion, cost, …
  t.equal(await row.locator('td').nth(7).textContent(), money(priced[0].cost), 'the record shows its cost');
  const cost = page.locator('.stat').filter({ has: page.getByText('Cost', { exact: true }) }).locator('.stat-value');
  t.equal(await cost.textContent(), money(total), 'the total cost');
  t.equal(await page.locator(`tr[data-request="${requestId}"]`).locator('td').nth(7).textContent(), '–', 'an unpriced model has no cost');

  const spend = page.locator('.chart-card', { hasText: 'Spend by group' });
  await spend.locator('canvas').waitFor();
  t.equal(await spend.locator('.chart-empty').count(), 0, 'the spend chart has something to draw');
  const legend = (await spend.locator('.u-legend').textContent()) ?? '';
  t.match(legend, /default/);
  t.match(legend, /team-b/);
  t.notMatch(legend, /team-a/, 'a group that spent nothing has no line');
  await screenshot(page, 'usage');

  await open(page, 'Groups');
  const teamB = ((await gw.admin('GET', '/admin/groups')).body.data as { name: string }[]).find((g) => g.name === 'team-b') as Record<string, any>;
  t.ok(teamB.spend.spent > 0, 'team-b spent some of its budget');
  const budget = (await page.locator('tr[data-group="team-b"] .budget').textContent()) ?? '';
  t.match(budget, `${money(teamB.spend.spent)} of 1.00 per day`, "the period's spend");
  t.match(budget, `${money(teamB.spend.remaining)} left`, 'what remains');
});

// After the priced traffic and the budgets: the fullest rows, the widest tables.
t.test('at 1280×800 every column and every row action is on screen', async (t) => {
  t.same(page.viewportSize(), { width: 1280, height: 800 });
  // A passing toast (bottom right, 3 s) would cover the last row's actions: what is measured is the page.
  // A function, not a string: the console's Content-Security-Policy forbids eval.
  await page.waitForFunction(() => !(globalThis as unknown as { document: { querySelector(s: string): unknown } }).document.querySelector('.toast'));
  await open(page, 'Keys');
  await page.getByRole('row', { name: new RegExp(keyName) }).waitFor();
  await checkTableFits(t, page, 'Keys');
  for (const name of [keyName, 'expiring', 'budgeted-app', 'demo']) {
    const row = page.getByRole('row', { name: new RegExp(name) });
    for (const [action, label] of [[/^(Disable|Enable) key/, 'Disable/Enable'], [/^Delete key/, 'Delete'], [/^Rename key/, 'Rename']] as const) {
      await checkOnScreen(t, row.getByRole('button', { name: action }), `Keys: ${label} of ${name}`);
    }
  }

  await open(page, 'Requests');
  const failed = page.locator('tr[data-request]', { hasText: 'sim-unreachable' }).first();
  await failed.waitFor();
  await checkTableFits(t, page, 'Requests');
  await checkOnScreen(t, page.getByRole('columnheader', { name: 'Error / notes' }), 'Requests: the Error column heading');
  await checkOnScreen(t, failed.locator('td.request-error'), 'Requests: the error of a failed call');

  await open(page, 'Usage');
  const usageFailed = page.locator('tr[data-request]', { hasText: 'sim-unreachable' }).first();
  await usageFailed.waitFor();
  await checkTableFits(t, page, 'Usage records');
  await checkOnScreen(t, page.getByRole('columnheader', { name: 'Outcome' }), 'Usage: the Outcome column heading');
  await checkOnScreen(t, usageFailed.locator('td').last(), 'Usage: the outcome of a failed call');
});

t.test('the models page shows each channel with its breaker, prices and limits', async (t) => {
  // Five failures in a row open a breaker (the default policy).
  for (let i = 0; i < 5; i++) t.equal((await chat(gw.key, 'sim-failover', 'Anyone? [[sim tokens=3]]')).status, 200, 'the second channel answers');
  const { body } = await gw.admin('GET', '/admin/upstreams');
  const states = new Map(
    (body.data as { channels: { model: string; channel: string; state: string; recentErrors: number }[] }[]).flatMap((u) => u.channels.map((c) => [`${c.model} ${c.channel}`, c])),
  );
  const dead = states.get('sim-failover unreachable')!;
  t.equal(dead.state, 'open', "the dead channel's breaker is open");

  await open(page, 'Models');
  const row = page.locator('tr[data-model="sim-failover"]');
  await row.waitFor();
  for (const name of ['unreachable', 'sim']) {
    const channel = row.locator(`.channel[data-channel="${name}"]`);
    t.equal(await channel.getAttribute('data-state'), states.get(`sim-failover ${name}`)!.state, `channel ${name}: the state the API reports`);
  }
  const deadText = (await row.locator('.channel[data-channel="unreachable"]').textContent()) ?? '';
  t.match(deadText, /Open/);
  t.match(deadText, new RegExp(`${dead.recentErrors} of \\d+ recent requests? failed`));
  t.match(deadText, /unreachable/i);
  // Each channel's latency average and calls under way, as GET /admin/upstreams reports them.
  const served = states.get('sim-failover sim') as unknown as { latencyMs: number | null; inFlight: number };
  t.ok(served.latencyMs !== null && served.latencyMs > 0, `the API reports the serving channel's latency average (${served.latencyMs} ms)`);
  const servedLine = row.locator('.channel[data-channel="sim"] .channel-load');
  t.equal(Number(await servedLine.getAttribute('data-latency-ms')), served.latencyMs, 'the page shows the latency the API reports');
  t.match(await servedLine.textContent(), /^Latency (\d+ ms|[\d.]+ s|< 1 ms) · 0 in flight$/);
  t.match(await row.locator('.channel[data-channel="unreachable"] .channel-load').textContent(), /Latency not measured yet · 0 in flight/, 'a channel that never answered has no average');
  await checkOnScreen(t, servedLine, 'Models: a channel\'s latency and calls in flight');
  // A call held by the upstream (its first token a minute away) is in flight while the page loads.
  const held = new AbortController();
  const holding = fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${gw.key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'sim-priced', stream: true, messages: user('Take your time [[sim ttft_ms=60000]]') }),
    signal: held.signal,
  }).catch(() => undefined);
  await eventually(async () => {
    const upstreams = (await gw.admin('GET', '/admin/upstreams')).body.data as { channels: { model: string; inFlight: number }[] }[];
    return upstreams.some((u) => u.channels.some((c) => c.model === 'sim-priced' && c.inFlight === 1));
  }, 'the held call to be in flight');
  await page.getByRole('button', { name: 'Refresh' }).click();
  const heldLine = page.locator('tr[data-model="sim-priced"] .channel-load[data-in-flight="1"]');
  await heldLine.waitFor();
  t.match(await heldLine.textContent(), /· 1 in flight$/, 'the page shows the call in flight');
  held.abort();
  await holding;
  const pricedRow = (await page.locator('tr[data-model="sim-priced"]').textContent()) ?? '';
  t.match(pricedRow, /Input 2\.00.*Cached 1\.00.*Output 8\.00/, 'prices per million tokens');
  t.match(pricedRow, /Requests\/min 600/, "the model's own limit");
  t.match(await page.locator('tr[data-model="sim-chat"]').textContent(), /No prices/);
  await screenshot(page, 'models');
});

t.test('Reload config applies the file, or shows why not and keeps the running one', async (t) => {
  const file = join(gw.dataDir, 'sluice.yaml');
  const original = readFileSync(file, 'utf8');
  const reload = async () => {
    await page.getByRole('button', { name: 'Reload config' }).click();
    const dialog = page.getByRole('dialog');
    t.match(await dialog.textContent(), /finish on the config they started with/, 'asks first');
    await dialog.getByRole('button', { name: 'Reload config' }).click();
  };
  await open(page, 'Models');

  writeFileSync(file, original + '  - { id: sim-late, upstream: sim, upstreamModel: sim-chat }\n');
  await reload();
  const status = page.getByRole('status').filter({ hasText: 'Config reloaded' });
  await status.waitFor();
  t.match(await status.textContent(), /models added: sim-late/);
  await page.locator('tr[data-model="sim-late"]').waitFor();

  writeFileSync(file, original.replace('upstream: sim\n', 'upstream: nowhere\n'));
  await reload();
  const alert = page.getByRole('alert').filter({ hasText: 'not reloaded' });
  await alert.waitFor();
  t.match(await alert.textContent(), /no upstream named "nowhere"/, 'the reason');
  t.equal((await chat(gw.key, 'sim-late', 'Still here? [[sim tokens=2]]')).status, 200, 'the running config stays');

  writeFileSync(file, original);
  t.equal((await gw.admin('POST', '/admin/reload')).status, 200);
});

t.test('latencies under a millisecond read "< 1 ms"; usage fits its range to the data until one is chosen', async (t) => {
  // The rule: the shortest range holding every request of the last 30 days (counts per range, shortest first).
  const fit = (counts: number[]) => page.evaluate(`import('/console/app/usage.js').then((m) => m.fitPreset(${JSON.stringify(counts)}))`);
  t.equal(await fit([4, 4, 4, 4]), '1h', 'all in the last hour: 1 h');
  t.equal(await fit([0, 3, 3, 3]), '24h', 'all today: 24 h');
  t.equal(await fit([1, 2, 3, 3]), '7d');
  t.equal(await fit([0, 0, 2, 5]), '30d');
  t.equal(await fit([0, 0, 0, 0]), '24h', 'nothing yet: 24 h');

  await open(page, 'Usage');
  t.equal(await page.getByRole('button', { name: '1 h' }).getAttribute('aria-pressed'), 'true', 'every call so far is from the last hour');
  await page.getByRole('button', { name: '7 days' }).click();
  await eventually(async () => (await page.locator('.stat').first().textContent())?.includes('in the last 7 days'), 'the 7-day totals');
  t.notOk(await page.getByText('fits the data').isVisible(), 'a chosen range no longer follows the data');
  await open(page, 'Groups');
  await open(page, 'Usage');
  t.equal(await page.getByRole('button', { name: '7 days' }).getAttribute('aria-pressed'), 'true', 'the chosen range stays across visits');
  const { body } = await gw.admin('GET', '/admin/requests?status=4xx');
  t.ok(body.data.length > 0);
  const fast = body.data.find((r: { latencyMs: number }) => r.latencyMs < 1);
  if (fast) t.match(await page.locator(`tr[data-request="${fast.requestId}"]`).textContent(), /< 1 ms/);
  t.notOk(/\b0 ms/.test((await page.locator('tbody').last().textContent()) ?? ''), 'never "0 ms"');
});

t.test('at phone width (390×844) no page scrolls sideways', async (t) => {
  const phone = await context.newPage();
  await phone.setViewportSize({ width: 390, height: 844 });
  for (const [hash, name] of [['groups', 'Groups'], ['keys', 'Keys'], ['models', 'Models'], ['usage', 'Usage'], ['requests', 'Requests'], ['audit', 'Audit']]) {
    await phone.goto(`${consoleUrl}#/${hash}`);
    await phone.getByRole('heading', { level: 1, name }).waitFor();
    await phone.waitForLoadState('networkidle');
    // A string, evaluated in the page: the test itself is compiled without the DOM's types.
    const { scrollWidth, innerWidth } = (await phone.evaluate('({ scrollWidth: document.documentElement.scrollWidth, innerWidth: window.innerWidth })')) as {
      scrollWidth: number;
      innerWidth: number;
    };
    t.ok(scrollWidth <= innerWidth, `${name}: page ${scrollWidth} px wide in a ${innerWidth} px window`);
    await screenshot(phone, `phone-${hash}`);
  }
  await phone.close();
});

t.test('logout returns to the login screen, for good', async (t) => {
  await page.getByRole('button', { name: 'Logout' }).click();
  await page.getByLabel('Admin token').waitFor();
  await page.reload();
  await page.getByLabel('Admin token').waitFor();
  t.equal((await page.request.get(`${gw.url}/admin/groups`)).status(), 401, 'the session is gone on the server too');
});

t.test('an open gateway (allowAnonymous) is said above every page, and a closed one says nothing', async (t) => {
  t.equal(await page.locator('.gateway-warning').count(), 0, 'the gateway with auth shows no standing warning');
  const open = await startTestGateway(
    (dataDir) => `dataDir: ${dataDir}
plugins: [grant, limits, codecs/chat, upstreams/simulator, usage, console]
allowAnonymous: true
upstreams:
  sim: { kind: simulator }
models:
  - { id: m, upstream: sim }
`,
  );
  t.teardown(() => open.stop());
  const other = await browser.newPage();
  t.teardown(() => other.close());
  await other.goto(`${open.url}/console`);
  await other.getByLabel('Admin token').fill(open.adminToken);
  await other.getByRole('button', { name: 'Sign in' }).click();
  await other.getByRole('heading', { level: 1, name: 'Groups' }).waitFor();
  const warning = other.locator('.gateway-warning');
  t.match(await warning.textContent(), /anyone who reaches this port may call every model/, 'the warning is shown once signed in');
  await other.goto(`${open.url}/console#/usage`);
  await other.reload();
  await other.getByRole('heading', { level: 1, name: 'Usage' }).waitFor();
  t.equal(await warning.count(), 1, 'and still on another page, after a reload');
});

t.test('no page errors, nothing fetched from elsewhere', async (t) => {
  t.same(pageErrors, []);
  t.same(foreign, []);
});
