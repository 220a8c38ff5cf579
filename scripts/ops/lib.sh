# shellcheck shell=bash
# Shared by the e2e scripts in scripts/ops (sourced, not run): the pass/fail tally and
# its last line, a temporary directory removed on exit, processes started with their
# logs there and ended by PID on exit, free loopback ports, and polling a URL.
#
#   . "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#   ops_init e2e-name          # TMP, the EXIT trap, pass/fail/skip/summary/die
#   read -r P1 P2 < <(free_ports 2)
#   start sim "$BIN" sim --listen "127.0.0.1:$P1"
#   wait_http sim "http://127.0.0.1:$P1/health" 200 20 || ...
#   summary; [ "$FAILED" = 0 ]
#
# KEEP_E2E_TMP=1 keeps the logs.

ops_init() {
  OPS_NAME=$1
  PASSED=0 FAILED=0 SKIPPED=0
  TMP=$(mktemp -d "${TMPDIR:-/tmp}/tokentap-$OPS_NAME.XXXXXX")
  declare -gA PID_OF=()
  PIDS=()
  trap ops_cleanup EXIT
  trap 'echo "interrupted"; exit 130' INT TERM
}

pass() { PASSED=$((PASSED + 1)); echo "PASS $*"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL $*"; }
skip() { SKIPPED=$((SKIPPED + 1)); echo "SKIP $*"; }
summary() {
  local s="$OPS_NAME: $PASSED passed, $FAILED failed"
  [ "$SKIPPED" -gt 0 ] && s="$s, $SKIPPED skipped"
  echo "$s"
}
die() { echo "$OPS_NAME: $*" >&2; exit 2; }

ops_cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  if [ "${KEEP_E2E_TMP:-0}" = 1 ]; then echo "logs kept in $TMP"; else rm -rf "$TMP"; fi
}

# start NAME CMD...: run CMD in the background, output to $TMP/NAME.log.
start() {
  local name=$1; shift
  "$@" >"$TMP/$name.log" 2>&1 &
  PID_OF[$name]=$!
  PIDS+=("$!")
}

log_tail() { echo "---- $1.log (tail)"; tail -n 20 "$TMP/$1.log" 2>/dev/null; echo "----"; }

# free_ports N: N loopback ports free right now, on one line.
free_ports() {
  python3 - "$1" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
for s in socks: s.close()
EOF
}

# wait_http NAME URL WANT_CODE TIMEOUT_S: poll until URL answers WANT_CODE; fails early
# if the process NAME started has exited.
wait_http() {
  local name=$1 url=$2 want=$3 limit=$4 code
  for _ in $(seq $((limit * 10))); do
    code=$(curl -s -o /dev/null -m 2 -w '%{http_code}' "$url" 2>/dev/null)
    [ "$code" = "$want" ] && return 0
    if [ -n "${PID_OF[$name]:-}" ] && ! kill -0 "${PID_OF[$name]}" 2>/dev/null; then
      echo "$name exited early"; log_tail "$name"; return 1
    fi
    sleep 0.1
  done
  echo "$url answered ${code:-nothing}, wanted $want after ${limit}s"; log_tail "$name"
  return 1
}
