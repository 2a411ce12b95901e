/**
 * The simulator's brain, in family-neutral terms: a normalized conversation goes in, a plan of what
 * to answer (tokens, tool call, finish reason, usage, timing, fault) comes out. Pure and
 * deterministic: the same conversation always gets the same answer. Wire rendering lives in the
 * family modules (chat.ts, responses.ts, gemini.ts, messages.ts).
 *
 * Agents (Claude Code, Codex CLI, Gemini CLI) run against it as the embedded default, so a tool call
 * follows what the prompt asks for ("Read the file X": a file-reading tool, else a shell running
 * `cat X`), and the answer to a tool result repeats what the tool returned.
 */
import { createHash } from 'node:crypto';
import { estimateTokens } from '../../../src/plugin-api.js';

export type Role = 'system' | 'user' | 'assistant' | 'tool';

export interface SimToolCall {
  name: string;
  argumentsJson: string;
}

export interface SimMessage {
  role: Role;
  /** All text of the message; for a tool result, its content. */
  text: string;
  images: number;
  /** Calls an assistant message made (counted as prompt text). */
  toolCalls?: SimToolCall[];
}

/** A JSON Schema, as far as the simulator reads it. */
export type JsonSchema = boolean | { [keyword: string]: unknown };

export interface SimTool {
  name: string;
  parameters?: JsonSchema;
  /** Offered with `defer_loading`: a tool search loads its schema first, so it is never called as offered. */
  deferred?: boolean;
}

export type ToolChoice = 'auto' | 'none' | 'required' | { name: string };
export type ResponseFormat = 'text' | 'json_object' | { schema: JsonSchema };

export interface EngineInput {
  messages: SimMessage[];
  tools: SimTool[];
  toolChoice: ToolChoice;
  responseFormat: ResponseFormat;
  maxTokens?: number;
  stop?: string[];
  n: number;
}

export type FinishReason = 'stop' | 'length' | 'tool_calls';

export interface PlannedCall {
  name: string;
  /** 24 characters, family-neutral; renderers add their own prefix (`call_`). */
  callId: string;
  /** The arguments as emitted: the concatenated fragments (cut short on a length finish); `''` with `empty_args=1`. */
  argumentsJson: string;
  fragments: string[];
}

export type ChoicePlan =
  | {
      kind: 'text';
      tokens: string[];
      finishReason: FinishReason;
      /** The stop sequence that ended the text, if one did. */
      stopSequence?: string;
    }
  | ({
      kind: 'tool_call';
      finishReason: FinishReason;
      /** The further calls of the same turn (`parallel=N`), each complete. */
      parallel?: PlannedCall[];
    } & PlannedCall);

export interface Plan {
  choices: ChoicePlan[];
  /** Cached tokens (read and written) are counted within the input tokens, as the OpenAI families report them. */
  usage: { inputTokens: number; outputTokens: number; cachedTokens: number; cacheWriteTokens: number };
  timing: { ttftMs: number; tokensPerSecond: number };
  /** `blocked`: the prompt is refused by a (simulated) safety filter; families that have no such answer ignore it. */
  fault: { errorStatus?: number; cutAfter?: number; blocked?: boolean };
  /** How an odd upstream deviates on the wire: a wrong content type on its answer, no usage anywhere. */
  wire: { contentType?: string; noUsage?: boolean };
}

/** What a `[[sim …]]` directive can set. */
export interface Directives {
  tokens: number;
  tps: number;
  ttftMs: number;
  errorStatus?: number;
  cutAfter?: number;
  /** `block=1`: the prompt is blocked (set only when asked for). */
  block?: boolean;
  /** `content_type=text/plain`: the answer's content type, whatever its body is. */
  contentType?: string;
  /** `no_usage=1`: the answer reports no usage. */
  noUsage?: boolean;
  /** `parallel=N`: a tool answer makes N calls in one turn (the offered tools in turn, each its own id). */
  parallel?: number;
  /** `empty_args=1`: a call whose arguments are the empty object sends them as `''`, as some servers do. */
  emptyArgs?: boolean;
  /** `cached=N`: N of the prompt tokens are reported as read from the prompt cache. */
  cached?: number;
  /** `cache_write=N`: N of the prompt tokens are reported as written to the prompt cache (after those read). */
  cacheWrite?: number;
}

const DEFAULT_TOKENS = 16;
/**
 * Directive ceiling, so a typo cannot make one request allocate gigabytes; it is also the model's
 * output ceiling, shared by all choices of a request (beyond it an answer finishes with `length`).
 */
