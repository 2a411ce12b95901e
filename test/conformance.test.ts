/**
 * The shared conformance suite (test/conformance/pair.ts) run on every codec plugin in the tree:
 * each family and the dialect of the same name must agree on requests, answers, streams, failures
 * and errors.
 */
import t from 'tap';
import chat from '../plugins/codecs/chat/index.js';
import gemini from '../plugins/codecs/gemini/index.js';
import messages from '../plugins/codecs/messages/index.js';
import responses from '../plugins/codecs/responses/index.js';
import { checkPair, loadPairs } from './conformance/pair.js';

for (const plugin of [chat, responses, gemini, messages]) {
  const pairs = await loadPairs(plugin);
  t.equal(pairs.length, 1, 'the plugin adds one family and its dialect');
  for (const pair of pairs) checkPair(t, pair);
}
