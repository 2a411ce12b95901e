/** What every page gets from the router. */
export interface PageContext {
  /** The content area, empty when the page starts. */
  root: HTMLElement;
  /** Aborted when the operator leaves the page: stop loading, render nothing more. */
  signal: AbortSignal;
  /** The query part of the hash, e.g. `#/usage?key=key_1`. */
  params: URLSearchParams;
  navigate(hash: string): void;
}

/** Renders into `ctx.root`; may return a cleanup for when the page is left. */
export type Page = (ctx: PageContext) => (() => void) | void;