const MAX_DIRECTIVE_TOKENS = 100_000;
/** `[[sim …]]`; the body stops at any bracket, so text full of `[[sim` is still scanned in linear time. */
export const DIRECTIVE = /\[\[sim\b([^\][]*)\]\]/g;
/** A bare media type (`text/plain`), the only string a directive takes. */
const MEDIA_TYPE = /^[\w.+-]+\/[\w.+-]+$/;
/** Of a longer text, the seed hashes this many characters at each end (hashing stays cheap on huge prompts). */
const SEED_CHARS = 4096;
/** How far into a tool result the echo looks for its words. */
const TOOL_RESULT_SCAN = 4096;
/** How much of the latest user message (its end, where an agent puts the prompt) is read for what it asks. */
const ASK_SCAN = 16_384;
/** Ceilings on one sampled value, so a schema asking for millions of items (or recursing widely) stays cheap. */
const MAX_SAMPLE_VALUES = 10_000;
const MAX_SAMPLE_CHARS = 100_000;
const MAX_ALL_OF = 64;
const MAX_PARALLEL_CALLS = 16;
const TOKENS_PER_MESSAGE = 4;
const TOKENS_PER_IMAGE = 85;
const TOOL_RESULT_WORDS = 20;

/** Words that are single o200k tokens as " word", "Word" and " Word" alike. */
const VOCABULARY = (
  'river light stone water sky tree wind cloud small quiet bright green old new long day night ' +
  'morning field road house city garden bird song way time world home hand story warm cold deep ' +
  'clear soft slow fast high low open simple early late little great good blue red white black ' +
  'golden silver path hill lake sea sun moon star rain snow fire forest mountain island bridge ' +
  'window door table book letter voice music dream idea plan answer'
).split(' ');
/**
 * Each word after a space, made once: a long answer's tokens are then references to these (8 bytes
 * a token) rather than a fresh string each (a 100,000-token plan: 0.9 MB instead of 3.3 MB).
 */
const SPACED_VOCABULARY = VOCABULARY.map((word) => ' ' + word);

/**
 * A provider's automatic prompt cache, modelled for measuring routing: the longest prefix of a
 * prompt, at a message boundary, that this upstream has been sent before is read from its cache
 * (reported as cached tokens), as OpenAI's, Anthropic's and Gemini's implicit caches do. Each
 * upstream has its own: a conversation that moves to another channel starts cold there.
 */
export class PromptCache {
  /** Digests of the prefixes seen, oldest first (a Map keeps insertion order): an LRU. */
  private readonly seen = new Map<string, true>();

  constructor(private readonly maxPrefixes = 100_000) {}

  /** The prompt tokens of `messages` read from the cache; then every prefix of it is remembered. */
  read(messages: SimMessage[]): number {
    let digest = '';
    let cachedMessages = 0;
    const prefixes: string[] = [];
    for (let i = 0; i < messages.length; i++) {
      // Each prefix's digest chains the previous one's: one pass over the prompt.
      digest = createHash('sha256').update(digest).update(JSON.stringify(messages[i])).digest('base64');
      prefixes.push(digest);
      if (this.seen.has(digest)) cachedMessages = i + 1;
    }
    for (const prefix of prefixes) {
      this.seen.delete(prefix);
      this.seen.set(prefix, true);
    }
    for (const oldest of this.seen.keys()) {
      if (this.seen.size <= this.maxPrefixes) break;
      this.seen.delete(oldest);
    }
    return cachedMessages === 0 ? 0 : inputTokens(messages.slice(0, cachedMessages));
  }
}

/** `cache`: the upstream's prompt cache, when it models one; `cached=N` still sets a floor. */
export function plan(input: EngineInput, cache?: PromptCache): Plan {
  const lastUser = input.messages.findLast((m) => m.role === 'user');
  const directives = parseDirectives(lastUser?.text ?? '');
  const seed = conversationSeed(input.messages);
  const ceiling = Math.floor(MAX_DIRECTIVE_TOKENS / input.n);
  const limited = { ...input, maxTokens: Math.min(input.maxTokens ?? ceiling, ceiling) };
  // A sampled value depends only on its schema: every choice shares it.
  const samples = new Map<JsonSchema, string[]>();
  const sample = (schema: JsonSchema) =>
    samples.get(schema) ?? samples.set(schema, fragments(JSON.stringify(sampleValue(schema, { root: schema, values: 0, chars: 0 })))).get(schema)!;
  const pick = pickTool(input);
  const choices: ChoicePlan[] = [];
  for (let i = 0; i < input.n; i++) choices.push(planChoice(limited, directives, seed + i * 0x9e3779b9, sample, pick));
  const prompt = inputTokens(input.messages);
  const cachedTokens = Math.min(Math.max(directives.cached ?? 0, cache?.read(input.messages) ?? 0), prompt);
  return {
    choices,
    usage: {
      inputTokens: prompt,
      outputTokens: choices.reduce((sum, c) => sum + units(c).length, 0),
      cachedTokens,
      cacheWriteTokens: Math.min(directives.cacheWrite ?? 0, prompt - cachedTokens),
    },
    timing: { ttftMs: directives.ttftMs, tokensPerSecond: directives.tps },
    fault: { errorStatus: directives.errorStatus, cutAfter: directives.cutAfter, ...(directives.block ? { blocked: true } : {}) },
    wire: { contentType: directives.contentType, ...(directives.noUsage ? { noUsage: true } : {}) },
  };
}

