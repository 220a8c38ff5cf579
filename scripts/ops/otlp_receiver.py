#!/usr/bin/env python3
"""A minimal OTLP metrics and traces receiver on the OpenTelemetry project's own Python
packages (`opentelemetry-proto` for the messages and the gRPC service stubs, `grpcio`),
for the end-to-end test of tokentap's OTLP push (scripts/ops/e2e-otlp.sh).

It accepts OTLP/gRPC (`MetricsService/Export`, `TraceService/Export`) on one port and
OTLP/HTTP protobuf (`POST /v1/metrics`, `POST /v1/traces`, gzip or not) on another. It
keeps the latest metrics export of each protocol, and answers
`GET /latest?protocol=grpc|http` on the HTTP port with that export decoded to JSON:
resource attributes, scope, and every metric's points (kind, attributes, count, sum,
buckets, exemplars' trace ids), plus how many exports arrived. It keeps every span, and
answers `GET /spans?protocol=grpc|http` with them (ids in hex, name, kind, flags,
status, attributes with their values) and how many trace exports arrived.

    otlp_receiver.py GRPC_PORT HTTP_PORT
"""
import gzip
import http.server
import json
import sys
import threading
import urllib.parse
from concurrent import futures

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

LOCK = threading.Lock()
LATEST = {}
RECEIVED = {"grpc": 0, "http": 0}
SPANS = {"grpc": [], "http": []}
TRACE_EXPORTS = {"grpc": 0, "http": 0}


def attrs(kvs):
    return {kv.key: kv.value.string_value for kv in kvs}


def summary(request):
    out = {"metrics": {}}
    for rm in request.resource_metrics:
        out["resource"] = attrs(rm.resource.attributes)
        for sm in rm.scope_metrics:
            out["scope"] = sm.scope.name
            for m in sm.metrics:
                kind = m.WhichOneof("data")
                points = []
                if kind == "exponential_histogram":
                    out_temporality = m.exponential_histogram.aggregation_temporality
                    for p in m.exponential_histogram.data_points:
                        points.append({
                            "attributes": attrs(p.attributes), "count": p.count, "sum": p.sum,
                            "scale": p.scale, "zero_count": p.zero_count,
                            "zero_threshold": p.zero_threshold,
                            "offset": p.positive.offset,
                            "bucket_counts": list(p.positive.bucket_counts),
                            "start": p.start_time_unix_nano, "time": p.time_unix_nano,
                            "exemplars": [e.trace_id.hex() for e in p.exemplars],
                        })
                elif kind == "histogram":
                    out_temporality = m.histogram.aggregation_temporality
                    for p in m.histogram.data_points:
                        points.append({
                            "attributes": attrs(p.attributes), "count": p.count, "sum": p.sum,
                            "bounds": list(p.explicit_bounds),
                            "bucket_counts": list(p.bucket_counts),
                            "exemplars": [e.trace_id.hex() for e in p.exemplars],
                        })
                elif kind == "sum":
                    out_temporality = m.sum.aggregation_temporality
                    for p in m.sum.data_points:
                        points.append({"attributes": attrs(p.attributes), "value": p.as_double,
                                       "monotonic": m.sum.is_monotonic})
                else:
                    out_temporality = 0
                    for p in m.gauge.data_points:
                        points.append({"attributes": attrs(p.attributes), "value": p.as_double})
                out["metrics"][m.name] = {"kind": kind, "unit": m.unit,
                                          "temporality": out_temporality, "points": points}
    return out


def value(any_value):
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


def keep_spans(protocol, request):
    spans = []
    for rs in request.resource_spans:
        resource = attrs(rs.resource.attributes)
        for ss in rs.scope_spans:
            for span in ss.spans:
                spans.append({
                    "trace_id": span.trace_id.hex(), "span_id": span.span_id.hex(),
                    "parent_span_id": span.parent_span_id.hex(), "name": span.name,
                    "kind": span.kind, "flags": span.flags, "status": span.status.code,
                    "start": span.start_time_unix_nano, "end": span.end_time_unix_nano,
                    "scope": ss.scope.name, "service": resource.get("service.name"),
                    "attributes": {kv.key: value(kv.value) for kv in span.attributes},
                })
    with LOCK:
        SPANS[protocol].extend(spans)
        TRACE_EXPORTS[protocol] += 1


def keep(protocol, request):
    with LOCK:
        LATEST[protocol] = summary(request)
        RECEIVED[protocol] += 1


class MetricsService(metrics_service_pb2_grpc.MetricsServiceServicer):
    def Export(self, request, context):
        keep("grpc", request)
        return metrics_service_pb2.ExportMetricsServiceResponse()


class TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def Export(self, request, context):
        keep_spans("grpc", request)
        return trace_service_pb2.ExportTraceServiceResponse()


class Http(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        if self.path not in ("/v1/metrics", "/v1/traces") \
                or self.headers.get("content-type") != "application/x-protobuf":
            self.answer(404, b"")
            return
        if self.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        if self.path == "/v1/traces":
            request = trace_service_pb2.ExportTraceServiceRequest()
            request.ParseFromString(body)
            keep_spans("http", request)
            answer = trace_service_pb2.ExportTraceServiceResponse()
        else:
            request = metrics_service_pb2.ExportMetricsServiceRequest()
            request.ParseFromString(body)
            keep("http", request)
            answer = metrics_service_pb2.ExportMetricsServiceResponse()
        self.answer(200, answer.SerializeToString(), "application/x-protobuf")

    def do_GET(self):
        url = urllib.parse.urlparse(self.path)
        protocol = urllib.parse.parse_qs(url.query).get("protocol", ["grpc"])[0]
        with LOCK:
            if url.path == "/spans":
                latest = {"spans": list(SPANS[protocol]), "received": TRACE_EXPORTS[protocol]}
            else:
                latest = dict(LATEST.get(protocol, {}), received=RECEIVED[protocol])
        self.answer(200, json.dumps(latest).encode(), "application/json")

    def answer(self, status, body, content_type="text/plain"):
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def main():
    grpc_port, http_port = int(sys.argv[1]), int(sys.argv[2])
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(MetricsService(), server)
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(TraceService(), server)
    server.add_insecure_port(f"127.0.0.1:{grpc_port}")
    server.start()
    http.server.ThreadingHTTPServer(("127.0.0.1", http_port), Http).serve_forever()


if __name__ == "__main__":
    main()
