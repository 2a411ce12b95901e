/**
 * The CLI's limits, budgets and channels, as an operator runs it: `node dist/src/main.js` on a data
 * dir, a gateway in between to spend some of a budget, then the CLI again to read the spend.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { loadConfig } from '../src/config/load.js';
import { startGateway } from '../src/gateway.js';
import { createLogger } from '../src/log.js';
import { childEnv, distRoot, firstStart, runCommand } from './helpers.js';

// About twenty CLI processes, each a node start that loads every plugin, and a gateway: close to a
// minute of CPU, so far more than tap's default 60 s on two busy cores. This bounds only a hang.
t.setTimeout(480_000);

const run = runCommand;
const main = join(distRoot, 'src/main.js');
const dataDir = mkdtempSync(join(tmpdir(), 'sluice-cli-limits-'));
t.teardown(() => rmSync(dataDir, { recursive: true, force: true }));
const configFile = join(dataDir, 'sluice.yaml');
// Two channels for one model, and prices, on the in-process simulator.
writeFileSync(
  configFile,
  `upstreams:
  primary: { kind: simulator }
  backup: { kind: simulator }
models:
  - id: priced
    channels:
      - { upstream: primary, upstreamModel: sim-chat }
      - { upstream: backup, upstreamModel: sim-chat, priority: 1, weight: 3 }
    prices: { input: 2, output: 8 }
`,
);
const env = childEnv({ SLUICE_DATA_DIR: dataDir, SLUICE_CONFIG: configFile, SLUICE_LOG_LEVEL: 'warn' });
await firstStart(dataDir);
const cli = async (...args: string[]) => JSON.parse((await run(process.execPath, [main, ...args], { env })).stdout);
/** A refused command: its exit code and what it printed on stderr. */
const refused = async (...args: string[]) => {
  const err = await run(process.execPath, [main, ...args], { env }).then(
    () => ({ code: 0, stderr: '' }),
    (e: { code: number; stderr: string }) => e,
  );
  return { code: err.code, stderr: err.stderr };
};

