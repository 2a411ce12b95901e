/**
 * The Responses request as ajv checks it. Input items are checked one by one against the schema
 * of their type, so an error can name the item (`input[3].call_id`); unknown fields pass through.
 */
import { compileValidator, GatewayError, type RequestValidator } from '../../../src/plugin-api.js';
import type { RequestOf } from '../schema-types.js';
import type { InputItem, ReasoningEffort, ResponsesTool, ResponsesToolChoice, TextFormat } from './wire.js';

const text = { type: 'string' } as const;
const callId = { type: 'string', minLength: 1 } as const;

const inputPart = {
  type: 'object',
  required: ['type'],
  discriminator: { propertyName: 'type' },
  oneOf: [
    { properties: { type: { const: 'input_text' }, text }, required: ['text'] },
    {
      properties: {
        type: { const: 'input_image' },
        image_url: { type: 'string', minLength: 1 },
        file_id: { type: 'string' },
        detail: { enum: ['low', 'high', 'auto', 'original'] },
      },
    },
    { properties: { type: { const: 'input_file' } } },
    { properties: { type: { const: 'input_audio' } } },
  ],
} as const;

const outputPart = {
  type: 'object',
  required: ['type'],
  discriminator: { propertyName: 'type' },
  oneOf: [
    { properties: { type: { const: 'output_text' }, text }, required: ['text'] },
    { properties: { type: { const: 'refusal' }, refusal: text }, required: ['refusal'] },
  ],
} as const;

const itemSchemas = {
  message: {
    type: 'object',
    required: ['role', 'content'],
    properties: {
      role: { enum: ['user', 'system', 'developer', 'assistant'] },
      content: { anyOf: [{ type: 'string' }, { type: 'array' }] },
    },
    if: { properties: { role: { const: 'assistant' } } },
    then: { properties: { content: { anyOf: [{ type: 'string' }, { type: 'array', items: outputPart }] } } },
    else: { properties: { content: { anyOf: [{ type: 'string' }, { type: 'array', items: inputPart }] } } },
  },
  function_call: {
    type: 'object',
    required: ['call_id', 'name', 'arguments'],
    properties: { call_id: callId, name: { type: 'string', minLength: 1 }, arguments: text, namespace: text },
  },
  function_call_output: {
    type: 'object',
    required: ['call_id', 'output'],
    properties: { call_id: callId, output: { anyOf: [{ type: 'string' }, { type: 'array', items: inputPart }] } },
  },
  custom_tool_call: {
    type: 'object',
    required: ['call_id', 'name', 'input'],
    properties: { call_id: callId, name: { type: 'string', minLength: 1 }, input: text },
  },
  custom_tool_call_output: {
    type: 'object',
    required: ['call_id', 'output'],
    properties: { call_id: callId, output: { anyOf: [{ type: 'string' }, { type: 'array', items: inputPart }] } },
  },
  reasoning: { type: 'object', properties: { summary: { type: 'array' } } },
  item_reference: { type: 'object', required: ['id'], properties: { id: { type: 'string', minLength: 1 } } },
} as const;

const toolName = { type: 'string', pattern: '^[A-Za-z0-9_-]{1,64}$' } as const;

/** tool_choice and allowed_tools entries: function and custom tools are chosen by name. */
const byName = {
  allOf: [
    { if: { properties: { type: { const: 'function' } } }, then: { required: ['name'], properties: { name: { type: 'string' }, namespace: text } } },
    { if: { properties: { type: { const: 'custom' } } }, then: { required: ['name'], properties: { name: { type: 'string' }, namespace: text } } },
  ],
} as const;

const functionTool = {
  properties: {
    type: { const: 'function' },
    name: toolName,
    parameters: { type: ['object', 'null'] },
    strict: { type: ['boolean', 'null'] },
  },
  required: ['name'],
} as const;

