/**
 * The chat completions request as ajv checks it: the fields Sluice relies on are typed; anything
 * else is passed through to the upstream untouched. `ChatRequest` is derived from it.
 */
import type { RequestOf } from '../schema-types.js';

const textPart = {
  type: 'object',
  required: ['type', 'text'],
  properties: { type: { const: 'text' }, text: { type: 'string' } },
} as const;

const userPart = {
  type: 'object',
  required: ['type'],
  discriminator: { propertyName: 'type' },
  oneOf: [
    textPart,
    {
      properties: {
        type: { const: 'image_url' },
        image_url: {
          type: 'object',
          required: ['url'],
          properties: { url: { type: 'string', minLength: 1 }, detail: { enum: ['auto', 'low', 'high'] } },
        },
      },
      required: ['image_url'],
    },
    {
      properties: {
        type: { const: 'input_audio' },
        input_audio: { type: 'object', required: ['data', 'format'], properties: { data: { type: 'string' }, format: { type: 'string' } } },
      },
      required: ['input_audio'],
    },
    {
      properties: {
        type: { const: 'file' },
        file: { type: 'object', properties: { file_id: { type: 'string' }, file_data: { type: 'string' }, filename: { type: 'string' } } },
      },
      required: ['file'],
    },
  ],
} as const;

const assistantPart = {
  type: 'object',
  required: ['type'],
  discriminator: { propertyName: 'type' },
  oneOf: [textPart, { properties: { type: { const: 'refusal' }, refusal: { type: 'string' } }, required: ['refusal'] }],
} as const;

const textContent = { anyOf: [{ type: 'string' }, { type: 'array', items: textPart }] } as const;

const toolCall = {
  type: 'object',
  required: ['id', 'type'],
  properties: { id: { type: 'string' } },
  discriminator: { propertyName: 'type' },
  oneOf: [
    {
      properties: {
        type: { const: 'function' },
        function: {
          type: 'object',
          required: ['name', 'arguments'],
          properties: { name: { type: 'string' }, arguments: { type: 'string' } },
        },
      },
      required: ['function'],
    },
    {
      properties: {
        type: { const: 'custom' },
        custom: { type: 'object', required: ['name', 'input'], properties: { name: { type: 'string' }, input: { type: 'string' } } },
      },
      required: ['custom'],
    },
  ],
} as const;

const message = {
  type: 'object',
  required: ['role'],
  discriminator: { propertyName: 'role' },
  oneOf: [
    { properties: { role: { const: 'system' }, content: textContent }, required: ['content'] },
    { properties: { role: { const: 'developer' }, content: textContent }, required: ['content'] },
    {
      properties: {
        role: { const: 'user' },
        content: { anyOf: [{ type: 'string' }, { type: 'array', items: userPart }] },
      },
      required: ['content'],
    },
    {
      properties: {
        role: { const: 'assistant' },
        content: { anyOf: [{ type: 'string' }, { type: 'null' }, { type: 'array', items: assistantPart }] },
        tool_calls: { type: 'array', items: toolCall },
      },
    },
    {
      properties: { role: { const: 'tool' }, tool_call_id: { type: 'string' }, content: textContent },
      required: ['tool_call_id', 'content'],
    },
    { properties: { role: { const: 'function' }, name: { type: 'string' } }, required: ['name'] },
  ],
} as const;

const toolName = { type: 'string', pattern: '^[A-Za-z0-9_-]{1,64}$' } as const;

const tool = {
  type: 'object',
  required: ['type'],
  discriminator: { propertyName: 'type' },
  oneOf: [
    {
      properties: {
        type: { const: 'function' },
        function: {
          type: 'object',
          required: ['name'],
          properties: {
            name: toolName,
            description: { type: 'string' },
            parameters: { type: 'object' },
            strict: { type: ['boolean', 'null'] },
          },
        },
      },
      required: ['function'],
    },
    {
      properties: {
        type: { const: 'custom' },
        custom: { type: 'object', required: ['name'], properties: { name: toolName } },
      },
      required: ['custom'],
    },
  ],
} as const;

