/**
 * OTLP trace export: one server span per model exchange and one client span per upstream call
 * (a failover shows each attempt), with the OpenTelemetry GenAI attributes, sent by the
 * OpenTelemetry SDK over OTLP/HTTP, protobuf or JSON.
 *
 * Off unless the config's `tracing.endpoint` or the standard `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` /
 * `OTEL_EXPORTER_OTLP_ENDPOINT` variables name a receiver (and `OTEL_SDK_DISABLED` is not true).
 * Off, the plugin joins no phase and loads nothing of the SDK: it costs nothing per exchange.
 *
 * The spans are made when the exchange is done, from what it recorded (its trace context, its
 * timing, each upstream call): nothing is added to the exchange's own path but a span id per
 * upstream call. The server span keeps the exchange's own span id, the one the access log names;
 * each client span has the id its call's `traceparent` carried as parent (`callSpan`), sampled, so
 * an upstream's own spans join the tree under the attempt that made them.
 */
import { definePlugin, type Exchange, type TracingConfig } from '../../src/plugin-api.js';

/** The GenAI provider names of the upstream families (the `gen_ai.provider.name` registry). */
const PROVIDER: Record<string, string> = { chat: 'openai', responses: 'openai', messages: 'anthropic', gemini: 'gcp.gemini' };

type Protocol = TracingConfig['protocol'];

/** Where to send and how, from the config or else the environment; undefined: tracing is off. */
export function exportSettings(config: TracingConfig | undefined, env: NodeJS.ProcessEnv): TracingConfig | undefined {
  if (config) return config;
  if (env.OTEL_SDK_DISABLED?.trim().toLowerCase() === 'true') return undefined;
  const traces = env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT?.trim();
  const base = env.OTEL_EXPORTER_OTLP_ENDPOINT?.trim();
  if (!traces && !base) return undefined;
  // The specification's rule: the signal's own variable is used as it is; the base gets /v1/traces.
  const endpoint = traces || `${base!.replace(/\/+$/, '')}/v1/traces`;
  const protocol = (env.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL ?? env.OTEL_EXPORTER_OTLP_PROTOCOL ?? 'http/protobuf').trim();
  if (protocol !== 'http/protobuf' && protocol !== 'http/json') {
    throw new Error(`OTEL_EXPORTER_OTLP_PROTOCOL: Sluice exports traces over http/protobuf or http/json, not ${protocol}; set one of those (the collector's OTLP/HTTP port, usually 4318)`);
  }
  return { endpoint, protocol: protocol as Protocol, headers: otlpHeaders(env.OTEL_EXPORTER_OTLP_TRACES_HEADERS ?? env.OTEL_EXPORTER_OTLP_HEADERS), serviceName: env.OTEL_SERVICE_NAME?.trim() || 'sluice' };
}

/** `key1=value1,key2=value2`, values percent-encoded (the OTLP exporter specification's format). */
function otlpHeaders(text: string | undefined): Record<string, string> {
  const headers: Record<string, string> = {};
  const decoded = (part: string) => {
    try {
      return decodeURIComponent(part.trim());
    } catch {
      throw new Error(`OTEL_EXPORTER_OTLP_HEADERS: "${part.trim()}" is not percent-encoded correctly; write each header as name=value, separated by commas, with % only as %XX`);
    }
  };
  for (const pair of (text ?? '').split(',')) {
    const eq = pair.indexOf('=');
    if (eq > 0) headers[decoded(pair.slice(0, eq))] = decoded(pair.slice(eq + 1));
  }
  return headers;
}

type Sdk = typeof import('@opentelemetry/sdk-trace-base');

/**
 * The sampler `OTEL_TRACES_SAMPLER` (and `OTEL_TRACES_SAMPLER_ARG`) names, as the specification
 * defines them; parentbased_always_on by default. Built here rather than left to the SDK's
 * provider because the gateway decides before the span exists: an upstream call's `traceparent`
 * says sampled only when the spans will be exported (callSpan).
 */
