#!/usr/bin/env bash
# End-to-end alerting: the page arrives, and leaves. On loopback:
#
#   cargo build && TOKENTAP_BIN=target/debug/tokentap scripts/ops/e2e-alerts.sh
#
#   tokentap sim (models steady, regress, limited) <- tokentap <- scripts/ops/e2e_alerts.py
#                                  ^ scrape, 1 s
#   Prometheus (Debian's) evaluating the SHIPPED deploy/prometheus/rules.yaml, time-scaled
#     | alerts
#   Alertmanager (Debian's prometheus-alertmanager) -> webhook scripts/ops/e2e_webhook.py
#
# The rules are the shipped ones with every window, `for:` and group interval divided by
# 60 (scripts/ops/scale-rules.py writes the copy; deploy/README.md, "Testing the alerts
# end to end"): 5m -> 5 s, for 10m -> 10 s, 1h -> 1 min, 30d -> 12 h. Prometheus scrapes
# and evaluates every second. Alertmanager groups by alertname and model, waits 1 s
# before a group's first notification and 1 s between its updates, and sends resolved
# notifications (send_resolved: true); it runs alone (no cluster), so it sends at once.
# scripts/ops/e2e_alerts.py then runs a healthy baseline, raises the ITL of model
# `regress` to 150 ms a gap (x-sim-itl-ms) while half the requests to `limited` get a 429,
# and checks that TokentapInterTokenLatencyHigh and the ITL budget-burn page for
# `regress` and TokentapUpstreamRateLimited for `limited` reach the webhook with the
# labels and annotations their rules promise, within 45 s, and resolved within 75 s
# once the regression ends; and that nothing else did (see its --help).
# What to expect, scaled: the ITL alert needs its 5 s window to hold slow gaps (~1 s)
# and then `for:` 10 s, plus an evaluation (1 s) and Alertmanager's group_wait (1 s):
# about 15 s. The rate-limit alert likewise (~13 s). The page has no `for:`; it waits
# for the 6 min and 30 s windows to hold 6% of slow gaps (~10 s). Resolving takes the
# 5 s windows (~5-7 s), and the page its 30 s window (~25 s). The bounds leave room for a
# loaded machine, not for a missing `for:` scale (600 s) or a stuck Alertmanager.
# Installs prometheus and prometheus-alertmanager with apt when missing. Every process
# is started here and ended by PID on exit. About a minute.
# Last lines: `e2e-alerts: N passed, M failed`, then, when all passed, `e2e-alerts: N
# alerts fired and resolved as expected; ITL alert X s, ITL budget-burn page Y s,
# rate-limit alert Z s after the regression (run: T s)`; exit 1 on any failure, 2 if it
# could not run.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OPS=$ROOT/scripts/ops
# shellcheck source=scripts/ops/lib.sh
. "$OPS/lib.sh"
BIN=${TOKENTAP_BIN:-$ROOT/target/release/tokentap}
FACTOR=60
H=127.0.0.1
# The live view of every tokentap started here on a free port, not its default 9465.
export TOKENTAP_UI_LISTEN=$H:0
if [ -n "${1:-}" ]; then
  sed -n '2,35p' "$0"; exit 2
fi

ops_init e2e-alerts

# ------------------------------------------------------------------ preflight
[ -x "$BIN" ] || die "no tokentap binary at $BIN: run \`cargo build\` and set TOKENTAP_BIN"
missing=()
command -v prometheus >/dev/null || missing+=(prometheus)
command -v prometheus-alertmanager >/dev/null || missing+=(prometheus-alertmanager)
if [ "${#missing[@]}" -gt 0 ]; then
  [ "$(id -u)" = 0 ] || die "need root to apt-get install ${missing[*]}"
  echo "installing ${missing[*]} with apt"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"; } \
    >/tmp/e2e-alerts-apt.log 2>&1 || { cat /tmp/e2e-alerts-apt.log; die "apt-get install ${missing[*]} failed"; }
fi
for t in prometheus prometheus-alertmanager amtool promtool curl python3; do
  command -v "$t" >/dev/null || die "$t not found"
done
python3 -c 'import yaml' 2>/dev/null || die "python3 needs PyYAML (pip install pyyaml)"

read -r P_SIM P_PROXY P_ADMIN P_PROM P_AM P_HOOK < <(free_ports 6)
echo "binary: $BIN, temp: $TMP"

# ------------------------------------------------------------------ configs
if python3 "$OPS/scale-rules.py" "$ROOT/deploy/prometheus/rules.yaml" "$TMP/rules.yaml" --factor "$FACTOR" >"$TMP/scale.log" 2>&1 &&
   promtool check rules "$TMP/rules.yaml" >>"$TMP/scale.log" 2>&1; then
  pass "the shipped rules.yaml with windows, for: and intervals divided by $FACTOR passes promtool check rules ($(head -n1 "$TMP/scale.log"))"
else
  fail "scaling the shipped rules"; cat "$TMP/scale.log"; summary; exit 1
