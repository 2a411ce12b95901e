/**
 * The model rules, applied once to the canonical request of every exchange, whatever the client's
 * family and whether the upstream is native (passthrough) or translated: what the model cannot do
 * is refused, parameters and server-side tools its upstream cannot take are dropped or refused by
 * the model's policy, and the output ceiling is checked or defaulted. Families only express requests
 * canonically and dialects only say what they cannot send; no rule lives in either, so every family
 * gets the same answer.
 */
import type { ParamName, Request, ServerTool } from './canonical.js';
import type { ModelConfig, ParameterPolicy } from './config/types.js';
import type { RuleOutcome, UpstreamDialect } from './contracts.js';
import { GatewayError } from './errors.js';
import type { Exchange } from './exchange.js';
import { StateKey } from './state-key.js';

/** What the rules dropped, for the usage log (`dropped tools: web_search`); absent when nothing was. */
export const modelRuleNotes = new StateKey<string>('model rule notes');


/**
 * Applies the rules of `ex.model` to `req` in place, for an upstream that speaks `dialect`.
 * Throws the GatewayError the client gets; records what was dropped on the exchange.
 */
export function applyModelRules(ex: Exchange, req: Request, dialect: UpstreamDialect): RuleOutcome {
  const model = ex.model!;
  const native = dialect.family === ex.family;
  const param = (name: ParamName) => req.params?.[name] ?? name;
  checkFeatures(req, model, param);
  const outcome: RuleOutcome = { droppedTools: dropServerTools(req, model, native, dialect.family), droppedParams: [] };
  if (!native) outcome.droppedParams = dropUnexpressible(req, model, dialect, param);
  applyCeiling(req, model, param, outcome);
  const notes = [
    outcome.droppedTools.length ? `dropped tools: ${outcome.droppedTools.map((t) => t.type).join(', ')}` : '',
    outcome.droppedParams.length ? `dropped parameters: ${outcome.droppedParams.join(', ')}` : '',
  ].filter(Boolean);
  if (notes.length) ex.set(modelRuleNotes, notes.join('; '));
  return outcome;
}

function unsupported(param: string, model: ModelConfig, what: string): GatewayError {
  return new GatewayError('unsupported_parameter', `Unsupported parameter: '${param}': model \`${model.id}\` does not support ${what}.`, param);
}

/** What the model cannot do at all, on any upstream: refused. */
function checkFeatures(req: Request, model: ModelConfig, param: (name: ParamName) => string): void {
  const { features } = model;
  if (!features.tools && (req.tools.length || (req.toolChoice !== undefined && req.toolChoice !== 'none'))) throw unsupported(param('tools'), model, 'tool calling');
  if (!features.jsonSchema && req.format?.type === 'json_schema') throw unsupported(param('format'), model, 'json_schema structured output');
  if (!features.temperature && req.temperature !== undefined) throw unsupported(param('temperature'), model, 'a sampling temperature');
  if (!features.reasoning && (req.reasoning?.effort !== undefined || req.reasoning?.summary !== undefined)) throw unsupported(param('reasoning'), model, 'reasoning controls');
  if (!features.vision) {
    for (const m of req.messages) {
      for (const p of m.content) if (p.type === 'image') throw unsupported(p.where ?? 'image', model, 'image input');
    }
  }
}

/** Only a native upstream that offers a server-side tool can run it; the others follow the model's policy. */
function dropServerTools(req: Request, model: ModelConfig, native: boolean, upstreamFamily: string): ServerTool[] {
  const tools = req.serverTools ?? [];
  const unrunnable = tools.filter((t) => !native || !model.features.serverTools.includes(t.type));
  if (!unrunnable.length) return [];
  if (model.features.unsupportedTools === 'reject') {
    const tool = unrunnable[0]!;
    const why = native ? 'does not offer' : `is served by an upstream that speaks ${upstreamFamily}, which cannot run`;
    throw new GatewayError(
      'unsupported_parameter',
      `Unsupported parameter: '${tool.param}': model \`${model.id}\` ${why} the server-side tool '${tool.type}'. The model config can drop such tools instead: features.unsupportedTools: drop.`,
      tool.param,
    );
  }
  req.serverTools = tools.filter((t) => !unrunnable.includes(t));
  return unrunnable;
}

/** Parameters the upstream's dialect has no way to say, by the model's parameter policy. */
function dropUnexpressible(req: Request, model: ModelConfig, dialect: UpstreamDialect, param: (name: ParamName) => string): string[] {
  const policy = model.features.unsupportedParameters;
  const dropped: string[] = [];
  const settle = (name: string, path: string, drop: () => unknown) => {
    if (decide(policy, name) === 'reject') {
      throw new GatewayError(
        'unsupported_parameter',
        `Unsupported parameter: '${path}': model \`${model.id}\` is served by an upstream that speaks ${dialect.family}, which cannot take it. The model config can drop it instead: features.unsupportedParameters.drop: [${name}].`,
        path,
      );
    }
    drop();
    dropped.push(path);
  };
  for (const [name, path] of Object.entries(req.extra ?? {})) settle(name, path, () => delete req.extra![name]);
  for (const name of dialect.unsendable ?? []) {
    const value = req[name];
    if (value === undefined || (Array.isArray(value) && !value.length)) continue;
    settle(name, param(name), () => (req[name] = undefined));
  }
  return dropped;
}

const decide = (policy: ParameterPolicy, name: string) => (policy.reject.includes(name) ? 'reject' : policy.drop.includes(name) ? 'drop' : policy.policy);

function applyCeiling(req: Request, model: ModelConfig, param: (name: ParamName) => string, outcome: RuleOutcome): void {
  const { max, default: byDefault } = model.maxOutputTokens;
  if (req.maxOutputTokens === undefined) {
    // With no default, the ceiling itself: leaving the limit out must not lift it.
    const ceiling = byDefault ?? max;
    if (ceiling !== undefined) req.maxOutputTokens = outcome.defaultOutputTokens = ceiling;
  } else if (max !== undefined && req.maxOutputTokens > max) {
    if (model.maxOutputTokens.overMax === 'clamp') {
      req.maxOutputTokens = outcome.defaultOutputTokens = max;
      return;
    }
    const path = param('maxOutputTokens');
    throw new GatewayError('invalid_value', `${path} is too large: ${req.maxOutputTokens}. Model \`${model.id}\` supports at most ${max} output tokens.`, path);
  }
}
