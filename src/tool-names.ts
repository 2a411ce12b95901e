/**
 * Tool names fitted to what an upstream takes, and their answers' names back. Each family allows
 * other names: Gemini `fs.read:file`, MCP-style `server/tool`, or a name past 64 characters are
 * refused by OpenAI (`^[a-zA-Z0-9_-]{1,64}$`) or Anthropic (`^[a-zA-Z0-9_-]{1,128}$`), so a client
 * of another family got the upstream's 400. A name the upstream would refuse is renamed for it
 * (its invalid characters as `_`, and past the length a prefix, `_` and 8 hex digits of its
 * SHA-256, as other gateways do); the call the model makes comes back under the client's name.
 */
import { createHash } from 'node:crypto';
import type { Event, Request, Response } from './canonical.js';
import { StateKey } from './state-key.js';

/** What tool names an upstream's dialect takes (UpstreamDialect.toolNames). */
export interface ToolNameRule {
  /** A whole name it takes, length included: `/^[a-zA-Z0-9_-]{1,64}$/`. */
  valid: RegExp;
  /** Any one character it does not take, global: `/[^a-zA-Z0-9_-]/g`. */
  invalid: RegExp;
  maxLength: number;
}

/** Upstream name → the client's, for the exchange's translated answer: set when a name was fitted. */
export const fittedToolNames = new StateKey<Map<string, string> | undefined>('fitted tool names');

/** `name` as `rule` takes it: itself when it already fits. */
export function fitToolName(name: string, rule: ToolNameRule): string {
  if (rule.valid.test(name)) return name;
  // A changed name gets its hash whatever its length, so two names that fit to the same never meet;
  // it begins with a letter or `_`, which every family takes first.
  const hash = createHash('sha256').update(name).digest('hex').slice(0, 8);
  const base = name.replace(rule.invalid, '_');
  return `${(/^[A-Za-z_]/.test(base) ? base : `_${base}`).slice(0, rule.maxLength - 9)}_${hash}`;
}

/**
 * `req` with every tool name in it fitted to `rule` (declarations, the tool choice, calls and
 * results in the history), and the names changed, upstream → client; `req` itself when none had to.
 */
export function fitToolNames(req: Request, rule: ToolNameRule | undefined): { req: Request; renamed?: Map<string, string> } {
  if (!rule || !namesToFit(req, rule)) return { req };
  const renamed = new Map<string, string>();
  const fit = (name: string) => {
    const fitted = fitToolName(name, rule);
    if (fitted !== name) renamed.set(fitted, name);
    return fitted;
  };
  // Copies only what holds a name that changes.
  const tools = req.tools.map((t) => withName(t, fit(t.name)));
  const messages = req.messages.map((m) => {
    if (m.role === 'assistant') {
      const toolCalls = m.toolCalls.map((c) => withName(c, fit(c.name)));
      return toolCalls.some((c, i) => c !== m.toolCalls[i]) ? { ...m, toolCalls } : m;
    }
    return m.role === 'tool' && m.name !== undefined ? withName(m, fit(m.name)) : m;
  });
  const choice = req.toolChoice;
  const toolChoice =
    typeof choice === 'object' && 'name' in choice ? { name: fit(choice.name) } : typeof choice === 'object' ? { ...choice, allowed: choice.allowed.map(fit) } : choice;
  return { req: { ...req, tools, messages, toolChoice }, renamed };
}

const withName = <T extends { name?: string }>(holder: T, name: string): T => (holder.name === name ? holder : { ...holder, name });

/** Whether any tool name in `req` needs fitting: most requests have none, and are not copied. */
function namesToFit(req: Request, rule: ToolNameRule): boolean {
  const fits = (name: string) => rule.valid.test(name);
  if (!req.tools.every((t) => fits(t.name))) return true;
  for (const m of req.messages) {
    if (m.role === 'assistant' && !m.toolCalls.every((c) => fits(c.name))) return true;
    if (m.role === 'tool' && m.name !== undefined && !fits(m.name)) return true;
  }
  const choice = req.toolChoice;
  return typeof choice === 'object' && ('name' in choice ? !fits(choice.name) : !choice.allowed.every(fits));
}

/** An answer's tool calls under the client's names. */
export function restoreToolNames(res: Response, renamed: Map<string, string> | undefined): Response {
  if (renamed) for (const call of res.toolCalls) call.name = renamed.get(call.name) ?? call.name;
  return res;
}

/** A stream's tool calls under the client's names. */
export function restoreEventNames(events: Event[], renamed: Map<string, string> | undefined): Event[] {
  if (renamed) for (const e of events) if (e.type === 'tool_call') e.name = renamed.get(e.name) ?? e.name;
  return events;
}
