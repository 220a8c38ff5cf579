#!/usr/bin/env bash
# The instruction budget: counts tokentap's own work per streamed event and per request
# under valgrind (benches/budget.rs, release build), prints each count beside its budget
# in benches/budget.toml, and fails when one grew past its budget by more than the
# tolerance the file states (measured above the run-to-run spread; see the file).
#
#   bash scripts/budget.sh             build, count, compare (exit 1 if over budget)
#   bash scripts/budget.sh --update    write the counts into benches/budget.toml
#   bash scripts/budget.sh --runs 5    count 5 times, print each run's figures (the spread),
#                                      and compare (or --update with) their medians
#   bash scripts/budget.sh --no-build  use the bench binary already built
#   bash scripts/budget.sh relay/      only the cases whose name contains `relay/`
#   bash scripts/budget.sh --process   count a whole tokentap process (release build)
#                                      serving requests from the simulator, for the relay,
#                                      hyper's HTTP/1.1 and h2c: what the benches leave out
#                                      (sockets, hyper's HTTP, the runtime), printed, not
#                                      held to a budget (threads make it less exact), with
#                                      the simulated cache misses (I1: the code's footprint)
#                                      and branch mispredictions
#     --streams N                      ... with N streams at once (default 4; 1000 is the
#                                      A/B's load: whose code and data stay in cache)
#     --binary PATH                    ... of another build (e.g. an older commit's, or
#                                      target/release/examples/relay_floor for `relay`)
#     --i1 KIB                         ... with an L1 instruction cache of KIB KiB
#                                      (default 32; this machine's cores have 64)
#     --ll MIB                         ... with a last-level cache of MIB MiB, a power of
#                                      two (default 8, which holds every stream's
#                                      state; 2 is this machine's L2 per core, where
#                                      1,000 streams' state meets memory)
#     --lines N                        ... and the code run per event and per request,
#                                      in cache lines, with the N functions that run the
#                                      most per event (scripts/bench/callgrind_process.py)
#     --keep DIR                       ... and keep the callgrind dumps in DIR (PATH.out.1
#                                      after the short requests, PATH.out.2 after the
#                                      long), to read by function and source line with
#                                      callgrind_annotate, with valgrind's logs
#     relay hyper h2c                  ... only these paths (default: all three)
#
# A change that has to cost more raises the budget in the same commit (--update); a
# change that saves lowers it (the script says when it can). How a change's cost is
# judged: docs/PERFORMANCE.md, "How a change's cost is judged".
set -euo pipefail
cd "$(dirname "$0")/.."

update=0
process=0
runs=3
build=1
streams=4
binary=
i1=32
ll=8
lines=0
keep=
filters=()
process_only=()
benches_only=()
while [ $# -gt 0 ]; do
    case "$1" in
        --update) update=1; benches_only+=(--update) ;;
        --runs) runs="$2"; benches_only+=(--runs); shift ;;
        --no-build) build=0 ;;
        --process) process=1 ;;
        --streams) streams="$2"; process_only+=(--streams); shift ;;
        --binary) binary="$2"; process_only+=(--binary); shift ;;
        --i1) i1="$2"; process_only+=(--i1); shift ;;
        --ll) ll="$2"; process_only+=(--ll); shift ;;
        --lines) lines="$2"; process_only+=(--lines); shift ;;
        --keep) keep="$2"; process_only+=(--keep); shift ;;
        -h|--help) sed -n '2,/^[^#]/{/^#/p}' "$0"; exit 0 ;;
        -*) echo "budget.sh: unknown option $1" >&2; exit 2 ;;
        *) filters+=("$1") ;;
    esac
    shift
done

