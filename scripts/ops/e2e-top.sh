#!/usr/bin/env bash
# `tokentap top` in a pseudo-terminal: `tokentap demo` (simulator, tokentap, traffic) on
# free loopback ports, and `tokentap top` against its live view (ui.listen) in a tmux pane. Checks
# that top draws every demo model, that its figures refresh (the frame count moves on),
# that `w` switches the window,
# that `q` exits with status 0 and gives the terminal back, and that when the server goes
# away top exits by itself, with a message, the terminal given back; and that
# `tokentap demo --top` shows top over the demo and ends on q.
#
#   cargo build --release && scripts/ops/e2e-top.sh
#   TOKENTAP_BIN=target/debug/tokentap scripts/ops/e2e-top.sh
#   CAPTURE=docs/images/top.txt scripts/ops/e2e-top.sh   # keep a screen capture there
#
# Installs tmux and curl (apt) when missing. Last line: `e2e-top: N passed, M failed`; exit 1 on a
# failure, 2 if it could not run.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=scripts/ops/lib.sh
. "$ROOT/scripts/ops/lib.sh"  # free_ports (the tmux server needs a cleanup of its own)
BIN=${TOKENTAP_BIN:-$ROOT/target/release/tokentap}
MODELS=(llama-3.1-8b qwen2.5-32b mistral-7b)

die() { echo "e2e-top: $*" >&2; exit 2; }
[ -x "$BIN" ] || die "no tokentap binary at $BIN: run \`cargo build --release\` or set TOKENTAP_BIN"
if ! command -v tmux >/dev/null || ! command -v curl >/dev/null; then
  apt-get update -qq >/dev/null 2>&1
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tmux curl >/dev/null 2>&1 \
    || die "cannot install tmux and curl"
fi

