/**
 * The exact response cache: an answer to a request is replayed to an identical one, in the
 * client's own family (a stream request gets it as a stream), without calling the upstream.
 *
 * Opt-in: a model's `responseCache`, or the groups in `responseCache.groups`. A request is cached
 * when it asks for determinism (`temperature: 0`) or says `x-sluice-cache: use`; `bypass` skips the
 * cache both ways. Identical means the same canonical request (messages, tools, format, sampling)
 * for the same model from the same group: no group ever reads another's answers. A request with a
 * parameter the canonical form cannot carry (`n`, `logprobs`, `topK`…) is not cached, since its
 * answer could not be replayed whole; nor is an answer with reasoning, whose provider signatures
 * a replay could not reproduce.
 *
 * It runs in the admit phase after the grant and before the limits: a hit is answered without
 * spending the caller's rate, tokens or budget, costs nothing, and is recorded with no upstream.
 */
import { createHash } from 'node:crypto';
import { type canonical, definePlugin, type Exchange, GatewayError, LocalAnswer, modelRuleNotes, socketTurn, StateKey } from '../../src/plugin-api.js';
import { type AnswerStore, MemoryAnswers, RedisAnswers } from './answers.js';

const NAME = 'response-cache';
const HEADER = 'x-sluice-cache';

/** A miss to store once answered: where, and for how long. */
const pending = new StateKey<{ key: string; ttlMs: number }>('response cache miss');

export default definePlugin(({ config, gateway, log }) => {
  const settings = config.responseCache;
  const groups = new Set(settings.groups);
  let redisErrorLogged = 0;
  const answers: AnswerStore =
    settings.store === 'redis' && config.limiter.kind === 'redis'
      ? new RedisAnswers(config.limiter.url, config.limiter.prefix, settings.maxBytes, config.limiter.timeoutMs, (err) => {
          // A Redis that is away means misses, not failures; said once a minute at most.
          if (Date.now() - redisErrorLogged < 60_000) return;
          redisErrorLogged = Date.now();
          log.warn({ err }, 'the response cache cannot reach Redis: requests go to the upstream meanwhile');
        })
      : new MemoryAnswers(settings.maxBytes);
  const counts = { hits: 0, misses: 0, stored: 0 };
  if (gateway) {
    const figure = (name: string, help: string, type: 'counter' | 'gauge', read: () => number, aggregate?: 'max') => gateway.addFigure({ name, help, type, read, ...(aggregate && { aggregate }) });
    const shared = settings.store === 'redis' ? 'max' : undefined;
    figure('sluice_response_cache_hits_total', 'Requests answered from the response cache.', 'counter', () => counts.hits);
    figure('sluice_response_cache_misses_total', 'Cacheable requests the response cache had no answer for.', 'counter', () => counts.misses);
    figure('sluice_response_cache_stored_total', 'Answers stored in the response cache.', 'counter', () => counts.stored);
    figure('sluice_response_cache_evictions_total', 'Answers dropped from the response cache to make room.', 'counter', () => answers.evictions());
    figure('sluice_response_cache_bytes', 'Bytes of answers the response cache holds (with Redis, the shared store as last seen).', 'gauge', () => answers.bytes(), shared);
    figure('sluice_response_cache_entries', 'Answers the response cache holds (with Redis, the shared store as last seen).', 'gauge', () => answers.entries(), shared);
  }

  const hit = (ex: Exchange, json: string | undefined, key: string, ttlMs: number): LocalAnswer | undefined => {
    if (json !== undefined) {
      counts.hits++;
      say(ex, 'hit');
      ex.set(modelRuleNotes, 'answered from the response cache');
      return new LocalAnswer(JSON.parse(json) as canonical.Response, NAME);
    }
    counts.misses++;
    say(ex, 'miss');
    ex.set(pending, { key, ttlMs });
    // An answer of more characters than maxEntryBytes has more bytes too: it could not be stored, so it is not kept.
    ex.keepAnswer(settings.maxEntryBytes);
    return undefined;
  };

  return {
    name: NAME,
    admit(ex) {
      const model = ex.model!;
      const group = ex.principal?.group.name;
      const ttlMs = model.responseCache?.ttlMs ?? (group !== undefined && groups.has(group) ? settings.ttlMs : undefined);
      if (ttlMs === undefined || ex.endpoint.kind !== 'generate' || ex.get(socketTurn)) return;
      const asked = ex.headers[HEADER];
      if (asked !== undefined && asked !== 'use' && asked !== 'bypass') {
        return new GatewayError('invalid_request', `The ${HEADER} header takes \`use\` (cache this request whatever its temperature) or \`bypass\` (neither read nor store), not \`${asked.slice(0, 40)}\`.`);
      }
      if (asked === 'bypass') return void say(ex, 'bypass');
      const request = canonicalRequest(ex);
      if (!request || (request.temperature !== 0 && asked !== 'use') || !replayable(request, model.features.unsupportedParameters.drop)) return;
      const key = cacheKey(group, model.id, request);
      const found = answers.get(key);
      return found instanceof Promise ? found.then((json) => hit(ex, json, key, ttlMs)) : hit(ex, found, key, ttlMs);
    },
    done(ex) {
      const miss = ex.get(pending);
      const answer = ex.answer;
      if (!miss || !answer || ex.outcome !== 'finished' || ex.status !== 200 || answer.reasoning) return;
      // A replay gets an id, a time and the client's model name of its own.
      const { id: _id, created: _created, model: _model, ...kept } = answer;
      kept.usage ??= ex.usage;
      const json = JSON.stringify(kept);
      const bytes = Buffer.byteLength(json);
      if (bytes > settings.maxEntryBytes) return;
      answers.set(miss.key, json, bytes, miss.ttlMs);
      counts.stored++;
    },
    close: () => answers.close(),
  };
});

/** Tells the client what the cache did (`hit`, `miss`, `bypass`). */
function say(ex: Exchange, what: string): void {
  ex.responseHeaders = { ...ex.responseHeaders, [HEADER]: what };
}

/**
 * The request canonically, as the upstream call will read it; undefined when the family refuses
 * it here (the upstream call then refuses it with the same error).
 */
function canonicalRequest(ex: Exchange): canonical.Request | undefined {
  // The family reads a request for its own upstream more permissively; any other name reads it as for a translation.
  const native = ex.model!.families[ex.family] === 'native';
  try {
    return ex.clientFamily.toCanonical(ex, native ? ex.family : 'canonical');
  } catch {
    return undefined;
  }
}

/** Whether every parameter outside the canonical form is one the model drops anyway. */
function replayable(request: canonical.Request, dropped: string[]): boolean {
  for (const name in request.extra) if (!dropped.includes(name)) return false;
  return true;
}

/** The group, the model and what the upstream would be asked, hashed: how the client phrased it (its family, `stream`) is not part of it. */
function cacheKey(group: string | undefined, model: string, request: canonical.Request): string {
  const { stream: _stream, metadata: _metadata, params: _params, extra: _extra, ...asked } = request;
  return createHash('sha256')
    .update(group === undefined ? '\u0000anonymous' : `group ${group}`)
    .update('\u0000')
    .update(model)
    .update('\u0000')
    .update(JSON.stringify(asked))
    .digest('base64url');
}
