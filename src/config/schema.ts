/**
 * The config file's JSON schema, and its ajv validator. The validator is compiled when this module
 * loads, so the build step (src/precompile-schemas.ts) imports this module to collect it.
 */
import { schemaCompiler } from '../schema-compiler.js';
import { defaultRequestCaps } from '../request-caps.js';
import { limitsSchema } from '../limits/limiter.js';

/** One entry of `plugins` or `extraPlugins`: a name under plugins/, or a name with a module and options. */
const pluginEntrySchema = {
  anyOf: [
    { type: 'string', minLength: 1 },
    {
      type: 'object',
      required: ['name'],
      additionalProperties: false,
      properties: { name: { type: 'string', minLength: 1 }, options: { type: 'object' }, module: { type: 'string', minLength: 1 } },
    },
  ],
} as const;

export const configSchema = {
  type: 'object',
  additionalProperties: false,
  properties: {
    server: {
      type: 'object',
      additionalProperties: false,
      properties: {
        host: { type: 'string', minLength: 1 },
        port: { type: 'integer', minimum: 0, maximum: 65535 },
        workers: { type: 'integer', minimum: 1, maximum: 256 },
        maxBodyBytes: { type: 'integer', minimum: 1024 },
        shutdownTimeoutMs: { type: 'integer', minimum: 0 },
        trustedProxies: { type: 'array', items: { type: 'string', minLength: 1 } },
        maxConnections: { type: 'integer', minimum: 1 },
        maxInFlightBodyBytes: { type: 'integer', minimum: 1024 },
        maxUpstreamBodyBytes: { type: 'integer', minimum: 1024 },
        maxEventBytes: { type: 'integer', minimum: 1024 },
        writeStallMs: { type: 'integer', minimum: 100 },
        overheadHeader: { type: 'boolean' },
        websocket: {
          type: 'object',
          additionalProperties: false,
          properties: {
            enabled: { type: 'boolean' },
            maxSockets: { type: 'integer', minimum: 0 },
            idleTimeoutSeconds: { type: 'integer', minimum: 8, maximum: 960 },
            maxLifetimeMinutes: { type: 'number', exclusiveMinimum: 0, maximum: 10080 },
          },
        },
        requestCaps: {
          type: 'object',
          additionalProperties: false,
          properties: Object.fromEntries(Object.keys(defaultRequestCaps).map((name) => [name, { type: 'integer', minimum: 1 }])),
        },
      },
    },
    dataDir: { type: 'string', minLength: 1 },
    adminToken: { type: 'string', minLength: 16 },
    allowAnonymous: { type: 'boolean' },
    tracing: {
      type: 'object',
      additionalProperties: false,
      required: ['endpoint'],
      properties: {
        endpoint: { type: 'string', pattern: '^https?://' },
        protocol: { enum: ['http/protobuf', 'http/json'] },
        headers: { type: 'object', additionalProperties: { type: 'string' } },
        serviceName: { type: 'string', minLength: 1 },
      },
    },
    responseCache: {
      type: 'object',
      additionalProperties: false,
      properties: {
        store: { enum: ['memory', 'redis'] },
        maxBytes: { type: 'integer', minimum: 1024 },
        maxEntryBytes: { type: 'integer', minimum: 256 },
        ttlSeconds: { type: 'integer', minimum: 1 },
        groups: { type: 'array', items: { type: 'string', minLength: 1 }, uniqueItems: true },
      },
    },
    affinity: {
      type: 'object',
      additionalProperties: false,
      properties: {
        enabled: { type: 'boolean' },
        header: { type: 'string', pattern: '^[A-Za-z0-9!#$%&\'*+.^_`|~-]+$' },
        pinTtlSeconds: { type: 'integer', minimum: 1 },
        maxPins: { type: 'integer', minimum: 1 },
      },
    },
    admin: {
      type: 'object',
      additionalProperties: false,
      properties: {
        allowedOrigins: { type: 'array', items: { type: 'string', pattern: '^https?://[^/?#\\s]+$' }, uniqueItems: true },
      },
    },
    log: {
      type: 'object',
      additionalProperties: false,
      properties: { level: { enum: ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] } },
    },
    usage: { type: 'object', additionalProperties: false, properties: { journalFsync: { type: 'boolean' } } },
    // The discriminator picks the one branch `kind` names, so an error says what that kind lacks.
    store: {
      type: 'object',
      required: ['kind'],
      properties: { kind: { type: 'string' } },
      discriminator: { propertyName: 'kind' },
      oneOf: [
        { type: 'object', additionalProperties: false, required: ['kind'], properties: { kind: { const: 'sqlite' } } },
        {
          type: 'object',
          additionalProperties: false,
          required: ['kind', 'url'],
          properties: { kind: { const: 'postgres' }, url: { type: 'string', pattern: '^postgres(ql)?://' }, poolSize: { type: 'integer', minimum: 1, maximum: 1000 } },
        },
      ],
    },
    limiter: {
      type: 'object',
      required: ['kind'],
      properties: { kind: { type: 'string' } },
      discriminator: { propertyName: 'kind' },
      oneOf: [
        { type: 'object', additionalProperties: false, required: ['kind'], properties: { kind: { const: 'memory' } } },
        {
          type: 'object',
          additionalProperties: false,
          // No default fail mode: serving without limits and refusing everything are both costly, so the operator chooses.
          required: ['kind', 'url', 'failMode'],
          properties: {
            kind: { const: 'redis' },
            url: { type: 'string', pattern: '^rediss?://' },
            failMode: { enum: ['open', 'closed'] },
            leaseMs: { type: 'integer', minimum: 100 },
            timeoutMs: { type: 'integer', minimum: 1 },
            prefix: { type: 'string', minLength: 1, pattern: '^[A-Za-z0-9:._-]+$' },
          },
        },
      ],
    },
    mcp: {
      type: 'object',
      additionalProperties: false,
      required: ['servers'],
      properties: {
        servers: {
          type: 'object',
          // The name prefixes its tools (`server_tool`) and names it in grants (`server/tool`).
          propertyNames: { pattern: '^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$' },
          additionalProperties: {
            type: 'object',
            required: ['transport'],
            properties: { transport: { type: 'string' } },
            discriminator: { propertyName: 'transport' },
            oneOf: [
              {
                type: 'object',
                additionalProperties: false,
                required: ['transport', 'command'],
                properties: {
                  transport: { const: 'stdio' },
                  command: { type: 'string', minLength: 1 },
                  args: { type: 'array', items: { type: 'string' } },
                  env: { type: 'object', additionalProperties: { type: 'string' } },
                  cwd: { type: 'string', minLength: 1 },
                  timeoutSeconds: { type: 'number', exclusiveMinimum: 0 },
                },
              },
              {
                type: 'object',
                additionalProperties: false,
                required: ['transport', 'url'],
                properties: {
                  transport: { const: 'http' },
                  url: { type: 'string', pattern: '^https?://' },
                  headers: { type: 'object', additionalProperties: { type: 'string' } },
                  timeoutSeconds: { type: 'number', exclusiveMinimum: 0 },
                },
              },
            ],
          },
        },
        maxArgumentBytes: { type: 'integer', minimum: 2 },
        maxResultBytes: { type: 'integer', minimum: 2 },
        sessionIdleSeconds: { type: 'number', exclusiveMinimum: 0 },
      },
    },
    plugins: { type: 'array', items: pluginEntrySchema },
    extraPlugins: { type: 'array', items: pluginEntrySchema },
    upstreams: {
      type: 'object',
      minProperties: 1,
      additionalProperties: {
        type: 'object',
        required: ['kind'],
        properties: {
          kind: { type: 'string', minLength: 1 },
          timeouts: {
            type: 'object',
            additionalProperties: false,
            properties: Object.fromEntries(['connectMs', 'firstByteMs', 'idleMs', 'totalMs'].map((k) => [k, { type: 'integer', minimum: 1 }])),
          },
          retry: {
            type: 'object',
            additionalProperties: false,
            properties: {
              attempts: { type: 'integer', minimum: 1, maximum: 10 },
              backoffMs: { type: 'integer', minimum: 0 },
              maxRetryAfterSeconds: { type: 'number', minimum: 0 },
              maxCoolDownSeconds: { type: 'number', minimum: 0 },
            },
          },
          breaker: {
            type: 'object',
            additionalProperties: false,
            properties: {
              failures: { type: 'integer', minimum: 1 },
              errorRate: { type: 'number', exclusiveMinimum: 0, maximum: 1 },
              windowSeconds: { type: 'integer', minimum: 1, maximum: 3600 },
              minRequests: { type: 'integer', minimum: 1 },
              coolDownSeconds: { type: 'number', exclusiveMinimum: 0 },
            },
          },
        },
      },
    },
    models: {
      type: 'array',
      minItems: 1,
      items: {
        type: 'object',
        required: ['id'],
        additionalProperties: false,
        properties: {
          id: { type: 'string', minLength: 1, pattern: '^[A-Za-z0-9._:/-]+$' },
          upstream: { type: 'string', minLength: 1 },
          upstreamModel: { type: 'string', minLength: 1 },
          strategy: { enum: ['weighted', 'least-latency', 'least-busy'] },
          responseCache: {
            oneOf: [{ type: 'boolean' }, { type: 'object', additionalProperties: false, properties: { ttlSeconds: { type: 'integer', minimum: 1 } } }],
          },
          channels: {
            type: 'array',
            minItems: 1,
            items: {
              type: 'object',
              required: ['upstream'],
              additionalProperties: false,
              properties: {
                upstream: { type: 'string', minLength: 1 },
                upstreamModel: { type: 'string', minLength: 1 },
                priority: { type: 'integer', minimum: 0 },
                weight: { type: 'number', exclusiveMinimum: 0 },
              },
            },
          },
          prices: {
            type: 'object',
            required: ['input', 'output'],
            additionalProperties: false,
            properties: Object.fromEntries(['input', 'cachedInput', 'cacheWrite', 'output', 'reasoning'].map((k) => [k, { type: 'number', minimum: 0 }])),
          },
          limits: limitsSchema,
          maxOutputTokens: {
            type: 'object',
            additionalProperties: false,
            properties: { default: { type: 'integer', minimum: 1 }, max: { type: 'integer', minimum: 1 }, overMax: { enum: ['reject', 'clamp'] } },
          },
          features: {
            type: 'object',
            additionalProperties: false,
            properties: {
              tools: { type: 'boolean' },
              jsonSchema: { type: 'boolean' },
              vision: { type: 'boolean' },
              temperature: { type: 'boolean' },
              reasoning: { type: 'boolean' },
              streamUsage: { type: 'boolean' },
              serverTools: { type: 'array', items: { type: 'string', minLength: 1 }, uniqueItems: true },
              unsupportedTools: { enum: ['drop', 'reject'] },
              unsupportedParameters: {
                type: 'object',
                additionalProperties: false,
                properties: {
                  policy: { enum: ['drop', 'reject'] },
                  drop: { type: 'array', items: { type: 'string', minLength: 1 }, uniqueItems: true },
                  reject: { type: 'array', items: { type: 'string', minLength: 1 }, uniqueItems: true },
                },
              },
            },
          },
          families: { type: 'array', minItems: 1, items: { type: 'string', minLength: 1 }, uniqueItems: true },
          ignoreParameters: { type: 'array', items: { type: 'string', minLength: 1 }, uniqueItems: true },
          contextTokens: { type: 'integer', minimum: 1 },
          created: { type: 'integer', minimum: 0 },
          ownedBy: { type: 'string' },
        },
      },
    },
  },
};

export const validateConfig = schemaCompiler('config', { allErrors: true, strict: true, discriminator: true }).compile(configSchema);