fi
python3 "$OPS/prom_config.py" derive "$ROOT/deploy/prometheus/scrape-config.yaml" "$TMP/prometheus.yaml" \
  --rules "$TMP/rules.yaml" --interval 1s --alertmanager "$H:$P_AM" \
  --target "$H:$P_ADMIN,__meta_kubernetes_namespace=e2e,__meta_kubernetes_pod_name=alerts,__meta_kubernetes_pod_container_name=tokentap,__meta_kubernetes_pod_container_port_name=metrics,__meta_kubernetes_pod_phase=Running,__meta_kubernetes_pod_node_name=loopback"
cat >"$TMP/alertmanager.yaml" <<EOF
route:
  receiver: webhook
  group_by: [alertname, model]
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: webhook
    webhook_configs:
      - url: http://$H:$P_HOOK/alerts
        send_resolved: true
EOF
if promtool check config "$TMP/prometheus.yaml" >"$TMP/check.log" 2>&1 && amtool check-config "$TMP/alertmanager.yaml" >>"$TMP/check.log" 2>&1; then
  pass "promtool check config (the tokentap job, the scaled rules, the Alertmanager) and amtool check-config"
else
  fail "configs"; cat "$TMP/check.log"; summary; exit 1
fi

# ------------------------------------------------------------------ processes
start sim "$BIN" sim --listen "$H:$P_SIM" --models steady,regress,limited --ttft 50ms --itl 20ms --tokens 20
start tokentap "$BIN" --upstream "http://$H:$P_SIM" --listen "$H:$P_PROXY" --admin "$H:$P_ADMIN" --log-format json
start webhook python3 "$OPS/e2e_webhook.py" --listen "$H:$P_HOOK" --log "$TMP/webhook.jsonl"
start alertmanager prometheus-alertmanager --config.file="$TMP/alertmanager.yaml" --storage.path="$TMP/am" \
  --web.listen-address="$H:$P_AM" --cluster.listen-address= --log.level=warn
start prometheus prometheus --config.file="$TMP/prometheus.yaml" --storage.tsdb.path="$TMP/tsdb" \
  --web.listen-address="$H:$P_PROM" --storage.tsdb.retention.time=1h --log.level=warn
ok_start=1
wait_http sim "http://$H:$P_SIM/health" 200 20 || ok_start=0
wait_http tokentap "http://$H:$P_ADMIN/readyz" 200 20 || ok_start=0
wait_http webhook "http://$H:$P_HOOK/health" 200 20 || ok_start=0
wait_http alertmanager "http://$H:$P_AM/-/ready" 200 30 || ok_start=0
wait_http prometheus "http://$H:$P_PROM/-/ready" 200 30 || ok_start=0
if [ "$ok_start" = 1 ]; then pass "simulator, tokentap, webhook receiver, Alertmanager and Prometheus are up"
else fail "start-up (see logs above)"; summary; exit 1; fi
up=0
for _ in $(seq 100); do
  up=$(curl -s "http://$H:$P_PROM/api/v1/query" --data-urlencode 'query=up{job="tokentap"}' |
       python3 -c 'import json,sys; print(sum(1 for r in json.load(sys.stdin)["data"]["result"] if r["value"][1] == "1"))' 2>/dev/null || echo 0)
  [ "$up" = 1 ] && break
  sleep 0.1
done
if [ "$up" = 1 ]; then pass "Prometheus scrapes tokentap as job tokentap (the shipped relabel rules)"
else fail "Prometheus does not scrape tokentap"; log_tail prometheus; summary; exit 1; fi
if curl -s "http://$H:$P_PROM/api/v1/alertmanagers" | grep -q "$H:$P_AM"; then pass "Prometheus sends alerts to the Alertmanager"
else fail "Prometheus has not found the Alertmanager"; summary; exit 1; fi

# ------------------------------------------------------------------ traffic and checks
python3 "$OPS/e2e_alerts.py" --proxy "http://$H:$P_PROXY" --prom "http://$H:$P_PROM" \
  --webhook-log "$TMP/webhook.jsonl" --rules "$ROOT/deploy/prometheus/rules.yaml" \
  --steady steady --regress regress --limited limited | tee "$TMP/check.out"
counts=$(grep '^E2E_ALERTS ' "$TMP/check.out" | tail -n1)
if [ -z "$counts" ]; then
  fail "e2e_alerts.py did not finish"; log_tail prometheus; log_tail alertmanager; summary; exit 1
fi
read -r _ cp cf both itl page limited <<<"$counts"
PASSED=$((PASSED + cp)); FAILED=$((FAILED + cf))
if [ "$FAILED" -gt 0 ]; then
  log_tail alertmanager; log_tail prometheus
  summary; exit 1
fi
summary
echo "e2e-alerts: $both alerts fired and resolved as expected; ITL alert ${itl} s, ITL budget-burn page ${page} s, rate-limit alert ${limited} s after the regression (run: ${SECONDS} s)"
