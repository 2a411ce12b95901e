/** Micro benchmarks of the hot path: SSE splitting, the chat usage scan, choosing a channel, and recording usage. */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Bench } from 'tinybench';
import { Failover } from '../src/channels/failover.js';
import { ChannelTable } from '../src/channels/table.js';
import type { ModelConfig } from '../src/config/types.js';
import type { Exchange } from '../src/exchange.js';
import type { StateKey } from '../src/state-key.js';
import { replaceStringField } from '../src/json-splice.js';
import { SseSplitter, frameData } from '../src/sse.js';
import codecPlugin from '../plugins/codecs/chat/index.js';
import type { ClientFamily, Upstream, UpstreamCall } from '../src/contracts.js';
import { createLogger } from '../src/log.js';
import { JournaledStore } from '../src/store/journal.js';
import { SqliteStore } from '../src/store/sqlite.js';
import { sqliteDriverName } from '../src/store/sqlite-driver.js';
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
  const fakeExchange = { request: {}, get: (key: StateKey<unknown>) => key.description === 'chat usage injected' } as unknown as Exchange;
  // The client asked for usage itself: nothing is blanked, each piece's last frame is visited (for [DONE]).
  const askingExchange = { request: { stream_options: { include_usage: true } }, get: () => undefined } as unknown as Exchange;
  /** As the relay runs a passthrough with no frame plugin: the sparse scan, then each run of kept frames checked, edited and written. */
  const relayed = (ex: Exchange) => {
    const splitter = new SseSplitter();
    const pass = family!.passthrough!.stream(ex);
    const out = (b: Buffer) => {
      if ((pass.check?.(b) ?? -1) >= 0) throw new Error('a frame taken for malformed');
      sink += pass.edit?.(b) ?? b.length;
    };
    for (const p of pieces) splitter.pushSparse(Buffer.from(p), pass.sparse!, pass.frame, out);
    if (!pass.usage()) throw new Error('usage not found');
  };
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
  // The store itself, without the journal or the cache in front: what the SQLite driver costs
  // (node:sqlite on Node 24, better-sqlite3 before; SLUICE_SQLITE_DRIVER picks one to compare).
  const driver = sqliteDriverName();
  const plainStore = new SqliteStore(join(dir, 'plain.db'));
  await plainStore.createGroup({ name: 'default', models: ['*'], families: ['openai-chat'] });
  const { secret } = await plainStore.createKey({ group: 'default' });
  const batch = Array.from({ length: 256 }, usage);

  // Choosing a channel as the route does: 2 channels of one priority by weight, a third behind them.
  const channel = (name: string, priority: number) => ({ name, upstream: name, upstreamModel: 'm', priority, weight: 1 });
  const model = { id: 'bench', channels: [channel('a', 0), channel('b', 0), channel('c', 1)], families: {} } as unknown as ModelConfig;
  const upstreams = new Map(['a', 'b', 'c'].map((name) => [name, { name, family: 'chat' } as Upstream]));
  const upstreamConfigs = { a: { kind: 'x' }, b: { kind: 'x' }, c: { kind: 'x' } };
  const idle = new ChannelTable([model], upstreamConfigs, upstreams).of('bench');
  // Another upstream model cooling down: the cool-down map is not empty, so each channel is looked up.
  const busyTable = new ChannelTable([model], upstreamConfigs, upstreams);
  busyTable.coolDowns.coolDown('elsewhere/m', 3_600_000);
  const busy = busyTable.of('bench');
  const routed = { set() {}, attempts: 0, model } as unknown as Exchange;
  const noCall = {} as UpstreamCall;
  const route = (channels: typeof idle) => {
    const failover = new Failover(routed, channels, () => noCall, (step) => step(), log);
    failover.begin();
    failover.succeeded();
  };

  const bench = new Bench({ time: 500 });
  bench
    .add('SseSplitter: 258 frames in 1400-byte pieces', () => {
      const splitter = new SseSplitter();
      for (const p of pieces) splitter.push(p, () => true, (b) => (sink += b.length));
    })
    .add('chat passthrough: split + usage scan + drop usage chunk', () => {
      const splitter = new SseSplitter();
      const pass = family!.passthrough!.stream(fakeExchange);
      for (const p of pieces) splitter.push(p, pass.frame, (b) => (sink += b.length));
      if (!pass.usage()) throw new Error('usage not found');
    })
    .add('chat passthrough as relayed, usage asked for by Sluice: sparse scan + check + remove usage null', () => relayed(fakeExchange))
    .add('chat passthrough as relayed, usage asked for by the client: sparse scan with last frames + check', () => relayed(askingExchange))
    .add('copy the pieces (the baseline of the two above: `edit` works in place, so each run gets fresh bytes)', () => {
      for (const p of pieces) sink += Buffer.from(p).length;
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
    .add('route: choose 1 of 3 channels (breakers closed, nothing cooling down)', () => route(idle))
    .add('route: choose 1 of 3 channels (another upstream model cooling down)', () => route(busy))
    .add('recordUsage: journal append + 1/256 SQLite batch', () => stores[0]!.recordUsage(usage()))
    .add('recordUsage: journal append with fsync + 1/256 SQLite batch', () => stores[1]!.recordUsage(usage()))
    .add(`store (${driver}): find a key by its secret`, async () => {
      if (!(await plainStore.findKeyBySecret(secret))) throw new Error('key not found');
    })
    .add(`store (${driver}): write a batch of 256 usage records (one transaction, fsync)`, async () => {
      for (const record of batch) record.requestId = `batch-${++requestNo}`;
      await plainStore.writeUsage(batch);
    });
  await bench.run();
  for (const store of stores) await store.close();
  await plainStore.close();
  rmSync(dir, { recursive: true, force: true });
  return bench.tasks.map((task) => {
    const r = task.result as { throughput?: { mean: number }; latency?: { mean: number } } | undefined;
    const bytes = task.name.startsWith('frameData') ? pieces[0]!.length : task.name.startsWith('recordUsage') ? recordBytes : task.name.startsWith('store') ? (task.name.includes('batch') ? 256 * recordBytes : 0) : task.name.startsWith('route') ? 0 : stream.length;
    const opsPerSec = r?.throughput?.mean ?? 0;
    return {
      benchmark: task.name,
      'ops/s': Math.round(opsPerSec).toLocaleString('en'),
      'mean µs': ((r?.latency?.mean ?? 0) * 1000).toFixed(2),
      'MB/s': ((opsPerSec * bytes) / 1e6).toFixed(0),
    };
  });
}
