#!/usr/bin/env bash
# The whole test suite, as CI runs it (`.ci/run` calls exactly this).
# Installs what the checks need when it is missing (idempotent), then runs:
# formatting, the source files' sizes, clippy, the API docs without warnings, every Rust
# test (the integration suite on both HTTP/1.1 paths, and the inject, wire, metrics and sim crates), the instruction budget,
# the fuzz targets, the checks of the shipped deploy files, `tokentap inject` end to end,
# and an
# end-to-end run of tokentap under a real Prometheus of each kind (classic and native)
# with the dashboard's queries, the exemplars through both, the shipped alerts through a
# real Alertmanager to a webhook, two pods under one Prometheus against one merged
# histogram, the live view in headless Chromium, and `top` in a
# terminal against the demo and against a hostile server.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step says when it started (seconds into the run): where CI's 35 minutes go.
step() { printf '\n==> [%d s] %s\n' "$SECONDS" "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "sizes: no source file over 1,000 lines before its tests (functions: clippy's too_many_lines, below)"
bash scripts/sizes.sh

step "cargo clippy --workspace --all-targets --features inject -- -D warnings"
# Every target of every crate, with `tokentap inject` (crates/inject, the `inject`
# feature) as the image is built. The library's code is the same with the feature or
# without (it never names the inject crate: tests/it/layering.rs), so without it only the
# binary differs: its lints are checked apart, and the rest is not checked twice.
cargo clippy --workspace --all-targets --features inject -- -D warnings
cargo clippy --bin tokentap -- -D warnings

step "cargo doc --no-deps, warnings as errors: public docs link only to what their reader can see"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace

step "python gRPC clients for the engine-service tests (grpcio, grpcio-tools, tritonclient[grpc]) and the OTLP receiver (opentelemetry-proto)"
python3 -c 'import grpc, grpc_tools, tritonclient.grpc' 2>/dev/null \
    || python3 -m pip install -q grpcio grpcio-tools 'tritonclient[grpc]'
python3 -c 'import opentelemetry.proto.collector.metrics.v1.metrics_service_pb2_grpc' 2>/dev/null \
    || python3 -m pip install -q opentelemetry-proto

step "cargo test (unit, fixtures, property tests, integration)"
# Four test threads on CI's two cores: the integration tests mostly wait on sockets and
# timers (about 50 s of CPU in 125 s with two threads); with four the suite passed under
# a load of 4-7 from other builds. Sixteen broke tests that hold timings.
export RUST_TEST_THREADS=4
cargo test --all-targets 2>&1 | tee /tmp/tokentap-cargo-test.log
# Doc tests run separately (all-targets skips them).
cargo test --doc 2>&1 | tee -a /tmp/tokentap-cargo-test.log
# The integration suite once more with `proxy.http1_fast_path` off (about a minute and a
# half): the run above went through the fast path (the default), this one through hyper's
# HTTP/1.1 server and client, which serve everything the fast path hands over.
TOKENTAP_IT_FAST_PATH=0 cargo test --test it 2>&1 | tee -a /tmp/tokentap-cargo-test.log
# `tokentap inject`'s own crate: fixtures against their expected outputs, the webhook's
# patch against the CLI, hostile reviews and manifests on a proptest budget.
cargo test -p tokentap-inject 2>&1 | tee -a /tmp/tokentap-cargo-test.log
# The decoders', the metric store's and the simulator's own crates (crates/wire,
# crates/metrics, crates/sim): their unit tests (each decoder's rules, the families, the
# expositions against the prometheus crate's, the outcome's verdict rules, the
# simulator's dialects and timing, tokentap-bench's flags).
cargo test -p tokentap-wire -p tokentap-metrics -p tokentap-sim --all-targets 2>&1 | tee -a /tmp/tokentap-cargo-test.log
cargo test -p tokentap-wire -p tokentap-metrics -p tokentap-sim --doc 2>&1 | tee -a /tmp/tokentap-cargo-test.log

passed=$(grep -Eo 'test result: ok\. [0-9]+ passed' /tmp/tokentap-cargo-test.log | awk '{s+=$4} END {print s+0}')
failed=$(grep -Eo '[0-9]+ failed' /tmp/tokentap-cargo-test.log | awk '{s+=$1} END {print s+0}')
echo
echo "cargo: ${passed} passed, ${failed} failed"

step "soak, short version: sustained streams, nothing lost, nothing growing (scripts/soak.sh --minutes 30 is the full run)"
bash scripts/soak.sh --minutes 0.5 --debug

step "benchmark smoke: the load harness against tokentap and a direct connection (scripts/bench.sh is the full run)"
bash scripts/bench.sh --smoke --debug

step "instruction budget: tokentap's own work per event and per request under callgrind, held to benches/budget.toml (docs/PERFORMANCE.md, how a change's cost is judged)"
bash scripts/budget.sh

step "coverage-guided fuzzing of every decoder and the request scanner, 10 s per target, one target per core"
bash scripts/fuzz.sh --seconds 10

step "tokentap built with --features inject (as the image is): the binary every step below runs"
cargo build --features inject

step "deploy/ and grafana/ checks (kustomize, kubernetes-validate, hadolint, promtool, dashboard types)"
# check-config in ops-check uses this binary.
export TOKENTAP_BIN="$PWD/target/debug/tokentap"
bash scripts/ops-check.sh

step "end to end: tokentap inject: an injected pod's sidecar args and env, run as processes, in front of the simulator on the engine port; the webhook over TLS gives the CLI's pod"
bash scripts/ops/e2e-inject.sh

step "end to end: a real Prometheus scrapes tokentap; every dashboard query and rule must return data"
bash scripts/ops/e2e-prometheus.sh

step "end to end: exemplars through a real Prometheus of each kind, the OpenMetrics text through a third-party parser"
bash scripts/ops/e2e-exemplars.sh

step "end to end: OTLP push over gRPC and HTTP to an opentelemetry-proto receiver, equal to /metrics; the receiver stopped mid-run"
bash scripts/ops/e2e-otlp.sh

step "end to end: metrics.names (the GenAI semantic conventions' families) through promtool and a real Prometheus of each kind"
bash scripts/ops/e2e-gen-ai.sh

step "end to end: the shipped alerts, time-scaled, reach a webhook through a real Alertmanager, and resolve"
bash scripts/ops/e2e-alerts.sh

step "end to end: two tokentap pods, one Prometheus: the dashboard's per-model p99 ITL and request rate equal one merged histogram of both pods' traffic (docs/FLEET.md)"
bash scripts/ops/e2e-fleet.sh

step "end to end: the live view (/ui, on its own loopback listener) in headless Chromium: every model's figures equal /metrics over the window, an ITL regression shows in its heatmap, models named constructor, __proto__, toString and hasOwnProperty keep the page ticking; screenshot in target/e2e-ui/"
bash scripts/ops/e2e-ui.sh

step "end to end: buffered responses: the simulator's streams at 1-20 ms per token are not flagged, every one behind nginx with gzip on for event streams is"
STREAMS=20 bash scripts/ops/e2e-buffered.sh

step "end to end: tokentap top in a tmux pane against the demo: draws every model, refreshes, q exits 0, exits with a message when the server goes away"
bash scripts/ops/e2e-top.sh

step "end to end: tokentap top against a hostile admin server in a tmux pane: no escape sequence reaches the terminal, the title is kept, a huge or endless frame is refused in bounded memory and CPU"
bash scripts/ops/e2e-top-hostile.sh

step "end to end: the SGLang Model Gateway (smg, PyPI) -> tokentap -> the simulator's gRPC engines"
bash scripts/ops/smg_check.sh --tokentap "$TOKENTAP_BIN"