/** The streamed pieces of a choice: text tokens or argument fragments (of every call, in order). */
export function units(choice: ChoicePlan): string[] {
  return choice.kind === 'text' ? choice.tokens : calls(choice).flatMap((c) => c.fragments);
}

/** Every call of a tool answer, in order. */
export function calls(choice: Extract<ChoicePlan, { kind: 'tool_call' }>): PlannedCall[] {
  return [choice, ...(choice.parallel ?? [])];
}

/** Reads `[[sim key=value …]]`; unknown keys and bad values are ignored. */
export function parseDirectives(text: string): Directives {
  const out: Directives = { tokens: DEFAULT_TOKENS, tps: 0, ttftMs: 0 };
  for (const match of text.matchAll(DIRECTIVE)) {
    for (const pair of match[1].trim().split(/\s+/)) {
      const eq = pair.indexOf('=');
      const key = pair.slice(0, eq);
      const raw = pair.slice(eq + 1);
      if (key === 'content_type' && MEDIA_TYPE.test(raw)) {
        out.contentType = raw;
        continue;
      }
      const value = Number(raw);
      if (eq < 0 || raw === '' || !Number.isFinite(value) || value < 0) continue;
      const whole = Number.isInteger(value);
      if (key === 'tokens' && whole && value <= MAX_DIRECTIVE_TOKENS) out.tokens = value;
      else if (key === 'tps') out.tps = value;
      else if (key === 'ttft_ms') out.ttftMs = value;
      else if (key === 'error' && whole && value >= 400 && value <= 599) out.errorStatus = value;
      else if (key === 'cut_after' && whole) out.cutAfter = value;
      else if (key === 'cached' && whole) out.cached = value;
      else if (key === 'cache_write' && whole) out.cacheWrite = value;
      else if (key === 'block' && whole) {
        if (value > 0) out.block = true;
        else delete out.block;
      } else if (key === 'no_usage' && whole) {
        if (value > 0) out.noUsage = true;
        else delete out.noUsage;
      } else if (key === 'parallel' && whole && value >= 1 && value <= MAX_PARALLEL_CALLS) {
        if (value > 1) out.parallel = value;
        else delete out.parallel;
      } else if (key === 'empty_args' && whole) {
        if (value > 0) out.emptyArgs = true;
        else delete out.emptyArgs;
      }
    }
  }
  return out;
}

/** o200k tokens of all message text (estimated in bounded time), plus a fixed overhead per message and per image. */
export function inputTokens(messages: SimMessage[]): number {
  const texts: string[] = [];
  let overhead = 0;
  for (const m of messages) {
    texts.push(m.text);
    overhead += TOKENS_PER_MESSAGE + TOKENS_PER_IMAGE * m.images;
    for (const call of m.toolCalls ?? []) texts.push(call.name, call.argumentsJson);
  }
  return estimateTokens(texts) + overhead;
}

/** Splits text into token-like pieces (" word", punctuation runs, whitespace) that concatenate back to it. */
export function fragments(text: string): string[] {
  return text.match(/ ?[\p{L}\p{N}_]+|\s+|[^\p{L}\p{N}_\s]+/gu) ?? [];
}

function planChoice(input: EngineInput, directives: Directives, seed: number, sample: (schema: JsonSchema) => string[], pick: ToolPick | undefined): ChoicePlan {
  const random = mulberry32(seed);
  if (pick) {
    // The further calls take the next callable tools, with distinct sample values; the token cap spans them all.
    const { tool, callable } = pick;
    const picked = [tool, ...Array.from({ length: (directives.parallel ?? 1) - 1 }, (_, i) => callable[(callable.indexOf(tool) + 1 + i) % callable.length] ?? tool)];
    let room = input.maxTokens ?? Infinity;
    let cut = false;
    const planned: PlannedCall[] = [];
    for (const [i, t] of picked.entries()) {
      const schema = t.parameters ?? OBJECT_SCHEMA;
      let full = i === 0 ? (pick.asked ?? sample(schema)) : fragments(JSON.stringify(sampleValue(schema, { root: schema, values: 0, chars: 0 }, 0, i)));
      if (directives.emptyArgs && full.join('') === '{}') full = [];
      const kept = capped(full, room);
      room -= kept.length;
      planned.push({ name: t.name, callId: callId(random), argumentsJson: kept.join(''), fragments: kept });
      if (kept.length < full.length) {
        cut = true;
        break;
      }
    }
    const [first, ...parallel] = planned;
    return { kind: 'tool_call', ...first, ...(parallel.length > 0 ? { parallel } : {}), finishReason: cut ? 'length' : 'tool_calls' };
  }
  const format = input.responseFormat;
  let full: string[];
  if (format === 'text') full = textAnswer(input.messages, directives.tokens, random);
  else if (format === 'json_object') full = fragments(JSON.stringify({ answer: textAnswer(input.messages, directives.tokens, random).join('') }));
  else full = sample(format.schema);
  return applyLimits(full, input.maxTokens, input.stop ?? []);
}

