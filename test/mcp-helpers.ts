/** Real parts for the MCP gateway's tests: the official servers' entry points, a fixture server, the SDK client through `/mcp`. */
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { distRoot } from './helpers.js';

const require = createRequire(import.meta.url);
const packageDir = (name: string) => dirname(require.resolve(`${name}/package.json`));

/** server-everything's launcher (`stdio` or `streamableHttp` as its first argument). */
export const everythingEntry = join(packageDir('@modelcontextprotocol/server-everything'), 'dist', 'index.js');
export const filesystemEntry = join(packageDir('@modelcontextprotocol/server-filesystem'), 'dist', 'index.js');
/** test/fixtures/mcp-faulty-server.ts, compiled. */
export const faultyEntry = join(distRoot, 'test', 'fixtures', 'mcp-faulty-server.js');
/** Preloaded into server-everything's HTTP launcher: it listens on 127.0.0.1, on a free port it prints. */
export const loopbackPreload = join(distRoot, 'test', 'fixtures', 'mcp-loopback.js');

/** A YAML flow mapping of a stdio server running `entry` with node. */
export function nodeServer(entry: string, args: string[] = [], extra = ''): string {
  return `{ transport: stdio, command: ${JSON.stringify(process.execPath)}, args: ${JSON.stringify([entry, ...args])}${extra ? `, ${extra}` : ''} }`;
}

/** The SDK's client, connected to the gateway's `/mcp` with `key`. */
export async function mcpClient(url: string, key: string): Promise<Client> {
  const client = new Client({ name: 'sluice-test', version: '1' });
  await client.connect(new StreamableHTTPClientTransport(new URL(`${url}/mcp`), { requestInit: { headers: { authorization: `Bearer ${key}` } } }));
  return client;
}

/** The JSON-RPC error a promise rejected with: its code and message. */
export async function rpcError(promise: Promise<unknown>): Promise<{ code: number; message: string; data?: unknown }> {
  try {
    await promise;
  } catch (err) {
    const e = err as { code?: number; message?: string; data?: unknown };
    return { code: e.code ?? NaN, message: e.message ?? String(err), data: e.data };
  }
  throw new Error('expected a JSON-RPC error, got a result');
}
