#!/usr/bin/env bash
# shellcheck disable=SC2015  # pass and fail (scripts/ops/lib.sh) always succeed: `A && pass || fail` is an if-then-else here
# `tokentap top` against a hostile admin server, in a pseudo-terminal: a fake server
# (scripts/ops/top_hostile_server.py) serves /api/live/stream with strings that carry
# terminal escapes, a huge frame, a frame that never ends and a stream that never
# completes an event; top runs in a tmux pane behind scripts/ops/top_pty.py, which
# records every byte top writes to its terminal, its exit status, peak memory and CPU.
# Checks that the pane's title never changes, that no OSC (title, clipboard), BEL, C1
# control or second alternate-screen switch reaches the terminal, that the hostile frames
# are still drawn (as harmless text), that a frame over top's cap is refused with a
# message and bounded memory, and that a frame that never ends costs neither memory nor
# CPU without bound.
#
#   cargo build --release && scripts/ops/e2e-top-hostile.sh
#   TOKENTAP_BIN=target/debug/tokentap scripts/ops/e2e-top-hostile.sh
#
# Installs tmux (apt) when missing. Last line: `e2e-top-hostile: N passed, M failed`;
# exit 1 on a failure, 2 if it could not run. KEEP_E2E_TMP=1 keeps the recordings.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=scripts/ops/lib.sh
. "$ROOT/scripts/ops/lib.sh"
BIN=${TOKENTAP_BIN:-$ROOT/target/release/tokentap}
SERVER=$ROOT/scripts/ops/top_hostile_server.py
PTY=$ROOT/scripts/ops/top_pty.py
# Peak memory allowed to top in any scenario: its cap on one event (1 MiB) plus the
# frame parsed from it and the terminal's buffers are far below this; the unbounded
# reader held hundreds of MB for the huge frame.
MAX_RSS_KB=$((48 * 1024))
# CPU allowed to top for a scenario that ends it (the refused or missing frame).
MAX_CPU_S=2

ops_init e2e-top-hostile
[ -x "$BIN" ] || die "no tokentap binary at $BIN: run \`cargo build --release\` or set TOKENTAP_BIN"
if ! command -v tmux >/dev/null; then
  apt-get update -qq >/dev/null 2>&1
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tmux >/dev/null 2>&1 || die "cannot install tmux"
fi
SOCKET="$TMP/tmux.sock"
trap 'tmux -S "$SOCKET" kill-server 2>/dev/null; ops_cleanup' EXIT
TITLE=e2e-top-hostile-title

tm() { tmux -S "$SOCKET" "$@"; }
screen() { tm capture-pane -p -t "$1"; }
title() { tm display -p -t "$1" '#{pane_title}'; }
result() { sed -n "s/.*$2=\([^ ]*\).*/\1/p" "$TMP/$1.result" 2>/dev/null; }

# start_case NAME MODE: the fake server in MODE, and top against it in a tmux pane whose
# title is set before top starts.
start_case() {
  local name=$1 mode=$2
  start "server-$name" python3 "$SERVER" "$mode" "$TMP/$name.port"
  for _ in $(seq 100); do [ -s "$TMP/$name.port" ] && break; sleep 0.1; done
  [ -s "$TMP/$name.port" ] || { log_tail "server-$name"; die "the fake server did not start"; }
  # top waits for a key, so the title is set and the pane recorded before it starts.
  tm new-session -d -s "$name" -x 150 -y 40 \
    "read go; python3 '$PTY' '$TMP/$name' -- '$BIN' top --addr 127.0.0.1:$(cat "$TMP/$name.port")"
  tm set-option -t "$name" remain-on-exit on >/dev/null
  tm select-pane -t "$name" -T "$TITLE"
  tm send-keys -t "$name" Enter
  for _ in $(seq 50); do [ -s "$TMP/$name.pid" ] && break; sleep 0.1; done
  PID=$(cat "$TMP/$name.pid" 2>/dev/null)
  [ -n "$PID" ] || die "top did not start in $name"
}

