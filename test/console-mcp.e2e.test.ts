/**
 * The console's MCP page and the group form's MCP grants, in Debian's Chromium: a group granted a
 * tool from the form, the servers with their states (one failed, with its error) and tools, and
 * the grants per group, all read from /admin/mcp through the console session.
 */
import { existsSync } from 'node:fs';
import t from 'tap';
import { chromium } from 'playwright-core';
import { startTestGateway } from './helpers.js';
import { faultyEntry, nodeServer } from './mcp-helpers.js';

const chromiumPath = process.env.SLUICE_CHROMIUM ?? '/usr/bin/chromium';
if (!existsSync(chromiumPath)) throw new Error(`the console test needs Chromium at ${chromiumPath} (apt-get install chromium)`);

const gw = await startTestGateway(
  (dataDir) => `dataDir: ${dataDir}
upstreams:
  sim: { kind: simulator }
models:
  - { id: m, upstream: sim }
mcp:
  servers:
    faulty: ${nodeServer(faultyEntry)}
    broken: ${nodeServer(faultyEntry, [], 'env: { FAIL_LISTING: "1" }')}
`,
);
const browser = await chromium.launch({
  executablePath: chromiumPath,
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
t.teardown(async () => {
  await browser.close();
  await gw.stop();
});
const page = await (await browser.newContext({ viewport: { width: 1280, height: 800 }, locale: 'en-US', timezoneId: 'UTC' })).newPage();
page.setDefaultTimeout(15_000);
const pageErrors: string[] = [];
page.on('pageerror', (err) => pageErrors.push(err.message));

t.test('a group granted an MCP tool from the form; the MCP page shows servers, tools and grants', async (t) => {
  await page.goto(`${gw.url}/console`);
  await page.getByLabel('Admin token').fill(gw.adminToken);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByRole('heading', { level: 1, name: 'Groups' }).waitFor();

  await page.getByRole('button', { name: 'New group' }).click();
  await page.getByLabel('Name', { exact: true }).fill('agents');
  await page.getByLabel('chat', { exact: true }).check();
  await page.getByLabel('MCP tools').fill('faulty/pid, broken/*');
  await page.getByRole('button', { name: 'Create group' }).click();
  await page.getByRole('row', { name: /agents/ }).waitFor();
  const { body } = await gw.admin('GET', '/admin/groups');
  t.same(body.data.find((g: { name: string }) => g.name === 'agents').mcpTools, ['faulty/pid', 'broken/*'], 'the grants are stored');

  await page.getByRole('navigation', { name: 'Sections' }).getByRole('link', { name: 'MCP' }).click();
  await page.getByRole('heading', { level: 1, name: 'MCP' }).waitFor();
  const faulty = page.locator('tr[data-server="faulty"]');
  await faulty.waitFor();
  t.match(await faulty.textContent(), /ready/);
  t.match(await faulty.textContent(), /faulty_pid/, 'its tools, as clients see them');
  t.match(await page.locator('tr[data-server="broken"]').textContent(), /failed.*listing is broken on purpose/, 'a failed server with its error');
  const grants = page.locator('tr[data-group="agents"]');
  t.match(await grants.textContent(), /faulty\/pid.*broken\/\*.*1 tool/, "the group's grants and what they reach");
  t.match(await page.locator('tr[data-group="default"]').textContent(), /none/, 'the default group: none');
  t.same(pageErrors, [], 'no page errors');
});