const OBJECT_SCHEMA: JsonSchema = { type: 'object' };

/** The tool a turn calls, and with what. */
interface ToolPick {
  tool: SimTool;
  /** The arguments the prompt asked for (fragments); undefined: every property sampled. */
  asked?: string[];
  /** The tools that may be called, in offered order (`parallel=N` calls the ones after `tool`). */
  callable: SimTool[];
}

/**
 * No call right after a tool result, nor with `none`. A tool the client names is called with
 * sampled arguments; otherwise the one the prompt asks for, with arguments from the prompt, and when
 * the prompt asks for nothing in particular, the first callable tool with sampled arguments.
 */
function pickTool(input: EngineInput): ToolPick | undefined {
  const { tools, toolChoice } = input;
  if (toolChoice === 'none' || input.messages.at(-1)?.role === 'tool') return undefined;
  const callable = tools.filter((t) => !t.deferred);
  if (typeof toolChoice === 'object') return { tool: tools.find((t) => t.name === toolChoice.name) ?? { name: toolChoice.name }, callable };
  const prompt = input.messages.findLast((m) => m.role === 'user')?.text;
  const ask = prompt === undefined ? undefined : askOf(prompt, callable);
  if (ask) return { tool: ask.tool, asked: fragments(JSON.stringify(askedArguments(ask))), callable };
  return callable.length > 0 ? { tool: callable[0], callable } : undefined;
}

// ---------------------------------------------------------------------------------------------
// What a prompt asks of the tools

/** A call the prompt asks for: the tool, and the file path it names, if any. */
interface Ask {
  tool: SimTool;
  path?: string;
}

/** A word asking for a file's content, and how many words after it, on its line, may name the file. */
const READ_VERB = /^\W*(?:read|show|open|cat|display|print|view)\W*$/i;
const READ_REACH = 8;
/** Every character a path may have here is one a shell leaves alone, so `cat PATH` needs no quoting. */
const SHELL_SAFE_PATH = /^[\p{L}\p{N}_.~@+%=,/-]+$/u;
const ROOTED_PATH = /^(?:~|\.{1,2})?\/./;
/** A file name with an extension; a bare name needs two characters before it, so `e.g.` and `i.e.` are none. */
const FILE_NAME = /(?:^[^/.]{2,}|\/[^/.]+|[^/.]\.[^/]*)\.[A-Za-z][A-Za-z0-9]{0,7}$/;
/** Tool names (split into words) that read a file, and that run a shell command. */
const READER_WORDS = new Set(['read', 'open', 'cat']);
const SHELL_WORDS = new Set(['shell', 'bash', 'sh', 'zsh', 'powershell', 'exec', 'terminal', 'cmd']);
/** Argument names (split into words) that take a command line, a directory, a file path. */
const COMMAND_ARGUMENT = /^(?:cmd|command|commands|script|argv)$/i;
const DIRECTORY_WORDS = new Set(['dir', 'directory', 'folder', 'cwd', 'workdir']);
const PATH_WORDS = new Set(['path', 'file', 'filename', 'filepath']);

/**
 * What the latest user message asks for: an offered tool it names (exact spelling), or a file it
 * asks to read, shown or opened (a file-reading tool, else a shell tool). Undefined when neither.
 */
function askOf(text: string, callable: SimTool[]): Ask | undefined {
  const prose = withoutHarnessBlocks(text.slice(-ASK_SCAN)).replace(DIRECTIVE, ' ');
  const readPath = pathToRead(prose);
  const words = new Set(prose.match(/[\w-]+/g));
  const named = callable.find((t) => words.has(t.name));
  if (named) return { tool: named, path: readPath ?? prose.split(/\s+/).map(asPath).find((p) => p !== undefined) };
  if (readPath === undefined) return undefined;
  const tool = callable.find((t) => nameWords(t.name).some((w) => READER_WORDS.has(w)) && requiredKeys(t).some(isPathArgument)) ??
    callable.find((t) => nameWords(t.name).some((w) => SHELL_WORDS.has(w)) && requiredKeys(t).some((k) => COMMAND_ARGUMENT.test(k)));
  return tool && { tool, path: readPath };
}