# watch NAME SECONDS: until top ends or SECONDS pass, sample its resident memory
# (/proc/PID/status VmRSS) and the pane's title; sets PEAK_KB, TITLE_KEPT (0 or 1) and
# CPU_S (its CPU time, from /proc while it runs, from wait4 once it ended).
watch() {
  local name=$1 limit=$2 rss ticks stat
  PEAK_KB=0 TITLE_KEPT=1 CPU_S=
  for _ in $(seq $((limit * 10))); do
    [ -s "$TMP/$name.result" ] && break
    rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$PID/status" 2>/dev/null)
    [ -n "$rss" ] && [ "$rss" -gt "$PEAK_KB" ] && PEAK_KB=$rss
    [ "$(title "$name")" = "$TITLE" ] || TITLE_KEPT=0
    stat=$(cat "/proc/$PID/stat" 2>/dev/null) && ticks=$(echo "${stat##*) }" | awk '{print $12 + $13}')
    sleep 0.1
  done
  if [ -s "$TMP/$name.result" ]; then
    CPU_S=$(result "$name" cpu_s)
    rss=$(result "$name" maxrss_kb)
    [ "$rss" -gt "$PEAK_KB" ] && PEAK_KB=$rss
  else
    CPU_S=$(awk -v t="${ticks:-0}" -v hz="$(getconf CLK_TCK)" 'BEGIN {printf "%.2f", t / hz}')
  fi
}

# stop NAME: end a top still running (by its PID) so the next case starts clean.
stop() { [ -s "$TMP/$1.result" ] || kill -TERM "$PID" 2>/dev/null; }

# raw_count NAME PYTHON-BYTES-REGEX: how often the pattern occurs in what top wrote.
raw_count() {
  python3 -c 'import re, sys; print(len(re.findall(sys.argv[2].encode(), open(sys.argv[1], "rb").read())))' \
    "$TMP/$1.raw" "$2"
}

# 1. Escapes in every string top draws: drawn as text, never reaching the terminal.
start_case hostile hostile
for _ in $(seq 100); do screen hostile | grep -q c1-osc && break; sleep 0.1; done
screen hostile | grep -q 'c1-osc'; check=$?
[ "$check" = 0 ] && pass "top draws the hostile frames" || fail "top draws the hostile frames: $(screen hostile | head -5)"
watch hostile 3
[ "$TITLE_KEPT" = 1 ] && pass "the pane's title is unchanged while top runs" \
  || fail "the pane's title changed while top runs ($(title hostile))"
frames() { screen "$1" | grep -o 'frames [0-9]*' | head -1 | awk '{print $2}'; }
first=$(frames hostile)
sleep 1.5
second=$(frames hostile)
[ -n "$first" ] && [ -n "$second" ] && [ "$second" -gt "$first" ] \
  && pass "the hostile frames keep coming (frames $first -> $second)" \
  || fail "the hostile frames do not come (frames ${first:-?} -> ${second:-?})"
[ "$(tm display -p -t hostile '#{alternate_on}')" = 1 ] && pass "top is on the alternate screen" \
  || fail "top is not on the alternate screen"
tm send-keys -t hostile q
for _ in $(seq 50); do [ -s "$TMP/hostile.result" ] && break; sleep 0.1; done
[ "$(result hostile status)" = 0 ] && pass "q exits with 0" || fail "q exits with $(result hostile status)"
[ "$(title hostile)" = "$TITLE" ] && pass "the title is unchanged after top exits" \
  || fail "the title is '$(title hostile)' after top exits"
[ "$(tm display -p -t hostile '#{alternate_on}')" = 0 ] && pass "the terminal is back on its normal screen" \
  || fail "the terminal is left on the alternate screen"
n=$(raw_count hostile '\x1b\]'); [ "$n" = 0 ] && pass "no OSC sequence (title, clipboard) reached the terminal" \
  || fail "$n OSC sequences (ESC ]) reached the terminal"