export function samplerFromEnv(sdk: Sdk, env: NodeJS.ProcessEnv): import('@opentelemetry/sdk-trace-base').Sampler {
  // Empty is unset, as the specification says (a chart often sets the variable to nothing).
  const name = (env.OTEL_TRACES_SAMPLER?.trim() || 'parentbased_always_on').toLowerCase();
  // Read by the ratio samplers alone: another sampler's leftover argument is no error.
  const ratio = () => {
    const arg = env.OTEL_TRACES_SAMPLER_ARG?.trim();
    const value = arg ? Number(arg) : 1;
    if (!(value >= 0 && value <= 1)) throw new Error(`OTEL_TRACES_SAMPLER_ARG: a ratio from 0 to 1 is expected, not "${arg}"`);
    return value;
  };
  const samplers: Record<string, () => import('@opentelemetry/sdk-trace-base').Sampler> = {
    always_on: () => new sdk.AlwaysOnSampler(),
    always_off: () => new sdk.AlwaysOffSampler(),
    traceidratio: () => new sdk.TraceIdRatioBasedSampler(ratio()),
    parentbased_always_on: () => new sdk.ParentBasedSampler({ root: new sdk.AlwaysOnSampler() }),
    parentbased_always_off: () => new sdk.ParentBasedSampler({ root: new sdk.AlwaysOffSampler() }),
    parentbased_traceidratio: () => new sdk.ParentBasedSampler({ root: new sdk.TraceIdRatioBasedSampler(ratio()) }),
  };
  const make = samplers[name];
  if (!make) throw new Error(`OTEL_TRACES_SAMPLER: "${name}" is not a sampler Sluice knows; use one of ${Object.keys(samplers).join(', ')}`);
  return make();
}

