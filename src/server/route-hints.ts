/**
 * What a 404 suggests: when a path is not served but would be with its API version prefix added
 * (a client whose base URL lacks `/v1`), doubled prefix removed (a base URL ending in `/v1` and a
 * client that adds it again) or, for a POST, the other prefix (`/v1/models/…` for
 * `/v1beta/models/…`), the 404 names the path that is served and what to change. Nothing else is
 * guessed at.
 */

/** A served method and uWS path pattern (`/v1beta/models/:target`), with whatever the caller keeps beside it. */
export interface ServedRoute<T> {
  method: string;
  pattern: string;
  value: T;
}

export interface RouteHint<T> {
  /** `No route for POST /chat/completions. Did you mean POST /v1/chat/completions? …` */
  message: string;
  /** The route of the first suggestion; undefined when nothing is suggested. */
  suggested?: T;
}

/** `''` and the version prefix at least: a prefix several APIs share (`/v1`) leaves several owners, for the caller to choose among. */
const MIN_SHARED_SEGMENTS = 2;

/** A version prefix: the first segment of a served path when it looks like `/v1`, `/v1beta`, `/v2alpha`. */
const VERSION = /^\/v\d+[a-z]*\d*$/i;

export class RouteHints<T> {
  private readonly routes: { method: string; segments: string[]; value: T }[];
  /** The version prefixes served, in the order first seen. */
  private readonly prefixes: string[];

  constructor(served: ServedRoute<T>[]) {
    this.routes = served.map((r) => ({ method: r.method.toUpperCase(), segments: r.pattern.split('/'), value: r.value }));
    this.prefixes = [...new Set(served.map((r) => firstSegment(r.pattern)).filter((p) => VERSION.test(p)))];
  }

  hint(method: string, path: string): RouteHint<T> {
    const message = `No route for ${method} ${path}.`;
    const found: { path: string; value: T }[] = [];
    let advice = '';
    const tryPath = (candidate: string) => {
      const value = this.match(method, candidate);
      if (value !== undefined && !found.some((f) => f.path === candidate)) found.push({ path: candidate, value });
    };
    const first = firstSegment(path);
    if (!this.prefixes.includes(first)) {
      for (const prefix of this.prefixes) tryPath(prefix + path);
      const prefixes = found.map((f) => firstSegment(f.path));
      advice =
        prefixes.length === 1
          ? `Set your client's base URL to end in ${prefixes[0]}.`
          : `Set your client's base URL to end in ${prefixes.slice(0, -1).join(', ')} or ${prefixes.at(-1)}, whichever its API uses.`;
    } else {
      const rest = path.slice(first.length);
      if (firstSegment(rest) === first) {
        tryPath(rest);
        advice = `The path repeats ${first}: your client's base URL already ends in it.`;
      } else if (method === 'POST') {
        // Only for a POST, which names an operation: a GET under the wrong prefix (OpenAI's
        // GET /v1/models/{id}) is a call this gateway does not serve, not a Gemini call misplaced.
        for (const prefix of this.prefixes) if (prefix !== first) tryPath(prefix + rest);
        if (found.length === 1) advice = `This path is served under ${firstSegment(found[0]!.path)}, not ${first}.`;
        else found.length = 0;
      }
    }
    if (found.length === 0) return { message };
    const suggestions = found.map((f) => `${method} ${f.path}`);
    const meant = suggestions.length === 1 ? suggestions[0] : `${suggestions.slice(0, -1).join(', ')} or ${suggestions.at(-1)}`;
    return { message: `${message} Did you mean ${meant}? ${advice}`, suggested: found[0]!.value };
  }

  /**
   * The routes nearest `path` by its leading segments (the version prefix at least; a parameter
   * matches any segment), whatever their method: whose API a path that no route serves belongs to,
   * for the shape of its 404. Empty when none shares even the prefix.
   */
  nearest(path: string): T[] {
    const segments = path.split('/');
    let best = MIN_SHARED_SEGMENTS - 1;
    let nearest: T[] = [];
    for (const route of this.routes) {
      let shared = 0;
      while (shared < route.segments.length && shared < segments.length && (route.segments[shared]!.startsWith(':') ? segments[shared] !== '' : route.segments[shared] === segments[shared])) shared++;
      if (shared > best) {
        best = shared;
        nearest = [route.value];
      } else if (shared === best) nearest.push(route.value);
    }
    return nearest;
  }

  private match(method: string, path: string): T | undefined {
    const segments = path.split('/');
    for (const route of this.routes) {
      if (route.method !== method || route.segments.length !== segments.length) continue;
      if (route.segments.every((s, i) => (s.startsWith(':') ? segments[i] !== '' : s === segments[i]))) return route.value;
    }
    return undefined;
  }
}

function firstSegment(path: string): string {
  const end = path.indexOf('/', 1);
  return end === -1 ? path : path.slice(0, end);
}
