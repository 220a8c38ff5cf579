#!/usr/bin/env bash
# Every dashboard query and every rule returns data on BOTH kinds of Prometheus: a
# classic one (histograms stored as `X_bucket{le}`, `X_sum`, `X_count`) and one with
# native histograms (`--enable-feature=native-histograms`, scraping the protobuf format),
# which in 2.42 stores ONLY the native series `X`. promtool 2.42 cannot write native
# histograms in rule-test input, so this is where the rules' native arms are proven.
#
#   cargo build && TOKENTAP_BIN=target/debug/tokentap scripts/ops/check-queries-both-kinds.sh
#
# What it does:
#   1. starts `tokentap sim` (two models) and tokentap in front of it, with the default
#      labels.tenant.families;
#   2. starts two Prometheus servers scraping tokentap every second, both loading
#      deploy/prometheus/rules.yaml: one classic, one with native histograms;
#   3. streams chat completions as three tenants (and none), until both hold them;
#   4. checks the native one holds no `_bucket` series and the classic one no native one;
#   5. on each server: every recording rule has samples; every alert expression
#      evaluates; every dashboard panel query (variables at their defaults) evaluates and
#      returns data, except those reading only event-driven counters or timeouts, which
#      this traffic never creates; each heatmap's query of that kind has data.
# Every process is started here and ended by PID on exit. Last line:
# `check-queries-both-kinds: N passed, M failed`; exit 1 on a failure, 2 if it could not run.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=${TOKENTAP_BIN:-$ROOT/target/release/tokentap}
PROMETHEUS=${PROMETHEUS:-prometheus}
REQUESTS=${REQUESTS:-120}

die() { echo "check-queries-both-kinds: $*" >&2; exit 2; }
[ -x "$BIN" ] || die "no tokentap binary at $BIN: run \`cargo build --release\` or set TOKENTAP_BIN"
for t in "$PROMETHEUS" curl python3; do
  command -v "$t" >/dev/null || die "$t not found (apt-get install -y prometheus curl)"
done

TMP=$(mktemp -d "${TMPDIR:-/tmp}/tokentap-kinds.XXXXXX")
PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  if [ "${KEEP_E2E_TMP:-0}" = 1 ]; then echo "logs kept in $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
start() {  # start NAME CMD...   (stdout and stderr to $TMP/NAME.log)
  local name=$1; shift
  "$@" >"$TMP/$name.log" 2>&1 &
  PIDS+=("$!")
}
wait_http() {  # wait_http URL TIMEOUT_S
  for _ in $(seq $(($2 * 10))); do
    [ "$(curl -s -o /dev/null -m 2 -w '%{http_code}' "$1")" = 200 ] && return 0
    sleep 0.1
  done
  return 1
}

read -r P_SIM P_PROXY P_ADMIN P_CLASSIC P_NATIVE < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(5)]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))')
H=127.0.0.1