export default definePlugin(async ({ config, log }) => {
  const settings = exportSettings(config.tracing, process.env);
  if (!settings) return { name: 'tracing' };

  const api = await import('@opentelemetry/api');
  const sdk = await import('@opentelemetry/sdk-trace-base');
  const { resourceFromAttributes } = await import('@opentelemetry/resources');
  const { OTLPTraceExporter } =
    settings.protocol === 'http/json' ? await import('@opentelemetry/exporter-trace-otlp-http') : await import('@opentelemetry/exporter-trace-otlp-proto');

  // The SDK makes the ids; the server span must have the exchange's own, and each client span the
  // one its call's traceparent named, so they are handed over just before that span starts
  // (startSpan asks for them synchronously).
  const random = new sdk.RandomIdGenerator();
  let presetTraceId: string | undefined;
  let presetSpanId: string | undefined;
  const ids = {
    generateTraceId: () => {
      const id = presetTraceId ?? random.generateTraceId();
      presetTraceId = undefined;
      return id;
    },
    generateSpanId: () => {
      const id = presetSpanId ?? random.generateSpanId();
      presetSpanId = undefined;
      return id;
    },
  };
  const exporter = new OTLPTraceExporter({ url: settings.endpoint, headers: settings.headers });
  const sampler = samplerFromEnv(sdk, process.env);
  const provider = new sdk.BasicTracerProvider({
    resource: resourceFromAttributes({ 'service.name': settings.serviceName }),
    idGenerator: ids,
    sampler,
    spanProcessors: [new sdk.BatchSpanProcessor(exporter)],
  });
  const tracer = provider.getTracer('sluice');
  log.info({ endpoint: settings.endpoint, protocol: settings.protocol }, 'exporting traces over OTLP');

  /** The client's span is the parent when it sent one; else this exchange is the trace's root. */
  const parentOf = (ex: Exchange) => {
    const { traceId, parentId, sampled } = ex.trace;
    return parentId
      ? api.trace.setSpanContext(api.ROOT_CONTEXT, { traceId, spanId: parentId, traceFlags: sampled ? api.TraceFlags.SAMPLED : api.TraceFlags.NONE, isRemote: true })
      : api.ROOT_CONTEXT;
  };

  /** The exchange's server span; `operation` and `provider` are its GenAI names, shared with the client spans. */
  const spanOf = (ex: Exchange, operation: string, provider: string | undefined, finishReasons: string[] | undefined) => {
    presetTraceId = ex.trace.traceId;
    presetSpanId = ex.trace.spanId;
    const server = tracer.startSpan(
      ex.modelId ? `${operation} ${ex.modelId}` : operation,
      {
        kind: api.SpanKind.SERVER,
        startTime: ex.createdAt,
        attributes: {
          'gen_ai.operation.name': operation,
          ...(provider && { 'gen_ai.provider.name': provider, 'gen_ai.system': provider }),
          'gen_ai.request.model': ex.modelId,
          ...(ex.model?.upstreamModel && { 'gen_ai.response.model': ex.model.upstreamModel }),
          ...(finishReasons && { 'gen_ai.response.finish_reasons': finishReasons }),
          ...usageAttributes(ex),
          ...(ex.cost !== undefined && { 'sluice.cost': ex.cost }),
          ...(ex.channel && { 'sluice.channel': ex.channel.name }),
          'sluice.attempts': ex.attempts,
          'sluice.family': ex.family,
          'sluice.stream': ex.stream,
          'sluice.outcome': ex.outcome,
          'http.request.method': ex.endpoint.method.toUpperCase(),
          'http.response.status_code': ex.reportedStatus,
          ...(ex.error && { 'error.type': ex.error.code }),
        },
      },
      parentOf(ex),
    );
    presetTraceId = undefined;
    return server;
  };

  /**
   * Whether the exchange's spans are exported: the sampler's decision, the same one the provider
   * makes when the spans start (each sampler decides from the parent and the trace id alone). By
   * default a client whose own trace is not recorded (its sampled flag is off) is not recorded
   * here either, and every other exchange is.
   */
  const recorded = (ex: Exchange) =>
    sampler.shouldSample(parentOf(ex), ex.trace.traceId, 'exchange', api.SpanKind.SERVER, {}, []).decision === sdk.SamplingDecision.RECORD_AND_SAMPLED;

  return {
    name: 'tracing',
    callSpan: (ex) => (recorded(ex) ? random.generateSpanId() : undefined),
    done(ex) {
      if (ex.endpoint.kind !== 'generate' && ex.endpoint.kind !== 'socket') return;
      if (!recorded(ex)) return;
      const operation = ex.family === 'gemini' ? 'generate_content' : 'chat';
      const family = ex.upstream?.family;
      const provider = family && (PROVIDER[family] ?? family);
      const finishReasons = ex.finishReasons && [...ex.finishReasons];
      const server = spanOf(ex, operation, provider, finishReasons);
      const context = api.trace.setSpan(api.ROOT_CONTEXT, server);
      const now = Date.now();
      ex.calls.forEach((call, i) => {
        // The answer's finish reasons are the call's that gave it: the last, when it did not fail.
        const answered = finishReasons && i === ex.calls.length - 1 && call.error === undefined;
        presetSpanId = call.spanId;
        const client = tracer.startSpan(
          `${operation} ${call.upstreamModel}`,
          {
            kind: api.SpanKind.CLIENT,
            startTime: call.startedAt,
            attributes: {
              'gen_ai.request.model': call.upstreamModel,
              ...(provider && { 'gen_ai.provider.name': provider }),
              'sluice.upstream': call.upstream,
              'sluice.attempt': i + 1,
              ...(answered && { 'gen_ai.response.finish_reasons': finishReasons }),
              ...(call.error !== undefined && { 'error.type': 'upstream_call_failed' }),
            },
          },
          context,
        );
        presetSpanId = undefined;
        if (call.error !== undefined) client.setStatus({ code: api.SpanStatusCode.ERROR, message: call.error });
        client.end(call.endedAt ?? now);
      });
      if (ex.outcome !== 'finished' || ex.error) server.setStatus({ code: api.SpanStatusCode.ERROR, message: ex.error?.message ?? ex.outcome });
      server.end(now);
    },
    async close() {
      await provider.shutdown();
    },
  };
});

/** Token usage under the GenAI names; cache reads and writes are included in the input tokens, as the conventions say. */
function usageAttributes(ex: Exchange): Record<string, number> {
  const usage = ex.usage;
  if (!usage) return {};
  return {
    'gen_ai.usage.input_tokens': usage.inputTokens,
    'gen_ai.usage.output_tokens': usage.outputTokens,
    ...(usage.cachedTokens !== undefined && { 'gen_ai.usage.cache_read.input_tokens': usage.cachedTokens }),
    ...(usage.cacheWriteTokens !== undefined && { 'gen_ai.usage.cache_creation.input_tokens': usage.cacheWriteTokens }),
    ...(usage.reasoningTokens !== undefined && { 'gen_ai.usage.reasoning.output_tokens': usage.reasoningTokens }),
  };
}
