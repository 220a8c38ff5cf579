#!/usr/bin/env bash
# Interleaved A/B of tokentap builds (and nginx) behind one simulator: CPU per event and
# per-event latency, round-robin, so slow drift of a shared machine hits every target
# alike. For comparing two builds of tokentap; the full side-by-side table is bench.sh.
#
#   bash scripts/bench/ab.sh -c 1000 -r 3 before=/tmp/tokentap-old after=target/release/tokentap
#
# With the per-event floor of a purpose-built relay (`cargo build --release --example
# relay_floor` first; tokentap goes first, as the first target also runs the simulator):
#
#   bash scripts/bench/ab.sh tokentap=target/release/tokentap floor=target/release/examples/relay_floor
#
# The fast path on and off in one build (`--hyper NAME` turns `proxy.http1_fast_path`
# off for target NAME, `--fast NAME` on, for builds from before it was the default;
# both repeatable):
#
#   bash scripts/bench/ab.sh -c 1000 -r 3 --no-nginx --hyper off off=target/release/tokentap on=target/release/tokentap
#
# A feature on and off in one build: `--yaml NAME=FILE` appends FILE's YAML to target
# NAME's config (repeatable), e.g. the OTLP push with spans against a collector already
# listening (scripts/ops/otlp_receiver.py):
#
#   bash scripts/bench/ab.sh -c 1000 -r 3 --no-nginx --yaml on=/tmp/otlp-spans.yaml \
#       off=target/release/tokentap on=target/release/tokentap
#
# The live view's cost in one build (`--no-ui NAME` switches `ui.enabled` off for target
# NAME; `--viewer NAME` keeps one SSE client on its `/api/live/stream` through the run, a
# curl whose own CPU is not counted; both repeatable):
#
#   bash scripts/bench/ab.sh -c 1000 -r 3 --no-nginx --ports 19100 --no-ui off --viewer one \
#       off=target/release/tokentap none=target/release/tokentap one=target/release/tokentap
#
# Options: -c streams (default 1000), -r rounds (default 3), --no-nginx, --samples,
# --sample-period NS, --together, --fast NAME, --hyper NAME,
# --yaml NAME=FILE, --no-ui NAME, --viewer NAME, --ports BASE (default 18000: the simulator's
# port; nginx BASE+82, targets from BASE+310), --duration SECONDS (of each run's measured
# window, default 6), --tokens N (per stream, default 40: with many more, a run's window
# holds few requests' starts and ends, and the CPU per event is the per-event work alone).
# Prints one line per run: target, CPU per event and its user and system parts, latency
# p50/p99.
#
# The total is exact: the nanoseconds the scheduler ran the process's threads
# (/proc/PID/task/TID/schedstat, thread by thread, so a thread that starts in the run counts
# whole). The user/system split is not: a kernel with tick accounting (CONFIG_TICK_CPU_ACCOUNTING,
# as this machine's, HZ=250) charges each whole tick to the mode it lands in, so the split
# is a sample of the ticks that hit the process, printed with each line ("split by N
# ticks": a few dozen per run at 100 streams). How far that carries: docs/PERFORMANCE.md,
# "How a change's cost is judged".
#
# With --samples the split comes from `perf record -e cpu-clock -c 1000000` of each target
# through its measured window instead (a sample per millisecond of its threads' CPU, user or
# kernel by the sampled address: about four times the ticks, and not tied to the tick), and
# each run's samples stay in the run directory as NAME.rROUND.data, for
# `scripts/bench/samples_table.py` to put the user time on functions. The sampling costs CPU
# itself (in this VM 1.5-4 us per event at 1,000 streams, most of it the kernel's), so
# the totals of such a run are compared with each other, not with a run without it.
# --sample-period NS samples every NS ns of CPU instead: at 100 streams a 12 s window holds
# about 500 samples at the default, whose user share is then itself off by ~7% (one
# standard deviation); 100000 gives ten times the samples, for more sampling cost.
#
# --together runs the targets' loads at the same time in each round (the simulator
# directly not measured), each with -c streams of its own, instead of one after another:
# whatever the shared machine does to one target in a round it does to the others too.
# Each then shares the cores with the others' loads, so its figures are compared only
# with the other targets' of the same run.
set -euo pipefail
cd "$(dirname "$0")/../.."
C=1000 ROUNDS=3 DURATION=6 WARMUP=2 TOKENS=40 NGINX=1 SAMPLES=0 PERIOD=1000000 TOGETHER=0 TARGETS=() SWITCHES=() EXTRA=() BASE=18000 NO_UI=() VIEWERS=()
while [ $# -gt 0 ]; do
    case "$1" in
        -c) C=$2; shift ;;
        --fast) SWITCHES+=("$2=true"); shift ;;
        --hyper) SWITCHES+=("$2=false"); shift ;;
        --yaml) EXTRA+=("$2"); shift ;;
        --no-ui) NO_UI+=("$2"); shift ;;
        --viewer) VIEWERS+=("$2"); shift ;;
        --ports) BASE=$2; shift ;;
        --duration) DURATION=$2; shift ;;
        --tokens) TOKENS=$2; shift ;;
        -r) ROUNDS=$2; shift ;;
        --no-nginx) NGINX=0 ;;
        --samples) SAMPLES=1 ;;
        --sample-period) SAMPLES=1 PERIOD=$2; shift ;;
        --together) TOGETHER=1 ;;
        *=*) TARGETS+=("$1") ;;
        *) echo "ab.sh: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