# An option of the other mode is refused, not ignored.
if [ "$process" = 0 ] && [ ${#process_only[@]} -gt 0 ]; then
    echo "budget.sh: ${process_only[*]}: only with --process (a whole process's count)" >&2; exit 2
fi
if [ "$process" = 1 ] && [ ${#benches_only[@]} -gt 0 ]; then
    echo "budget.sh: ${benches_only[*]}: only for the benches' budget, not with --process" >&2; exit 2
fi

# The simulated caches of --process, checked before anything is built: 64 sets of
# 64-byte lines in the L1i, as the L1s of x86 cores have (the size sets the ways), and 16
# ways in the LL, whose sets valgrind wants a power of two of.
i1_ways=$((i1 / 4))
if [ "$i1_ways" -lt 1 ] || [ $((i1 % 4)) != 0 ]; then
    echo "budget.sh: --i1 takes a multiple of 4 KiB" >&2; exit 2
fi
if [ "$ll" -lt 1 ] || [ $((ll & (ll - 1))) != 0 ]; then
    echo "budget.sh: --ll takes a power of two of MiB" >&2; exit 2
fi

if ! command -v valgrind >/dev/null; then
    apt-get update -qq >/dev/null 2>&1
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null 2>&1 \
        || { echo "budget.sh: valgrind is not installed and cannot be (apt-get install valgrind)" >&2; exit 2; }
fi

if [ "$process" = 1 ]; then
    # A whole process: tokentap under callgrind behind the simulator, tokentap-bench as
    # the client (both outside valgrind). The counters are zeroed after a warm-up, then
    # dumped after R requests of S tokens and again after R of L: per request = the first
    # / R, per token event = (the second - the first) / ((L - S) R). The caches are
    # simulated as in the benches (32 KiB L1s, 8 MiB LL; --i1 sets the L1i's size, to
    # see where an event's code stops fitting: docs/PERFORMANCE.md, "The instruction
    # cache's cliff"; --ll the LL's, to count the lines an event reads from memory when
    # the streams' state does not all fit, which callgrind counts before any prefetch),
    # and so are the branch predictors (mispredictions per event). With many streams the
    # simulator's tokens come slowly enough (0.6 ms per stream between a stream's tokens)
    # that tokentap under valgrind, on a busy machine too, keeps up and reads each event
    # alone, as it does at full speed; a count far under the benches' says it did not.
    [ "$build" = 1 ] && [ -z "$binary" ] && cargo build --release -p tokentap -p tokentap-sim --bin tokentap --bin tokentap-bench >&2
    [ "$build" = 1 ] && [ -n "$binary" ] && cargo build --release -p tokentap-sim --bin tokentap-bench >&2
    tt=${binary:-target/release/tokentap}
    bench=target/release/tokentap-bench
    if [ "$streams" -le 16 ]; then
        requests=${BUDGET_PROCESS_REQUESTS:-40} short=40 long=240 itl=2
    else
        requests=$streams short=10 long=30 itl=$((streams * 6 / 10))
    fi
    out=$(mktemp -d "${TMPDIR:-/tmp}/tokentap-budget.XXXXXX")
    pids=()
    cleanup() {
        for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
        if [ -n "$keep" ]; then
            mkdir -p "$keep" && cp "$out"/*.out.* "$out"/*.log "$keep"/ 2>/dev/null || true
        fi
        rm -rf "$out"
    }
    trap cleanup EXIT
    port=${BUDGET_PROCESS_PORT:-19870}
    target/release/tokentap sim --listen "127.0.0.1:$port" --ttft 5ms --itl "${itl}ms" --tokens "$long" >"$out/sim.log" 2>&1 &
    pids+=($!)
    # Everything the process needs is in its config, so that the floor relay, which reads
    # only `listen` and `upstream.url`, runs the same way.
    for path in relay hyper h2c; do
        printf 'listen: 127.0.0.1:%d\nadmin: 127.0.0.1:%d\nupstream:\n  url: http://127.0.0.1:%d\n' \
            $((port + 1)) $((port + 2)) "$port" >"$out/$path.yaml"
    done
    printf 'proxy:\n  http1_fast_path: false\n' >>"$out/hyper.yaml"
    dump_instr=()
    [ "$lines" -gt 0 ] && dump_instr=(--dump-instr=yes)
    echo "$tt, $streams streams at once, $requests requests of $short and of $long tokens, ${i1} KiB L1i, ${ll} MiB LL:"
    paths=(relay hyper h2c)
    [ ${#filters[@]} -gt 0 ] && paths=("${filters[@]}")
    for path in "${paths[@]}"; do
        client=()
        [ "$path" = h2c ] && client=(--http2 --h2-connections 1)
        valgrind --tool=callgrind --cache-sim=yes --branch-sim=yes --I1=$((i1 * 1024)),"$i1_ways",64 \
            --D1=32768,8,64 --LL=$((ll * 1048576)),16,64 ${dump_instr[@]+"${dump_instr[@]}"} \
            --callgrind-out-file="$out/$path.out" \
            "$tt" --config "$out/$path.yaml" >"$out/$path.log" 2>&1 &
        vg=$!
        pids+=("$vg")
        for _ in $(seq 1 120); do
            (exec 3<>"/dev/tcp/127.0.0.1/$((port + 1))") 2>/dev/null && break
            sleep 0.5
        done
        load() {
            "$bench" run --url "http://127.0.0.1:$((port + 1))" -c "$streams" --requests "$requests" \
                --max-tokens "$1" --timeout 300s --duration 600s ${client[@]+"${client[@]}"} >/dev/null
        }
        load "$short"
        callgrind_control -z "$vg" >/dev/null 2>&1
        load "$short"
        callgrind_control -d "$vg" >/dev/null 2>&1
        load "$long"
        callgrind_control -d "$vg" >/dev/null 2>&1
        kill "$vg"; wait "$vg" 2>/dev/null || true
        lines_arg=()
        [ "$lines" -gt 0 ] && lines_arg=(--lines "$lines")
        python3 scripts/bench/callgrind_process.py "$out" "$path" "$requests" "$short" "$long" \
            ${lines_arg[@]+"${lines_arg[@]}"}
    done
    exit 0
fi

# `cargo bench` builds with the bench profile, which is the release profile: the counts
# are of the code that ships.
if [ "$build" = 1 ]; then
    cargo bench --bench budget --no-run >&2
fi
bin=$(cargo bench --bench budget --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "budget" and m.get("executable"):
        print(m["executable"])')
[ -x "$bin" ] || { echo "budget.sh: no bench binary (drop --no-build)" >&2; exit 2; }

out=$(mktemp -d "${TMPDIR:-/tmp}/tokentap-budget.XXXXXX")
trap 'rm -rf "$out"' EXIT
# The runs go side by side (a count does not depend on the load; the bench's pause only
# grows under it), so the check takes the time of about one run per core.
count() {
    local run=$1
    mkdir -p "$out/$run"
    # Counted only inside `budget_measure`, a dump after each call (one measured run each).
    # The simulated caches are fixed (32 KiB L1s, 8 MiB LL), not read from the host, so
    # the miss counts compare across machines.
    valgrind --tool=callgrind --cache-sim=yes --collect-atstart=no \
        --I1=32768,8,64 --D1=32768,8,64 --LL=8388608,16,64 \
        --toggle-collect=budget_measure --dump-after=budget_measure \
        --callgrind-out-file="$out/$run/callgrind.out" \
        "$bin" ${filters[@]+"${filters[@]}"} >"$out/$run/measures" 2>"$out/$run/valgrind.log" \
        || { cat "$out/$run/valgrind.log" >&2; return 2; }
}
counting=()
for run in $(seq 1 "$runs"); do
    count "$run" &
    counting+=($!)
done
for pid in "${counting[@]}"; do
    wait "$pid" || exit 2
done

python3 - "$out" "$runs" "$update" "${#filters[@]}" <<'EOF'
import os, re, sys, tomllib

sys.path.insert(0, "scripts/bench")
from callgrind_process import totals

out, runs, update = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
filtered = sys.argv[4] != "0"
BUDGET = "benches/budget.toml"

def counts(run_dir):
    """Each measured call's events, by (case, token events), per request."""
    measures = []
    for line in open(os.path.join(run_dir, "measures")):
        m = re.match(r"measure (\d+) (\S+) events=(\d+) requests=(\d+)", line)
        if m:
            measures.append((int(m[1]), m[2], int(m[3]), int(m[4])))
    found = {}
    for index, case, events, requests in measures:
        counted = totals(os.path.join(run_dir, f"callgrind.out.{index}"))
        found[(case, events)] = {n: v / requests for n, v in counted.items()}
    return found

def derived(found):
    """Per request (the shorter run) and per event (the difference of the two runs)."""
    figures = {}
    cases = sorted({case for case, _ in found})
    for case in cases:
        runs = sorted(events for c, events in found if c == case)
        short, long_ = runs[0], runs[-1]
        a, b = found[(case, short)], found[(case, long_)]
        figures[f"{case}/request"] = a
        figures[f"{case}/event"] = {n: (b[n] - a[n]) / (long_ - short) for n in a}
    return figures

all_runs = [derived(counts(os.path.join(out, str(r)))) for r in range(1, runs + 1)]
# With several runs, each figure is their median.
figures = {
    name: {event: sorted(r[name][event] for r in all_runs)[runs // 2] for event in f}
    for name, f in all_runs[0].items()
}
# A filter that names no case would otherwise read as "within budget".
if not figures:
    print("budget.sh: no bench case matched " + ("the filters" if filtered else "(none ran)"), file=sys.stderr)
    sys.exit(2)

def misses(f):
    d1 = f.get("D1mr", 0) + f.get("D1mw", 0)
    ll = f.get("ILmr", 0) + f.get("DLmr", 0) + f.get("DLmw", 0)
    return d1, ll

if runs > 1:
    print("instructions of each run (the spread is max/min - 1):")
    for name in figures:
        irs = [r[name]["Ir"] for r in all_runs]
        spread = max(irs) / min(irs) - 1 if min(irs) > 0 else 0.0
        print(f"  {name:42} " + " ".join(f"{v:12.1f}" for v in irs) + f"   spread {spread * 100:.3f}%")
    print()

budget = tomllib.load(open(BUDGET, "rb")) if os.path.exists(BUDGET) else {}
tolerances = budget.get("tolerance", {})
entries = budget.get("bench", {})
# A bench that is budgeted but no longer runs would otherwise pass unseen.
unmeasured = [] if filtered else [n for n in entries if n not in figures]

def tolerance(name):
    """The tolerance of a per-event or per-request figure."""
    return tolerances.get(name.rsplit("/", 1)[-1], 0.01)

over, lower = [], []
print(f"{'bench':42} {'instructions':>12} {'budget':>10} {'change':>8} {'D1 miss':>8} {'LL miss':>8}")
for name, f in figures.items():
    ir = f["Ir"]
    d1, ll = misses(f)
    limit = entries.get(name, {}).get("instructions")
    if limit is None:
        print(f"{name:42} {ir:12.1f} {'-':>10} {'new':>8} {d1:8.1f} {ll:8.1f}")
        continue
    change = ir / limit - 1 if limit else 0.0
    mark = ""
    if ir > limit * (1 + tolerance(name)):
        over.append(name)
        mark = "  OVER BUDGET"
    elif ir < limit * (1 - tolerance(name)):
        lower.append(name)
        mark = "  (budget can be lowered)"
    print(f"{name:42} {ir:12.1f} {limit:10} {change * 100:+7.2f}% {d1:8.1f} {ll:8.1f}{mark}")
unsaid = [n for n, e in entries.items() if not e.get("buys")]

if update:
    text = open(BUDGET).read() if os.path.exists(BUDGET) else ""
    for name, f in figures.items():
        value = round(f["Ir"])
        header = f'[bench."{name}"]'
        if header in text:
            start = text.index(header)
            text = text[:start] + re.sub(r"instructions = \d+", f"instructions = {value}", text[start:], count=1)
        else:
            text += f'\n{header}\ninstructions = {value}\nbuys = ""\n'
    open(BUDGET, "w").write(text)
    print(f"\nwrote the counts into {BUDGET}")
    print("docs/PERFORMANCE.md's table of bench counts quotes them as \"now\": update it too "
          "(tests/it/docs.rs holds the two equal)")
    if any(f'[bench."{n}"]' not in open(BUDGET).read() or not entries.get(n, {}).get("buys") for n in figures):
        print("say in each new entry's `buys` what its instructions buy")
    sys.exit(0)

print("\ntolerance: " + ", ".join(f"{k} {v * 100:.1f}%" for k, v in tolerances.items()) + " (benches/budget.toml)")
if lower:
    print("cheaper than budgeted by more than the tolerance (lower it: bash scripts/budget.sh --update): " + ", ".join(lower))
if unsaid:
    print("entries that do not say what their instructions buy: " + ", ".join(unsaid))
if over:
    print("OVER BUDGET: " + ", ".join(over))
    print("A change that has to cost this raises the budget in the same commit (--update) and says why.")
    sys.exit(1)
if unmeasured:
    print("budgeted but not measured (remove the entry with the bench, or bring the bench back): " + ", ".join(unmeasured))
    sys.exit(1)
if unsaid:
    sys.exit(1)
print("within budget")
EOF
