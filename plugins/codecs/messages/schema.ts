/**
 * The Messages request as ajv checks it. The fields and block types Sluice reads are typed; other
 * fields and block types (new betas, server-tool history) pass, so a Messages upstream gets them
 * as sent. Blocks are checked by their `type` with if/then, which lets unknown types through.
 */
import { compileValidator } from '../../../src/plugin-api.js';
import type { RequestOf } from '../schema-types.js';
import type { MessagesMessage, MessagesOutputConfig, MessagesThinking, MessagesTool, MessagesToolChoice } from './wire.js';

/** The block of `type` must match `schema`; blocks of other types are not checked by it. */
const when = <const T extends string, const S extends object>(type: T, schema: S) => ({ if: { properties: { type: { const: type } }, required: ['type'] }, then: schema }) as const;

const cacheControl = { type: 'object', required: ['type'], properties: { type: { type: 'string' }, ttl: { type: 'string' } } } as const;

const text = { required: ['text'], properties: { text: { type: 'string' }, cache_control: cacheControl } } as const;

const imageSource = {
  type: 'object',
  required: ['type'],
  allOf: [
    when('base64', { required: ['media_type', 'data'], properties: { media_type: { type: 'string', minLength: 1 }, data: { type: 'string' } } }),
    when('url', { required: ['url'], properties: { url: { type: 'string', minLength: 1 } } }),
    when('file', { required: ['file_id'], properties: { file_id: { type: 'string', minLength: 1 } } }),
  ],
} as const;

const image = { required: ['source'], properties: { source: imageSource } } as const;

const documentSource = {
  type: 'object',
  required: ['type'],
  allOf: [
    when('base64', { required: ['media_type', 'data'], properties: { media_type: { type: 'string' }, data: { type: 'string' } } }),
    when('text', { required: ['data'], properties: { data: { type: 'string' } } }),
    when('url', { required: ['url'], properties: { url: { type: 'string', minLength: 1 } } }),
    when('content', { required: ['content'], properties: { content: { anyOf: [{ type: 'string' }, { type: 'array' }] } } }),
  ],
} as const;

/** Tool ids as Anthropic checks them. */
const toolId = { type: 'string', pattern: '^[A-Za-z0-9_-]+$' } as const;

/** A block of a tool result's content. */
const resultBlock = { type: 'object', required: ['type'], properties: { type: { type: 'string' } }, allOf: [when('text', text), when('image', image)] } as const;

const block = {
  type: 'object',
  required: ['type'],
  properties: { type: { type: 'string' } },
  allOf: [
    when('text', text),
    when('image', image),
    when('document', { required: ['source'], properties: { source: documentSource } }),
    when('tool_use', { required: ['id', 'name', 'input'], properties: { id: toolId, name: { type: 'string', minLength: 1 }, input: { type: 'object' } } }),
    when('tool_result', {
      required: ['tool_use_id'],
      properties: {
        tool_use_id: toolId,
        content: { anyOf: [{ type: 'string' }, { type: 'array', items: resultBlock }] },
        is_error: { type: 'boolean' },
      },
    }),
    when('thinking', { required: ['thinking', 'signature'], properties: { thinking: { type: 'string' }, signature: { type: 'string' } } }),
    when('redacted_thinking', { required: ['data'], properties: { data: { type: 'string' } } }),
  ],
} as const;

const message = {
  type: 'object',
  required: ['role', 'content'],
  properties: {
    role: { enum: ['user', 'assistant', 'system'] },
    content: { anyOf: [{ type: 'string' }, { type: 'array', items: block }] },
  },
} as const;

const tool = {
  type: 'object',
  properties: { type: { type: 'string' }, name: { type: 'string' } },
  // A custom tool (`type` absent or `custom`); any other type is a server tool, checked by the model rules.
  if: { properties: { type: { const: 'custom' } } },
  then: {
    required: ['name', 'input_schema'],
    properties: {
      name: { type: 'string', pattern: '^[A-Za-z0-9_-]{1,128}$' },
      description: { type: 'string' },
      input_schema: { type: 'object' },
      cache_control: cacheControl,
    },
  },
  else: { required: ['type', 'name'] },
} as const;

const toolChoice = {
  type: 'object',
  required: ['type'],
  properties: { type: { enum: ['auto', 'any', 'tool', 'none'] }, disable_parallel_tool_use: { type: 'boolean' } },
  allOf: [when('tool', { required: ['name'], properties: { name: { type: 'string', minLength: 1 } } })],
} as const;

const thinking = {
  type: 'object',
  required: ['type'],
  properties: { type: { enum: ['enabled', 'adaptive', 'disabled'] }, display: { type: 'string' } },
  allOf: [when('enabled', { required: ['budget_tokens'], properties: { budget_tokens: { type: 'integer', minimum: 1024 } } })],
} as const;

const outputConfig = {
  type: 'object',
  properties: {
    effort: { type: 'string' },
    format: {
      type: 'object',
      required: ['type'],
      properties: { type: { const: 'json_schema' } },
      allOf: [when('json_schema', { required: ['schema'], properties: { schema: { type: 'object' } } })],
    },
  },
} as const;

const system = { anyOf: [{ type: 'string' }, { type: 'array', items: { type: 'object', required: ['type', 'text'], properties: { type: { const: 'text' }, ...text.properties } } }] } as const;

/** What `POST /v1/messages/count_tokens` takes: a prompt, no generation settings. */
const countProperties = {
  model: { type: 'string', minLength: 1 },
  messages: { type: 'array', minItems: 1, items: message },
  system,
  tools: { type: 'array', items: tool },
  tool_choice: toolChoice,
  thinking,
  output_config: outputConfig,
} as const;

export const countTokensSchema = { type: 'object', required: ['model', 'messages'], properties: countProperties } as const;

export const messagesRequestSchema = {
  type: 'object',
  required: ['model', 'max_tokens', 'messages'],
  properties: {
    ...countProperties,
    // 0 pre-warms the prompt cache without generating (Messages upstreams only).
    max_tokens: { type: 'integer', minimum: 0 },
    stream: { type: 'boolean' },
    stop_sequences: { type: 'array', items: { type: 'string' } },
    temperature: { type: 'number', minimum: 0, maximum: 1 },
    top_p: { type: 'number', minimum: 0, maximum: 1 },
    top_k: { type: 'integer', minimum: 0 },
    metadata: { type: 'object', properties: { user_id: { type: ['string', 'null'] } } },
    cache_control: cacheControl,
    service_tier: { type: 'string' },
    context_management: { type: 'object' },
  },
} as const;

export const validateMessagesRequest = compileValidator(messagesRequestSchema);
export const validateCountTokens = compileValidator(countTokensSchema);

/**
 * A Messages request as the codec reads it (fields the schema does not name are in the bytes only):
 * derived from the schema, with the parts it checks by `type` with if/then (blocks, tools, choices),
 * from which json-schema-to-ts derives nothing useful, as wire.ts writes them by hand.
 */
export type MessagesRequest = Omit<RequestOf<typeof messagesRequestSchema>, 'messages' | 'tools' | 'tool_choice' | 'thinking' | 'output_config'> & {
  messages: MessagesMessage[];
  tools?: MessagesTool[];
  tool_choice?: MessagesToolChoice;
  thinking?: MessagesThinking;
  output_config?: MessagesOutputConfig;
};
