/**
 * The usage journal: the layer in front of any StoreBackend that makes usage records durable
 * before the store has them, and turns the backend into the Store the gateway uses.
 *
 * `recordUsage` queues the record and its line (a JSON array, src/store/journal-lines.ts); the
 * lines of every record made in one turn of the event loop are appended together at its end (group
 * commit, src/turn-end.ts: one `fs.writeSync` on an `O_APPEND` descriptor per turn), before the
 * answers of those exchanges are sent. The backend receives batches of BATCH_SIZE records or every
 * FLUSH_INTERVAL_MS. Once everything queued is committed, the file is emptied (in the same tick as
 * memory is seen empty, so no append slips in between); a store that is always busy gets the file
 * rewritten to what is still queued once it passes COMPACT_BYTES. At start the file is replayed
 * into the backend, whose writes skip request ids it already holds, so a crash between a commit
 * and the emptying counts nothing twice.
 *
 * `beginExchange` journals an exchange that is about to call its upstream (an open line,
 * kept across those rewrites while it runs), in the same append at the end of its turn, ahead of the
 * records. An open exchange without a record when the next owner starts died with the thread or
 * process that served it: it is recorded as `interrupted`.
 *
 * What it promises: a record survives a crash of the process (kill -9, an out-of-memory kill) once
 * the turn that made it has ended, which is before its exchange's answer (or a stream's last bytes)
 * leaves: a client that has its answer has a record in the kernel. A crash earlier in the turn
 * leaves the exchange's open line, so it is recorded as interrupted.
 * It survives power loss or a kernel crash only with `fsync` (config `usage.journalFsync`), which
 * syncs each append to the disk.
 *
 * A failed store write (disk full, a lock held past the busy timeout) keeps its records, logs the
 * failure and retries with backoff, from RETRY_MIN_MS doubling to RETRY_MAX_MS. Memory holds at most
 * `maxHeldRecords` of them; beyond that they are only in the file, which the next successful write
 * reads back in batches. A record that cannot be appended (the journal's disk is full) still goes
 * to the store through memory, without the crash guarantee, and is logged; if memory is full too it
 * is lost, and that is logged.
 *
 * One thread owns a file: the gateway (each worker thread its own file), which appends and
 * rewrites it. Others (the CLI) replay it without changing it, harmless beside a running owner
 * because replay is idempotent. Two gateways must not share a data directory: each would empty
 * the other's records.
 */
import { close, closeSync, fdatasyncSync, fstatSync, fsyncSync, openSync, readSync, renameSync, writeSync } from 'node:fs';
import { dirname } from 'node:path';
import { StringDecoder } from 'node:string_decoder';
import { pino, type Logger } from 'pino';
import { LiveSet } from '../live-set.js';
import { decodeLine, encodeOpen, encodeRecord } from './journal-lines.js';
import { commitAtTurnEnd } from '../turn-end.js';
import { createLogger } from '../log.js';
import { NO_TOKENS, type ApiKey, type AuditEntry, type AuditQuery, type Group, type GroupInput, type KeyPatch, type OpenExchange, type OpenTicket, type Store, type StoreBackend, type UpstreamActivity, type UsagePoint, type UsageQuery, type UsageRecord, type UsageTotals } from './store.js';

const BATCH_SIZE = 256;
const FLUSH_INTERVAL_MS = 1000;
const RETRY_MIN_MS = 1000;
const RETRY_MAX_MS = 60_000;
const READ_CHUNK_BYTES = 1 << 20;
/** A journal larger than this is rewritten to what is not yet stored, even while records keep arriving. */
const COMPACT_BYTES = 8 << 20;
/** With nothing queued, the file is rewritten to the open exchanges' lines once it passes this. */
const OPEN_ONLY_COMPACT_BYTES = 256 << 10;
/** About 5 MB of records; the file keeps the rest. */
const DEFAULT_MAX_HELD_RECORDS = 10_000;

export interface JournalOptions {
  /** Only the owner appends, writes batches and rewrites the file; others just replay at open. */
  owner: boolean;
  /** Sync each append to disk, so records survive power loss too (measured in bench/micro.ts). */
  fsync?: boolean;
  /** Records held in memory while the store refuses writes. */
  maxHeldRecords?: number;
  log?: Logger;
}

/** An open exchange, in the journal's LiveSet (not a Map keyed by id: see src/live-set.ts) until its record. */
class OpenEntry implements OpenTicket {
  liveSlot = -1;
  constructor(readonly exchange: OpenExchange) {}
}

