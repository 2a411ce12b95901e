/**
 * MCP grants from the CLI (`--mcp-tools`), and a CLI run on a config with MCP servers starts
 * none of them: only `sluice serve` runs a server's command.
 */
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { childEnv, distRoot, firstStart, runCommand } from './helpers.js';

t.setTimeout(240_000);
const main = join(distRoot, 'src/main.js');
const dataDir = mkdtempSync(join(tmpdir(), 'sluice-mcp-cli-'));
t.teardown(() => rmSync(dataDir, { recursive: true, force: true }));
const marker = join(dataDir, 'started');
const configFile = join(dataDir, 'sluice.yaml');
writeFileSync(
  configFile,
  `upstreams:
  sim: { kind: simulator }
models:
  - { id: m, upstream: sim }
mcp:
  servers:
    tattle: { transport: stdio, command: ${JSON.stringify(process.execPath)}, args: ["-e", ${JSON.stringify(`require('fs').writeFileSync(${JSON.stringify(marker)}, 'ran')`)}] }
`,
);
// Started on the embedded default, not this config: a start would run the MCP server.
await firstStart(dataDir);
const env = childEnv({ SLUICE_DATA_DIR: dataDir, SLUICE_CONFIG: configFile, SLUICE_LOG_LEVEL: 'warn' });
const cli = async (...args: string[]) => JSON.parse((await runCommand(process.execPath, [main, ...args], { env })).stdout);

t.test('groups create and update set MCP grants; none clears them', async (t) => {
  const created = await cli('groups', 'create', 'agents', '--models', '*', '--families', 'chat', '--mcp-tools', 'everything/*,files/read_text_file');
  t.same(created.mcpTools, ['everything/*', 'files/read_text_file']);
  const narrowed = await cli('groups', 'update', 'agents', '--mcp-tools', 'everything/echo');
  t.same(narrowed.mcpTools, ['everything/echo']);
  const untouched = await cli('groups', 'update', 'agents', '--models', 'm');
  t.same(untouched.mcpTools, ['everything/echo'], 'an update without --mcp-tools keeps them');
  t.same((await cli('groups', 'update', 'agents', '--mcp-tools', 'none')).mcpTools, []);
  const bad = await runCommand(process.execPath, [main, 'groups', 'update', 'agents', '--mcp-tools', 'no-slash'], { env }).then(
    () => ({ code: 0, stderr: '' }),
    (e: { code: number; stderr: string }) => e,
  );
  t.not(bad.code, 0, 'a grant that is not server/tool or server/* is refused');
  t.match(bad.stderr, /mcpTools/);
  t.notOk(existsSync(marker), "no CLI command ran the MCP server's command");
});
