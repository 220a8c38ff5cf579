#!/usr/bin/env bash
# The live view end to end in a real browser: `tokentap sim` with three models and
# tokentap in front of it; headless Chromium (Debian's `chromium`, driven over the
# DevTools protocol by scripts/ops/e2e_ui.py with websocket-client from PyPI) opens /ui on
# the live view's listener (ui.listen; the admin port answers it with a 404), waits for
# live data, checks that every model appears with figures equal to /metrics over the same
# window, injects an ITL regression into one model and checks that its heatmap shows it
# within seconds, writes a screenshot to target/e2e-ui/ui.png, then streams to models
# named `constructor`, `__proto__`, `toString` and `hasOwnProperty` and checks that the
# page keeps ticking, without a script error, with a row and heatmaps for each.
#
#   cargo build --release && scripts/ops/e2e-ui.sh
#   TOKENTAP_BIN=target/debug/tokentap scripts/ops/e2e-ui.sh
#   SCREENSHOT=docs/images/live-ui.png scripts/ops/e2e-ui.sh   # also write it there
#
# Installs chromium (apt) and websocket-client (pip) when missing. Every process is
# started here and ended by PID on exit. Last line: `e2e-ui: N passed, M failed`; exit 1
# on a failure, 2 if it could not run.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=scripts/ops/lib.sh
. "$ROOT/scripts/ops/lib.sh"
BIN=${TOKENTAP_BIN:-$ROOT/target/release/tokentap}
OUT=${E2E_UI_OUT:-$ROOT/target/e2e-ui}
MODELS=llama-3.1-8b,mixtral-8x7b,qwen2.5-72b
REGRESS=mixtral-8x7b
HOSTILE=constructor,__proto__,toString,hasOwnProperty

ops_init e2e-ui
[ -x "$BIN" ] || die "no tokentap binary at $BIN: run \`cargo build --release\` or set TOKENTAP_BIN"
APT_UPDATED=0
apt_install() {
  [ "$APT_UPDATED" = 1 ] || { apt-get update -qq >/dev/null 2>&1; APT_UPDATED=1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null 2>&1
}
command -v chromium >/dev/null || apt_install chromium || die "cannot install chromium"
command -v curl >/dev/null || apt_install curl || die "cannot install curl"
python3 -c 'import websocket' 2>/dev/null \
  || python3 -m pip install -q websocket-client >/dev/null 2>&1 \
  || die "cannot install websocket-client"

mkdir -p "$OUT"

read -r P_SIM P_PROXY P_ADMIN P_UI < <(free_ports 4)
H=127.0.0.1

start sim "$BIN" sim --listen "$H:$P_SIM" --models "$MODELS,$HOSTILE" --ttft 80ms --itl 12ms --jitter 0.3 --tokens 20
# The simulator first: tokentap's first readiness probe must find it.
for _ in $(seq 300); do curl -s -o /dev/null -m 2 "http://$H:$P_SIM/" && break; sleep 0.1; done
# An objective the simulator's TTFT (80 ms, jitter 30%) meets most of the time: the page's
# objectives column is checked against /metrics' counts.
cat >"$TMP/tokentap.yaml" <<'YAML'
objectives:
  interactive:
    ttft: 95ms
YAML
start tokentap "$BIN" --config "$TMP/tokentap.yaml" --upstream "http://$H:$P_SIM" --listen "$H:$P_PROXY" \
  --admin "$H:$P_ADMIN" --ui-listen "$H:$P_UI"
wait_http - "http://$H:$P_ADMIN/readyz" 200 30 || die "tokentap not ready"

python3 "$ROOT/scripts/ops/e2e_ui.py" --chromium "$(command -v chromium)" \
  --proxy "http://$H:$P_PROXY" --admin "http://$H:$P_ADMIN" --ui "http://$H:$P_UI" \
  --models "$MODELS" --regress "$REGRESS" --hostile "$HOSTILE" --out "$OUT" ${SCREENSHOT:+--screenshot "$SCREENSHOT"}
status=$?
[ "$status" = 0 ] || tail -n 20 "$TMP"/*.log "$OUT/chromium.log" 2>/dev/null
exit "$status"