/**
 * Writes `text` whole. The string goes to the kernel as it is: Node encodes it outside the JS heap,
 * where a Buffer of it would be garbage per write. A short write (a full disk, a file size limit)
 * goes on from where it stopped, or throws.
 */
function writeWhole(fd: number, text: string): void {
  const bytes = Buffer.byteLength(text);
  let at = writeSync(fd, text);
  if (at >= bytes) return;
  const rest = Buffer.from(text);
  while (at < bytes) at += writeSync(fd, rest, at);
}

/** The old file's descriptor, closed after a rewrite: nothing is left to lose if that close fails. */
const ignoreCloseError = () => {};

/** The owner's append-only file. */
class JournalFile {
  private fd: number;
  /** The file ends inside a line (a torn append): the next append starts a new line. */
  private torn: boolean;

  constructor(
    private readonly path: string,
    private readonly fsync: boolean,
  ) {
    this.fd = openSync(path, 'a+', 0o600);
    const size = this.size;
    const last = Buffer.alloc(1);
    this.torn = size > 0 && readSync(this.fd, last, 0, 1, size - 1) === 1 && last[0] !== 0x0a;
  }

  get size(): number {
    return fstatSync(this.fd).size;
  }

  /** Appends whole lines (`text` ends with a newline) in one write. */
  appendLines(text: string): void {
    if (this.torn) text = '\n' + text;
    this.torn = true;
    writeWhole(this.fd, text);
    if (this.fsync) fdatasyncSync(this.fd);
    this.torn = false;
  }

  /**
   * Replaces the file's contents with `lines` (whole lines, each ended by a newline), atomically:
   * a crash leaves either the old file or the new one, never a mix. Always by a rename, never a
   * truncate, and the old file's last descriptor is closed on libuv's pool: freeing its blocks is
   * the kernel's work at that close (or at a truncate), and on a filesystem mounted with `discard`
   * it waits for the disk. Done on the serving thread, a compaction per batch (80 a second at
   * 20,000 req/s) had it asleep in that wait 185 times in 4 s.
   */
  rewrite(lines: string): void {
    const next = `${this.path}.next`;
    const fd = openSync(next, 'w', 0o600);
    try {
      writeWhole(fd, lines);
      if (this.fsync) fdatasyncSync(fd);
    } finally {
      closeSync(fd);
    }
    renameSync(next, this.path);
    // Opened before the old one is closed, so the descriptor is never left pointing at nothing.
    const fresh = openSync(this.path, 'a+', 0o600);
    close(this.fd, ignoreCloseError);
    this.fd = fresh;
    this.torn = false;
    // With fsync, the rename itself must reach the disk too, or a power loss brings the old file back.
    if (this.fsync) {
      const dir = openSync(dirname(this.path), 'r');
      try {
        fsyncSync(dir);
      } finally {
        closeSync(dir);
      }
    }
  }

  close(): void {
    closeSync(this.fd);
  }
}

/**
 * The journal's records in batches, up to the size it had when reading began. Lines that are not
 * records (a torn append) are counted in `unreadable` and skipped.
 */
function* readJournal(path: string, unreadable: { lines: number }, opens?: Map<string, OpenExchange>): Generator<UsageRecord[]> {
  let fd: number;
  try {
    fd = openSync(path, 'r');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return;
    throw err;
  }
  try {
    const end = fstatSync(fd).size;
    const chunk = Buffer.allocUnsafe(READ_CHUNK_BYTES);
    const decoder = new StringDecoder('utf8');
    let carry = '';
    let batch: UsageRecord[] = [];
    for (let at = 0; at < end; ) {
      const n = readSync(fd, chunk, 0, Math.min(chunk.length, end - at), at);
      if (n === 0) break;
      at += n;
      const lines = (carry + decoder.write(chunk.subarray(0, n))).split('\n');
      carry = lines.pop()!;
      for (const line of lines) {
        if (!line) continue;
        const entry = decodeLine(line);
        if (!entry) unreadable.lines++;
        else if ('open' in entry) opens?.set(entry.open.requestId, entry.open);
        else if ((opens?.delete(entry.record.requestId), batch.push(entry.record) === BATCH_SIZE)) {
          yield batch;
          batch = [];
        }
      }
    }
    if (carry) unreadable.lines++;
    if (batch.length) yield batch;
  } finally {
    closeSync(fd);
  }
}

