/**
 * The Responses WebSocket mode (protocols.md 3): `response.create` messages, events back as JSON
 * text messages, and chaining with `previous_response_id` against the connection's most recent
 * response, which Sluice remembers per connection (nothing is stored server-side).
 */
import type { SocketProtocol } from '../../../src/contracts.js';
import { GatewayError } from '../../../src/errors.js';
import { checkDepth, type RequestCaps } from '../../../src/request-caps.js';
import { openAiErrorBody } from '../openai-common.js';

type Json = Record<string, any>;

interface Chain {
  /** The input items of the response in flight, history included. */
  pendingInput?: Json[];
  /** The most recent completed response: its id and the whole conversation up to it. */
  last?: { id: string; items: Json[] };
}

const asItems = (input: unknown): Json[] => (typeof input === 'string' ? [{ role: 'user', content: input }] : Array.isArray(input) ? input : []);

/** Terminal events name themselves near the start; only those are parsed. */
const TERMINAL = /"type":"(response\.completed|response\.incomplete|response\.failed|error)"/;

export const responsesSocket = (caps: RequestCaps): SocketProtocol<Chain> => ({
  open: () => ({}),

  request(message, chain) {
    checkDepth(Buffer.from(message), caps);
    let event: Json;
    try {
      event = JSON.parse(message);
    } catch {
      throw new GatewayError('invalid_json', 'The message is not valid JSON.');
    }
    if (!event || typeof event !== 'object' || event.type !== 'response.create') {
      throw new GatewayError('invalid_request', `Unsupported event type '${event?.type}': send 'response.create'.`, 'type');
    }
    const { type: _type, stream: _stream, previous_response_id: previous, ...body } = event;
    if (body.generate === false) throw new GatewayError('unsupported_parameter', "Warm-up requests ('generate': false) are not supported.", 'generate');
    let history: Json[] = [];
    if (previous != null) {
      const last = chain.last;
      if (!last || last.id !== previous) {
        throw new GatewayError('invalid_request', `Previous response with id '${previous}' not found on this connection.`, 'previous_response_id', 400, 'previous_response_not_found');
      }
      history = last.items;
    }
    chain.pendingInput = [...history, ...asItems(body.input)];
    return Buffer.from(JSON.stringify({ ...body, input: chain.pendingInput, stream: true }));
  },

  sent(event, chain) {
    if (!TERMINAL.test(event.slice(0, 160))) return;
    // A completed (or cut-short) response can be chained from; a failure ends the chain.
    try {
      const { type, response } = JSON.parse(event);
      chain.last =
        type === 'response.completed' || type === 'response.incomplete'
          ? { id: response.id, items: [...(chain.pendingInput ?? []), ...(response.output ?? [])] }
          : undefined;
    } catch {
      chain.last = undefined;
    }
  },

  error(err) {
    const { error } = JSON.parse(openAiErrorBody(err));
    return JSON.stringify({ type: 'error', status: err.status, error });
  },
});
