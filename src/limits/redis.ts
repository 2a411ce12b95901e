/**
 * The Redis Limiter: counters shared by every gateway instance (and worker thread) in one Redis,
 * with the same decisions as the memory limiter. Each decision is one Lua script over every scope
 * of the exchange, so it is atomic and all-or-nothing across instances; its times are Redis's
 * clock (TIME inside the script), never an instance's, so the `now` arguments are ignored.
 *
 * Keys, per scope S (`key:ID`, `group:NAME`, `model:ID`) under the configured prefix P:
 * - `P:S:leases`  sorted set, lease id → expiry. Every lease holding the scope (its concurrency);
 *                 renewed by its holder, so a crashed holder's slot returns after leaseMs. The key
 *                 lives leaseMs after its last write, as long as the spend key for a budget scope.
 * - `P:S:window`  sorted set, lease id → admit time: the sliding minute, for `rpm` and `tpm`.
 * - `P:S:tokens`  hash, lease id → its tokens in the window, and `total`. Both live a minute
 *                 after their last admission.
 * - `P:S:spend:SINCE` hash for the budget period starting at SINCE: `spent` (read once from the
 *                 usage records when absent), `reserved`, and lease id → its reserved cost (`e` once
 *                 the lease expired: the reservation went back, the spend still counts at settle).
 *                 It expires a day after the period ends (`total`: a day after its last admission).
 * - `P:cool:UPSTREAM/MODEL` a channel's cool-down after an upstream's 429 with Retry-After (the
 *                 value is nothing; its PX expiry is the rest), published on the `P:cool` channel.
 *                 Every instance subscribes (one more connection) and keeps what it hears in its
 *                 own map, so routing never waits on Redis; on (re)connecting it reads the keys.
 * - `P:pin:CONVERSATION` a prompt-cache affinity pin (src/channels/affinity.ts): the channel the
 *                 conversation is pinned to, with the pin's TTL as its PX expiry; made, moved,
 *                 renewed and dropped with a message on the `P:pin` channel, heard and read on
 *                 (re)connecting like the cool-downs, so no request waits on Redis for a pin.
 * Every key is passed in KEYS, so a decision touches only what it declares.
 *
 * Redis unreachable or not answering within timeoutMs: the fail mode decides, logged once when
 * Redis goes and once when it is back, and counted in `stats`. A decision that timed out may still
 * run on Redis later; nobody renews its lease, so what it took returns after leaseMs.
 */