/** The first path within a few words after a read verb; each word is looked at once. */
function pathToRead(prose: string): string | undefined {
  for (const line of prose.split('\n')) {
    let sinceVerb = Infinity;
    for (const word of line.split(/[ \t]+/)) {
      const path = sinceVerb < READ_REACH ? asPath(word) : undefined;
      if (path !== undefined) return path;
      sinceVerb = READ_VERB.test(word) ? 0 : sinceVerb + 1;
    }
  }
  return undefined;
}

/** A word as a file path (quotes and trailing punctuation dropped): rooted, or ending in an extension. URLs are none. */
function asPath(word: string): string | undefined {
  const token = word.replace(/^[`'"(<[]+/, '').replace(/[`'")>\].,:;!?]+$/, '');
  if (!SHELL_SAFE_PATH.test(token)) return undefined;
  return ROOTED_PATH.test(token) || FILE_NAME.test(token) ? token : undefined;
}

/** Tags an agent harness wraps context in (`<system-reminder>`, `<session_context>`): names with `-` or `_`, which HTML's own never have. */
const HARNESS_OPEN = /<([A-Za-z]+[-_][\w-]*)(?:\s[^<>]*)?>/g;
const HARNESS_CLOSE = /<\/([A-Za-z]+[-_][\w-]*)>/g;

/**
 * Text without the context an agent harness wraps in tags (`<environment_context>` and the like),
 * in linear time: the closings are found once, then each opening takes the next closing of its name.
 */
function withoutHarnessBlocks(text: string): string {
  const closings = new Map<string, { at: number[]; next: number }>();
  for (const close of text.matchAll(HARNESS_CLOSE)) {
    const known = closings.get(close[1]);
    if (known) known.at.push(close.index);
    else closings.set(close[1], { at: [close.index], next: 0 });
  }
  if (closings.size === 0) return text;
  let out = '';
  let from = 0;
  for (const open of text.matchAll(HARNESS_OPEN)) {
    const close = closings.get(open[1]);
    if (!close || open.index < from) continue;
    const contentStart = open.index + open[0].length;
    while (close.next < close.at.length && close.at[close.next] < contentStart) close.next++;
    if (close.next === close.at.length) continue;
    out += text.slice(from, open.index) + ' ';
    from = close.at[close.next] + open[1].length + 3;
  }
  return out + text.slice(from);
}

/** `read_file`, `ReadFile`, `run-shell` → lower-case words. */
function nameWords(name: string): string[] {
  return name
    .replace(/([a-z0-9])([A-Z])/g, '$1 $2')
    .toLowerCase()
    .split(/[^a-z0-9]+/)
    .filter(Boolean);
}

function requiredKeys(tool: SimTool): string[] {
  const schema = tool.parameters;
  return isRecord(schema) && Array.isArray(schema.required) ? schema.required.filter((k): k is string => typeof k === 'string') : [];
}

function isPathArgument(key: string): boolean {
  const words = nameWords(key);
  return words.some((w) => PATH_WORDS.has(w)) && !words.some((w) => DIRECTORY_WORDS.has(w));
}

/**
 * The required arguments only (an agent fills in the optional ones itself): a command line runs `cat
 * PATH`, a directory is the path's, a file path is the path, and anything else takes its default or
 * a sampled value.
 */
function askedArguments(ask: Ask): Record<string, unknown> {
  const schema = ask.tool.parameters ?? OBJECT_SCHEMA;
  const properties = isRecord(schema) && isRecord(schema.properties) ? schema.properties : {};
  // Property names are data: `__proto__` or `toString` is a key like any other.
  const out: Record<string, unknown> = Object.create(null);
  for (const key of requiredKeys(ask.tool)) {
    const property = Object.hasOwn(properties, key) ? properties[key] : {};
    out[key] = askedValue(key, property, ask.path) ?? sampleValue(property, { root: schema, values: 0, chars: 0 });
  }
  return out;
}

function askedValue(key: string, property: unknown, path: string | undefined): unknown {
  const type = isRecord(property) ? schemaType(property) : 'string';
  if (path !== undefined) {
    if (COMMAND_ARGUMENT.test(key)) return type === 'array' ? ['cat', path] : type === 'string' ? `cat ${path}` : undefined;
    if (type === 'string' && nameWords(key).some((w) => DIRECTORY_WORDS.has(w))) return directoryOf(path);
    if (type === 'string' && isPathArgument(key)) return path;
  }
  return isRecord(property) ? property.default : undefined;
}

function directoryOf(path: string): string {
  const slash = path.lastIndexOf('/');
  return slash < 0 ? '.' : slash === 0 ? '/' : path.slice(0, slash);
}

/** Prefix (tool result echo or image count) followed by a generated sentence, `length` tokens in all. */
function textAnswer(messages: SimMessage[], length: number, random: () => number): string[] {
  const last = messages.at(-1);
  let prefix: string[] = [];
  if (last?.role === 'tool') {
    const content = leadingWords(toolOutput(last.text), TOOL_RESULT_WORDS);
    prefix = fragments(`The tool returned: ${content}${/[.!?]$/.test(content) ? '' : '.'}`);
  } else if (last?.role === 'user' && last.images > 0) {
    prefix = fragments(`I see ${last.images} image${last.images === 1 ? '' : 's'}.`);
  }
  return [...prefix, ...sentence(Math.max(0, length - prefix.length), random, prefix.length > 0)];
}

/** Claude Code numbers the lines of a file it read: `     1→text` (older versions: `1\ttext`). */
const LINE_NUMBER = /^[ \t]*\d+(?:→|\t)/;
const LINE_NUMBERS = new RegExp(LINE_NUMBER.source, 'gm');
/** Codex CLI heads a command's output with a few lines (chunk id, wall time, exit code), then `Output:`. */
const COMMAND_OUTPUT_HEAD = /^(?:[^\n]*\n){1,8}?Output:\r?\n/;

/** Where a tool result wrapped in a JSON object (by an agent, or by translation into Gemini's form) keeps its text. */
const RESULT_TEXT_KEYS = ['output', 'content', 'result', 'text', 'error'];

/**
 * What a tool returned, without what an agent wraps around it: a JSON envelope, harness blocks, a
 * command's head, line numbers.
 */
function toolOutput(result: string): string {
  let out = withoutHarnessBlocks(jsonEnvelopeText(result).slice(0, TOOL_RESULT_SCAN)).trimStart();
  const head = COMMAND_OUTPUT_HEAD.exec(out);
  if (head && /\bexit/i.test(head[0])) out = out.slice(head[0].length);
  return LINE_NUMBER.test(out) ? out.replace(LINE_NUMBERS, '') : out;
}

/** The text inside `{"output": "…"}` and the like; the result itself when it is no such object. */
function jsonEnvelopeText(result: string): string {
  const trimmed = result.trim();
  if (!trimmed.startsWith('{') || !trimmed.endsWith('}')) return result;
  const envelope = parseJson(trimmed);
  if (!isRecord(envelope)) return result;
  const text = RESULT_TEXT_KEYS.map((key) => envelope[key]).find((value) => typeof value === 'string');
  return typeof text === 'string' ? text : result;
}

function parseJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

/** The first `count` words, each line kept as written (trimmed), the lines joined by a space. */
function leadingWords(text: string, count: number): string {
  const kept: string[] = [];
  let left = count;
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (line === '') continue;
    const words = [...line.matchAll(/\S+/g)];
    if (words.length >= left) {
      const last = words[left - 1];
      kept.push(line.slice(0, last.index + last[0].length));
      break;
    }
    kept.push(line);
    left -= words.length;
  }
  return kept.join(' ');
}

/** `count` tokens: a capitalized word, more words, and a closing period. */
function sentence(count: number, random: () => number, afterPrefix: boolean): string[] {
  const out: string[] = [];
  for (let i = 0; i < count; i++) {
    if (i > 0 && i === count - 1) {
      out.push('.');
      break;
    }
    const pick = Math.floor(random() * VOCABULARY.length);
    if (i > 0) out.push(SPACED_VOCABULARY[pick]);
    else {
      const word = VOCABULARY[pick];
      out.push((afterPrefix ? ' ' : '') + word[0].toUpperCase() + word.slice(1));
    }
  }
  return out;
}

function capped(tokens: string[], maxTokens: number | undefined): string[] {
  return maxTokens !== undefined && tokens.length > maxTokens ? tokens.slice(0, maxTokens) : tokens;
}

/** Applies the token cap, then cuts at the earliest stop sequence in what remains. */
function applyLimits(full: string[], maxTokens: number | undefined, stop: string[]): ChoicePlan {
  const kept = capped(full, maxTokens);
  const text = kept.join('');
  let at = -1;
  let matched = '';
  for (const s of stop) {
    const i = s === '' ? -1 : text.indexOf(s);
    if (i >= 0 && (at < 0 || i < at)) {
      at = i;
      matched = s;
    }
  }
  if (at < 0) return { kind: 'text', tokens: kept, finishReason: kept.length < full.length ? 'length' : 'stop' };
  const tokens: string[] = [];
  let offset = 0;
  for (const token of kept) {
    if (offset + token.length > at) {
      if (at > offset) tokens.push(token.slice(0, at - offset));
      break;
    }
    tokens.push(token);
    offset += token.length;
  }
  return { kind: 'text', tokens, finishReason: 'stop', stopSequence: matched };
}

/** One sampled value's context: the schema `$ref`s resolve against, and what it has produced so far. */
interface Sampler {
  root: JsonSchema;
  values: number;
  chars: number;
}

/**
 * A value that validates against `schema`: the first enum value, the const, the first branch of
 * anyOf/oneOf, every declared property, minItems items. `variant` keeps array items distinct.
 * Past MAX_SAMPLE_VALUES values (or MAX_SAMPLE_CHARS of strings) arrays and objects stop growing.
 * A subschema that is no schema at all (a number, a string) allows anything, like `{}`.
 */
function sampleValue(raw: unknown, sampler: Sampler, depth = 0, variant = 0): unknown {
  const schema: JsonSchema = typeof raw === 'boolean' || isRecord(raw) ? raw : {};
  sampler.values++;
  if (typeof schema === 'boolean') return schema ? 'sample' : null;
  if (depth > 32) return null;
  if (typeof schema.$ref === 'string') {
    const target = resolveRef(sampler.root, schema.$ref);
    if (target !== undefined) return sampleValue(target, sampler, depth + 1, variant);
  }
  if ('const' in schema) return schema.const;
  if (Array.isArray(schema.enum) && schema.enum.length > 0) return schema.enum[variant % schema.enum.length];
  for (const key of ['anyOf', 'oneOf'] as const) {
    const branches = schema[key];
    if (Array.isArray(branches) && branches.length > 0) return sampleValue(merge(schema, branches[0]), sampler, depth + 1, variant);
  }
  if (Array.isArray(schema.allOf)) {
    const parts = schema.allOf.slice(0, MAX_ALL_OF);
    const merged = parts.reduce<Record<string, unknown>>((acc, part) => merge(acc, part), { ...schema, allOf: undefined });
    return sampleValue(merged, sampler, depth + 1, variant);
  }
  switch (schemaType(schema)) {
    case 'null':
      return null;
    case 'boolean':
      return variant % 2 === 0;
    case 'integer':
      return sampleNumber(schema, true, variant);
    case 'number':
      return sampleNumber(schema, false, variant);
    case 'array':
      return sampleArray(schema, sampler, depth, variant);
    case 'object':
      return sampleObject(schema, sampler, depth);
    default:
      return sampleString(schema, sampler, variant);
  }
}

type SchemaObject = { [keyword: string]: unknown };

function schemaType(schema: SchemaObject): string {
  const t = Array.isArray(schema.type) ? schema.type[0] : schema.type;
  if (typeof t === 'string') return t;
  if (schema.properties !== undefined || schema.required !== undefined) return 'object';
  if (schema.items !== undefined || schema.prefixItems !== undefined) return 'array';
  return 'string';
}

/** A branch inherits the sibling keywords of its parent (minus the combinator itself). */
function merge(base: SchemaObject, branch: unknown): SchemaObject {
  const { anyOf: _a, oneOf: _o, ...rest } = base;
  if (typeof branch !== 'object' || branch === null) return rest;
  const b = branch as SchemaObject;
  const out: SchemaObject = { ...rest, ...b };
  if (isRecord(rest.properties) && isRecord(b.properties)) out.properties = { ...rest.properties, ...b.properties };
  if (Array.isArray(rest.required) && Array.isArray(b.required)) out.required = [...rest.required, ...b.required];
  return out;
}

function resolveRef(root: JsonSchema, ref: string): JsonSchema | undefined {
  if (!ref.startsWith('#')) return undefined;
  let node: unknown = root;
  for (const raw of ref.slice(1).split('/').filter(Boolean)) {
    const key = decodeSegment(raw).replace(/~1/g, '/').replace(/~0/g, '~');
    node = isRecord(node) ? node[key] : undefined;
  }
  return typeof node === 'boolean' || isRecord(node) ? node : undefined;
}

/** A %-encoded pointer segment; one that is not valid %-encoding is taken as written. */
function decodeSegment(raw: string): string {
  try {
    return decodeURIComponent(raw);
  } catch {
    return raw;
  }
}

/** The first of a few candidates that fits the bounds: 1, near the minimum, midway, near the maximum. */
function sampleNumber(schema: SchemaObject, integer: boolean, variant: number): number {
  const bound = (key: string) => (typeof schema[key] === 'number' ? (schema[key] as number) : undefined);
  const [min, exclusiveMin, max, exclusiveMax] = ['minimum', 'exclusiveMinimum', 'maximum', 'exclusiveMaximum'].map(bound);
  const step = bound('multipleOf') ?? (integer ? 1 : undefined);
  const fits = (v: number) =>
    !(v < (min ?? -Infinity) || v <= (exclusiveMin ?? -Infinity) || v > (max ?? Infinity) || v >= (exclusiveMax ?? Infinity));
  const low = min ?? exclusiveMin;
  const high = max ?? exclusiveMax;
  const candidates = [1 + variant];
  if (low !== undefined) candidates.push(low + variant, low + 1 + variant);
  if (low !== undefined && high !== undefined) candidates.push((low + high) / 2);
  if (high !== undefined) candidates.push(high - variant, high - 1 - variant);
  const snapped = candidates.map((v) => (step && step > 0 ? Math.ceil(v / step) * step : v));
  return snapped.find(fits) ?? snapped[0];
}

function sampleString(schema: SchemaObject, sampler: Sampler, variant: number): string {
  const formats: Record<string, string> = {
    'date-time': '2024-01-01T00:00:00Z',
    date: '2024-01-01',
    time: '00:00:00Z',
    email: 'user@example.com',
    uri: 'https://example.com/',
    uuid: '00000000-0000-4000-8000-000000000000',
  };
  let value = (typeof schema.format === 'string' && formats[schema.format]) || (variant === 0 ? 'sample' : `sample${variant}`);
  const room = Math.max(0, MAX_SAMPLE_CHARS - sampler.chars);
  if (typeof schema.minLength === 'number' && value.length < schema.minLength) value = value.padEnd(Math.min(schema.minLength, room), 'x');
  if (typeof schema.maxLength === 'number' && value.length > schema.maxLength) value = value.slice(0, Math.max(0, schema.maxLength));
  sampler.chars += value.length;
  return value;
}

function sampleArray(schema: SchemaObject, sampler: Sampler, depth: number, variant: number): unknown[] {
  const prefix = Array.isArray(schema.prefixItems) ? (schema.prefixItems as JsonSchema[]) : [];
  const items = (schema.items ?? {}) as JsonSchema;
  // One item by default, none deep in a recursive schema, so generation always terminates.
  const min = typeof schema.minItems === 'number' ? schema.minItems : depth > 8 ? 0 : 1;
  const max = typeof schema.maxItems === 'number' ? schema.maxItems : Infinity;
  const count = Math.min(Math.max(min, prefix.length), max);
  const out: unknown[] = [];
  for (let i = 0; i < count && sampler.values < MAX_SAMPLE_VALUES; i++) out.push(sampleValue(prefix[i] ?? items, sampler, depth + 1, variant + i));
  return out;
}

function sampleObject(schema: SchemaObject, sampler: Sampler, depth: number): Record<string, unknown> {
  const properties = isRecord(schema.properties) ? (schema.properties as Record<string, JsonSchema>) : {};
  const required = Array.isArray(schema.required) ? schema.required.filter((k): k is string => typeof k === 'string') : [];
  const extra = isRecord(schema.additionalProperties) ? (schema.additionalProperties as JsonSchema) : {};
  // Property names are data: `__proto__` or `toString` is a key like any other.
  const out: Record<string, unknown> = Object.create(null);
  // Deep in a recursive schema, only what is required.
  const keys = depth > 8 ? required : [...Object.keys(properties), ...required];
  for (const key of keys) {
    if (sampler.values >= MAX_SAMPLE_VALUES) break;
    if (!Object.hasOwn(out, key)) out[key] = sampleValue(Object.hasOwn(properties, key) ? properties[key] : extra, sampler, depth + 1);
  }
  return out;
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/**
 * FNV-1a over each role and text, NUL after each: the same conversation gives the same seed. Of a
 * text longer than 2 × SEED_CHARS only both ends count, so the work is bounded per message.
 */
function conversationSeed(messages: SimMessage[]): number {
  let hash = 0x811c9dc5;
  const mix = (text: string, from: number, to: number) => {
    for (let i = from; i < to; i++) hash = Math.imul(hash ^ text.charCodeAt(i), 0x01000193);
  };
  const nul = () => (hash = Math.imul(hash, 0x01000193));
  for (const { role, text } of messages) {
    mix(role, 0, role.length);
    nul();
    if (text.length <= 2 * SEED_CHARS) mix(text, 0, text.length);
    else {
      mix(text, 0, SEED_CHARS);
      mix(text, text.length - SEED_CHARS, text.length);
    }
    nul();
  }
  return hash >>> 0;
}

function mulberry32(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const ID_ALPHABET = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789';

function callId(random: () => number): string {
  let id = '';
  for (let i = 0; i < 24; i++) id += ID_ALPHABET[Math.floor(random() * ID_ALPHABET.length)];
  return id;
}
