/** ajv validators that explain the first problem by the field's path, e.g. `messages[2].content`. */
import type { ErrorObject } from 'ajv';
import { GatewayError } from './errors.js';
import { schemaCompiler } from './schema-compiler.js';

const requests = schemaCompiler('request', { allErrors: false, discriminator: true, strict: false });

export type RequestValidator = (value: unknown) => GatewayError | undefined;

export function compileValidator(schema: object): RequestValidator {
  const validate = requests.compile(schema);
  return (value) => (validate(value) ? undefined : describe(validate.errors ?? []));
}

/** `/messages/2/content` → `messages[2].content` */
export function fieldPath(pointer: string): string {
  return pointer
    .split('/')
    .slice(1)
    .map((s) => s.replace(/~1/g, '/').replace(/~0/g, '~'))
    .reduce((path, seg) => (/^\d+$/.test(seg) ? `${path}[${seg}]` : path ? `${path}.${seg}` : seg), '');
}

/**
 * Keywords that only say a value took another branch of a union (a string where an object was
 * also allowed): at the same depth, a missing field or bad tag says more.
 */
const branchMismatch = new Set(['type', 'enum', 'const', 'anyOf', 'oneOf', 'if']);

const rank = (e: ErrorObject) => e.instancePath.length * 2 + (branchMismatch.has(e.keyword) ? 0 : 1);

function describe(errors: ErrorObject[]): GatewayError {
  // The deepest error is the most specific one; union branches report shallower failures.
  const e = errors.reduce((best, cur) => (rank(cur) > rank(best) ? cur : best), errors[0]!);
  let field = fieldPath(e.instancePath);
  let problem: string;
  switch (e.keyword) {
    case 'required': {
      const missing = (e.params as { missingProperty: string }).missingProperty;
      field = field ? `${field}.${missing}` : missing;
      problem = 'is required';
      break;
    }
    case 'discriminator': {
      const { tag, tagValue } = e.params as { tag: string; tagValue: unknown };
      field = field ? `${field}.${tag}` : tag;
      problem = tagValue === undefined ? 'is required' : `has an unsupported value ${JSON.stringify(tagValue)}`;
      break;
    }
    case 'enum':
      problem = `must be one of ${(e.params as { allowedValues: unknown[] }).allowedValues.map((v) => JSON.stringify(v)).join(', ')}`;
      break;
    case 'const':
      problem = `must be ${JSON.stringify((e.params as { allowedValue: unknown }).allowedValue)}`;
      break;
    case 'anyOf':
    case 'oneOf':
      problem = 'has an unsupported type or shape';
      break;
    default:
      problem = e.message ?? 'is invalid';
  }
  return new GatewayError('invalid_request', `Invalid request: '${field || 'body'}' ${problem}.`, field || null);
}
