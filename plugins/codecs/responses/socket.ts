/**
 * The Responses WebSocket mode (protocols.md 3): `response.create` messages, events back as JSON
 * text messages, and chaining with `previous_response_id` against the lane's most recent response,
 * which Sluice remembers per lane of a connection (nothing is stored server-side; the socket drops
 * the oldest chains beyond its bound). `stream_id`
 * names the lane and is echoed on every event of its turns; `generate: false` is a warm-up,
 * answered here with no model output and no upstream call, that the next turn can chain from.
 */
import { randomBytes } from 'node:crypto';
import { checkDepth, GatewayError, type JsonObject, type JsonValue, type RequestCaps, type SocketProtocol } from '../../../src/plugin-api.js';
import { openAiErrorBody } from '../openai-common.js';

/**
 * A `response.create` message: a Responses request (checked when it is decoded) with the socket's
 * own fields. Items are kept as sent, unread: they go back to the upstream in the next turn.
 */
interface ResponseCreate {
  type: 'response.create';
  /** The lane: a string of 1 to MAX_LANE_CHARS characters once read. */
  stream_id?: JsonValue;
  generate?: JsonValue;
  previous_response_id?: JsonValue;
  stream?: JsonValue;
  model?: JsonValue;
  input?: JsonValue;
  [field: string]: JsonValue | undefined;
}

interface Lane {
  lane?: string;
  /** The input items of the response in flight, history included, and the size of its request. */
  pendingInput?: JsonValue[];
  pendingBytes?: number;
  /** The response in flight continues this one: its Response objects say so (`previous_response_id`). */
  pendingPrevious?: string;
  /**
   * The most recent completed response: its id, the whole conversation up to it, and its size
   * (its request's bytes and its terminal event's, which holds its output).
   */
  last?: { id: string; items: JsonValue[]; bytes: number };
  /** The response the socket last dropped from this lane to stay in its bound, to say so. */
  forgotten?: string;
}

/** A lane name longer than this is refused: it is echoed on every event. */
const MAX_LANE_CHARS = 128;

const asItems = (input: JsonValue | undefined): JsonValue[] => (typeof input === 'string' ? [{ role: 'user', content: input }] : Array.isArray(input) ? input : []);

/**
 * What may be a terminal event, spaced or not, its `type` anywhere (a native upstream may write
 * `"type": "response.completed"` last): only those are parsed, and the parse says which it is.
 */
const TERMINAL = /"type"\s*:\s*"(?:response\.(?:completed|incomplete|failed)|error)"/;
/** A Response object's `previous_response_id` when the upstream had none to say. */
const NO_PREVIOUS = /"previous_response_id"\s*:\s*null/;

/** The event with the lane's `stream_id` added as its last field (events are JSON objects). */
const onLane = (event: string, lane: string | undefined): string => {
  if (lane === undefined) return event;
  const end = event.lastIndexOf('}');
  return end < 0 ? event : `${event.slice(0, end)},"stream_id":${JSON.stringify(lane)}}`;
};

/** A warm-up's events: created, then completed with no output and zero usage. */
function warmUp(body: Omit<ResponseCreate, 'type'>): string[] {
  const response = {
    id: `resp_${randomBytes(12).toString('hex')}`,
    object: 'response',
    created_at: Math.floor(Date.now() / 1000),
    status: 'in_progress',
    model: body.model,
    output: [],
    usage: null,
  };
  const usage = { input_tokens: 0, input_tokens_details: { cached_tokens: 0 }, output_tokens: 0, output_tokens_details: { reasoning_tokens: 0 }, total_tokens: 0 };
  return [
    JSON.stringify({ type: 'response.created', sequence_number: 0, response }),
    JSON.stringify({ type: 'response.completed', sequence_number: 1, response: { ...response, status: 'completed', usage } }),
  ];
}

