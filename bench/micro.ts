/** Micro benchmarks of the hot path: SSE splitting, the chat usage scan, and recording usage. */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Bench } from 'tinybench';
import type { Exchange, StateKey } from '../src/exchange.js';
import { replaceStringField } from '../src/json-splice.js';
import { SseSplitter, frameData } from '../src/sse.js';
import codecPlugin from '../plugins/codecs/chat/index.js';
import type { ClientFamily } from '../src/contracts.js';
import { createLogger } from '../src/log.js';
import { JournaledStore } from '../src/store/journal.js';
import { SqliteStore } from '../src/store/sqlite.js';
import type { UsageRecord } from '../src/store/store.js';

function chatStream(tokens: number, withUsage: boolean): Buffer {
  const frames: string[] = [];
  const base = { id: 'chatcmpl-bench', object: 'chat.completion.chunk', created: 1767225600, model: 'sim-chat' };
  const chunk = (delta: object, finish: string | null) =>
    JSON.stringify({ ...base, choices: [{ index: 0, delta, finish_reason: finish }], ...(withUsage && { usage: null }) });
  frames.push(chunk({ role: 'assistant', content: '' }, null));
  for (let i = 0; i < tokens; i++) frames.push(chunk({ content: ' river' }, null));
  frames.push(chunk({}, 'stop'));
  if (withUsage) frames.push(JSON.stringify({ ...base, choices: [], usage: { prompt_tokens: 12, completion_tokens: tokens, total_tokens: tokens + 12 } }));
  frames.push('[DONE]');
  return Buffer.from(frames.map((f) => `data: ${f}\n\n`).join(''));
}

export async function runMicro(): Promise<Record<string, string>[]> {
  let family: ClientFamily | undefined;
  await codecPlugin({ addFamily: (f: ClientFamily) => (family = f), addDialect: () => {} } as never);
  const stream = chatStream(256, true);
  // Upstream TCP reads rarely align with frames: split into 1400-byte pieces like real segments.
  const pieces: Buffer[] = [];
  for (let i = 0; i < stream.length; i += 1400) pieces.push(stream.subarray(i, i + 1400));
  // Sluice asked for the usage chunk on the client's behalf, so the passthrough drops it.
  const fakeExchange = { get: (key: StateKey<unknown>) => key.description === 'chat usage injected' } as unknown as Exchange;
  const modelKey = Buffer.from('"model"');
  const alias = Buffer.from('"team-chat"');
  let sink = 0;

  // Recording usage as the usage plugin does: the journal append, plus its share of the store's
  // batch write (one SQLite transaction per 256 records) and the truncate after it.
  const dir = mkdtempSync(join(tmpdir(), 'sluice-bench-'));
  const log = createLogger('silent');
  const stores = await Promise.all([false, true].map((fsync) =>
    JournaledStore.open(new SqliteStore(join(dir, `${fsync}.db`)), join(dir, `${fsync}.journal`), { owner: true, fsync, log }),
  ));
  let requestNo = 0;
  const usage = (): UsageRecord => ({
    time: Date.now(), requestId: `bench-${++requestNo}`, keyId: 'key_0123456789abcdef', group: 'default', model: 'sim-chat',
    upstream: 'simulator', family: 'chat', status: 200, promptTokens: 12, completionTokens: 256, estimated: false,
    latencyMs: 12.34, ttfbMs: 1.23, streamed: true, outcome: 'finished', error: null, notes: null,
    cachedInputTokens: null, cacheWriteTokens: null, reasoningTokens: null, cost: null, channel: 'simulator', attempts: 1,
  });
  const recordBytes = JSON.stringify(usage()).length + 1;

  const bench = new Bench({ time: 500 });
  bench
    .add('SseSplitter: 258 frames in 1400-byte pieces', () => {
      const splitter = new SseSplitter();
      for (const p of pieces) splitter.push(p, () => true, (b) => (sink += b.length));
    })
    .add('chat passthrough: split + usage scan + drop usage chunk', () => {
      const splitter = new SseSplitter();
      const pass = family!.passthroughStream(fakeExchange);
      for (const p of pieces) splitter.push(p, pass.frame, (b) => (sink += b.length));
      if (!pass.usage()) throw new Error('usage not found');
    })
    .add('model alias: split + splice the client\'s model name into every frame', () => {
      // As the relay does when the alias differs from the upstream's name: renamed copies, one write per piece.
      const splitter = new SseSplitter();
      const renamed: Buffer[] = [];
      for (const p of pieces) {
        splitter.push(p, (frame) => (renamed.push(replaceStringField(frame, modelKey, alias)), false), (b) => (sink += b.length));
        if (renamed.length) sink += Buffer.concat(renamed).length;
        renamed.length = 0;
      }
    })
    .add('frameData: parse one data frame', () => {
      sink += frameData(pieces[0]!)?.length ?? 0;
    })
    .add('recordUsage: journal append + 1/256 SQLite batch', () => stores[0]!.recordUsage(usage()))
    .add('recordUsage: journal append with fsync + 1/256 SQLite batch', () => stores[1]!.recordUsage(usage()));
  await bench.run();
  for (const store of stores) await store.close();
  rmSync(dir, { recursive: true, force: true });
  return bench.tasks.map((task) => {
    const r = task.result as { throughput?: { mean: number }; latency?: { mean: number } } | undefined;
    const bytes = task.name.startsWith('frameData') ? pieces[0]!.length : task.name.startsWith('recordUsage') ? recordBytes : stream.length;
    const opsPerSec = r?.throughput?.mean ?? 0;
    return {
      benchmark: task.name,
      'ops/s': Math.round(opsPerSec).toLocaleString('en'),
      'mean µs': ((r?.latency?.mean ?? 0) * 1000).toFixed(2),
      'MB/s': ((opsPerSec * bytes) / 1e6).toFixed(0),
    };
  });
}
