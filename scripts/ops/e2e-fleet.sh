#!/usr/bin/env bash
# End-to-end check of the fleet claim (docs/FLEET.md, "The claim, tested"): two tokentap
# pods, each in front of its own simulator, one Prometheus scraping both; the shipped
# dashboard's per-model p99 ITL and request rate equal what one histogram of both pods'
# traffic gives.
#
#   cargo build --release && scripts/ops/e2e-fleet.sh
#   TOKENTAP_BIN=/path/to/tokentap scripts/ops/e2e-fleet.sh
#
# What it does:
#   1. starts two `tokentap sim`s serving the same two models with different timing
#      (pod a: ITL 15 ms, pod b: ITL 40 ms, both +-30% jitter), so that the merged p99 is
#      far from either pod's and from their mean, and a tokentap in front of each;
#   2. starts Debian's /usr/bin/prometheus with the `tokentap` job of
#      deploy/prometheus/scrape-config.yaml (relabel rules unchanged; static targets
#      carrying the labels pod discovery would set, one per pod) and rules.yaml, scraping
#      every second;
#   3. scripts/ops/e2e_fleet.py sends the traffic to both pods, scrapes both itself
#      before and after it (the merged histogram), and compares the dashboard's "Per
#      model" p99 ITL and request-rate queries, evaluated in Prometheus over the window
#      of that traffic, with the merged histogram's p99 and count.
# Every process is started here and ended by PID on exit (trap). Bounded in time.
# Last line: `e2e-fleet: N passed, M failed`; exit 1 on any failure, 2 if it could not
# run (missing binary or tool).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OPS=$ROOT/scripts/ops
# shellcheck source=scripts/ops/lib.sh
. "$OPS/lib.sh"
BIN=${TOKENTAP_BIN:-$ROOT/target/release/tokentap}
if [ -n "${1:-}" ]; then
  sed -n '2,24p' "$0"; exit 2
fi
PROMETHEUS=${PROMETHEUS:-prometheus}
MODELS=fleet-small,fleet-large

ops_init e2e-fleet
[ -x "$BIN" ] || die "no tokentap binary at $BIN: run \`cargo build --release\` or set TOKENTAP_BIN"
for t in "$PROMETHEUS" promtool curl python3; do
  command -v "$t" >/dev/null || die "$t not found (apt-get install -y prometheus curl)"
done
python3 -c 'import yaml' 2>/dev/null || die "python3 needs PyYAML (pip install pyyaml)"

read -r P_SIM_A P_SIM_B P_A P_A_ADMIN P_B P_B_ADMIN P_PROM < <(free_ports 7)
H=127.0.0.1
# The live view of every tokentap started here on a free port, not its default 9465.
export TOKENTAP_UI_LISTEN=$H:0
echo "binary: $BIN, temp: $TMP"

start sim-a "$BIN" sim --listen "$H:$P_SIM_A" --models "$MODELS" --ttft 30ms --itl 15ms --jitter 0.3 --tokens 20
start sim-b "$BIN" sim --listen "$H:$P_SIM_B" --models "$MODELS" --ttft 30ms --itl 40ms --jitter 0.3 --tokens 20
start pod-a "$BIN" --upstream "http://$H:$P_SIM_A" --listen "$H:$P_A" --admin "$H:$P_A_ADMIN"
start pod-b "$BIN" --upstream "http://$H:$P_SIM_B" --listen "$H:$P_B" --admin "$H:$P_B_ADMIN"
ok_start=1
wait_http sim-a "http://$H:$P_SIM_A/health" 200 20 || ok_start=0
wait_http sim-b "http://$H:$P_SIM_B/health" 200 20 || ok_start=0
wait_http pod-a "http://$H:$P_A_ADMIN/readyz" 200 20 || ok_start=0
wait_http pod-b "http://$H:$P_B_ADMIN/readyz" 200 20 || ok_start=0
if [ "$ok_start" = 1 ]; then pass "two simulators and two tokentap pods started"
else fail "start-up (see logs above)"; summary; exit 1; fi

meta() {  # meta POD
  echo "__meta_kubernetes_namespace=e2e,__meta_kubernetes_pod_name=$1,__meta_kubernetes_pod_container_name=tokentap,__meta_kubernetes_pod_container_port_name=metrics,__meta_kubernetes_pod_phase=Running,__meta_kubernetes_pod_node_name=loopback"
}
python3 "$OPS/prom_config.py" derive "$ROOT/deploy/prometheus/scrape-config.yaml" "$TMP/prometheus.yaml" \
  --rules "$ROOT/deploy/prometheus/rules.yaml" --interval 1s \
  --target "$H:$P_A_ADMIN,$(meta engine-a)" --target "$H:$P_B_ADMIN,$(meta engine-b)"
start prometheus "$PROMETHEUS" --config.file="$TMP/prometheus.yaml" --storage.tsdb.path="$TMP/tsdb" \
  --web.listen-address="$H:$P_PROM" --storage.tsdb.retention.time=1h --log.level=warn
PROM=http://$H:$P_PROM
if wait_http prometheus "$PROM/-/ready" 200 30; then pass "Prometheus ready on $PROM"
else fail "Prometheus did not start"; summary; exit 1; fi
up=0
for _ in $(seq 300); do
  up=$(curl -s "$PROM/api/v1/targets?state=active" | python3 -c 'import json,sys; print(sum(1 for t in json.load(sys.stdin)["data"]["activeTargets"] if t["health"]=="up"))' 2>/dev/null || echo 0)
  [ "$up" = 2 ] && break
  sleep 0.1
done
if [ "$up" = 2 ]; then pass "one Prometheus scrapes both pods"
else fail "Prometheus has $up healthy targets, expected 2"; summary; exit 1; fi

if python3 "$OPS/e2e_fleet.py" --prom "$PROM" --models "$MODELS" \
     --proxies "http://$H:$P_A,http://$H:$P_B" --admins "http://$H:$P_A_ADMIN,http://$H:$P_B_ADMIN" \
     --dashboard "$ROOT/grafana/dashboards/tokentap.json" >"$TMP/check.log" 2>&1; then
  :
fi
while IFS= read -r line; do
  case "$line" in
    PASS\ *) pass "${line#PASS }" ;;
    FAIL\ *) fail "${line#FAIL }" ;;
    *) echo "$line" ;;
  esac
done <"$TMP/check.log"
grep -q '^PASS \|^FAIL ' "$TMP/check.log" || fail "e2e_fleet.py ran no check"
summary
[ "$FAILED" = 0 ]
