/**
 * An OTLP/HTTP trace receiver for tests: `POST /v1/traces` in protobuf or JSON, decoded into
 * plain spans. The protobuf side is protobufjs with the messages of OTLP's trace service, written
 * here from the specification's definitions (opentelemetry-proto, `collector/trace/v1` and
 * `trace/v1`) with only the fields the tests read; a field left out is skipped by the decoder.
 */
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import protobuf from 'protobufjs';

const schema = protobuf.Root.fromJSON({
  nested: {
    otlp: {
      nested: {
        ExportTraceServiceRequest: { fields: { resourceSpans: { rule: 'repeated', type: 'ResourceSpans', id: 1 } } },
        ResourceSpans: { fields: { resource: { type: 'Resource', id: 1 }, scopeSpans: { rule: 'repeated', type: 'ScopeSpans', id: 2 } } },
        Resource: { fields: { attributes: { rule: 'repeated', type: 'KeyValue', id: 1 } } },
        ScopeSpans: { fields: { spans: { rule: 'repeated', type: 'Span', id: 2 } } },
        Span: {
          fields: {
            traceId: { type: 'bytes', id: 1 },
            spanId: { type: 'bytes', id: 2 },
            parentSpanId: { type: 'bytes', id: 4 },
            name: { type: 'string', id: 5 },
            kind: { type: 'int32', id: 6 },
            startTimeUnixNano: { type: 'fixed64', id: 7 },
            endTimeUnixNano: { type: 'fixed64', id: 8 },
            attributes: { rule: 'repeated', type: 'KeyValue', id: 9 },
            status: { type: 'Status', id: 15 },
          },
        },
        Status: { fields: { message: { type: 'string', id: 2 }, code: { type: 'int32', id: 3 } } },
        KeyValue: { fields: { key: { type: 'string', id: 1 }, value: { type: 'AnyValue', id: 2 } } },
        AnyValue: {
          oneofs: { value: { oneof: ['stringValue', 'boolValue', 'intValue', 'doubleValue', 'arrayValue'] } },
          fields: {
            stringValue: { type: 'string', id: 1 },
            boolValue: { type: 'bool', id: 2 },
            intValue: { type: 'int64', id: 3 },
            doubleValue: { type: 'double', id: 4 },
            arrayValue: { type: 'ArrayValue', id: 5 },
          },
        },
        ArrayValue: { fields: { values: { rule: 'repeated', type: 'AnyValue', id: 1 } } },
      },
    },
  },
});
const ExportRequest = schema.lookupType('otlp.ExportTraceServiceRequest');

/** OTLP's span kinds. */
export const SPAN_KIND = { SERVER: 2, CLIENT: 3 } as const;
/** OTLP's status codes. */
export const STATUS = { UNSET: 0, OK: 1, ERROR: 2 } as const;

export interface ReceivedSpan {
  traceId: string;
  spanId: string;
  /** '' for a root span. */
  parentSpanId: string;
  name: string;
  kind: number;
  startMs: number;
  endMs: number;
  attributes: Record<string, AttributeValue>;
  status: { code: number; message: string };
  service: string;
  /** How it arrived. */
  encoding: 'protobuf' | 'json';
}

/** An attribute's value; an array attribute (`gen_ai.response.finish_reasons`) is a list of them. */
export type AttributeValue = string | number | boolean | AttributeValue[];

interface WireValue {
  stringValue?: string;
  boolValue?: boolean;
  intValue?: number | string;
  doubleValue?: number;
  arrayValue?: { values?: WireValue[] };
}
interface WireSpan {
  traceId?: string;
  spanId?: string;
  parentSpanId?: string;
  name?: string;
  kind?: number;
  startTimeUnixNano?: number | string;
  endTimeUnixNano?: number | string;
  attributes?: { key: string; value?: WireValue }[];
  status?: { code?: number; message?: string };
}
interface WireRequest {
  resourceSpans?: { resource?: { attributes?: { key: string; value?: WireValue }[] }; scopeSpans?: { spans?: WireSpan[] }[] }[];
}

const valueOf = (v: WireValue | undefined): AttributeValue =>
  v?.stringValue ?? v?.boolValue ?? (v?.intValue !== undefined ? Number(v.intValue) : undefined) ?? v?.doubleValue ?? v?.arrayValue?.values?.map(valueOf) ?? '';

function spansOf(request: WireRequest, encoding: ReceivedSpan['encoding']): ReceivedSpan[] {
  return (request.resourceSpans ?? []).flatMap((rs) => {
    const service = String(valueOf(rs.resource?.attributes?.find((a) => a.key === 'service.name')?.value));
    return (rs.scopeSpans ?? []).flatMap((ss) =>
      (ss.spans ?? []).map((s) => ({
        traceId: s.traceId ?? '',
        spanId: s.spanId ?? '',
        parentSpanId: s.parentSpanId ?? '',
        name: s.name ?? '',
        kind: s.kind ?? 0,
        startMs: Number(BigInt(s.startTimeUnixNano ?? 0) / 1_000_000n),
        endMs: Number(BigInt(s.endTimeUnixNano ?? 0) / 1_000_000n),
        attributes: Object.fromEntries((s.attributes ?? []).map((a) => [a.key, valueOf(a.value)])),
        status: { code: s.status?.code ?? 0, message: s.status?.message ?? '' },
        service,
        encoding,
      })),
    );
  });
}

export interface OtlpReceiver {
  url: string;
  spans: ReceivedSpan[];
  /** Each request's content type, in order. */
  contentTypes: string[];
  close(): void;
}

export async function startOtlpReceiver(): Promise<OtlpReceiver> {
  const spans: ReceivedSpan[] = [];
  const contentTypes: string[] = [];
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c)).on('end', () => {
      const body = Buffer.concat(chunks);
      const type = req.headers['content-type'] ?? '';
      contentTypes.push(type);
      if (req.method !== 'POST' || req.url !== '/v1/traces') {
        res.writeHead(404).end();
        return;
      }
      if (type.startsWith('application/x-protobuf')) {
        // protobufjs gives bytes as base64; ids are read as lowercase hex, as OTLP/JSON writes them.
        const decoded = ExportRequest.toObject(ExportRequest.decode(body), { bytes: String, longs: String }) as WireRequest;
        for (const rs of decoded.resourceSpans ?? []) {
          for (const ss of rs.scopeSpans ?? []) {
            for (const span of ss.spans ?? []) for (const id of ['traceId', 'spanId', 'parentSpanId'] as const) span[id] = Buffer.from(span[id] ?? '', 'base64').toString('hex');
          }
        }
        spans.push(...spansOf(decoded, 'protobuf'));
        res.writeHead(200, { 'content-type': 'application/x-protobuf' }).end();
      } else if (type.startsWith('application/json')) {
        // OTLP/JSON writes trace and span ids as hex strings.
        spans.push(...spansOf(JSON.parse(body.toString()) as WireRequest, 'json'));
        res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
      } else {
        res.writeHead(415).end();
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, spans, contentTypes, close: () => server.close() };
}
