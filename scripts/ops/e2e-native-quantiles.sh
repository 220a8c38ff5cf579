#!/usr/bin/env bash
# Native histograms end to end: a real Prometheus with native histograms scrapes tokentap
# in the protobuf format, and `histogram_quantile` over the native TTFT series must lie
# within 5% of the exact quantile of the TTFTs tokentap measured.
#
#   cargo build --release && scripts/ops/e2e-native-quantiles.sh
#   TOKENTAP_BIN=target/debug/tokentap REQUESTS=200 scripts/ops/e2e-native-quantiles.sh
#
# What it does:
#   1. starts `tokentap sim` (TTFT 120 ms +-30%, uniform, as the demo's llama-3.1-8b) and
#      tokentap in front of it with JSON access logs;
#   2. starts Prometheus (2.40+, `--enable-feature=native-histograms`) scraping tokentap's
#      admin port every second;
#   3. sends REQUESTS streamed chat completions, a few at a time;
#   4. once Prometheus holds all of them, for q = 0.5, 0.9, 0.99 compares
#      `histogram_quantile(q, tokentap_time_to_first_token_seconds)` (native) with the
#      exact quantile (nearest rank) of the access log's `ttft_ms` values, and reports
#      beside it the same quantile interpolated from the classic buckets of the text
#      scrape, with its error (informational: the classic error is what native fixes).
# Every process is started here and ended by PID on exit. Last line:
# `e2e-native-quantiles: N passed, M failed`; exit 1 on a failure, 2 if it could not run.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=${TOKENTAP_BIN:-$ROOT/target/release/tokentap}
PROMETHEUS=${PROMETHEUS:-prometheus}
REQUESTS=${REQUESTS:-300}
TOLERANCE=${TOLERANCE:-0.05}
MODEL=llama-3.1-8b

die() { echo "e2e-native-quantiles: $*" >&2; exit 2; }
[ -x "$BIN" ] || die "no tokentap binary at $BIN: run \`cargo build --release\` or set TOKENTAP_BIN"
for t in "$PROMETHEUS" curl python3; do
  command -v "$t" >/dev/null || die "$t not found (apt-get install -y prometheus curl)"
done

TMP=$(mktemp -d "${TMPDIR:-/tmp}/tokentap-native.XXXXXX")
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

read -r P_SIM P_PROXY P_ADMIN P_PROM < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(4)]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))')
H=127.0.0.1

start sim "$BIN" sim --listen "$H:$P_SIM" --models "$MODEL" --ttft 120ms --itl 20ms --jitter 0.3 --tokens 20
start tokentap "$BIN" --upstream "http://$H:$P_SIM" --listen "$H:$P_PROXY" --admin "$H:$P_ADMIN" --log-format json
wait_http "http://$H:$P_ADMIN/readyz" 30 || { tail "$TMP"/*.log; die "tokentap not ready"; }

cat >"$TMP/prometheus.yaml" <<EOF
global: {scrape_interval: 1s}
scrape_configs:
  - job_name: tokentap
    static_configs: [{targets: ["$H:$P_ADMIN"]}]
EOF
start prometheus "$PROMETHEUS" --config.file="$TMP/prometheus.yaml" --storage.tsdb.path="$TMP/tsdb" \
  --web.listen-address="$H:$P_PROM" --enable-feature=native-histograms --log.level=warn
wait_http "http://$H:$P_PROM/-/ready" 30 || { tail "$TMP/prometheus.log"; die "Prometheus not ready"; }

python3 - "$ROOT" "$H" "$P_PROXY" "$P_ADMIN" "$P_PROM" "$REQUESTS" "$TOLERANCE" "$MODEL" "$TMP/tokentap.log" <<'EOF'
import json, math, sys, time, urllib.parse, urllib.request
from concurrent.futures import ThreadPoolExecutor

root, host, proxy, admin, prom, requests, tolerance, model, log = sys.argv[1:]
requests, tolerance = int(requests), float(tolerance)
passed = failed = 0

def check(ok, what):
    global passed, failed
    passed, failed = passed + ok, failed + (not ok)
    print(("PASS " if ok else "FAIL ") + what)

def chat(i):
    body = json.dumps({"model": model, "stream": True,
                       "messages": [{"role": "user", "content": f"request {i}"}]}).encode()
    req = urllib.request.Request(f"http://{host}:{proxy}/v1/chat/completions", body,
                                 {"content-type": "application/json", "x-tenant-id": "e2e"})
    with urllib.request.urlopen(req, timeout=30) as response:
        response.read()

with ThreadPoolExecutor(8) as pool:
    list(pool.map(chat, range(requests)))

def query(expr):
    url = f"http://{host}:{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as response:
        result = json.load(response)["data"]["result"]
    return float(result[0]["value"][1]) if result else None

series = f'tokentap_time_to_first_token_seconds{{model="{model}"}}'
deadline = time.time() + 60
while time.time() < deadline and query(f"histogram_count(sum({series}))") != requests:
    time.sleep(0.5)
check(query(f"histogram_count(sum({series}))") == requests,
      f"Prometheus holds {requests} TTFTs as one native histogram")

ttfts = []
with open(log) as lines:
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        fields = event.get("fields", event)
        if event.get("target") == "tokentap::access" and fields.get("ttft_ms") is not None:
            ttfts.append(fields["ttft_ms"] / 1e3)
ttfts.sort()
check(len(ttfts) == requests, f"{len(ttfts)} TTFTs in the access log")

with urllib.request.urlopen(f"http://{host}:{admin}/metrics", timeout=10) as response:
    text = response.read().decode()
classic = []
for line in text.splitlines():
    if line.startswith("tokentap_time_to_first_token_seconds_bucket{") and f'model="{model}"' in line:
        le = line.split('le="')[1].split('"')[0]
        classic.append((float(le), float(line.rsplit(" ", 1)[1])))

def classic_quantile(q):
    # histogram_quantile's interpolation over the classic buckets.
    count = classic[-1][1]
    rank, lower, below = q * count, 0.0, 0.0
    for upper, cumulative in classic:
        if cumulative >= rank and cumulative > below:
            if math.isinf(upper):
                return lower
            return lower + (upper - lower) * (rank - below) / (cumulative - below)
        lower, below = upper, cumulative
    return lower

for q in (0.5, 0.9, 0.99):
    exact = ttfts[max(0, math.ceil(q * len(ttfts)) - 1)] if ttfts else float("nan")
    native = query(f"histogram_quantile({q}, sum({series}))")
    native_error = abs(native - exact) / exact if native is not None else float("inf")
    classic_estimate = classic_quantile(q) if classic else float("nan")
    classic_error = abs(classic_estimate - exact) / exact
    check(native_error <= tolerance,
          f"p{q * 100:g}: native {native * 1e3 if native else float('nan'):.1f} ms vs exact "
          f"{exact * 1e3:.1f} ms ({native_error:.1%}); classic {classic_estimate * 1e3:.1f} ms "
          f"({classic_error:.1%})")

print(f"e2e-native-quantiles: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
EOF