export const responsesSocket = (caps: RequestCaps): SocketProtocol<Lane> => ({
  open: (lane) => ({ lane }),

  read(message) {
    checkDepth(Buffer.from(message), caps);
    let parsed: JsonValue;
    try {
      parsed = JSON.parse(message);
    } catch {
      throw new GatewayError('invalid_json', 'The message is not valid JSON.');
    }
    const type = parsed && typeof parsed === 'object' && !Array.isArray(parsed) ? parsed.type : undefined;
    if (type !== 'response.create') {
      throw new GatewayError('invalid_request', `Unsupported event type '${type}': send 'response.create'.`, 'type');
    }
    const event = parsed as ResponseCreate;
    const lane = event.stream_id;
    if (lane !== undefined && (typeof lane !== 'string' || lane.length === 0 || lane.length > MAX_LANE_CHARS)) {
      throw new GatewayError('invalid_value', `'stream_id' must be a string of 1 to ${MAX_LANE_CHARS} characters.`, 'stream_id');
    }
    return { lane, message: event };
  },

  request(message, chain) {
    const { type: _type, stream: _stream, stream_id: _lane, generate, previous_response_id: previous, ...body } = message as ResponseCreate;
    // Checked here as the schema checks them over HTTP: the items are assembled before it sees them.
    if (body.input !== undefined && typeof body.input !== 'string' && !Array.isArray(body.input)) {
      throw new GatewayError('invalid_request', `Invalid request: 'input' must be a string or an array of items.`, 'input');
    }
    if (previous != null && typeof previous !== 'string') {
      throw new GatewayError('invalid_request', `Invalid request: 'previous_response_id' must be a string.`, 'previous_response_id');
    }
    let history: JsonValue[] = [];
    if (previous != null) {
      const last = chain.last;
      if (previous === chain.forgotten) {
        throw new GatewayError(
          'invalid_request',
          `Previous response with id '${previous}' is no longer held on this connection: a connection keeps at most server.maxBodyBytes of history across its lanes, and drops the oldest first. Send the whole conversation as input, without previous_response_id.`,
          'previous_response_id',
          400,
          'previous_response_not_found',
        );
      }
      if (!last || last.id !== previous) {
        throw new GatewayError('invalid_request', `Previous response with id '${previous}' not found on this connection.`, 'previous_response_id', 400, 'previous_response_not_found');
      }
      history = last.items;
    }
    chain.pendingInput = [...history, ...asItems(body.input)];
    chain.pendingPrevious = previous ?? undefined;
    const request = Buffer.from(JSON.stringify({ ...body, input: chain.pendingInput, stream: true }));
    chain.pendingBytes = request.length;
    return generate === false ? { body: request, answer: warmUp(body) } : { body: request };
  },

  sent(event, chain) {
    // The upstream got the history inlined, so its Response objects say null: they say what the client chained from.
    if (chain.pendingPrevious !== undefined) event = event.replace(NO_PREVIOUS, `"previous_response_id":${JSON.stringify(chain.pendingPrevious)}`);
    if (TERMINAL.test(event)) {
      // A completed (or cut-short) response can be chained from; a failure ends the chain. Any
      // other type is an event whose items merely contain such a `type`.
      try {
        const { type, response }: { type: string; response: { id: string; output?: JsonValue[] } } = JSON.parse(event);
        if (type === 'response.completed' || type === 'response.incomplete') {
          chain.last = { id: response.id, items: [...(chain.pendingInput ?? []), ...(response.output ?? [])], bytes: (chain.pendingBytes ?? 0) + event.length };
        } else if (type === 'response.failed' || type === 'error') {
          chain.last = undefined;
        }
      } catch {
        chain.last = undefined;
      }
    }
    return onLane(event, chain.lane);
  },

  turnEnded(chain) {
    chain.pendingInput = chain.pendingBytes = chain.pendingPrevious = undefined;
    return chain.last?.bytes ?? 0;
  },

  forget(chain) {
    chain.forgotten = chain.last?.id;
    chain.last = undefined;
  },

  error(err, lane) {
    const { error }: { error: JsonObject } = JSON.parse(openAiErrorBody(err));
    // An HTTP answer's headers that matter to a retry travel in the error event (`error.headers`).
    if (err.retryAfterSeconds !== undefined) error.headers = { 'retry-after': String(err.retryAfterSeconds) };
    return onLane(JSON.stringify({ type: 'error', status: err.status, error }), lane);
  },
});