start sim "$BIN" sim --listen "$H:$P_SIM" --models llama-3.1-8b,mistral-7b --ttft 80ms --itl 10ms --jitter 0.3 --tokens 12 --usage always
start tokentap "$BIN" --upstream "http://$H:$P_SIM" --listen "$H:$P_PROXY" --admin "$H:$P_ADMIN"
wait_http "http://$H:$P_ADMIN/readyz" 30 || { tail "$TMP"/*.log; die "tokentap not ready"; }

for kind in classic native; do
  mkdir -p "$TMP/$kind"
  cat >"$TMP/$kind/prometheus.yaml" <<EOF
global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: ["$ROOT/deploy/prometheus/rules.yaml"]
scrape_configs:
  - job_name: tokentap
    static_configs: [{targets: ["$H:$P_ADMIN"]}]
EOF
done
start prom-classic "$PROMETHEUS" --config.file="$TMP/classic/prometheus.yaml" --storage.tsdb.path="$TMP/classic/tsdb" \
  --web.listen-address="$H:$P_CLASSIC" --log.level=warn
start prom-native "$PROMETHEUS" --config.file="$TMP/native/prometheus.yaml" --storage.tsdb.path="$TMP/native/tsdb" \
  --web.listen-address="$H:$P_NATIVE" --enable-feature=native-histograms --log.level=warn
for p in "$P_CLASSIC" "$P_NATIVE"; do
  wait_http "http://$H:$p/-/ready" 30 || { tail "$TMP"/prom-*.log; die "Prometheus on $p not ready"; }
done

python3 - "$ROOT" "$H" "$P_PROXY" "$P_CLASSIC" "$P_NATIVE" "$REQUESTS" <<'EOF'
import json, sys, time, urllib.parse, urllib.request
from concurrent.futures import ThreadPoolExecutor

root, host, proxy, p_classic, p_native, requests = sys.argv[1:]
sys.path.insert(0, f"{root}/scripts/ops")
import dashboard_queries as dq  # noqa: E402
import tokentap_contract as contract  # noqa: E402
import yaml  # noqa: E402

requests = int(requests)
passed = failed = 0

def check(ok, what, detail=""):
    global passed, failed
    passed, failed = passed + ok, failed + (not ok)
    print(("PASS " if ok else "FAIL ") + what + (f": {detail}" if detail and not ok else ""))

TENANTS = ["acme", "globex", "initech", None]
MODELS = ["llama-3.1-8b", "mistral-7b"]

def chat(i):
    body = json.dumps({"model": MODELS[i % 2], "stream": True,
                       "messages": [{"role": "user", "content": f"request {i}"}]}).encode()
    headers = {"content-type": "application/json"}
    if TENANTS[i % 4]:
        headers["x-tenant-id"] = TENANTS[i % 4]
    req = urllib.request.Request(f"http://{host}:{proxy}/v1/chat/completions", body, headers)
    with urllib.request.urlopen(req, timeout=30) as response:
        response.read()

def query(port, expr):
    url = f"http://{host}:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.load(response)["data"]["result"], None
    except urllib.error.HTTPError as e:
        return None, e.read().decode(errors="replace")

servers = {"classic": p_classic, "native": p_native}
# Two rounds a few seconds apart, so that every rate() window holds an increase.
for _ in range(2):
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(chat, range(requests // 2)))
    time.sleep(3)

total = f"sum(tokentap_requests_total)"
for kind, port in servers.items():
    deadline = time.time() + 60
    while time.time() < deadline:
        result, _ = query(port, total)
        if result and float(result[0]["value"][1]) >= requests:
            break
        time.sleep(0.5)
    result, _ = query(port, total)
    check(bool(result) and float(result[0]["value"][1]) >= requests, f"{kind}: Prometheus holds {requests} requests")

# What each kind stores.
ttft = "tokentap_time_to_first_token_seconds"
classic_buckets, _ = query(p_native, f"count({ttft}_bucket)")
check(not classic_buckets, "native: no `_bucket` series (2.42 keeps only the native histogram)", classic_buckets)
native_series, _ = query(p_native, f"histogram_count(sum({ttft}))")
check(bool(native_series), "native: the native TTFT histogram is stored", native_series)
native_on_classic, _ = query(p_classic, f"histogram_count(sum({ttft}))")
check(not native_on_classic, "classic: no native histogram series", native_on_classic)
per_model, _ = query(p_classic, 'count(tokentap_request_duration_seconds_count{tenant!=""})')
check(not per_model, "classic: per-model families carry no tenant label (default labels.tenant.families)", per_model)
# Wait for a few rule evaluations over the new data (rate windows are 5m; 1s evaluation).
time.sleep(5)

rules = yaml.safe_load(open(f"{root}/deploy/prometheus/rules.yaml"))
dashboard = json.load(open(f"{root}/grafana/dashboards/tokentap.json"))
panels = dq.panel_queries(dashboard, rate_interval="1m")
event_driven = contract.EVENT_DRIVEN

def only_event_driven(expr):
    names = contract.referenced(expr)
    return bool(names) and names <= event_driven

for kind, port in servers.items():
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "record" in rule:
                result, error = query(port, rule["record"])
                empty_ok = only_event_driven(str(rule["expr"]))
                check(error is None and (bool(result) or empty_ok),
                      f"{kind}: rule {rule['record']} has samples", error or "no samples")
            else:
                result, error = query(port, str(rule["expr"]))
                check(error is None, f"{kind}: alert {rule['alert']} evaluates", error)
    heatmaps = {p["id"] for p in dashboard["panels"] if p.get("type") == "heatmap"}
    heatmap_data = {}
    for pid, title, ref, _raw, expr in panels:
        result, error = query(port, expr)
        check(error is None, f"{kind}: panel {pid} \"{title}\" {ref} evaluates", error)
        if pid in heatmaps:
            # One query per kind of histogram: the one of this kind must have data.
            heatmap_data.setdefault((pid, title), []).append(bool(result))
            continue
        # This traffic never times out, and event-driven counters may not exist yet.
        empty_ok = only_event_driven(expr) or 'outcome="timeout"' in expr
        check(bool(result) or empty_ok, f"{kind}: panel {pid} \"{title}\" {ref} returns data", expr)
    for (pid, title), data in heatmap_data.items():
        check(data.count(True) == 1, f"{kind}: heatmap {pid} \"{title}\": the query of this kind has data", data)

# The same quantile from both kinds, side by side (informational: native is exact to a
# few percent, classic interpolates within a bucket).
for q in ("0.5", "0.99"):
    row = []
    for kind, port in servers.items():
        result, _ = query(port, f'model:tokentap_time_to_first_token_seconds:p{q[2:].ljust(2, "0")}_5m{{model="llama-3.1-8b"}}')
        row.append(f"{kind} {float(result[0]['value'][1]) * 1e3:.1f} ms" if result else f"{kind} -")
    print(f"  TTFT p{float(q) * 100:g} of llama-3.1-8b: " + ", ".join(row))

print(f"check-queries-both-kinds: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
EOF
