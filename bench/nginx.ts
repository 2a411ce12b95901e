/**
 * nginx as a reverse proxy in front of one upstream, the baseline of the versus rows: a foreground
 * child process with a private prefix directory and one worker process, forwarding answers as they
 * come (no buffering, as Sluice streams) over kept-alive upstream connections.
 */
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { freePort } from '../test/servers.js';

export interface NginxBinary {
  path: string;
  /** As `nginx -v` prints it, e.g. `nginx/1.22.1`. */
  version: string;
}

export interface Nginx {
  url: string;
  /** The master and its worker, for the CPU they use. */
  pids(): number[];
  stop(): Promise<void>;
}

const isRoot = process.getuid?.() === 0;

function locate(): string | undefined {
  const found = spawnSync('sh', ['-c', 'command -v nginx'], { encoding: 'utf8' });
  if (found.status === 0 && found.stdout.trim()) return found.stdout.trim();
  // Not on a regular user's PATH on Debian.
  return existsSync('/usr/sbin/nginx') ? '/usr/sbin/nginx' : undefined;
}

/**
 * The nginx binary, installed from Debian (nginx-light) when missing and running as root, as on
 * CI machines; otherwise the reason the nginx rows are skipped.
 */
export function nginxBinary(): NginxBinary | { skip: string } {
  let path = locate();
  if (!path && isRoot && spawnSync('sh', ['-c', 'command -v apt-get']).status === 0) {
    console.log('nginx is missing: installing nginx-light from Debian');
    const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
    const install = () => spawnSync('apt-get', ['install', '-y', '-qq', 'nginx-light'], { env, stdio: 'inherit' }).status === 0;
    // A fresh CI image may have no package lists yet.
    if (!install()) {
      spawnSync('apt-get', ['update', '-qq'], { env, stdio: 'inherit' });
      install();
    }
    path = locate();
  }
  if (!path) {
    return { skip: isRoot ? 'nginx is not installed and apt-get could not install nginx-light' : 'nginx is not installed (install nginx-light, or run as root to have the bench install it)' };
  }
  const printed = spawnSync(path, ['-v'], { encoding: 'utf8' });
  const version = /nginx\/\S+/.exec(printed.stderr + printed.stdout)?.[0];
  return version ? { path, version } : { skip: `${path} -v printed no version: ${printed.stderr}` };
}

function accepts(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect(port, '127.0.0.1');
    socket.once('connect', () => (socket.destroy(), resolve(true)));
    socket.once('error', () => resolve(false));
  });
}

function config(dir: string, port: number, upstream: URL): string {
  return `${isRoot ? 'user root;\n' : ''}worker_processes 1;
pid ${dir}/nginx.pid;
error_log ${dir}/error.log warn;
events { worker_connections 4096; }
http {
  # Every exchange logged, as Sluice logs every exchange; buffered, as pino buffers.
  access_log ${dir}/access.log combined buffer=64k;
  client_body_temp_path ${dir}/client_body;
  proxy_temp_path ${dir}/proxy;
  fastcgi_temp_path ${dir}/fastcgi;
  uwsgi_temp_path ${dir}/uwsgi;
  scgi_temp_path ${dir}/scgi;
  # Connections kept for good on both sides, as Sluice keeps them.
  upstream backend {
    server ${upstream.host};
    keepalive 64;
    keepalive_requests 1000000;
  }
  server {
    listen 127.0.0.1:${port};
    keepalive_requests 1000000;
    location / {
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
`;
}

/** Starts nginx in front of `upstreamUrl` (http://127.0.0.1:PORT) and resolves once it accepts connections. */
export async function startNginx(binary: NginxBinary, upstreamUrl: string): Promise<Nginx> {
  const dir = mkdtempSync(join(tmpdir(), 'sluice-bench-nginx-'));
  try {
    // nginx cannot report a port it picked, so take a free one; another process may take it first.
    for (let attempt = 1; ; attempt++) {
      const port = await freePort();
      writeFileSync(join(dir, 'nginx.conf'), config(dir, port, new URL(upstreamUrl)));
      const started = await launch(binary.path, dir, port);
      if (started) return started;
      const log = readFileSync(join(dir, 'error.log'), 'utf8');
      if (attempt === 3 || !log.includes('Address already in use')) throw new Error(`nginx did not start:\n${log}`);
    }
  } catch (err) {
    rmSync(dir, { recursive: true, force: true });
    throw err;
  }
}

function killHard(pid: number): void {
  try {
    process.kill(pid, 'SIGKILL');
  } catch {
    // Already gone.
  }
}

async function launch(path: string, dir: string, port: number): Promise<Nginx | undefined> {
  // -e: the error log before the configuration is read, which would otherwise be /var/log/nginx's.
  const child = spawn(path, ['-p', `${dir}/`, '-c', join(dir, 'nginx.conf'), '-e', join(dir, 'error.log'), '-g', 'daemon off;'], { stdio: 'ignore' });
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const deadline = Date.now() + 10_000;
  while (!(await accepts(port))) {
    if (child.exitCode !== null || child.signalCode !== null) return undefined;
    if (Date.now() > deadline) {
      child.kill('SIGKILL');
      await exited;
      throw new Error(`nginx did not listen on ${port} within 10 s`);
    }
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  // What accepted may be another process that took the port first.
  await new Promise((resolve) => setTimeout(resolve, 50));
  if (child.exitCode !== null || child.signalCode !== null) return undefined;
  const pids = () => {
    try {
      const workers = readFileSync(`/proc/${child.pid}/task/${child.pid}/children`, 'utf8').trim().split(/\s+/).filter(Boolean).map(Number);
      return [child.pid!, ...workers];
    } catch {
      return [child.pid!];
    }
  };
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      // SIGTERM: fast shutdown; the master waits for its worker before it exits.
      child.kill('SIGTERM');
      const all = pids();
      const timer = setTimeout(() => all.forEach(killHard), 5_000);
      await exited;
      clearTimeout(timer);
    }
    rmSync(dir, { recursive: true, force: true });
  };
  return { url: `http://127.0.0.1:${port}`, pids, stop };
}
