/**
 * The generateContent request as ajv checks it; unknown fields pass through to Gemini upstreams.
 * `GeminiRequest` is derived from it.
 */
import { compileValidator } from '../../../src/plugin-api.js';
import type { RequestOf } from '../schema-types.js';

const part = {
  type: 'object',
  properties: {
    text: { type: 'string' },
    thought: { type: 'boolean' },
    thoughtSignature: { type: 'string' },
    inlineData: {
      type: 'object',
      required: ['mimeType', 'data'],
      properties: { mimeType: { type: 'string', minLength: 1 }, data: { type: 'string' } },
    },
    fileData: {
      type: 'object',
      required: ['fileUri'],
      properties: { mimeType: { type: 'string' }, fileUri: { type: 'string', minLength: 1 } },
    },
    functionCall: {
      type: 'object',
      required: ['name'],
      properties: { name: { type: 'string', minLength: 1 }, args: { type: 'object' }, id: { type: 'string' } },
    },
    functionResponse: {
      type: 'object',
      required: ['name', 'response'],
      properties: { name: { type: 'string', minLength: 1 }, response: { type: 'object' }, id: { type: 'string' } },
    },
  },
} as const;

const content = {
  type: 'object',
  required: ['parts'],
  properties: { role: { enum: ['user', 'model'] }, parts: { type: 'array', items: part } },
} as const;

const functionDeclaration = {
  type: 'object',
  required: ['name'],
  properties: {
    name: { type: 'string', pattern: '^[A-Za-z_][A-Za-z0-9_.:-]{0,127}$' },
    description: { type: 'string' },
    parameters: { type: 'object' },
    parametersJsonSchema: { type: 'object' },
  },
} as const;

export const generateContentSchema = {
  type: 'object',
  required: ['contents'],
  properties: {
    contents: { type: 'array', minItems: 1, items: content },
    systemInstruction: { type: 'object', properties: { parts: { type: 'array', items: part } } },
    tools: {
      type: 'array',
      items: { type: 'object', properties: { functionDeclarations: { type: 'array', items: functionDeclaration } } },
    },
    toolConfig: {
      type: 'object',
      properties: {
        functionCallingConfig: {
          type: 'object',
          properties: {
            mode: { enum: ['AUTO', 'ANY', 'NONE', 'VALIDATED', 'MODE_UNSPECIFIED'] },
            allowedFunctionNames: { type: 'array', items: { type: 'string' } },
          },
        },
      },
    },
    // Not checked, only looked at: a translated request refuses it.
    cachedContent: {},
    safetySettings: {
      type: 'array',
      items: { type: 'object', required: ['category', 'threshold'], properties: { category: { type: 'string' }, threshold: { type: 'string' } } },
    },
    generationConfig: {
      type: 'object',
      properties: {
        temperature: { type: 'number', minimum: 0, maximum: 2 },
        topP: { type: 'number', minimum: 0, maximum: 1 },
        topK: { type: 'number', minimum: 1 },
        maxOutputTokens: { type: 'integer', minimum: 1 },
        stopSequences: { type: 'array', maxItems: 5, items: { type: 'string' } },
        candidateCount: { type: 'integer', minimum: 1 },
        responseMimeType: { type: 'string' },
        // Not checked, only looked at (an empty schema types it `unknown`): a translated request refuses it.
        responseLogprobs: {},
        responseSchema: { type: 'object' },
        responseJsonSchema: { type: 'object' },
        seed: { type: 'integer' },
        presencePenalty: { type: 'number' },
        frequencyPenalty: { type: 'number' },
        thinkingConfig: {
          type: 'object',
          properties: {
            includeThoughts: { type: 'boolean' },
            thinkingBudget: { type: 'integer', minimum: -1 },
            thinkingLevel: { enum: ['MINIMAL', 'LOW', 'MEDIUM', 'HIGH', 'THINKING_LEVEL_UNSPECIFIED'] },
          },
        },
      },
    },
  },
} as const;

export const validateGenerateContent = compileValidator(generateContentSchema);

/** A generateContent request as the codec reads it (fields the schema does not name are in the bytes only). */
export type GeminiRequest = RequestOf<typeof generateContentSchema>;
export type GeminiRequestPart = GeminiRequest['contents'][number]['parts'][number];
export type GeminiGenerationConfig = NonNullable<GeminiRequest['generationConfig']>;
