/**
 * A policy plugin: callers name their team in a header, and each team may call only the models
 * the plugin's options list for it. It runs after Sluice's own auth and grants (an `extraPlugins`
 * entry comes after the default list), answers with the team in a response header, and logs what
 * each team used when the exchange is done.
 *
 *   extraPlugins:
 *     - { name: team-policy, module: ./dist/team-policy.js, options: { header: x-team, models: { red: [m], blue: ["*"] } } }
 */
import { definePlugin, GatewayError, StateKey, type Plugin } from 'sluice/plugin-api';

const team = new StateKey<string>('team-policy.team');

function modelsOption(value: unknown): Map<string, string[]> {
  const teams = new Map<string, string[]>();
  if (value === null || typeof value !== 'object') throw new Error('team-policy: options.models must map each team to its model ids, for example { red: [m] }');
  for (const [name, models] of Object.entries(value)) {
    if (!Array.isArray(models) || !models.every((m) => typeof m === 'string')) throw new Error(`team-policy: options.models.${name} must be a list of model ids ("*" for all)`);
    teams.set(name, models);
  }
  return teams;
}

export default definePlugin(({ options, log }) => {
  const header = typeof options.header === 'string' ? options.header.toLowerCase() : 'x-team';
  const teams = modelsOption(options.models);
  const plugin: Plugin = {
    name: 'team-policy',
    // Headers only: an unknown team is refused before a byte of the body is read.
    request(ex) {
      const name = ex.headers[header];
      if (name === undefined || !teams.has(name)) {
        return new GatewayError('model_not_permitted', `Name your team in the ${header} header (one of: ${[...teams.keys()].join(', ')}).`);
      }
      ex.set(team, name);
      ex.responseHeaders = { ...ex.responseHeaders, [header]: name };
    },
    // The body is read and the model known.
    admit(ex) {
      const name = ex.get(team)!;
      const allowed = teams.get(name)!;
      if (!allowed.includes('*') && !allowed.includes(ex.modelId)) {
        return new GatewayError('model_not_permitted', `Team ${name} may not use model ${ex.modelId}; it may use: ${allowed.join(', ')}.`);
      }
    },
    // Exactly once per exchange, whatever happened; the lifecycle fields are there to read.
    done(ex) {
      const name = ex.get(team);
      if (name === undefined) return;
      log.info({ req: ex.id, team: name, model: ex.modelId, outcome: ex.outcome, input: ex.usage?.inputTokens ?? 0, output: ex.usage?.outputTokens ?? 0 }, 'team usage');
    },
  };
  return plugin;
});
