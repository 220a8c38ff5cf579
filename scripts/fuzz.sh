#!/usr/bin/env bash
# Coverage-guided fuzzing of every decoder, of the request scanner, of the HTTP/1.1
# fast path's readers and of `tokentap inject`'s AdmissionReview and manifest input
# (cargo-fuzz, libFuzzer), each target for a fixed time budget. The
# checks are in fuzz/src/lib.rs: whole vs split decoding must agree, nothing may panic,
# the request scanner must agree with serde_json, and the fast path never forwards an
# ambiguous request (fuzz/src/fast_path.rs). A fixed-budget proptest run of the same
# checks is part of `cargo test` (tests/it/fuzz_decoders.rs, tests/it/fuzz_fast_path.rs,
# crates/inject/tests/hostile.rs for fuzz/src/inject.rs);
# this is the deeper, coverage-guided run.
#
#   scripts/fuzz.sh [--seconds N] [--target NAME]... [--jobs N] [--list]
#
#   --seconds N   budget per target (default 60)
#   --target NAME run only this target (repeatable; default: every target)
#   --jobs N      libFuzzer worker processes per target (default 1)
#   --list        list the targets and exit
#
# Seeds come from tests/fixtures (every recorded stream, plain and compressed) and are
# kept with what the fuzzer finds in fuzz/corpus/<target>/ (not committed). A crash
# leaves its input in fuzz/artifacts/<target>/; replay it with
#   RUSTC_BOOTSTRAP=1 cargo fuzz run <target> fuzz/artifacts/<target>/crash-...
#
# cargo-fuzz needs nightly-only flags; the stable toolchain accepts them with
# RUSTC_BOOTSTRAP=1, which this script sets. cargo-fuzz itself is installed from
# crates.io when missing. Prints one line per target (executions, corpus) and ends with
# `fuzz: N passed, M failed`.
set -uo pipefail
cd "$(dirname "$0")/.."

seconds=60
jobs=1
only=()
list=0
while [ $# -gt 0 ]; do
    case "$1" in
        --seconds) seconds="$2"; shift 2 ;;
        --target) only+=("$2"); shift 2 ;;
        --jobs) jobs="$2"; shift 2 ;;
        --list) list=1; shift ;;
        -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
        *) echo "fuzz.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

