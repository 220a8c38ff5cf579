#!/usr/bin/env bash
# End-to-end check of `metrics.names`: the GenAI semantic conventions' families on
# /metrics, read by promtool and by a real Prometheus of each kind.
#
#   cargo build --release && scripts/ops/e2e-gen-ai.sh
#   TOKENTAP_BIN=/path/to/tokentap scripts/ops/e2e-gen-ai.sh
#
# What it does:
#   1. starts `tokentap sim` and two tokentap proxies in front of it, one with
#      `metrics.names: both`, one with `metrics.names: gen_ai`;
#   2. sends the same bounded traffic through each (scripts/ops/e2e_gen_ai.py traffic):
#      streamed and non-streamed chats, completions, Ollama chats, streams the engine
#      fails part-way;
#   3. `promtool check metrics` on both expositions;
#   4. starts Debian's /usr/bin/prometheus twice, `classic` (scrapes text, classic
#      buckets) and `native` (--enable-feature=native-histograms: scrapes protobuf,
#      native histograms), both scraping both proxies every second;
#   5. once each Prometheus has scraped the final state, scripts/ops/e2e_gen_ai.py check:
#      every GenAI family present in both expositions and in both Prometheus, its
#      counts there equal to the scrape's, the replaced tokentap_ families absent under
#      `gen_ai`, and each family's counts as its definition says against tokentap's own.
# Last line: `e2e-gen-ai: N passed, M failed`; exit 1 on any failure, 2 if it could not run.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OPS=$ROOT/scripts/ops
# shellcheck source=scripts/ops/lib.sh
. "$OPS/lib.sh"
BIN=${TOKENTAP_BIN:-$ROOT/target/release/tokentap}
PROMETHEUS=${PROMETHEUS:-prometheus}
ops_init e2e-gen-ai

[ -x "$BIN" ] || die "no tokentap binary at $BIN: run \`cargo build --release\` or set TOKENTAP_BIN"
for t in "$PROMETHEUS" promtool curl python3; do
  command -v "$t" >/dev/null || die "$t not found (apt-get install -y prometheus curl)"
done

read -r P_SIM P_BOTH P_BOTH_A P_GENAI P_GENAI_A P_CLASSIC P_NATIVE < <(free_ports 7)
H=127.0.0.1
# The live view of every tokentap started here on a free port, not its default 9465.
export TOKENTAP_UI_LISTEN=$H:0
echo "binary: $BIN, temp: $TMP"

start sim "$BIN" sim --listen "$H:$P_SIM" --models llama-3-8b --ttft 100ms --itl 10ms --tokens 12
for names in both gen_ai; do
  if [ "$names" = both ]; then listen=$P_BOTH admin=$P_BOTH_A; else listen=$P_GENAI admin=$P_GENAI_A; fi
  cat >"$TMP/$names.yaml" <<EOF
listen: $H:$listen
admin: $H:$admin
upstream: http://$H:$P_SIM
metrics:
  names: $names
log:
  format: json
EOF
  start "tokentap-$names" "$BIN" --config "$TMP/$names.yaml"
done
ok=1
wait_http sim "http://$H:$P_SIM/health" 200 20 || ok=0
wait_http tokentap-both "http://$H:$P_BOTH_A/readyz" 200 20 || ok=0
wait_http tokentap-gen_ai "http://$H:$P_GENAI_A/readyz" 200 20 || ok=0
if [ "$ok" = 1 ]; then pass "simulator and two tokentap instances (names: both, gen_ai) ready"
else fail "start-up"; summary; exit 1; fi

cat >"$TMP/prometheus.yaml" <<EOF
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: tokentap
    static_configs:
      - targets: ["$H:$P_BOTH_A"]
        labels: {names: both}
      - targets: ["$H:$P_GENAI_A"]
        labels: {names: gen_ai}
EOF
start prometheus-classic "$PROMETHEUS" --config.file="$TMP/prometheus.yaml" --storage.tsdb.path="$TMP/tsdb-classic" \
  --web.listen-address="$H:$P_CLASSIC" --log.level=warn
start prometheus-native "$PROMETHEUS" --config.file="$TMP/prometheus.yaml" --storage.tsdb.path="$TMP/tsdb-native" \
  --web.listen-address="$H:$P_NATIVE" --log.level=warn --enable-feature=native-histograms
for kind in classic native; do
  port=P_${kind^^}
  if wait_http "prometheus-$kind" "http://$H:${!port}/-/ready" 200 30; then pass "[$kind] Prometheus ready"
  else fail "[$kind] Prometheus did not start"; summary; exit 1; fi
done

if python3 "$OPS/e2e_gen_ai.py" traffic "http://$H:$P_BOTH" "http://$H:$P_GENAI" >"$TMP/traffic.log" 2>&1; then
  pass "traffic: $(tail -n 1 "$TMP/traffic.log")"
else fail "traffic"; cat "$TMP/traffic.log"; summary; exit 1; fi

for names in both gen_ai; do
  if [ "$names" = both ]; then admin=$P_BOTH_A; else admin=$P_GENAI_A; fi
  curl -s "http://$H:$admin/metrics" >"$TMP/metrics-$names.txt"
  if promtool check metrics <"$TMP/metrics-$names.txt" >"$TMP/promtool-$names.log" 2>&1; then
    pass "promtool check metrics (names: $names, $(grep -c '^gen_ai_' "$TMP/metrics-$names.txt") gen_ai_ samples)"
  else fail "promtool check metrics (names: $names)"; cat "$TMP/promtool-$names.log"; fi
done

python3 "$OPS/e2e_gen_ai.py" check \
  --both "http://$H:$P_BOTH_A" --gen-ai "http://$H:$P_GENAI_A" \
  --classic "http://$H:$P_CLASSIC" --native "http://$H:$P_NATIVE" >"$TMP/check.log" 2>&1
while read -r verdict rest; do
  case "$verdict" in PASS) pass "$rest" ;; FAIL) fail "$rest" ;; *) echo "$verdict $rest" ;; esac
done <"$TMP/check.log"
[ -s "$TMP/check.log" ] || fail "e2e_gen_ai.py check printed nothing"

summary
[ "$FAILED" = 0 ]