[ ${#TARGETS[@]} -gt 0 ] || { echo "ab.sh: name=BINARY targets needed" >&2; exit 2; }
BENCH=target/release/tokentap-bench
SIM_BIN=${TARGETS[0]#*=}
RUN=$(mktemp -d /tmp/tokentap-ab.XXXXXX)
PIDS_ALL=()
cleanup() {
    for p in "${PIDS_ALL[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT

wait_port() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return; sleep 0.1; done; echo "ab.sh: port $1 never opened" >&2; exit 1; }

"$SIM_BIN" sim --listen "127.0.0.1:$BASE" --stamp --ttft 50ms --itl 50ms --tokens "$TOKENS" \
    --models sim-model > "$RUN/sim.log" 2>&1 &
PIDS_ALL+=($!)
declare -A PID PORT
PID[direct]=$!; PORT[direct]=$BASE
NAMES=(direct)
port=$((BASE + 310))
for t in "${TARGETS[@]}"; do
    name=${t%%=*}; bin=${t#*=}
    printf 'listen: 127.0.0.1:%d\nadmin: 127.0.0.1:%d\nupstream:\n  url: http://127.0.0.1:%d\nlog:\n  level: warn\n' \
        "$port" $((port + 1)) "$BASE" > "$RUN/$name.yaml"
    for s in "${SWITCHES[@]}"; do
        if [ "${s%=*}" = "$name" ]; then printf 'proxy:\n  http1_fast_path: %s\n' "${s##*=}" >> "$RUN/$name.yaml"; fi
    done
    for e in "${EXTRA[@]}"; do
        if [ "${e%%=*}" = "$name" ]; then cat "${e#*=}" >> "$RUN/$name.yaml"; fi
    done
    for n in "${NO_UI[@]}"; do
        if [ "$n" = "$name" ]; then printf 'ui:\n  enabled: false\n' >> "$RUN/$name.yaml"; fi
    done
    # The live view on the port after the admin port (a build before ui.listen ignores it).
    TOKENTAP_UI_LISTEN=127.0.0.1:$((port + 2)) "$bin" --config "$RUN/$name.yaml" > "$RUN/$name.log" 2>&1 &
    PIDS_ALL+=($!); PID[$name]=$!; PORT[$name]=$port; NAMES+=("$name")
    port=$((port + 3))
done
if [ "$NGINX" = 1 ]; then
    sed -e "s#@RUN@#$RUN#g" -e "s#@NOFILE@#4096#g" -e "s#@WORKER_CONNECTIONS@#4096#g" \
        -e "s#@SIM_PORT@#$BASE#g" -e "s#@PORT@#$((BASE + 82))#g" -e "s#@H2_PORT@#$((BASE + 83))#g" \
        scripts/bench/nginx.conf.in > "$RUN/nginx.conf"
    nginx -c "$RUN/nginx.conf" -e "$RUN/nginx-error.log" > "$RUN/nginx.log" 2>&1 &
    NGINX_MASTER=$!
    PIDS_ALL+=("$NGINX_MASTER"); PORT[nginx]=$((BASE + 82)); NAMES+=(nginx)
fi
for name in "${NAMES[@]}"; do wait_port "${PORT[$name]}"; done
for v in "${VIEWERS[@]}"; do
    admin=$((${PORT[$v]} + 1))
    wait_port "$admin"
    # Its own listener (ui.listen); on the admin port in a build before it.
    live=$((${PORT[$v]} + 2))
    (exec 3<>"/dev/tcp/127.0.0.1/$live") 2>/dev/null || live=$admin
    curl -sN "http://127.0.0.1:$live/api/live/stream?window=60" > "$RUN/viewer-$v.sse" 2>/dev/null &
    PIDS_ALL+=($!)
done
# nginx's CPU is its master's and its workers'.
[ "$NGINX" = 1 ] && PID[nginx]="$NGINX_MASTER $(pgrep -P "$NGINX_MASTER" | tr '\n' ' ')"

# User and system clock ticks of the processes in $1, as "user sys".
ticks() { local u=0 s=0 p; for p in $1; do read -r pu ps < <(awk '{print $14, $15}' "/proc/$p/stat"); u=$((u + pu)); s=$((s + ps)); done; echo "$u $s"; }
# Nanoseconds on a CPU of each thread of the processes in $1, as "TID:NS,TID:NS...".
ran_ns() {
    local p t ns _
    for p in $1; do
        for t in /proc/"$p"/task/*; do
            { read -r ns _ < "$t/schedstat"; } 2>/dev/null && printf '%s:%s,' "${t##*/}" "$ns"
        done
    done
}
# Measure target $1 in round $2, and print its line.
measure() {
    local name=$1 r=$2 t0 t1 n0 n1 out SAMPLER
    t0=$(ticks "${PID[$name]}") n0=$(ran_ns "${PID[$name]}")
    if [ "$SAMPLES" = 1 ]; then
        # Through the measured window only (the bench records after its warm-up).
        (sleep "$WARMUP" && exec perf record -q -e cpu-clock -c "$PERIOD" -p "$(echo ${PID[$name]} | tr ' ' ,)" \
            -o "$RUN/$name.r$r.data" -- sleep "$DURATION" > /dev/null 2>&1) &
        SAMPLER=$!
    fi
    out=$("$BENCH" run --url "http://127.0.0.1:${PORT[$name]}" -c "$C" --duration "${DURATION}s" \
        --warmup "${WARMUP}s" --ramp 1s --max-tokens "$TOKENS" --label "ab/$name/r$r" 2>/dev/null | tail -1)
    t1=$(ticks "${PID[$name]}") n1=$(ran_ns "${PID[$name]}")
    if [ "$SAMPLES" = 1 ]; then
        wait "$SAMPLER" || true
        # "user kernel" sample counts.
        t0="0 0" t1=$(perf script -i "$RUN/$name.r$r.data" -F ip 2>/dev/null \
            | awk '{ if ($1 ~ /^ffff/) k++; else u++ } END { print u + 0, k + 0 }')
    fi
    python3 - "$name" "$t0" "$t1" "$out" "$C" "$r" "$n0" "$n1" "$([ "$SAMPLES" = 1 ] && echo samples || echo ticks)" "$RUN" <<'PY'
import json, sys
name, t0, t1, out, c, r = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), json.loads(sys.argv[4]), sys.argv[5], sys.argv[6]
def threads(arg):
    return {tid: int(ns) for tid, ns in (p.split(":") for p in arg.split(",") if p)}
before, after = threads(sys.argv[7]), threads(sys.argv[8])
# A thread gone before the end loses its last part; one born in the run counts whole.
ran_us = sum(ns - before.get(tid, 0) for tid, ns in after.items()) / 1e3
events = out["events_all"]
if sys.argv[9] == "samples":
    with open(f"{sys.argv[10]}/events.txt", "a") as f:
        f.write(f"{name} {r} {events}\n")
u, k = (int(b) - int(a) for a, b in zip(t0, t1))
user_share = u / (u + k) if u + k else float("nan")
how = f"split by {u + k} {sys.argv[9]}"
total = ran_us / events if events else float("nan")
lat = out["latency_us"]
print(f"c{c} r{r} {name:10s} cpu/event {total:6.2f} us (user {total * user_share:5.2f} sys {total * (1 - user_share):5.2f})  "
      f"latency p50 {lat['p50']:7.0f} p99 {lat['p99']:8.0f} us  "
      f"events/s {out['events_per_s']:.0f} errors {out['errors']}  {how}", flush=True)
PY
}
for r in $(seq "$ROUNDS"); do
    if [ "$TOGETHER" = 1 ]; then
        jobs_=()
        for name in "${NAMES[@]}"; do
            [ "$name" = direct ] && continue
            measure "$name" "$r" > "$RUN/line.$name.r$r" &
            jobs_+=($!)
        done
        wait "${jobs_[@]}"
        for name in "${NAMES[@]}"; do [ "$name" = direct ] || cat "$RUN/line.$name.r$r"; done
    else
        for name in "${NAMES[@]}"; do measure "$name" "$r"; done
    fi
done
for v in "${VIEWERS[@]}"; do
    echo "viewer on $v: $(grep -c '^event: tick' "$RUN/viewer-$v.sse") ticks and $(grep -c '^event: requests' "$RUN/viewer-$v.sse") requests events received"
done
[ "$SAMPLES" = 1 ] && echo "samples: $RUN (python3 scripts/bench/samples_table.py $RUN NAME...)"