export RUSTC_BOOTSTRAP=1
targets=()
for f in fuzz/fuzz_targets/*.rs; do
    targets+=("$(basename "$f" .rs)")
done
if [ "$list" = 1 ]; then
    printf '%s\n' "${targets[@]}"
    exit 0
fi
if [ ${#only[@]} -gt 0 ]; then
    targets=("${only[@]}")
fi

if ! command -v cargo-fuzz >/dev/null 2>&1; then
    echo "==> installing cargo-fuzz"
    cargo install cargo-fuzz --locked || cargo install cargo-fuzz || {
        echo "fuzz: 0 passed, 1 failed (cannot install cargo-fuzz)"
        exit 1
    }
fi

echo "==> cargo fuzz build (every target: release, debug assertions, ASan)"
if ! cargo fuzz build >/tmp/tokentap-fuzz-build.log 2>&1; then
    tail -30 /tmp/tokentap-fuzz-build.log
    echo "fuzz: 0 passed, ${#targets[@]} failed (build failed)"
    exit 1
fi
root=$(pwd)
host=$(rustc -vV | sed -n 's/^host: //p')
bindir="fuzz/target/$host/release"

# --- seed corpora -------------------------------------------------------------------
# Input layouts are documented in fuzz/src/lib.rs. Indices follow Framing::ALL
# (sse, json, ndjson, json array; a gRPC dialect's two bits pick its grpc-encoding, 0 is
# identity) and Dialect::ALL (openai_chat, openai_completions, openai_responses,
# anthropic, gemini, ollama, tgi, triton, sglang_grpc, vllm_grpc, trtllm_grpc,
# triton_grpc); a stale index only makes a seed exercise another decoder.
dialect_index() {
    case "$1" in
        openai_chat) echo 0 ;; openai_completions) echo 1 ;; openai_responses) echo 2 ;;
        anthropic) echo 3 ;; gemini) echo 4 ;; ollama) echo 5 ;; tgi) echo 6 ;;
        triton) echo 7 ;; sglang_grpc) echo 8 ;; vllm_grpc) echo 9 ;;
        trtllm_grpc) echo 10 ;; triton_grpc) echo 11 ;; *) echo 0 ;;
    esac
}
# dialect of a fixture path
fixture_dialect() {
    local dir file
    dir=$(basename "$(dirname "$1")")
    file=$(basename "$1")
    case "$dir" in
        openai) case "$file" in completions*) echo openai_completions ;; *) echo openai_chat ;; esac ;;
        responses) echo openai_responses ;;
        *) echo "$dir" ;;
    esac
}
byte() { printf "\\x$(printf '%02x' "$1")"; }
seed_file() { # dir name header-bytes... < content
    local dir="$1" name="$2"
    shift 2
    mkdir -p "$dir"
    {
        for b in "$@"; do byte "$b"; done
        cat
    } >"$dir/$name"
}

for fixture in tests/fixtures/*/*; do
    case "$fixture" in *.golden|*.py) continue ;; esac
    dialect=$(fixture_dialect "$fixture")
    di=$(dialect_index "$dialect")
    name=$(echo "$fixture" | tr '/' '_')
    coding=""
    plain="$fixture"
    case "$fixture" in
        *.gz) coding=0; plain="${fixture%.gz}" ;;
        *.br) coding=2; plain="${fixture%.br}" ;;
        *.zst) coding=3; plain="${fixture%.zst}" ;;
    esac
    case "$plain" in
        *.sse) framings=(0); ctype=0 ;;
        *.ndjson) framings=(2); ctype=2 ;;
        *.json) framings=(1 3); ctype=1 ;;
        *.grpc)
            # decode_grpc: `[dialect | encoding << 2 | messages_here << 4 | limits << 5, ...]`,
            # the recorded stream as it is (identity), for its own gRPC dialect.
            seed_file fuzz/corpus/decode_grpc "$name" "$((di - 8))" 42 <"$fixture"
            framings=(0); ctype=0 ;;
        *) continue ;;
    esac
    if [ -n "$coding" ]; then
        seed_file fuzz/corpus/decode_compressed "$name" "$((coding | (di << 3)))" 42 "$ctype" <"$fixture"
        continue
    fi
    for framing in "${framings[@]}"; do
        [ -f "fuzz/fuzz_targets/decode_$dialect.rs" ] &&
            seed_file "fuzz/corpus/decode_$dialect" "$name.$framing" "$framing" 42 <"$fixture"
        seed_file fuzz/corpus/decode_any "$name.$framing" "$framing" 42 "$di" <"$fixture"
    done
    # Plaintext for the harness to compress (gzip, deflate, zstd).
    for c in 0 1 3; do
        seed_file fuzz/corpus/decode_compressed "$name.plain$c" "$((c | 4 | (di << 3)))" 42 "$ctype" <"$fixture"
    done
done
for body in \
    '{"model":"llama-3.1-8b","messages":[{"role":"user","content":"hi"}],"stream":true}' \
    '{"messages":[{"model":"nested","content":"\"model\": \"decoy\""}],"stream":false,"model":"real"}' \
    '{"stream":true,"model":"org\/name\u0041"}' \
    '{"model": 42, "stream": "yes"}' \
    '[{"model":"not an object"}]'; do
    printf '%s' "$body" | seed_file fuzz/corpus/request_scanner "seed$(printf '%s' "$body" | cksum | cut -d' ' -f1)" 7
done

# The fast path's readers: `[selector, split seed, bytes...]` (fuzz/src/fast_path.rs).
fast_seed=0
for message in \
    'GET /v1/models HTTP/1.1\r\nHost: a\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n' \
    'POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{}' \
    'POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n2;x=y\r\n{}\r\n0\r\nX-T: 1\r\n\r\n' \
    'GET / HTTP/1.1\r\nHost: a\r\nConnection: close, x-a\r\nX-A: 1\r\nTE: trailers\r\n\r\n' \
    'HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello' \
    'HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n' \
    'HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: {}\n\n'; do
    fast_seed=$((fast_seed + 1))
    printf '%b' "$message" | seed_file fuzz/corpus/fast_path "seed$fast_seed" $((fast_seed % 4)) 7
done

