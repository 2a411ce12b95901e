/**
 * Real PostgreSQL and Redis servers for the tests that need them, on 127.0.0.1 with private data
 * directories and free ports. `.ci/run` starts one PostgreSQL and exports SLUICE_TEST_POSTGRES
 * (a server URL); each test then gets a fresh database on it. Without it (a developer's machine
 * with the Debian packages installed) a private server is started for the test file. Redis is
 * always private to the test that asks, because tests stop and restart it.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { chownSync, existsSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/** A port nothing listens on right now. */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as { port: number };
      server.close(() => resolve(port));
    });
  });
}

function postgresBin(name: string): string {
  const root = '/usr/lib/postgresql';
  const versions = existsSync(root) ? readdirSync(root).sort((a, b) => Number(b) - Number(a)) : [];
  for (const v of versions) if (existsSync(join(root, v, 'bin', name))) return join(root, v, 'bin', name);
  throw new Error(`PostgreSQL's ${name} is not installed (apt-get install postgresql)`);
}

/** PostgreSQL refuses to run as root: as root, run its tools as the `postgres` user. */
function asPostgresUser(bin: string, args: string[]): void {
  const root = process.getuid?.() === 0;
  const [cmd, argv] = root ? ['runuser', ['-u', 'postgres', '--', bin, ...args]] : [bin, args];
  const out = spawnSync(cmd, argv, { encoding: 'utf8' });
  if (out.status !== 0) throw new Error(`${bin} ${args.join(' ')} failed: ${out.stderr || out.stdout}`);
}

export interface PostgresServer {
  /** `postgres://postgres@127.0.0.1:PORT` (connect to a database by appending `/NAME`). */
  url: string;
  /** Stops it for good: its data goes. */
  stop(): void;
  /** Stops it the way a crash would, keeping its data for `start`. */
  halt(): void;
  /** Starts a halted server again on the same port. */
  start(): void;
}

/** Initialises and starts a private cluster (trust auth, 127.0.0.1 only). */
export async function startPostgres(): Promise<PostgresServer> {
  const dir = mkdtempSync(join(tmpdir(), 'sluice-pg-'));
  if (process.getuid?.() === 0) chownSync(dir, Number(execFileSync('id', ['-u', 'postgres']).toString()), Number(execFileSync('id', ['-g', 'postgres']).toString()));
  const port = await freePort();
  asPostgresUser(postgresBin('initdb'), ['-D', dir, '-A', 'trust', '-U', 'postgres', '--no-sync', '-E', 'UTF8']);
  const options = `-p ${port} -c listen_addresses=127.0.0.1 -c unix_socket_directories=${dir} -c fsync=off -c max_connections=200`;
  let running = false;
  const start = () => {
    asPostgresUser(postgresBin('pg_ctl'), ['-D', dir, '-o', options, '-l', join(dir, 'server.log'), '-w', 'start']);
    running = true;
  };
  const halt = () => {
    if (!running) return;
    running = false;
    asPostgresUser(postgresBin('pg_ctl'), ['-D', dir, '-m', 'immediate', '-w', 'stop']);
  };
  start();
  return {
    url: `postgres://postgres@127.0.0.1:${port}`,
    stop: () => {
      try {
        halt();
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    },
    halt,
    start,
  };
}

let fileServer: PostgresServer | undefined;
let databases = 0;

/**
 * A fresh, empty database for one test: on CI's shared server, or on a private server started
 * for this test file (stopped when the process exits).
 */
export async function postgresDatabase(): Promise<string> {
  let server = process.env.SLUICE_TEST_POSTGRES;
  if (!server) {
    if (!fileServer) {
      fileServer = await startPostgres();
      process.once('exit', () => fileServer?.stop());
    }
    server = fileServer.url;
  }
  const { default: pg } = await import('pg');
  const name = `sluice_test_${process.pid}_${++databases}_${Date.now().toString(36)}`;
  const admin = new pg.Client({ connectionString: `${server}/postgres` });
  await admin.connect();
  try {
    await admin.query(`CREATE DATABASE ${name}`);
  } finally {
    await admin.end();
  }
  return `${server}/${name}`;
}

export interface RedisServer {
  url: string;
  port: number;
  /** Stops it (its data goes; tests use Redis only for counters). */
  stop(): void;
  /** Starts it again on the same port. */
  start(): void;
}

/** A private redis-server on a free port, without persistence. */
export async function startRedis(): Promise<RedisServer> {
  const dir = mkdtempSync(join(tmpdir(), 'sluice-redis-'));
  const port = await freePort();
  const start = () => {
    execFileSync('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--daemonize', 'yes', '--dir', dir, '--save', '', '--appendonly', 'no', '--pidfile', join(dir, 'redis.pid')]);
    // daemonize returns before the socket listens.
    for (let i = 0; i < 200; i++) {
      if (spawnSync('redis-cli', ['-p', String(port), 'ping'], { encoding: 'utf8' }).stdout.trim() === 'PONG') return;
      spawnSync('sleep', ['0.02']);
    }
    throw new Error(`redis-server did not start on port ${port}`);
  };
  const stop = () => {
    spawnSync('redis-cli', ['-p', String(port), 'shutdown', 'nosave']);
  };
  start();
  process.once('exit', () => {
    stop();
    rmSync(dir, { recursive: true, force: true });
  });
  return { url: `redis://127.0.0.1:${port}`, port, stop, start };
}