/** The record of an exchange whose thread or process died while it ran. */
function interruptedRecord(open: OpenExchange): UsageRecord {
  return {
    ...open,
    ...NO_TOKENS,
    status: 502,
    channel: null,
    attempts: 1,
    estimated: true,
    latencyMs: 0,
    ttfbMs: null,
    outcome: 'interrupted',
    error: 'interrupted: the gateway thread serving this exchange ended before it finished',
    notes: null,
  };
}

export class JournaledStore implements Store {
  private readonly pending: UsageRecord[] = [];
  /**
   * Each pending record's JSON text, made once for its journal line: the backend gets them with
   * the batch (a thread of its own is sent 256 strings, a copy each, rather than 256 objects to
   * clone field by field), and a compaction rewrites them as they are.
   */
  private readonly pendingLines: string[] = [];
  /** Exchanges calling their upstream, journaled so that a crash turns them into interrupted records. */
  private readonly open = new LiveSet<OpenEntry>();
  /** The file holds records that memory does not (from before a restart, or beyond the bound). */
  private fileAhead = false;
  /** Consecutive failed writes; while above 0 only the retry timer writes. */
  private failures = 0;
  private timer: NodeJS.Timeout | undefined;
  /** The write under way: one at a time, so batches keep their order. */
  private writing: Promise<void> | undefined;
  private readonly log: Logger;
  private readonly maxHeld: number;

  private constructor(
    private readonly backend: StoreBackend,
    private readonly path: string,
    private readonly journal: JournalFile | undefined,
    options: JournalOptions,
  ) {
    this.log = options.log ?? createLogger('warn', pino.destination({ dest: 2, sync: true }));
    this.maxHeld = options.maxHeldRecords ?? DEFAULT_MAX_HELD_RECORDS;
  }

  /** Opens the journal at `path` in front of `backend` and replays it. */
  static async open(backend: StoreBackend, path: string, options: JournalOptions): Promise<JournaledStore> {
    const journal = options.owner ? new JournalFile(path, options.fsync ?? false) : undefined;
    const store = new JournaledStore(backend, path, journal, options);
    if (journal) {
      store.fileAhead = journal.size > 0;
      if (store.fileAhead) {
        // Exchanges the last owner began and never recorded died with it.
        const opens = new Map<string, OpenExchange>();
        for (const _ of readJournal(path, { lines: 0 }, opens));
        for (const open of opens.values()) store.hold(interruptedRecord(open));
        if (opens.size) store.log.warn({ exchanges: opens.size }, 'usage journal: exchanges interrupted by the last stop are recorded as interrupted');
        await store.flush();
      }
    } else {
      try {
        await store.replay();
      } catch (err) {
        store.log.warn({ err }, 'usage journal not replayed: records written since the gateway last stored them are not shown');
      }
    }
    return store;
  }

  beginExchange(exchange: OpenExchange): OpenTicket {
    if (!this.journal) throw new Error('usage is recorded only by the process that owns the usage journal');
    const entry = new OpenEntry(exchange);
    this.open.add(entry);
    this.opening.push(entry);
    this.commitAtTurnEnd();
    return entry;
  }

  /** Open exchanges not yet appended: those begun in this turn of the event loop. */
  private readonly opening: OpenEntry[] = [];
  /** The lines of the records made in this turn, not yet appended. */
  private recordLines = '';
  /** Of those, the records memory could not hold: once appended they are only in the file. */
  private recordsBeyondBound = 0;
  private commitScheduled = false;
  private closed = false;

  private commitAtTurnEnd(): void {
    if (this.commitScheduled) return;
    this.commitScheduled = true;
    commitAtTurnEnd(this.commitTurn);
  }

  /**
   * Appends what this turn journaled, in one write: the open lines first (an exchange that began
   * and ended in the turn has none), then the records. Also run before anything reads or rewrites
   * the file (a batch's replay, a compaction, the close), so that it never misses them.
   */
  private readonly commitTurn = (): void => {
    this.commitScheduled = false;
    const beyond = this.recordsBeyondBound;
    let text = '';
    for (const open of this.opening) if (open.liveSlot >= 0) text += encodeOpen(open.exchange) + '\n';
    const opened = this.opening.length;
    text += this.recordLines;
    this.opening.length = 0;
    this.recordLines = '';
    this.recordsBeyondBound = 0;
    if (text.length === 0 || this.closed) return;
    try {
      this.journal!.appendLines(text);
    } catch (err) {
      this.log.error({ err, exchanges: opened }, 'usage journal append failed: the records of this turn are held in memory only, and its exchanges are not recorded if the gateway dies during them');
      if (beyond > 0) this.log.error({ records: beyond }, 'usage records lost: the journal cannot be written and memory is full');
    }
  };