TMP=$(mktemp -d "${TMPDIR:-/tmp}/tokentap-top.XXXXXX")
SOCKET="$TMP/tmux.sock"
PIDS=()
passed=0 failed=0
check() {  # check CONDITION-EXIT-CODE WHAT
  if [ "$1" = 0 ]; then passed=$((passed + 1)); echo "PASS $2"; else failed=$((failed + 1)); echo "FAIL $2"; fi
}
cleanup() {
  local pid
  tmux -S "$SOCKET" kill-server 2>/dev/null
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  if [ "${KEEP_E2E_TMP:-0}" = 1 ]; then echo "logs kept in $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT

start_demo() {  # start_demo NAME -> DEMO_PID, ADMIN, UI
  read -r P_PROXY P_ADMIN P_UI < <(free_ports 3)
  ADMIN=127.0.0.1:$P_ADMIN
  UI=127.0.0.1:$P_UI
  "$BIN" demo --listen "127.0.0.1:$P_PROXY" --admin "$ADMIN" --ui-listen "$UI" --duration 120s \
    --concurrency 4 >"$TMP/$1.log" 2>&1 &
  DEMO_PID=$!
  PIDS+=("$DEMO_PID")
  for _ in $(seq 300); do
    curl -s -o /dev/null -m 2 "http://$ADMIN/healthz" && return 0
    sleep 0.1
  done
  tail "$TMP/$1.log"; die "the demo did not start"
}
start_top() {  # start_top NAME: top in a tmux pane, its status and stderr to files
  tmux -S "$SOCKET" new-session -d -s "$1" -x 150 -y 40 \
    "'$BIN' top --addr '$UI' 2>'$TMP/$1.err'; echo \$? >'$TMP/$1.status'"
  tmux -S "$SOCKET" set-option -t "$1" remain-on-exit on >/dev/null
}
screen() { tmux -S "$SOCKET" capture-pane -p -t "$1"; }
frames() { screen "$1" | grep -o 'frames [0-9]*' | head -1 | awk '{print $2}'; }
wait_status() {  # wait_status NAME SECONDS
  for _ in $(seq $(($2 * 10))); do [ -s "$TMP/$1.status" ] && return 0; sleep 0.1; done
  return 1
}

# 1. Draws, refreshes, q quits with 0.
start_demo demo1
grep -q "live view *http://$UI/ui" "$TMP/demo1.log"; check $? "the demo prints the page's address"
start_top quit
for _ in $(seq 100); do
  shown=0
  for m in "${MODELS[@]}"; do screen quit | grep -q "$m" && shown=$((shown + 1)); done
  [ "$shown" = ${#MODELS[@]} ] && break
  sleep 0.1
done
[ "$shown" = ${#MODELS[@]} ]; check $? "top draws every model (${shown}/${#MODELS[@]})"
screen quit | grep -q "slowest requests in flight"; check $? "top draws the requests in flight"
first=$(frames quit)
sleep 2.5
second=$(frames quit)
[ -n "$first" ] && [ -n "$second" ] && [ "$second" -gt "$first" ]
check $? "top refreshes (frames ${first:-?} -> ${second:-?})"
[ -n "${CAPTURE:-}" ] && screen quit >"$CAPTURE"
tmux -S "$SOCKET" send-keys -t quit w
for _ in $(seq 50); do screen quit | grep -q "window 300 s" && break; sleep 0.1; done
screen quit | grep -q "window 300 s"; check $? "w switches the window to 5 minutes"
for _ in $(seq 50); do [ -n "$(frames quit)" ] && [ "$(frames quit)" -gt 0 ] && break; sleep 0.1; done
[ -n "$(frames quit)" ] && [ "$(frames quit)" -gt 0 ]; check $? "and its frames come ($(frames quit))"
tmux -S "$SOCKET" send-keys -t quit q
wait_status quit 5; check $? "q ends top"
[ "$(cat "$TMP/quit.status" 2>/dev/null)" = 0 ]; check $? "q exits with status 0 ($(cat "$TMP/quit.status" 2>/dev/null))"
! screen quit | grep -q "slowest requests in flight"; check $? "the terminal is given back after q"

# 2. The server goes away: top exits by itself, with a message.
start_top gone
for _ in $(seq 100); do screen gone | grep -q "${MODELS[0]}" && break; sleep 0.1; done
kill -TERM "$DEMO_PID"
wait_status gone 15; check $? "top exits when the server goes away"
[ "$(cat "$TMP/gone.status" 2>/dev/null)" = 1 ]; check $? "with status 1 ($(cat "$TMP/gone.status" 2>/dev/null))"
grep -q "went away" "$TMP/gone.err"; check $? "and says so: $(head -c 200 "$TMP/gone.err")"
! screen gone | grep -q "slowest requests in flight"; check $? "the terminal is given back after the server left"

# 3. `tokentap demo --top`: the demo with top instead of its table; q ends both. Every
# port 0: top is pointed at the port the live view was given.
tmux -S "$SOCKET" new-session -d -s demo -x 150 -y 40 \
  "'$BIN' demo --top --listen 127.0.0.1:0 --admin 127.0.0.1:0 --ui-listen 127.0.0.1:0 --duration 120s 2>'$TMP/demo.err'; echo \$? >'$TMP/demo.status'"
tmux -S "$SOCKET" set-option -t demo remain-on-exit on >/dev/null
# top's heading and a model's table row (the demo's banner, drawn first, names the models
# and `tokentap top` too).
top_shows() { screen demo | grep -q "^tokentap top " && screen demo | grep -q "│${MODELS[2]} "; }
for _ in $(seq 150); do top_shows && break; sleep 0.1; done
top_shows
check $? "demo --top shows top with the demo's models"
tmux -S "$SOCKET" send-keys -t demo q
wait_status demo 30; check $? "q ends the demo too"
[ "$(cat "$TMP/demo.status" 2>/dev/null)" = 0 ]; check $? "demo --top exits with status 0 ($(cat "$TMP/demo.status" 2>/dev/null))"

echo "e2e-top: $passed passed, $failed failed"
[ "$failed" = 0 ]