const nullable = <const S extends object>(schema: S) => ({ anyOf: [schema, { type: 'null' }] }) as const;

const named = { type: 'object', required: ['name'], properties: { name: { type: 'string' } } } as const;

/** A reference to one tool by name, as tool_choice and allowed_tools give it. */
const namedTool = {
  type: 'object',
  required: ['type'],
  discriminator: { propertyName: 'type' },
  oneOf: [
    { properties: { type: { const: 'function' }, function: named }, required: ['function'] },
    { properties: { type: { const: 'custom' }, custom: named }, required: ['custom'] },
  ],
} as const;

export const chatRequestSchema = {
  type: 'object',
  required: ['model', 'messages'],
  properties: {
    model: { type: 'string', minLength: 1 },
    messages: { type: 'array', minItems: 1, items: message },
    stream: { type: ['boolean', 'null'] },
    stream_options: nullable({ type: 'object', properties: { include_usage: { type: 'boolean' } } }),
    tools: { type: 'array', items: tool },
    tool_choice: {
      anyOf: [
        { enum: ['none', 'auto', 'required'] },
        {
          type: 'object',
          required: ['type'],
          discriminator: { propertyName: 'type' },
          oneOf: [
            ...namedTool.oneOf,
            {
              properties: {
                type: { const: 'allowed_tools' },
                allowed_tools: {
                  type: 'object',
                  required: ['mode', 'tools'],
                  properties: {
                    mode: { enum: ['auto', 'required'] },
                    tools: { type: 'array', items: namedTool },
                  },
                },
              },
              required: ['allowed_tools'],
            },
          ],
        },
      ],
    },
    reasoning_effort: { type: ['string', 'null'] },
    parallel_tool_calls: { type: 'boolean' },
    response_format: {
      type: 'object',
      required: ['type'],
      discriminator: { propertyName: 'type' },
      oneOf: [
        { properties: { type: { const: 'text' } } },
        { properties: { type: { const: 'json_object' } } },
        {
          properties: {
            type: { const: 'json_schema' },
            json_schema: {
              type: 'object',
              required: ['name'],
              // description: not checked, passed on as sent (an empty schema types it `unknown`).
              properties: { name: toolName, description: {}, schema: { type: 'object' }, strict: { type: ['boolean', 'null'] } },
            },
          },
          required: ['json_schema'],
        },
      ],
    },
    temperature: nullable({ type: 'number', minimum: 0, maximum: 2 }),
    top_p: nullable({ type: 'number', minimum: 0, maximum: 1 }),
    presence_penalty: nullable({ type: 'number', minimum: -2, maximum: 2 }),
    frequency_penalty: nullable({ type: 'number', minimum: -2, maximum: 2 }),
    max_tokens: nullable({ type: 'integer', minimum: 1 }),
    max_completion_tokens: nullable({ type: 'integer', minimum: 1 }),
    n: nullable({ type: 'integer', minimum: 1, maximum: 128 }),
    stop: nullable({ anyOf: [{ type: 'string' }, { type: 'array', maxItems: 4, items: { type: 'string' } }] }),
    seed: nullable({ type: 'integer' }),
    user: { type: 'string' },
    metadata: nullable({ type: 'object', additionalProperties: { type: 'string' } }),
    // Not checked, only looked at (empty schemas type them `unknown`): a translated request refuses them.
    logprobs: {},
    web_search_options: {},
  },
} as const;

/** A chat completions request as the codec reads it (fields the schema does not name are in the bytes only). */
export type ChatRequest = RequestOf<typeof chatRequestSchema>;
export type ChatMessage = ChatRequest['messages'][number];
export type ChatTool = NonNullable<ChatRequest['tools']>[number];
/** A content part of any role. */
export type ChatPart = Exclude<Extract<ChatMessage, { role: 'user' | 'assistant' }>['content'], string | null | undefined>[number];