import { randomUUID } from 'node:crypto';
import { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { WINDOW_MS, type Amounts, type CoolDownBus, type Decision, type LimitScope, type Limiter, type PinBus, type Refusal, type SpendSource, type WindowStatus } from './limiter.js';

export interface RedisLimiterOptions {
  url: string;
  /** Redis unreachable: `open` grants without counting, `closed` refuses with `unavailable`. */
  failMode: 'open' | 'closed';
  /** How long a lease lives unless its holder renews it (every leaseMs / 3 while it runs). */
  leaseMs: number;
  /** A Redis call not answered in this long counts as Redis unavailable. */
  timeoutMs: number;
  /** Prefix of every key, so several gateways (or tests) can share one Redis. */
  prefix: string;
  log?: Logger;
}

export interface RedisLease {
  readonly id: string;
  /** False when the fail mode `open` granted it without Redis: there is nothing to settle. */
  readonly counted: boolean;
  /** Four keys per scope, as the decision passed them. */
  readonly keys: string[];
  /** Per scope: '1' when it took a window entry, '1' when it reserved against a budget. */
  readonly flags: string[];
  settled: boolean;
}

const DAY_MS = 86_400_000;

/** Shared by the scripts: Redis's clock in milliseconds, and numbers written so they read back exactly. */
const PRELUDE = `
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local WINDOW = ${WINDOW_MS}
local function fmt(x) return string.format('%.17g', x) end
local function nano(x) return math.floor(x * 1e9 + 0.5) end
-- Never shortens a key's life: a budget's expired leases must stay until a decision returns their reservations.
local function extend(key, ms)
  local ttl = redis.call('PTTL', key)
  if ttl < ms then redis.call('PEXPIRE', key, ms) end
end
`;

/**
 * KEYS: per scope its leases, window, tokens and spend keys.
 * ARGV: lease id, lease ms, asked tokens, asked cost; per scope rpm, tpm, concurrency, budget
 * amount, budget end, spent so far ('' for none of each).
 * Returns {'missing', scope indexes...} when a budget period is not counted yet and no spend
 * was given for it; else {'granted'|'refused', refused scope index, reason, retry after ms}
 * followed per scope by requests, tokens and reset ms of its window, and after a budget refusal
 * by the scope's spent and reserved.
 */
const ACQUIRE = `${PRELUDE}
local lease, leaseMs = ARGV[1], tonumber(ARGV[2])
local askTokens, askCost = tonumber(ARGV[3]), tonumber(ARGV[4])
local function num(s) if s == '' then return nil end return tonumber(s) end

local scopes = {}
for i = 1, #KEYS / 4 do
  local k, a = (i - 1) * 4, 4 + (i - 1) * 6
  scopes[i] = { leases = KEYS[k + 1], window = KEYS[k + 2], tokens = KEYS[k + 3], spend = KEYS[k + 4],
    rpm = num(ARGV[a + 1]), tpm = num(ARGV[a + 2]), concurrency = num(ARGV[a + 3]),
    budget = num(ARGV[a + 4]), ends = num(ARGV[a + 5]), spentSoFar = ARGV[a + 6] }
end

local function expireSpend(s)
  -- A day after the period ends (by Redis's clock, whatever the instance thought the period was).
  if s.ends then redis.call('PEXPIREAT', s.spend, math.max(s.ends, now) + ${DAY_MS}) else redis.call('PEXPIRE', s.spend, ${DAY_MS}) end
end

-- A budget period nobody has counted since Redis started: it starts from the usage records,
-- and the first instance to bring them wins.
local missing = {}
for i, s in ipairs(scopes) do
  if s.budget and redis.call('HEXISTS', s.spend, 'spent') == 0 then
    if s.spentSoFar == '' then
      missing[#missing + 1] = i - 1
    else
      redis.call('HSET', s.spend, 'spent', s.spentSoFar, 'reserved', '0')
      expireSpend(s)
    end
  end
end
if #missing > 0 then return { 'missing', unpack(missing) } end

local function prune(s)
  local expired = redis.call('ZRANGEBYSCORE', s.leases, '-inf', now)
  if #expired > 0 then
    redis.call('ZREMRANGEBYSCORE', s.leases, '-inf', now)
    if s.budget then
      local reserved = tonumber(redis.call('HGET', s.spend, 'reserved'))
      for _, id in ipairs(expired) do
        local cost = redis.call('HGET', s.spend, id)
        if cost and cost ~= 'e' then
          reserved = reserved - tonumber(cost)
          redis.call('HSET', s.spend, id, 'e')
        end
      end
      redis.call('HSET', s.spend, 'reserved', fmt(reserved))
    end
  end
  local old = redis.call('ZRANGEBYSCORE', s.window, '-inf', now - WINDOW)
  if #old > 0 then
    local total = tonumber(redis.call('HGET', s.tokens, 'total')) or 0
    for _, id in ipairs(old) do
      total = total - (tonumber(redis.call('HGET', s.tokens, id)) or 0)
      redis.call('HDEL', s.tokens, id)
    end
    redis.call('ZREMRANGEBYSCORE', s.window, '-inf', now - WINDOW)
    redis.call('HSET', s.tokens, 'total', fmt(total))
  end
end

-- Milliseconds until the window has room: the excessRequests-th oldest entry leaves, or enough
-- of the oldest entries' tokens do. The tokens are summed over at most WAIT_WALK entries: a key
-- with tens of thousands of small requests in its window would otherwise hold Redis (one script
-- at a time, for every tenant) for tens of milliseconds per refusal. Past it the wait is the whole
-- window, which is never too short.
local WAIT_WALK = 1000
local function waitFor(s, excessTokens, excessRequests)
  if excessTokens <= 0 then
    local entry = redis.call('ZRANGE', s.window, excessRequests - 1, excessRequests - 1, 'WITHSCORES')
    if #entry == 0 then return WINDOW end
    return math.max(1, tonumber(entry[2]) + WINDOW - now)
  end
  local freed, start = 0, 0
  while start < WAIT_WALK do
    local batch = redis.call('ZRANGE', s.window, start, start + 99, 'WITHSCORES')
    if #batch == 0 then return WINDOW end
    for j = 1, #batch, 2 do
      freed = freed + (tonumber(redis.call('HGET', s.tokens, batch[j])) or 0)
      if freed >= excessTokens then return math.max(1, tonumber(batch[j + 1]) + WINDOW - now) end
    end
    start = start + 100
  end
  return WINDOW
end

local refused
local counts = {}
for i, s in ipairs(scopes) do
  prune(s)
  local requests = redis.call('ZCARD', s.window)
  local tokens = tonumber(redis.call('HGET', s.tokens, 'total')) or 0
  counts[i] = { requests, tokens }
  if not refused and s.concurrency and redis.call('ZCARD', s.leases) >= s.concurrency then
    refused = { i - 1, 'concurrency', 1000 }
  end
  if not refused and s.rpm and requests >= s.rpm then
    refused = { i - 1, 'requests', waitFor(s, 0, requests - s.rpm + 1) }
  end
  if not refused and s.tpm then
    if askTokens > s.tpm then refused = { i - 1, 'too_large', WINDOW }
    elseif tokens + askTokens > s.tpm then refused = { i - 1, 'tokens', waitFor(s, tokens + askTokens - s.tpm, 0) } end
  end
  if not refused and s.budget then
    local spent = tonumber(redis.call('HGET', s.spend, 'spent'))
    local reserved = tonumber(redis.call('HGET', s.spend, 'reserved'))
    -- admitsSpend and budgetRetryMs of limiter.ts, the same additions in the same order.
    if not (nano(spent + reserved) < nano(s.budget) and nano(spent + reserved + askCost) <= nano(s.budget)) then
      local wait = s.ends and s.ends - now or ${DAY_MS}
      if nano(reserved) > 0 and nano(spent + askCost) <= nano(s.budget) and nano(spent) < nano(s.budget) then wait = 1000 end
      refused = { i - 1, 'budget', wait, fmt(spent), fmt(reserved) }
    end
  end
end

if not refused then
  for i, s in ipairs(scopes) do
    redis.call('ZADD', s.leases, now + leaseMs, lease)
    extend(s.leases, leaseMs)
    if s.rpm or s.tpm then
      counts[i][1] = counts[i][1] + 1
      counts[i][2] = counts[i][2] + askTokens
      redis.call('ZADD', s.window, now, lease)
      redis.call('HSET', s.tokens, lease, fmt(askTokens), 'total', fmt(counts[i][2]))
      redis.call('PEXPIRE', s.window, WINDOW)
      redis.call('PEXPIRE', s.tokens, WINDOW)
    end
    if s.budget then
      local reserved = tonumber(redis.call('HGET', s.spend, 'reserved')) + askCost
      redis.call('HSET', s.spend, 'reserved', fmt(reserved), lease, fmt(askCost))
      expireSpend(s)
      extend(s.leases, redis.call('PTTL', s.spend))
    end
  end
end

local out = refused and { 'refused', refused[1], refused[2], refused[3] } or { 'granted', -1, '', 0 }
for i, s in ipairs(scopes) do
  local oldest = redis.call('ZRANGE', s.window, 0, 0, 'WITHSCORES')
  out[#out + 1] = counts[i][1]
  out[#out + 1] = fmt(counts[i][2])
  out[#out + 1] = oldest[2] and tonumber(oldest[2]) + WINDOW - now or 0
end
if refused and refused[4] then
  out[#out + 1] = refused[4]
  out[#out + 1] = refused[5]
end
return out
`;

/**
 * KEYS: per scope its four keys, as acquired. ARGV: lease id, used tokens, used cost; per scope
 * '1'/'0' for a window entry and a budget reservation. Running it again changes nothing.
 */
const SETTLE = `${PRELUDE}
local lease, usedTokens, usedCost = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
for i = 1, #KEYS / 4 do
  local k, a = (i - 1) * 4, 3 + (i - 1) * 2
  redis.call('ZREM', KEYS[k + 1], lease)
  if ARGV[a + 1] == '1' then
    -- Only while the entry is still in the window does it count there.
    local admitted = redis.call('ZSCORE', KEYS[k + 2], lease)
    if admitted and tonumber(admitted) > now - WINDOW then
      local reserved = tonumber(redis.call('HGET', KEYS[k + 3], lease))
      local total = tonumber(redis.call('HGET', KEYS[k + 3], 'total')) + (usedTokens - reserved)
      redis.call('HSET', KEYS[k + 3], lease, fmt(usedTokens), 'total', fmt(total))
    end
  end
  if ARGV[a + 2] == '1' then
    local cost = redis.call('HGET', KEYS[k + 4], lease)
    if cost then
      local reserved = tonumber(redis.call('HGET', KEYS[k + 4], 'reserved'))
      if cost ~= 'e' then reserved = reserved - tonumber(cost) end
      local spent = tonumber(redis.call('HGET', KEYS[k + 4], 'spent')) + usedCost
      redis.call('HSET', KEYS[k + 4], 'reserved', fmt(reserved), 'spent', fmt(spent))
      redis.call('HDEL', KEYS[k + 4], lease)
    end
  end
end
return 1
`;

/**
 * KEYS: leases sets. ARGV: lease ms, then pairs of a key's index and a lease id. Extends each
 * lease still alive; returns the ids of those that had expired (their slots are gone).
 */
const RENEW = `${PRELUDE}
local leaseMs = tonumber(ARGV[1])
local lost = {}
for p = 2, #ARGV, 2 do
  local key, id = KEYS[tonumber(ARGV[p])], ARGV[p + 1]
  local expiry = redis.call('ZSCORE', key, id)
  if expiry and tonumber(expiry) > now then
    redis.call('ZADD', key, 'XX', now + leaseMs, id)
    extend(key, leaseMs)
  else
    lost[#lost + 1] = id
  end
end
return lost
`;

/**
 * KEYS: a cool-down key. ARGV: its ms, the channel to publish on, the message. The key's expiry
 * only ever grows (a shorter Retry-After heard later does not cut a rest short).
 */
const COOL = `
local ms = tonumber(ARGV[1])
if redis.call('PTTL', KEYS[1]) < ms then redis.call('SET', KEYS[1], '1', 'PX', ms) end
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
`;

/** KEYS: a pin key. ARGV: the channel ('' drops the pin), its TTL in ms, the channel to publish on, the message. */
const PIN = `
if ARGV[1] == '' then redis.call('DEL', KEYS[1]) else redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) end
redis.call('PUBLISH', ARGV[3], ARGV[4])
return 1
`;

type Arg = string | number;

/** What the subscriber connection does with one channel: each message, and a catch-up on every (re)connect. */
interface Listener {
  message(text: string): void;
  catchUp(): Promise<void>;
}

interface Scripts {
  limiterAcquire(numKeys: number, ...args: Arg[]): Promise<(string | number)[]>;
  limiterSettle(numKeys: number, ...args: Arg[]): Promise<number>;
  limiterRenew(numKeys: number, ...args: Arg[]): Promise<string[]>;
  limiterCool(numKeys: number, ...args: Arg[]): Promise<number>;
  limiterPin(numKeys: number, ...args: Arg[]): Promise<number>;
}

export class RedisLimiter implements Limiter<RedisLease> {
  /** Decisions taken without Redis, by fail mode; settlements Redis did not take; leases that expired while their holder still ran. */
  readonly stats = { failedOpen: 0, failedClosed: 0, settlesFailed: 0, leasesLost: 0 };

  private readonly redis: Redis;
  private readonly scripts: Scripts;
  private readonly firstReady: Promise<void>;
  private everReady = false;
  private up = true;
  /** Leases granted and not settled: renewed together every leaseMs / 3. */
  private readonly live = new Map<string, RedisLease>();
  private renewal: NodeJS.Timeout | undefined;
  private renewing = false;
  /** Spend of a budget period read from the usage records, kept until Redis has it: a burst that found it missing reads it once. */
  private readonly spendReads = new Map<string, Promise<number>>();
  /** Hears what other instances publish (cool-downs, pins); made on the first subscribe. */
  private subscriber: Redis | undefined;
  /** Pub/sub channel → what hears it. */
  private readonly listeners = new Map<string, Listener>();
  /** This limiter's own pin messages come back to it: they are known by this and skipped. */
  private readonly origin = randomUUID();

  /** Channel cool-downs shared by every instance (and thread) on this Redis: see the key layout above. */
  readonly coolDowns: CoolDownBus = {
    publish: (key, ms) => void this.publishCoolDown(key, ms),
    subscribe: (heard) => this.subscribeCoolDowns(heard),
  };

  /** Prompt-cache affinity pins shared by every instance (and thread) on this Redis: see the key layout above. */
  readonly pins: PinBus = {
    publish: (key, channel, ttlMs) => void this.publishPin(key, channel, ttlMs),
    subscribe: (heard) => this.subscribePins(heard),
  };

  constructor(
    private readonly options: RedisLimiterOptions,
    private readonly spendSource: SpendSource,
  ) {
    this.redis = new Redis(options.url, {
      commandTimeout: options.timeoutMs,
      // While Redis is away, calls fail at once instead of queueing decisions to run late.
      enableOfflineQueue: false,
      maxRetriesPerRequest: 0,
      autoResendUnfulfilledCommands: false,
      retryStrategy: (attempt) => Math.min(attempt * 100, 1000),
    });
    this.redis.defineCommand('limiterAcquire', { lua: ACQUIRE });
    this.redis.defineCommand('limiterSettle', { lua: SETTLE });
    this.redis.defineCommand('limiterRenew', { lua: RENEW });
    this.redis.defineCommand('limiterCool', { lua: COOL });
    this.redis.defineCommand('limiterPin', { lua: PIN });
    this.scripts = this.redis as unknown as Scripts;
    this.firstReady = new Promise((resolve) => this.redis.once('ready', resolve));
    this.redis.on('ready', () => {
      this.everReady = true;
      this.recovered();
      // Back after an outage: what was published meanwhile is read (the first time, subscribe reads it).
      if (this.subscriber?.status === 'ready') for (const listener of this.listeners.values()) void listener.catchUp();
    });
    this.redis.on('error', (err) => this.lost(err));
  }

  /** Whether Redis answered the last call (or the connection came back since it did not). */
  get available(): boolean {
    return this.up;
  }

  async acquire(scopes: LimitScope[], ask: Amounts): Promise<Decision<RedisLease>> {
    const id = randomUUID();
    const keys = scopes.flatMap((scope) => this.keysOf(scope));
    const perScope = (spent: (number | undefined)[]) =>
      scopes.flatMap(({ limits, budget }, i) => [limits?.rpm ?? '', limits?.tpm ?? '', limits?.concurrency ?? '', budget?.amount ?? '', budget?.until ?? '', spent[i] ?? '']);
    const decide = async (spent: (number | undefined)[]) => {
      await this.connected();
      return this.scripts.limiterAcquire(keys.length, ...keys, id, this.options.leaseMs, ask.tokens, ask.cost, ...perScope(spent));
    };
    let reply: (string | number)[];
    try {
      reply = await decide([]);
    } catch (err) {
      return this.unavailable(scopes, err);
    }
    if (reply[0] === 'missing') {
      // Read outside the try: a store that cannot say what was spent is not Redis being away.
      const missing = reply.slice(1).map((i) => scopes[Number(i)]!);
      const reads = await Promise.all(missing.map((scope) => this.spendOf(scope)));
      const spent = scopes.map((scope) => reads[missing.indexOf(scope)]);
      try {
        reply = await decide(spent);
      } catch (err) {
        return this.unavailable(scopes, err);
      } finally {
        // Redis has it now; every call that found it missing was sent before this one and is answered.
        for (const scope of missing) this.spendReads.delete(spendReadKey(scope));
      }
      // The spends given are written when absent, so a second answer is always a decision.
      if (reply[0] === 'missing') throw new Error('the Redis limiter did not take the budget spends it was given');
    }
    this.recovered();
    const windows = scopes.map((scope, i) => windowStatus(scope, Number(reply[4 + i * 3]), Number(reply[5 + i * 3]), Number(reply[6 + i * 3])));
    if (reply[0] === 'refused') {
      const scope = scopes[Number(reply[1])]!;
      const reason = reply[2] as Refusal;
      const after = 4 + scopes.length * 3;
      const budget = reason === 'budget' && reply.length > after + 1 ? { spent: Number(reply[after]), reserved: Number(reply[after + 1]) } : undefined;
      return { granted: false, scope: scope.id, reason, limit: limitOf(scope, reason), retryAfterMs: Number(reply[3]), windows, ...(budget && { budget }) };
    }
    const flags = scopes.flatMap(({ limits, budget }) => [limits?.rpm !== undefined || limits?.tpm !== undefined ? '1' : '0', budget ? '1' : '0']);
    const lease: RedisLease = { id, counted: true, keys, flags, settled: false };
    this.hold(lease);
    return { granted: true, lease, windows };
  }

  async settle(lease: RedisLease, used: Amounts): Promise<void> {
    if (lease.settled || !lease.counted) return;
    lease.settled = true;
    this.release(lease);
    try {
      await this.scripts.limiterSettle(lease.keys.length, ...lease.keys, lease.id, used.tokens, used.cost, ...lease.flags);
      this.recovered();
    } catch (err) {
      // Not renewed any more, the slot returns when the lease expires; the spend is not counted.
      this.stats.settlesFailed++;
      this.lost(err);
    }
  }

  async close(): Promise<void> {
    clearInterval(this.renewal);
    this.renewal = undefined;
    this.live.clear();
    this.subscriber?.disconnect();
    try {
      await this.redis.quit();
    } catch {
      this.redis.disconnect();
    }
  }

  private get coolChannel(): string {
    return `${this.options.prefix}:cool`;
  }

  /** One round trip on a 429, never on a request: the key with its expiry, and the message. */
  private async publishCoolDown(key: string, ms: number): Promise<void> {
    const whole = Math.max(1, Math.ceil(ms));
    try {
      await this.connected();
      await this.scripts.limiterCool(1, `${this.coolChannel}:${key}`, whole, this.coolChannel, JSON.stringify({ key, ms: whole }));
      this.recovered();
    } catch (err) {
      // The others will not hear of it; this instance still rests the channel.
      this.lost(err);
    }
  }

  private subscribeCoolDowns(heard: (key: string, ms: number) => void): void {
    this.listen(this.coolChannel, {
      message: (text) => {
        const { key, ms } = JSON.parse(text) as { key: unknown; ms: unknown };
        if (typeof key === 'string' && typeof ms === 'number') heard(key, ms);
      },
      catchUp: () => this.readCoolDowns(heard),
    });
  }

  /**
   * Hears `channel` on the subscriber connection, made by the first listener: one that subscribed
   * can do nothing else. Its commands queue while it connects; ioredis subscribes again after a
   * reconnect, and every (re)connect catches up with what was published meanwhile.
   */
  private listen(channel: string, listener: Listener): void {
    if (this.listeners.has(channel)) throw new Error(`the Redis limiter has one listener on ${channel}`);
    this.listeners.set(channel, listener);
    let sub = this.subscriber;
    if (!sub) {
      sub = this.subscriber = new Redis(this.options.url, { retryStrategy: (attempt) => Math.min(attempt * 100, 1000), maxRetriesPerRequest: null });
      // Redis going away is reported once, by the limiter's own connection.
      sub.on('error', () => {});
      sub.on('message', (from: string, text: string) => {
        try {
          this.listeners.get(from)?.message(text);
        } catch {
          // Not ours: ignored.
        }
      });
      sub.on('ready', () => {
        for (const l of this.listeners.values()) void l.catchUp();
      });
    }
    sub.subscribe(channel).then(
      () => listener.catchUp(),
      () => {},
    );
  }

  /** Every cool-down resting now (after a (re)connect: what was published while this one did not listen). */
  private readCoolDowns(heard: (key: string, ms: number) => void): Promise<void> {
    return this.readKeys(`${this.coolChannel}:`, ['pttl'], (key, [ttl]) => {
      if (Number(ttl) > 0) heard(key, Number(ttl));
    });
  }

  /**
   * Every key under `prefix` with the replies of `commands` on it, a pipeline per scanned batch:
   * how an instance that (re)connects catches up on what was published while it did not listen.
   */
  private async readKeys(prefix: string, commands: string[], read: (key: string, replies: unknown[]) => void): Promise<void> {
    try {
      await this.connected();
      let cursor = '0';
      do {
        const [next, keys] = await this.redis.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 1000);
        cursor = next;
        if (keys.length === 0) continue;
        const replies = await this.redis.pipeline(keys.flatMap((k) => commands.map((c) => [c, k]))).exec();
        keys.forEach((k, i) => read(k.slice(prefix.length), commands.map((_, j) => replies?.[i * commands.length + j]?.[1])));
      } while (cursor !== '0');
    } catch (err) {
      this.lost(err);
    }
  }

  private get pinChannel(): string {
    return `${this.options.prefix}:pin`;
  }

  /** One round trip when a pin is made, moved, renewed or dropped, never on a request's path. */
  private async publishPin(key: string, channel: string | undefined, ttlMs: number): Promise<void> {
    const ms = Math.max(1, Math.ceil(ttlMs));
    try {
      await this.connected();
      const message = JSON.stringify({ from: this.origin, key, ...(channel !== undefined && { channel }), ms });
      await this.scripts.limiterPin(1, `${this.pinChannel}:${key}`, channel ?? '', ms, this.pinChannel, message);
      this.recovered();
    } catch (err) {
      // The others will not hear of it; this instance keeps its own pin.
      this.lost(err);
    }
  }

  private subscribePins(heard: (key: string, channel: string | undefined, ttlMs: number) => void): void {
    this.listen(this.pinChannel, {
      message: (text) => {
        const { from, key, channel, ms } = JSON.parse(text) as { from: unknown; key: unknown; channel: unknown; ms: unknown };
        if (from === this.origin || typeof key !== 'string' || typeof ms !== 'number') return;
        heard(key, typeof channel === 'string' ? channel : undefined, ms);
      },
      catchUp: () => this.readPins(heard),
    });
  }

  /** Every pin alive (after a (re)connect: what was published while this one did not listen). */
  private readPins(heard: (key: string, channel: string, ttlMs: number) => void): Promise<void> {
    return this.readKeys(`${this.pinChannel}:`, ['get', 'pttl'], (key, [channel, ttl]) => {
      if (typeof channel === 'string' && Number(ttl) > 0) heard(key, channel, Number(ttl));
    });
  }

  private keysOf(scope: LimitScope): string[] {
    const base = `${this.options.prefix}:${scope.id}`;
    return [`${base}:leases`, `${base}:window`, `${base}:tokens`, scope.budget ? `${base}:spend:${scope.budget.since}` : `${base}:spend`];
  }

  /** Until the first connection, a decision waits for it (up to timeoutMs); afterwards calls fail fast on their own. */
  private async connected(): Promise<void> {
    if (this.everReady) return;
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`Redis at ${redact(this.options.url)} did not connect within ${this.options.timeoutMs}ms`)), this.options.timeoutMs);
    });
    try {
      await Promise.race([this.firstReady, timeout]);
    } finally {
      clearTimeout(timer);
    }
  }

  private spendOf(scope: LimitScope): Promise<number> {
    const key = spendReadKey(scope);
    let read = this.spendReads.get(key);
    if (!read) {
      const started = (read = this.spendSource(scope.id, scope.budget!.since));
      this.spendReads.set(key, started);
      started.catch(() => this.spendReads.get(key) === started && this.spendReads.delete(key));
    }
    return read;
  }

  private unavailable(scopes: LimitScope[], err: unknown): Decision<RedisLease> {
    this.lost(err);
    if (this.options.failMode === 'open') {
      this.stats.failedOpen++;
      return { granted: true, lease: { id: randomUUID(), counted: false, keys: [], flags: [], settled: false }, windows: [] };
    }
    this.stats.failedClosed++;
    return { granted: false, scope: scopes[0]?.id ?? '', reason: 'unavailable', limit: 0, retryAfterMs: 1000, windows: [] };
  }

  private lost(err: unknown): void {
    if (!this.up) return;
    this.up = false;
    const failMode = this.options.failMode;
    const effect = failMode === 'open' ? 'serving without limits' : 'refusing limited requests with 503';
    this.options.log?.warn({ err, failMode }, `Redis limiter unavailable: ${effect} until it answers again`);
  }

  private recovered(): void {
    if (this.up) return;
    this.up = true;
    this.options.log?.info('Redis limiter available again: limits are enforced');
  }

  private hold(lease: RedisLease): void {
    this.live.set(lease.id, lease);
    this.renewal ??= setInterval(() => void this.renew(), Math.max(1, Math.floor(this.options.leaseMs / 3))).unref();
  }

  private release(lease: RedisLease): void {
    this.live.delete(lease.id);
    if (this.live.size === 0 && this.renewal) {
      clearInterval(this.renewal);
      this.renewal = undefined;
    }
  }

  /** One round trip for every live lease in every scope it holds. */
  private async renew(): Promise<void> {
    if (this.renewing || this.live.size === 0) return;
    this.renewing = true;
    const keyIndex = new Map<string, number>();
    const pairs: Arg[] = [];
    for (const lease of this.live.values()) {
      for (let k = 0; k < lease.keys.length; k += 4) {
        const key = lease.keys[k]!;
        let index = keyIndex.get(key);
        if (index === undefined) keyIndex.set(key, (index = keyIndex.size + 1));
        pairs.push(index, lease.id);
      }
    }
    try {
      const expired = new Set(await this.scripts.limiterRenew(keyIndex.size, ...keyIndex.keys(), this.options.leaseMs, ...pairs));
      this.recovered();
      let lost = 0;
      for (const id of expired) {
        const lease = this.live.get(id);
        if (!lease) continue;
        this.release(lease);
        lost++;
      }
      if (lost > 0) {
        this.stats.leasesLost += lost;
        this.options.log?.warn({ leases: lost }, 'limiter leases expired before they were renewed: their slots went back while their exchanges run');
      }
    } catch (err) {
      this.lost(err);
    } finally {
      this.renewing = false;
    }
  }
}

const spendReadKey = (scope: LimitScope) => `${scope.id}\n${scope.budget!.since}`;

function limitOf(scope: LimitScope, reason: Refusal): number {
  switch (reason) {
    case 'concurrency':
      return scope.limits!.concurrency!;
    case 'requests':
      return scope.limits!.rpm!;
    case 'tokens':
    case 'too_large':
      return scope.limits!.tpm!;
    case 'budget':
      return scope.budget!.amount;
    case 'unavailable':
      return 0;
  }
}

function windowStatus(scope: LimitScope, requests: number, tokens: number, resetMs: number): WindowStatus {
  const { rpm, tpm } = scope.limits ?? {};
  const reset = Math.max(0, resetMs);
  return {
    scope: scope.id,
    ...(rpm !== undefined && { requests: { limit: rpm, remaining: Math.max(0, rpm - requests), resetMs: reset } }),
    ...(tpm !== undefined && { tokens: { limit: tpm, remaining: Math.max(0, tpm - tokens), resetMs: reset } }),
  };
}

/** A Redis URL without its password, for a log line. */
function redact(url: string): string {
  return url.replace(/\/\/[^@/]*@/, '//***@');
}
