/**
 * An upstream's 4xx reaches the client with its status. In passthrough the body is the upstream's
 * own, byte for byte. Translated, the upstream's words name the fields of the request as the gateway
 * translated it (`messages` for a Responses `input`), so the client gets them said as the
 * upstream's, in its own family's shape, with no `param` naming a field its request does not have
 * (before, a Responses client was told `param: "messages"`).
 */
import t from 'tap';
import { simulatorUpstreams, startStack } from './helpers.js';

const { gw } = await startStack(
  (simUrl) => `${simulatorUpstreams(simUrl)}models:
  - { id: sim-chat, upstream: chat }
  - { id: sim-gemini, upstream: gemini }
`,
);

async function post(path: string, body: unknown) {
  const res = await fetch(`${gw.url}${path}`, {
    method: 'POST',
    headers: { authorization: `Bearer ${gw.key}`, 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  return { status: res.status, text: await res.text() };
}

t.test('a Responses request the chat upstream refuses, as translated: said as the upstream\'s, without its param', async (t) => {
  for (const stream of [false, true]) {
    const { status, text } = await post('/v1/responses', { model: 'sim-chat', input: [], stream });
    t.equal(status, 400, `stream ${stream}: the upstream's status`);
    const { error } = JSON.parse(text);
    t.match(error.message, /^Upstream `chat` answered 400 to the request as translated for it: .*'messages'/, `stream ${stream}: the upstream named, and its words`);
    t.equal(error.param, null, `stream ${stream}: no param the client's request lacks`);
    t.equal(error.type, 'invalid_request_error', `stream ${stream}: in the Responses shape`);
  }
});

t.test('a Messages request the Gemini upstream refuses, as translated: Anthropic\'s shape, the upstream\'s words', async (t) => {
  const { status, text } = await post('/v1/messages', { model: 'sim-gemini', max_tokens: 16, messages: [{ role: 'user', content: [] }] });
  t.equal(status, 400);
  t.match(JSON.parse(text), { type: 'error', error: { type: 'invalid_request_error', message: /^Upstream `gemini` answered 400 to the request as translated for it: .*contents/ } });
});

t.test('in passthrough the upstream\'s own body, param and all', async (t) => {
  const { status, text } = await post('/v1/chat/completions', { model: 'sim-chat', messages: [] });
  t.equal(status, 400);
  const { error } = JSON.parse(text);
  t.equal(error.param, 'messages', 'the chat client did send messages');
  t.notMatch(error.message, /as translated/);
});