const requestSchema = {
  type: 'object',
  required: ['model', 'input'],
  properties: {
    model: { type: 'string', minLength: 1 },
    input: { anyOf: [{ type: 'string' }, { type: 'array', items: { type: 'object' } }] },
    instructions: { type: ['string', 'null'] },
    tools: {
      type: 'array',
      items: {
        type: 'object',
        required: ['type'],
        properties: { type: { type: 'string' } },
        allOf: [
          { if: { properties: { type: { const: 'function' } } }, then: functionTool },
          {
            if: { properties: { type: { const: 'custom' } } },
            then: { properties: { name: toolName }, required: ['name'] },
          },
          {
            if: { properties: { type: { const: 'namespace' } } },
            then: {
              required: ['name', 'tools'],
              properties: {
                name: { type: 'string', minLength: 1 },
                tools: { type: 'array', items: { type: 'object', required: ['type', 'name'], properties: { type: text, name: { type: 'string', minLength: 1 } } } },
              },
            },
          },
        ],
      },
    },
    tool_choice: {
      anyOf: [
        { enum: ['none', 'auto', 'required'] },
        {
          type: 'object',
          required: ['type'],
          properties: { type: text },
          ...byName,
          if: { properties: { type: { const: 'allowed_tools' } } },
          then: {
            required: ['mode', 'tools'],
            properties: { mode: { enum: ['auto', 'required'] }, tools: { type: 'array', items: { type: 'object', required: ['type'], properties: { type: text }, ...byName } } },
          },
        },
      ],
    },
    text: {
      type: 'object',
      properties: {
        format: {
          type: 'object',
          required: ['type'],
          discriminator: { propertyName: 'type' },
          oneOf: [
            { properties: { type: { const: 'text' } } },
            { properties: { type: { const: 'json_object' } } },
            {
              properties: { type: { const: 'json_schema' }, name: toolName, schema: { type: 'object' } },
              required: ['name', 'schema'],
            },
          ],
        },
      },
    },
    reasoning: {
      type: ['object', 'null'],
      properties: {
        effort: { enum: ['none', 'minimal', 'low', 'medium', 'high', 'xhigh', 'max', null] },
        summary: { enum: ['auto', 'concise', 'detailed', null] },
      },
    },
    max_output_tokens: { type: ['integer', 'null'], minimum: 1 },
    temperature: { type: ['number', 'null'], minimum: 0, maximum: 2 },
    top_p: { type: ['number', 'null'], minimum: 0, maximum: 1 },
    parallel_tool_calls: { type: ['boolean', 'null'] },
    metadata: { type: ['object', 'null'], additionalProperties: { type: 'string' } },
    stream: { type: ['boolean', 'null'] },
    previous_response_id: { type: ['string', 'null'] },
    store: { type: ['boolean', 'null'] },
  },
} as const;

const validateRequest = compileValidator(requestSchema);
const validateItem: Record<string, RequestValidator> = Object.fromEntries(
  Object.entries(itemSchemas).map(([type, schema]) => [type, compileValidator(schema)]),
);

/** The item's type; a bare `{role, content}` is a message. */
export const itemType = (item: { type?: unknown }) => (typeof item.type === 'string' ? item.type : 'message');

/**
 * A Responses request as the codec reads it (fields the schema does not name are in the bytes only):
 * derived from the schema, with what it checks item by item or with if/then (input items, tools,
 * tool choices, the JSON schema format), from which json-schema-to-ts derives nothing useful, as
 * wire.ts writes them by hand. `user` and `top_logprobs` are not checked: they are read as sent.
 */
export type ResponsesRequest = Omit<RequestOf<typeof requestSchema>, 'input' | 'tools' | 'tool_choice' | 'text'> & {
  input: string | InputItem[];
  tools?: ResponsesTool[];
  tool_choice?: ResponsesToolChoice;
  text?: { format?: TextFormat };
  user?: unknown;
  top_logprobs?: unknown;
};

/** A response echoes the request's `reasoning`: wire.ts's ReasoningEffort must cover every effort this schema allows. */
type Covered<Effort extends ReasoningEffort | null | undefined> = Effort;
export type EchoedEffort = Covered<NonNullable<ResponsesRequest['reasoning']>['effort']>;

export function validateResponsesRequest(body: Record<string, unknown>): GatewayError | undefined {
  const invalid = validateRequest(body);
  if (invalid) return invalid;
  if (!Array.isArray(body.input)) return undefined;
  for (let i = 0; i < body.input.length; i++) {
    const item = body.input[i];
    const check = validateItem[itemType(item)];
    const problem = check?.(item);
    if (problem) {
      const field = problem.param ? `input[${i}].${problem.param}` : `input[${i}]`;
      return new GatewayError('invalid_request', problem.message.replace(/'[^']*'/, `'${field}'`), field);
    }
  }
  return undefined;
}
