/**
 * The web console in a real browser: Debian's Chromium (driven by playwright-core) → /console on
 * a real gateway → the admin API, with chat calls through the simulator in its own process.
 * It also writes a screenshot of every page to test-output/console/ (and, with
 * SLUICE_UPDATE_SCREENSHOTS=1, to docs/console/, the pictures the README shows).
 */
import { existsSync, mkdirSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { chromium, type Page } from 'playwright-core';
import t from 'tap';
import { chatGatewayYaml, distRoot, eventually, startSimulatorProcess, startTestGateway } from './helpers.js';

const chromiumPath = process.env.SLUICE_CHROMIUM ?? '/usr/bin/chromium';
if (!existsSync(chromiumPath)) throw new Error(`the console test needs Chromium at ${chromiumPath} (apt-get install chromium)`);
if (!existsSync(`${distRoot}console/app/main.js`)) throw new Error('the console is not built: run npm run build');

const shots = fileURLToPath(new URL(process.env.SLUICE_UPDATE_SCREENSHOTS ? '../../docs/console/' : '../../test-output/console/', import.meta.url));
mkdirSync(shots, { recursive: true });

const sim = await startSimulatorProcess();
const gw = await startTestGateway(chatGatewayYaml(sim.url));
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

/** A full-page picture for the docs, without passing toasts. */
async function screenshot(p: Page, name: string): Promise<void> {
  await p.screenshot({ path: `${shots}${name}.png`, fullPage: true, animations: 'disabled', style: '.toasts { display: none !important; }' });
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
  await page.getByLabel('Admin token').fill(gw.adminToken);
  await page.getByRole('button', { name: 'Sign in' }).click();
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

t.test('usage shows the call, with charts and a CSV export', async (t) => {
  // More traffic for the charts: the demo key, and one upstream that cannot be reached.
  t.equal((await chat(gw.key, 'sim-basic', 'Hi [[sim tokens=12]]')).status, 200);
  t.equal((await chat(gw.key, 'sim-chat', 'Hi again [[sim tokens=30]]')).status, 200);
  t.equal((await chat(gw.key, 'sim-unreachable', 'Anyone there?')).status, 503);
  await eventually(async () => (await gw.admin('GET', '/admin/usage')).body.records.length >= 4, 'usage records written');

  await open(page, 'Usage');
  const row = page.locator(`tr[data-request="${requestId}"]`);
  await row.waitFor();
  const text = (await row.textContent()) ?? '';
  t.match(text, /sim-chat/, 'the model is in the table');
  t.match(text, new RegExp(keyName), 'the key is in the table, by name');
  t.match(text, /team-a/);
  const requests = page.locator('.stat').filter({ has: page.getByText('Requests', { exact: true }) }).locator('.stat-value');
  t.equal(await requests.textContent(), '4', 'the total counts every call');
  t.equal(await page.locator('.chart-card').count(), 4, 'four charts');
  t.equal(await page.locator('.chart-card canvas').count(), 4, 'each chart is drawn');
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
  await page.getByLabel('Status').selectOption('2xx');
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

t.test('latencies under a millisecond read "< 1 ms"; usage defaults to the last 7 days', async (t) => {
  await open(page, 'Usage');
  t.equal(await page.getByRole('button', { name: '7 days' }).getAttribute('aria-pressed'), 'true');
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

t.test('no page errors, nothing fetched from elsewhere', async (t) => {
  t.same(pageErrors, []);
  t.same(foreign, []);
});
