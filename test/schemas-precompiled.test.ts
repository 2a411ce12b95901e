/**
 * The build compiles every schema once (src/precompile-schemas.ts) so that a start compiles none:
 * loading every module that compiles a schema must take each from the build, and a precompiled
 * validator must judge exactly as one compiled here.
 */
import { Ajv } from 'ajv';
import t from 'tap';
import { schemasCompiledHere, schemaCompiler } from '../src/schema-compiler.js';
import { loadConfig } from '../src/config/load.js';
import { AdminService } from '../src/admin/service.js';
import { chatRequestSchema } from '../plugins/codecs/chat/schema.js';

t.test('a start compiles no schema: the build has them all', async (t) => {
  // The codecs, the config and the admin API compile theirs when loaded (loaded by the imports above).
  await Promise.all(['chat', 'responses', 'gemini', 'messages'].map((f) => import(`../plugins/codecs/${f}/index.js`)));
  t.ok(loadConfig({ env: {} }), 'the embedded config is valid');
  t.ok(AdminService, 'the admin API is loaded');
  t.equal(schemasCompiledHere(), 0, 'every schema came from the build');
});

t.test('a precompiled validator judges as a freshly compiled one', async (t) => {
  const options = { allErrors: false, discriminator: true, strict: false };
  const fromBuild = schemaCompiler('request', options).compile(chatRequestSchema);
  const fresh = new Ajv(options).compile(chatRequestSchema);
  t.equal(schemasCompiledHere(), 0, 'the chat request schema came from the build');
  const samples: unknown[] = [
    { model: 'm', messages: [{ role: 'user', content: 'hi' }] },
    { model: 'm', messages: [{ role: 'wizard', content: 'hi' }] },
    { model: 'm' },
    { messages: [] },
    { model: 'm', messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'data:' } }] }], temperature: 'hot' },
    [],
    null,
  ];
  for (const sample of samples) {
    t.equal(fromBuild(sample), fresh(sample), JSON.stringify(sample));
    t.same(fromBuild.errors ?? null, fresh.errors ?? null, 'with the same errors');
  }
});

t.test('a schema the build did not see is compiled here', async (t) => {
  const before = schemasCompiledHere();
  const validate = schemaCompiler('request', { allErrors: false, discriminator: true, strict: false }).compile({ type: 'object', required: ['edited-since-the-build'] });
  t.equal(schemasCompiledHere(), before + 1);
  t.equal(validate({}), false);
  t.equal(validate({ 'edited-since-the-build': 1 }), true);
});
