/**
 * Where the response cache keeps answers: in this thread's memory, or in Redis shared by every
 * thread and instance. Both are bounded in bytes and drop the least recently used answer first;
 * an answer also lapses after its time to live. Values are the canonical answer as JSON text,
 * counted in UTF-8 bytes by both, as Redis counts them.
 */
import { Redis } from 'ioredis';

export interface AnswerStore {
  /** The stored JSON, or undefined for a miss (a Redis that cannot answer in time is a miss too). */
  get(key: string): string | undefined | Promise<string | undefined>;
  /** `bytes`: the JSON's length in UTF-8. */
  set(key: string, json: string, bytes: number, ttlMs: number): void;
  /** Bytes held now: this thread's, or the whole Redis store's as last seen. */
  bytes(): number;
  entries(): number;
  /** Answers dropped to make room (not those that lapsed). */
  evictions(): number;
  close(): Promise<void>;
}

interface Held {
  json: string;
  bytes: number;
  expires: number;
}

/** A Map in use order (a hit moves its answer to the end), so the first entries are the least recently used. */
export class MemoryAnswers implements AnswerStore {
  private readonly held = new Map<string, Held>();
  private heldBytes = 0;
  private evicted = 0;

  constructor(private readonly maxBytes: number) {}

  get(key: string): string | undefined {
    const entry = this.held.get(key);
    if (!entry) return undefined;
    this.held.delete(key);
    if (entry.expires <= Date.now()) {
      this.heldBytes -= entry.bytes;
      return undefined;
    }
    this.held.set(key, entry);
    return entry.json;
  }

  set(key: string, json: string, bytes: number, ttlMs: number): void {
    const old = this.held.get(key);
    if (old) {
      this.held.delete(key);
      this.heldBytes -= old.bytes;
    }
    this.held.set(key, { json, bytes, expires: Date.now() + ttlMs });
    this.heldBytes += bytes;
    for (const [oldest, entry] of this.held) {
      if (this.heldBytes <= this.maxBytes) break;
      this.held.delete(oldest);
      this.heldBytes -= entry.bytes;
      this.evicted++;
    }
  }

  bytes(): number {
    return this.heldBytes;
  }

  entries(): number {
    return this.held.size;
  }

  evictions(): number {
    return this.evicted;
  }

  async close(): Promise<void> {
    this.held.clear();
  }
}

/**
 * Store and evict in one script, so instances never see the byte count and the entries disagree:
 * each answer's size is kept in a hash beside a use-ordered sorted set, and while the total is over
 * the bound the least recently used goes (one that already lapsed counts until it is popped).
 * Returns the bytes held after, and how many answers were evicted.
 */
const STORE = `
local sizes, order, total = KEYS[1], KEYS[2], KEYS[3]
local key, json, ttl, now, max = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
local old = tonumber(redis.call('HGET', sizes, key) or '0')
redis.call('SET', key, json, 'PX', ttl)
redis.call('HSET', sizes, key, #json)
redis.call('ZADD', order, now, key)
local bytes = redis.call('INCRBY', total, #json - old)
local evicted = 0
while bytes > max do
  local oldest = redis.call('ZPOPMIN', order)
  if #oldest == 0 then break end
  local size = tonumber(redis.call('HGET', sizes, oldest[1]) or '0')
  redis.call('HDEL', sizes, oldest[1])
  redis.call('DEL', oldest[1])
  bytes = redis.call('DECRBY', total, size)
  evicted = evicted + 1
end
return {bytes, redis.call('ZCARD', order), evicted}
`;

/** A hit refreshes the answer's place in the use order. */
const TOUCH = `
local json = redis.call('GET', KEYS[1])
if json then redis.call('ZADD', KEYS[2], ARGV[1], KEYS[1]) end
return json
`;

export class RedisAnswers implements AnswerStore {
  private readonly redis: Redis;
  private readonly keys: { sizes: string; order: string; total: string };
  private readonly prefix: string;
  private lastBytes = 0;
  private lastEntries = 0;
  private evicted = 0;

  constructor(
    url: string,
    prefix: string,
    private readonly maxBytes: number,
    /** A lookup that takes longer is a miss: the upstream answers instead. */
    timeoutMs: number,
    private readonly onError: (err: unknown) => void,
  ) {
    // One hash slot for every key ({…}), so the scripts also run on a cluster.
    this.prefix = `{${prefix}:response-cache}:`;
    this.keys = { sizes: `${this.prefix}sizes`, order: `${this.prefix}order`, total: `${this.prefix}bytes` };
    // While Redis is away a lookup fails at once (a miss) instead of queueing behind the reconnect.
    this.redis = new Redis(url, {
      commandTimeout: timeoutMs,
      enableOfflineQueue: false,
      maxRetriesPerRequest: 0,
      autoResendUnfulfilledCommands: false,
      retryStrategy: (attempt) => Math.min(attempt * 100, 1000),
    });
    this.redis.on('error', onError);
    this.redis.defineCommand('sluiceCacheStore', { numberOfKeys: 3, lua: STORE });
    this.redis.defineCommand('sluiceCacheTouch', { numberOfKeys: 2, lua: TOUCH });
  }

  async get(key: string): Promise<string | undefined> {
    try {
      const json = (await (this.redis as unknown as Scripts).sluiceCacheTouch(this.prefix + key, this.keys.order, Date.now())) as string | null;
      return json ?? undefined;
    } catch (err) {
      this.onError(err);
      return undefined;
    }
  }

  set(key: string, json: string, _bytes: number, ttlMs: number): void {
    // The script counts the bytes itself (Lua's # of a string is its length in bytes).
    const { sizes, order, total } = this.keys;
    (this.redis as unknown as Scripts).sluiceCacheStore(sizes, order, total, this.prefix + key, json, ttlMs, Date.now(), this.maxBytes).then(
      ([bytes, entries, evicted]) => {
        this.lastBytes = bytes;
        this.lastEntries = entries;
        this.evicted += evicted;
      },
      this.onError,
    );
  }

  bytes(): number {
    return this.lastBytes;
  }

  entries(): number {
    return this.lastEntries;
  }

  evictions(): number {
    return this.evicted;
  }

  async close(): Promise<void> {
    await this.redis.quit().catch(() => this.redis.disconnect());
  }
}

interface Scripts {
  sluiceCacheStore(...args: (string | number)[]): Promise<[number, number, number]>;
  sluiceCacheTouch(...args: (string | number)[]): Promise<string | null>;
}