n=$(raw_count hostile '\x07'); [ "$n" = 0 ] && pass "no BEL reached the terminal" || fail "$n BEL reached the terminal"
n=$(raw_count hostile '\xc2[\x80-\x9f]'); [ "$n" = 0 ] && pass "no C1 control reached the terminal" \
  || fail "$n C1 controls reached the terminal"
n=$(raw_count hostile '\x1b\[\?1049h'); [ "$n" = 1 ] && pass "one alternate-screen switch: top's own" \
  || fail "$n alternate-screen switches reached the terminal"
n=$(raw_count hostile 'screen\x1b'); [ "$n" = 0 ] && pass "no clear screen from the server" \
  || fail "$n clear-screen sequences from the server reached the terminal"
n=$(raw_count hostile 'pwned'); [ "$n" -gt 0 ] && pass "the hostile strings were shown as text ($n)" \
  || fail "the hostile strings were not shown at all"

# 2. A frame of 70,000 models: refused, with a message, in bounded memory.
start_case huge huge
watch huge 20
stop huge
[ -s "$TMP/huge.result" ] && pass "top ends on the huge frame" || fail "top still runs after the huge frame"
[ "$(result huge status)" = 1 ] && pass "with status 1" || fail "with status $(result huge status)"
grep -q 'larger than' "$TMP/huge.err" && pass "and says why: $(head -c 300 "$TMP/huge.err")" \
  || fail "no message for the refused frame: $(head -c 300 "$TMP/huge.err")"
[ "$PEAK_KB" -le "$MAX_RSS_KB" ] && pass "peak memory ${PEAK_KB} KB (at most $MAX_RSS_KB)" \
  || fail "peak memory ${PEAK_KB} KB (more than $MAX_RSS_KB)"
awk -v c="$CPU_S" -v m="$MAX_CPU_S" 'BEGIN {exit !(c <= m)}' && pass "CPU ${CPU_S} s (at most $MAX_CPU_S)" \
  || fail "CPU ${CPU_S} s (more than $MAX_CPU_S)"
[ "$(tm display -p -t huge '#{alternate_on}')" = 0 ] && pass "the terminal is given back" \
  || fail "the terminal is left on the alternate screen"

# 3. A frame that never ends, sent as fast as top reads: refused at the cap.
start_case endless endless
watch endless 10
stop endless
[ -s "$TMP/endless.result" ] && pass "top ends on a frame that never ends" || fail "top still runs after 10 s of one frame"
grep -q 'larger than' "$TMP/endless.err" && pass "and says why: $(head -c 300 "$TMP/endless.err")" \
  || fail "no message for the endless frame: $(head -c 300 "$TMP/endless.err")"
[ "$PEAK_KB" -le "$MAX_RSS_KB" ] && pass "peak memory ${PEAK_KB} KB (at most $MAX_RSS_KB)" \
  || fail "peak memory ${PEAK_KB} KB (more than $MAX_RSS_KB)"
awk -v c="$CPU_S" -v m="$MAX_CPU_S" 'BEGIN {exit !(c <= m)}' && pass "CPU ${CPU_S} s (at most $MAX_CPU_S)" \
  || fail "CPU ${CPU_S} s (more than $MAX_CPU_S)"

# 4. A stream that never completes an event (a comment every 100 ms): top does not wait
# forever on it.
start_case silent silent
watch silent 10
stop silent
[ -s "$TMP/silent.result" ] && pass "top ends when no tick comes" || fail "top still waits after 10 s without a tick"
grep -q 'tick for' "$TMP/silent.err" && pass "and says why: $(head -c 300 "$TMP/silent.err")" \
  || fail "no message for the missing ticks: $(head -c 300 "$TMP/silent.err")"
awk -v c="$CPU_S" -v m="$MAX_CPU_S" 'BEGIN {exit !(c <= m)}' && pass "CPU ${CPU_S} s (at most $MAX_CPU_S)" \
  || fail "CPU ${CPU_S} s (more than $MAX_CPU_S)"

summary
[ "$FAILED" = 0 ]