  recordUsage(record: UsageRecord, opened?: OpenTicket): void {
    if (!this.journal) throw new Error('usage is recorded only by the process that owns the usage journal');
    // An exchange that ends in the turn it began needs no open line.
    const entry = opened instanceof OpenEntry ? opened : this.open.find((e) => e.exchange.requestId === record.requestId);
    if (entry) this.open.delete(entry);
    const line = encodeRecord(record);
    this.recordLines += line + '\n';
    this.commitAtTurnEnd();
    if (this.pending.length < this.maxHeld) this.hold(record, line);
    else {
      this.recordsBeyondBound++;
      if (!this.fileAhead) this.log.warn({ maxHeldRecords: this.maxHeld }, 'usage records beyond the memory bound are kept only in the journal until the store takes writes again');
      this.fileAhead = true;
    }
    if (this.failures > 0 || this.writing) return;
    if (this.pending.length >= BATCH_SIZE) void this.flush(false);
    else this.timer ??= setTimeout(() => void this.flush(), FLUSH_INTERVAL_MS).unref();
  }

  private hold(record: UsageRecord, line = encodeRecord(record)): void {
    this.pending.push(record);
    this.pendingLines.push(line);
  }

  /**
   * Writes what is queued; joins a write under way and then writes what arrived meanwhile. With
   * `whole` false (a batch filled up), only full batches: the rest waits for the next full batch
   * or the timer. Draining whatever came in during the last write instead made batches of ~30
   * records at 4,000 a second, each its own transaction, fsync, message to the writer thread and
   * journal rewrite: 35 µs of the writer thread per record against about 15 in full batches.
   */
  async flush(whole = true): Promise<void> {
    while (this.writing) await this.writing;
    clearTimeout(this.timer);
    this.timer = undefined;
    this.writing = this.write(whole);
    try {
      await this.writing;
    } finally {
      this.writing = undefined;
      // Records that arrived during the write wait for the next one.
      if (this.pending.length > 0 && this.failures === 0) this.timer ??= setTimeout(() => void this.flush(), FLUSH_INTERVAL_MS).unref();
    }
  }

  private async write(whole: boolean): Promise<void> {
    // What the file is read back from or rewritten to must include this turn's lines.
    this.commitTurn();
    try {
      // The file holds every record memory holds (but those it failed to take), and more.
      if (this.fileAhead) {
        this.fileAhead = false;
        await this.replay().catch((err) => {
          this.fileAhead = true;
          throw err;
        });
      }
      while (this.pending.length >= (whole ? 1 : BATCH_SIZE)) {
        const batch = this.pending.slice(0, BATCH_SIZE);
        await this.backend.writeUsage(batch, this.pendingLines.slice(0, batch.length));
        this.pending.splice(0, batch.length);
        this.pendingLines.splice(0, batch.length);
        // A store that is always busy rarely lets memory empty: past COMPACT_BYTES the file is
        // rewritten to what is not stored yet, so it stays bounded.
        if (!this.fileAhead && this.journal && this.journal.size > COMPACT_BYTES) this.compact();
      }
      // Synchronously after the last write: the file is rewritten to what is not stored (records
      // still queued, open exchanges), nothing appended in between. While exchanges are open, only
      // past OPEN_ONLY_COMPACT_BYTES (a rewrite per flush would cost more than it saves; a large
      // file costs every replay).
      if (!this.fileAhead && (this.open.size === 0 || (this.journal && this.journal.size > OPEN_ONLY_COMPACT_BYTES))) this.compact();
      if (this.failures > 0) this.log.info({ attempts: this.failures + 1 }, 'usage writes recovered');
      this.failures = 0;
    } catch (err) {
      this.failures++;
      const retryMs = Math.min(RETRY_MIN_MS * 2 ** (this.failures - 1), RETRY_MAX_MS);
      this.log.error(
        { err, held: this.pending.length, journalOnly: this.fileAhead, attempt: this.failures, retryMs },
        'usage write failed: the records stay in the journal (and memory) for a retry',
      );
      this.timer = setTimeout(() => void this.flush(), retryMs).unref();
    }
  }

