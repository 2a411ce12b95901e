/**
 * An upstream reached over HTTP: an undici pool with keep-alive and connect, first-byte and idle
 * timeouts, shared by the upstream plugins that differ only in wire family and auth header.
 */
import { Pool } from 'undici';
import type { Upstream } from './contracts.js';
import { GatewayError } from './errors.js';

export interface HttpUpstreamOptions {
  baseUrl: string;
  apiKey?: string;
  headers?: Record<string, string>;
  connections?: number;
  timeouts?: { connectMs?: number; firstByteMs?: number; idleMs?: number };
}

function readOptions(name: string, raw: Record<string, unknown>): HttpUpstreamOptions {
  const o = raw as Partial<HttpUpstreamOptions>;
  if (typeof o.baseUrl !== 'string' || !/^https?:\/\//.test(o.baseUrl)) {
    throw new Error(`upstreams.${name}.baseUrl: an http(s) URL is required, e.g. https://api.openai.com/v1`);
  }
  if (o.apiKey !== undefined && typeof o.apiKey !== 'string') throw new Error(`upstreams.${name}.apiKey: must be a string`);
  return o as HttpUpstreamOptions;
}

/** Maps a transport failure to the gateway's terms: refused → 503, timed out → 504, else 502. */
export function transportError(upstream: string, err: Error & { code?: string }): GatewayError {
  const code = err.code ?? (err.cause as { code?: string } | undefined)?.code;
  if (code === 'UND_ERR_CONNECT_TIMEOUT' || code === 'UND_ERR_HEADERS_TIMEOUT' || code === 'UND_ERR_BODY_TIMEOUT') {
    return new GatewayError('upstream_timeout', `Upstream \`${upstream}\` timed out (${code}).`);
  }
  if (code === 'ECONNREFUSED' || code === 'ENOTFOUND' || code === 'EHOSTUNREACH' || code === 'EAI_AGAIN') {
    return new GatewayError('upstream_unavailable', `Upstream \`${upstream}\` is unreachable (${code}).`);
  }
  return new GatewayError('upstream_error', `Upstream \`${upstream}\` failed: ${err.message}.`);
}

export interface HttpUpstreamKind {
  family: string;
  /** Headers that carry the upstream API key. */
  authHeaders(apiKey: string): Record<string, string>;
}

export function createHttpUpstream(kind: HttpUpstreamKind, name: string, raw: Record<string, unknown>): Upstream {
  const options = readOptions(name, raw);
  const url = new URL(options.baseUrl);
  const basePath = url.pathname.replace(/\/+$/, '');
  const timeouts = options.timeouts ?? {};
  const pool = new Pool(url.origin, {
    connections: options.connections ?? 256,
    connectTimeout: timeouts.connectMs ?? 10_000,
    headersTimeout: timeouts.firstByteMs ?? 120_000,
    bodyTimeout: timeouts.idleMs ?? 120_000,
    keepAliveTimeout: 30_000,
  });
  const fixedHeaders: Record<string, string> = { ...options.headers };
  if (options.apiKey) Object.assign(fixedHeaders, kind.authHeaders(options.apiKey));

  const upstream: Upstream = {
    name,
    family: kind.family,
    send(req, sink) {
      let controller: { pause(): void; resume(): void; abort(reason: Error): void } | undefined;
      let aborted = false;
      pool.dispatch(
        { method: req.method, path: basePath + req.path, headers: { ...req.headers, ...fixedHeaders }, body: req.body },
        {
          onRequestStart(c) {
            controller = c;
            if (aborted) c.abort(new Error('client went away'));
          },
          onResponseStart(_c, status, headers) {
            sink.start(status, headers);
          },
          onResponseData(c, chunk) {
            if (!sink.data(chunk)) c.pause();
          },
          onResponseEnd() {
            sink.end();
          },
          onResponseError(_c, err) {
            if (!aborted) sink.error(transportError(name, err));
          },
        },
      );
      return {
        pause: () => controller?.pause(),
        resume: () => controller?.resume(),
        abort: () => {
          aborted = true;
          controller?.abort(new Error('client went away'));
        },
      };
    },
    close: () => pool.close(),
  };
  return upstream;
}