/** A model id a spreadsheet would split at `;` into a formula, with a terminal title escape, BEL, C1 CSI and a bidi override. */
const hostileModel = "x;=cmd|' /C calc'!A0\u001b]0;owned\u0007\u009b2J\u202e";
/** What a terminal would act on: controls other than the line breaks each output ends its lines with, and bidi controls. */
const rawControls = /[\u0000-\u0009\u000b\u000c\u000e-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/;

let keyId = '';
let secret = '';

t.test('groups create and update set limits and a budget; update changes only the fields named', async (t) => {
  const created = await cli('groups', 'create', 'team', '--models', '*', '--families', 'chat', '--rpm', '60', '--tpm', '10000', '--concurrency', '4', '--budget', '25/month');
  t.same(created.limits, { rpm: 60, tpm: 10000, concurrency: 4 });
  t.same(created.budget, { amount: 25, period: 'month' });
  t.match(created.spend, { period: 'month', spent: 0, remaining: 25 });

  const updated = await cli('groups', 'update', 'team', '--tpm', 'none', '--concurrency', '8');
  t.same(updated.limits, { rpm: 60, concurrency: 8 }, 'tpm removed, concurrency changed, rpm kept');
  t.same(updated.budget, { amount: 25, period: 'month' }, 'the budget stays');

  const listed = (await cli('groups', 'list')).find((g: { name: string }) => g.name === 'team');
  t.same(listed.limits, { rpm: 60, concurrency: 8 }, 'stored');
  const monthStart = new Date();
  monthStart.setUTCDate(1);
  monthStart.setUTCHours(0, 0, 0, 0);
  // A group made this month counts from its creation (a deleted group's records under its name are not its spend).
  t.equal(listed.spend.since, new Date(Math.max(monthStart.getTime(), listed.createdAt)).toISOString(), 'the month starts on the 1st, midnight UTC, or later at the group\'s creation');
  t.ok(listed.createdAt > monthStart.getTime(), 'made just now: so from its creation');

  await cli('groups', 'create', 'scratch', '--models', 'priced', '--families', 'chat', '--rpm', '5', '--budget', '1/day');
  const cleared = await cli('groups', 'update', 'scratch', '--no-limits', '--budget', 'none');
  t.equal(cleared.limits, null, '--no-limits clears every limit');
  t.equal(cleared.budget, null, '--budget none clears the budget');
  t.equal(cleared.spend, null, 'no budget, no spend');
});

t.test('keys create and update take the same options', async (t) => {
  const created = await cli('keys', 'create', '--group', 'team', '--name', 'ci', '--rpm', '5', '--budget', '1.5/day');
  keyId = created.id;
  secret = created.key;
  t.same(created.limits, { rpm: 5 });
  t.same(created.budget, { amount: 1.5, period: 'day' });

  const updated = await cli('keys', 'update', keyId, '--budget', '3/total', '--tpm', '2000');
  t.same(updated.limits, { rpm: 5, tpm: 2000 }, 'a limit added beside the one set');
  t.same(updated.budget, { amount: 3, period: 'total' });
  t.match(updated.spend, { period: 'total', spent: 0, remaining: 3, until: null });
});

t.test('bad values are refused with a message, exit code 2, and change nothing', async (t) => {
  for (const [args, message] of [
    [['groups', 'update', 'team', '--budget', '25/week'], /--budget takes AMOUNT\/PERIOD/],
    [['groups', 'update', 'team', '--budget', 'lots'], /--budget takes AMOUNT\/PERIOD/],
    [['groups', 'update', 'team', '--rpm', 'fast'], /--rpm takes a whole number/],
    [['groups', 'update', 'team', '--rpm', '0'], /limits\.rpm must be >= 1/],
    [['keys', 'update', keyId, '--no-limits', '--rpm', '5'], /--no-limits removes every limit/],
    // The CLI goes through the admin API's rules.
    [['keys', 'update', keyId, '--name', '\u001b[2Jci'], /name must not be blank, nor hold control characters/],
    [['keys', 'update', keyId, '--name', '  '], /name must not be blank/],
    [['keys', 'update', keyId, '--expires', '2026-02-31'], /expiresAt: 2026-02-31 is not a day of the calendar/],
    [['groups', 'update', 'team', '--budget', '2000000000000/month'], /budget\.amount must be <= 1000000000000/],
  ] as const) {
    const { code, stderr } = await refused(...args);
    t.equal(code, 2, args.join(' '));
    t.match(stderr, message);
  }
  const team = (await cli('groups', 'list')).find((g: { name: string }) => g.name === 'team');
  t.same(team.limits, { rpm: 60, concurrency: 8 }, 'unchanged');
  t.same(team.budget, { amount: 25, period: 'month' });
});

t.test('a bad option, a missing value or a missing required option: one line with the usage, exit 2, nothing changed', async (t) => {
  const keysCreate = 'usage: sluice keys create --group NAME [--name LABEL] [--expires ISO-TIME] [LIMITS]';
  const audited = (await cli('audit', '--limit', '1000')).length;
  for (const [args, line] of [
    [['keys', 'create', '--group', 'team', '--label', 'y'], `sluice: unknown option --label; ${keysCreate}`],
    [['--bogus'], 'sluice: unknown option --bogus; usage: sluice serve'],
    [['keys', 'create', '--group'], `sluice: --group needs a value; ${keysCreate}`],
    [['usage', '--csv=yes'], 'sluice: --csv takes no value; usage: sluice usage [--key ID] [--group NAME] [--model ID] [--since DATE] [--until DATE] [--limit N] [--csv]'],
    [['keys', 'move', keyId], 'sluice: keys move needs --group NAME; usage: sluice keys move ID --group NAME'],
    [['groups', 'create', 'useless'], 'sluice: groups create needs --models and --families; usage: sluice groups create NAME --models a,b|* --families chat,... [--mcp-tools server/tool,server/*] [LIMITS]'],
    [['keys', 'update', keyId], `sluice: keys update needs one of --name, --group, --expires, --rpm, --tpm, --concurrency, --no-limits, --budget at least; usage: sluice keys update ID [--name LABEL] [--group NAME] [--expires ISO-TIME|none] [LIMITS]`],
  ] as const) {
    const { code, stderr } = await refused(...args);
    t.equal(code, 2, args.join(' '));
    t.equal(stderr, `${line}\n`);
  }
  t.equal((await cli('audit', '--limit', '1000')).length, audited, 'nothing audited');
  t.notOk((await cli('groups', 'list')).some((g: { name: string }) => g.name === 'useless'), 'no group made');
});

t.test('groups list and keys list show what a priced request spent', async (t) => {
  const config = loadConfig({ path: configFile, env: { SLUICE_DATA_DIR: dataDir, SLUICE_PORT: '0' } });
  const gateway = await startGateway(config, createLogger('error'));
  let cost: number;
  try {
    const res = await fetch(`http://127.0.0.1:${gateway.port}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${secret}`, 'content-type': 'application/json' },
      // Within the key's 2000 tokens a minute: the prompt plus this output ceiling are reserved.
      body: JSON.stringify({ model: 'priced', max_tokens: 100, messages: [{ role: 'user', content: 'Spend a little [[sim tokens=40]]' }] }),
    });
    const body = await res.json();
    t.equal(res.status, 200, res.status === 200 ? 'the priced request passes' : JSON.stringify(body));
    const usage = (body as { usage: { prompt_tokens: number; completion_tokens: number } }).usage;
    cost = (usage.prompt_tokens * 2 + usage.completion_tokens * 8) / 1e6;
    // A key holder names the model: refused, and recorded as it was sent (for the output test below).
    const hostile = await fetch(`http://127.0.0.1:${gateway.port}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${secret}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: hostileModel, max_tokens: 10, messages: [{ role: 'user', content: 'hi' }] }),
    });
    t.equal(hostile.status, 400, 'an unknown model is refused');
  } finally {
    await gateway.shutdown();
  }
  t.ok(cost > 0);

  const [record] = (await cli('usage', '--key', keyId, '--model', 'priced')).records;
  t.ok(Math.abs(record.cost - cost) < 1e-12, `the record carries the cost at the model's prices (${record.cost})`);
  t.equal(record.channel, 'primary', 'served by the first channel');

  const team = (await cli('groups', 'list')).find((g: { name: string }) => g.name === 'team');
  t.equal(team.spend.spent, record.cost, "the group's spend this month");
  t.equal(team.spend.remaining, Math.round((25 - record.cost) * 1e9) / 1e9);
  const key = (await cli('keys', 'list')).find((k: { id: string }) => k.id === keyId);
  t.equal(key.spend.spent, record.cost, "the key's spend in total");
});

t.test("usage output, CSV or JSON, prints no control character from a key holder's model id", async (t) => {
  const csv = (await run(process.execPath, [main, 'usage', '--key', keyId, '--csv'], { env })).stdout;
  t.notMatch(csv, rawControls, 'no raw control character in the CSV');
  t.ok(csv.includes(`,"x;'=cmd|' /C calc'!A0]0;owned2J",`), 'the model cell quoted, its formula neutralised, its controls dropped');
  const json = (await run(process.execPath, [main, 'usage', '--key', keyId], { env })).stdout;
  t.notMatch(json, rawControls, 'no raw control character in the JSON');
  t.ok(JSON.parse(json).records.some((r: { model: string }) => r.model === hostileModel), 'escaped, the JSON still reads back as stored');
});

t.test('upstreams list shows the configured channels and says where the live state is', async (t) => {
  const out = await cli('upstreams', 'list');
  t.match(out.note, /GET \/admin\/upstreams/);
  const byName = Object.fromEntries(out.data.map((u: { name: string }) => [u.name, u]));
  t.match(byName.primary, { kind: 'simulator', family: 'chat', channels: [{ model: 'priced', channel: 'primary', upstreamModel: 'sim-chat', priority: 0, weight: 1 }] });
  t.match(byName.backup, { channels: [{ model: 'priced', channel: 'backup', priority: 1, weight: 3 }] });

  const help = (await run(process.execPath, [main, '--help'], { env })).stdout;
  t.match(help, /--budget AMOUNT\/PERIOD/);
  t.match(help, /--budget none removes it/);
  t.match(help, /--no-limits/);
});