  /** Rewrites the file to what is not stored (memory holds it all unless `fileAhead`): queued records and open exchanges. */
  private compact(): void {
    this.commitTurn();
    let text = '';
    for (const line of this.pendingLines) text += line + '\n';
    for (const open of this.open.values()) text += encodeOpen(open.exchange) + '\n';
    this.journal?.rewrite(text);
  }

  /** Writes the journal's records to the backend; what is already stored is skipped there. */
  private async replay(): Promise<void> {
    const unreadable = { lines: 0 };
    for (const batch of readJournal(this.path, unreadable)) await this.backend.writeUsage(batch);
    if (unreadable.lines) this.log.warn({ lines: unreadable.lines }, 'usage journal: unreadable lines skipped (an append torn by a crash)');
  }

  /** Records journaled and held for the store, not yet written (beyond the memory bound, only those held). */
  get queued(): number {
    return this.pending.length;
  }

  /** Everything journaled so far is in the store (nothing queued, nothing only in the file). */
  get drained(): boolean {
    return this.failures === 0 && this.pending.length === 0 && !this.fileAhead && this.open.size === 0;
  }

  /** Reads that show usage see what was recorded, unless the store is refusing writes. */
  async settle(): Promise<void> {
    if (this.failures === 0 && (this.pending.length > 0 || this.writing)) await this.flush();
  }

  async close(): Promise<void> {
    // The flush commits this turn's lines first (write does).
    await this.flush();
    clearTimeout(this.timer);
    this.closed = true;
    this.journal?.close();
    await this.backend.close();
  }

  async queryUsage(query: UsageQuery): Promise<{ records: UsageRecord[]; totals: UsageTotals }> {
    await this.settle();
    return this.backend.queryUsage(query);
  }
  async usageSeries(query: UsageQuery, bucketMs: number): Promise<UsagePoint[]> {
    await this.settle();
    return this.backend.usageSeries(query, bucketMs);
  }
  async upstreamActivity(since: number): Promise<UpstreamActivity[]> {
    await this.settle();
    return this.backend.upstreamActivity(since);
  }
  /** Keys' last-used times move with their usage batches. */
  async getKey(id: string): Promise<ApiKey | undefined> {
    await this.settle();
    return this.backend.getKey(id);
  }
  async listKeys(): Promise<ApiKey[]> {
    await this.settle();
    return this.backend.listKeys();
  }

  createGroup(group: GroupInput): Promise<Group> {
    return this.backend.createGroup(group);
  }
  getGroup(name: string): Promise<Group | undefined> {
    return this.backend.getGroup(name);
  }
  listGroups(): Promise<Group[]> {
    return this.backend.listGroups();
  }
  updateGroup(name: string, patch: Partial<GroupInput>): Promise<Group | undefined> {
    return this.backend.updateGroup(name, patch);
  }
  deleteGroup(name: string): Promise<'deleted' | 'not_found' | 'in_use'> {
    return this.backend.deleteGroup(name);
  }
  createKey(input: Parameters<Store['createKey']>[0]): Promise<{ key: ApiKey; secret: string }> {
    return this.backend.createKey(input);
  }
  findKeyBySecret(secret: string): Promise<ApiKey | undefined> {
    return this.backend.findKeyBySecret(secret);
  }
  updateKey(id: string, patch: KeyPatch): Promise<ApiKey | undefined> {
    return this.backend.updateKey(id, patch);
  }
  deleteKey(id: string): Promise<boolean> {
    return this.backend.deleteKey(id);
  }
  recordAudit(entry: AuditEntry): Promise<void> {
    return this.backend.recordAudit(entry);
  }
  getState(name: string): Promise<string | undefined> {
    return this.backend.getState(name);
  }
  setState(name: string, value: string, expiresAt: number | null, options?: { onlyIfAbsent?: boolean }): Promise<boolean> {
    return this.backend.setState(name, value, expiresAt, options);
  }
  deleteState(name: string): Promise<void> {
    return this.backend.deleteState(name);
  }
  watch(onChange: () => void): () => void {
    return this.backend.watch(onChange);
  }
  queryAudit(query: AuditQuery): Promise<AuditEntry[]> {
    return this.backend.queryAudit(query);
  }
}