# `tokentap inject` (fuzz/src/inject.rs): `[mode, bytes...]`; mode 2 is manifests text
# (the CLI fixtures and their outputs), mode 1 a pod inside a well-formed review.
for manifest in crates/inject/tests/fixtures/*.yaml; do
    seed_file fuzz/corpus/inject_admission "$(basename "$manifest")" 2 <"$manifest"
done
printf '%s' '{"metadata":{"name":"p","labels":{"app":"x"}},"spec":{"containers":[{"name":"e","image":"e:1","ports":[{"name":"http","containerPort":8000}]}]}}' |
    seed_file fuzz/corpus/inject_admission pod.json 1

# --- run ------------------------------------------------------------------------------
# One target per core at a time (libFuzzer is one process per target here): each still
# gets its whole time budget, and the run takes about the budget times the targets over
# the cores. Each target's line is printed in the list's order.
fuzz_one() { # target -> "line" in $results/<target>, exit status ok or not
    local target=$1 dict=fuzz/dicts/wire.dict
    [ "$target" = request_scanner ] && dict=fuzz/dicts/request.dict
    [ "$target" = fast_path ] && dict=fuzz/dicts/http.dict
    [ "$target" = inject_admission ] && dict=fuzz/dicts/inject.dict
    mkdir -p "fuzz/corpus/$target" "fuzz/artifacts/$target"
    local log="/tmp/tokentap-fuzz-$target.log"
    local start status took execs files bytes rate result scratch
    start=$(date +%s)
    # The binaries built above (`cargo fuzz run` would rebuild, and could pick up a
    # half-edited tree mid-run). With --jobs > 1 libFuzzer writes fuzz-N.log files into
    # its working directory: run it in a scratch one.
    local parallel=()
    [ "$jobs" -gt 1 ] && parallel=(-jobs="$jobs" -workers="$jobs")
    scratch=$(mktemp -d)
    (
        cd "$scratch" &&
            ASAN_OPTIONS="detect_odr_violation=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}" \
                "$root/$bindir/$target" "$root/fuzz/corpus/$target" \
                -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
                -dict="$root/$dict" -print_final_stats=1 ${parallel[@]+"${parallel[@]}"} \
                -artifact_prefix="$root/fuzz/artifacts/$target/"
    ) >"$log" 2>&1
    status=$?
    took=$(($(date +%s) - start))
    cat "$scratch"/fuzz-*.log >>"$log" 2>/dev/null
    rm -rf "$scratch"
    execs=$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$log" | awk '{s+=$2} END {print s+0}')
    files=$(find "fuzz/corpus/$target" -type f | wc -l)
    bytes=$(du -sb "fuzz/corpus/$target" | cut -f1)
    rate=$((execs / (seconds > 0 ? seconds : 1)))
    if [ "$status" -eq 0 ] && ! grep -q -E '^==[0-9]+==ERROR|panicked at|deadly signal' "$log"; then
        result=ok
    else
        result="FAILED (see $log)"
    fi
    {
        printf '%-28s %8s %12s %10s %8s %10s  %s\n' "$target" "$took" "$execs" "$rate" "$files" "$bytes" "$result"
        if [ "$result" != ok ]; then
            grep -E 'panicked at|ERROR|SUMMARY|Test unit written' "$log" | head -5 | sed 's/^/    /'
        fi
    } >"$results/$target"
    [ "$result" = ok ]
}

cores=$(nproc 2>/dev/null || echo 1)
side_by_side=$((cores / jobs > 0 ? cores / jobs : 1))
results=$(mktemp -d)
passed=0
failed=0
printf '\n%-28s %8s %12s %10s %8s %10s  %s\n' target seconds executions exec/s corpus bytes result
running=()
finish() { # wait for the oldest running target, print its line and count it
    if wait "${running[0]}"; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
    cat "$results/${names[0]}"
    running=("${running[@]:1}")
    names=("${names[@]:1}")
}
names=()
for target in "${targets[@]}"; do
    [ "${#running[@]}" -ge "$side_by_side" ] && finish
    fuzz_one "$target" &
    running+=($!)
    names+=("$target")
done
while [ "${#running[@]}" -gt 0 ]; do finish; done
rm -rf "$results"
echo
echo "fuzz: ${passed} passed, ${failed} failed"
[ "$failed" -eq 0 ]
