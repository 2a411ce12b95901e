/** Grant check: a key may use only the models and families granted to its group. */
import { definePlugin, type Exchange, GatewayError, groupAllowsModel } from '../../src/plugin-api.js';

function familyRefusal(ex: Exchange): GatewayError | undefined {
  const group = ex.principal?.group;
  const families = ex.endpoint.families ?? [ex.family];
  if (group && !families.some((f) => group.families.includes(f))) {
    return new GatewayError('family_not_permitted', `Keys of group \`${group.name}\` may not use the ${families.join(' or ')} endpoints.`);
  }
}

export default definePlugin(() => ({
  name: 'grant',
  catalog(ex) {
    const refusal = familyRefusal(ex);
    if (refusal) return refusal;
    const group = ex.principal?.group;
    if (group) ex.catalog = ex.catalog.filter((m) => groupAllowsModel(group, m.id));
  },
  admit(ex) {
    const refusal = familyRefusal(ex);
    if (refusal) return refusal;
    const group = ex.principal?.group;
    if (group && !groupAllowsModel(group, ex.modelId)) {
      return new GatewayError('model_not_permitted', `Keys of group \`${group.name}\` may not use model \`${ex.modelId}\`.`, 'model');
    }
  },
}));
