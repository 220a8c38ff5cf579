#!/usr/bin/env bash
# OTLP metrics push and per-request spans end to end, against a receiver built on the OpenTelemetry project's own
# Python packages (scripts/ops/otlp_receiver.py: opentelemetry-proto + grpcio from PyPI).
#
#   TOKENTAP_BIN=target/debug/tokentap scripts/ops/e2e-otlp.sh
#
# What it does:
#   1. starts `tokentap sim`, the receiver (OTLP/gRPC and OTLP/HTTP), and two tokentaps in
#      front of the simulator configured only by the OpenTelemetry environment variables:
#      one pushing over gRPC, one over HTTP (both gzip), every 500 ms, both with spans on
#      (OTEL_TRACES_EXPORTER=otlp);
#   2. sends streamed chat completions through both, with `traceparent`s, then stops;
#      checks the spans received: one per request, exactly the trace ids sent, each
#      span's parent the span id its `traceparent` named, the GenAI attributes, and the
#      exemplars on each tokentap's /metrics (OpenMetrics) naming received span ids;
#   3. once an export taken after the last request has arrived, scrapes each tokentap's
#      `/metrics` and compares it with what the receiver got: every histogram's count and
#      sum, and its p50/p90/p99 from the exponential buckets against the classic buckets'
#      (within the width of the classic bucket the value falls in); counters equal; the
#      resource (service.name, service.version, the pod's name from K8S_POD_NAME), scope,
#      cumulative temporality and the exemplars' trace ids among those sent; both
#      tokentaps judge every request against two objectives (their only config file:
#      `interactive`, met by every request, and `strict`, missed by every one), so the
#      objective counters are among those compared, and the targets' gauge is checked;
#   4. stops the receiver while traffic runs through the gRPC tokentap: every response is
#      complete, byte for byte what the simulator sends directly, tokentap counts every
#      request completed, and `tokentap_otlp_exports_total{result="failed"}` (or the
#      dropped counter) says exports were lost.
# Every process is started here and ended by PID on exit. Last line:
# `e2e-otlp: N passed, M failed`; exit 1 on a failure, 2 if it could not run.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=scripts/ops/lib.sh
. "$ROOT/scripts/ops/lib.sh"
BIN=${TOKENTAP_BIN:-$ROOT/target/release/tokentap}
MODEL=llama-3.1-8b

ops_init e2e-otlp
[ -x "$BIN" ] || die "no tokentap binary at $BIN: run \`cargo build --release\` or set TOKENTAP_BIN"
python3 -c 'import grpc, opentelemetry.proto.collector.metrics.v1.metrics_service_pb2_grpc, opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc' 2>/dev/null \
  || python3 -m pip install -q grpcio opentelemetry-proto \
  || die "cannot install grpcio and opentelemetry-proto"


read -r P_SIM P_GRPC P_HTTP P_PROXY_G P_ADMIN_G P_PROXY_H P_ADMIN_H < <(free_ports 7)
H=127.0.0.1
# The live view of every tokentap started here on a free port, not its default 9465.
export TOKENTAP_UI_LISTEN=$H:0

start sim "$BIN" sim --listen "$H:$P_SIM" --models "$MODEL" --ttft 40ms --itl 4ms --jitter 0.5 --tokens 20
wait_http - "http://$H:$P_SIM/health" 200 30 || die "simulator not ready"
start receiver python3 "$ROOT/scripts/ops/otlp_receiver.py" "$P_GRPC" "$P_HTTP"
RECEIVER_PID=${PIDS[-1]}
wait_http - "http://$H:$P_HTTP/latest" 200 30 || die "receiver not ready"
# The objective families exist only with `objectives` configured.
cat >"$TMP/objectives.yaml" <<'EOF'
objectives:
  interactive:
    ttft: 2s
  strict:
    ttft: 1ms
    target: 0.5
EOF
export OTEL_METRIC_EXPORT_INTERVAL=500 OTEL_EXPORTER_OTLP_TIMEOUT=300 OTEL_METRIC_EXPORT_TIMEOUT=1000 \
  K8S_POD_NAME=tokentap-e2e-0 OTEL_RESOURCE_ATTRIBUTES=deployment.environment.name=e2e \
  OTEL_TRACES_EXPORTER=otlp OTEL_BSP_SCHEDULE_DELAY=200
OTEL_EXPORTER_OTLP_ENDPOINT="http://$H:$P_GRPC" OTEL_EXPORTER_OTLP_PROTOCOL=grpc OTEL_EXPORTER_OTLP_COMPRESSION=gzip \
  start tokentap-grpc "$BIN" --config "$TMP/objectives.yaml" --upstream "http://$H:$P_SIM" --listen "$H:$P_PROXY_G" \
  --admin "$H:$P_ADMIN_G"
OTEL_EXPORTER_OTLP_METRICS_ENDPOINT="http://$H:$P_HTTP/v1/metrics" \
  OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="http://$H:$P_HTTP/v1/traces" OTEL_EXPORTER_OTLP_COMPRESSION=gzip \
  start tokentap-http "$BIN" --config "$TMP/objectives.yaml" --upstream "http://$H:$P_SIM" --listen "$H:$P_PROXY_H" \
  --admin "$H:$P_ADMIN_H"
for port in "$P_ADMIN_G" "$P_ADMIN_H"; do
  wait_http - "http://$H:$port/readyz" 200 30 || die "tokentap not ready"
done

python3 "$ROOT/scripts/ops/e2e_otlp.py" "$H" "$P_SIM" "$P_HTTP" "$RECEIVER_PID" \
  "grpc:$P_PROXY_G:$P_ADMIN_G" "http:$P_PROXY_H:$P_ADMIN_H" "$MODEL"
status=$?
[ $status -eq 0 ] || tail -n 20 "$TMP"/tokentap-*.log
exit $status
