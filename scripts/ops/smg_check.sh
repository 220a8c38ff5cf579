#!/usr/bin/env bash
# The SGLang Model Gateway (`smg`, PyPI) through tokentap to `tokentap sim`'s gRPC engines
# (issue 25): smg -> tokentap (h2c) -> sim. smg runs in IGW mode (the gRPC router, no
# startup workers); the simulator is registered through smg's POST /workers three times in
# turn: with its runtime detected (smg probes the SGLang HealthCheck first and drives it as
# SGLang, as it does for `--worker-urls grpc://...`), then as `runtime_type` vllm and trtllm.
# Each time a streamed OpenAI chat completion goes to smg, and tokentap's /metrics must have
# counted that engine's Generate call with exact token counts (its access log names the
# service and dialect).
#
#     scripts/ops/smg_check.sh [--tokentap target/debug/tokentap] [--no-install] [--keep]
#
# Nothing is downloaded but the pip packages `smg` and `tokenizers` (installed only if
# missing): smg needs a tokenizer, so a tiny WordLevel one (ids 3..31999 are the words
# t3..t31999, as the simulator emits ids 100, 101, ...) is written to a temporary directory
# with a chat template. The simulator serves its model under that directory's path: smg
# loads the tokenizer for a gRPC worker's model from the `tokenizer_path` its GetModelInfo
# answers (the sim answers the model name) and, failing that, from the worker's GetTokenizer
# (the sim does not serve it) -- a plain name like `tiny` is looked up on the HuggingFace
# hub, and the model's requests answer 503 tokenizer_load_failed.
#
# smg also calls GetServerInfo, GetLoads and SubscribeKvEvents, which the sim answers
# UNIMPLEMENTED; smg logs a warning for each and carries on (they pass through tokentap
# as passthrough calls, like the HealthCheck probes of every engine smg knows).
#
# Exit 0: every check passed; 1: a check failed; 77: smg or tokenizers could not be
# installed (nothing checked).
set -euo pipefail
# The live view of every tokentap started here on a free port, not its default 9465.
export TOKENTAP_UI_LISTEN=127.0.0.1:0

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TOKENTAP="$ROOT/target/debug/tokentap"
INSTALL=1
KEEP=0
while [ $# -gt 0 ]; do
  case "$1" in
    --tokentap) TOKENTAP="$2"; shift 2 ;;
    --no-install) INSTALL=0; shift ;;
    --keep) KEEP=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
PY="${PYTHON:-python3}"
TOKENS=12
TTFT_MS=150
ITL_MS=20

[ -x "$TOKENTAP" ] || { echo "no tokentap binary at $TOKENTAP (cargo build first)" >&2; exit 2; }

have() { "$PY" -c "import $1" 2>/dev/null; }
if [ "$INSTALL" = 1 ]; then
  have smg || "$PY" -m pip install -q smg || true
  have tokenizers || "$PY" -m pip install -q tokenizers || true
fi
if ! have smg || ! have tokenizers; then
  echo "SKIP: smg and tokenizers (pip) are needed" >&2
  exit 77
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/smg-check.XXXXXX")"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do
    # each was started with setsid: its process group is its own
    kill -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true
  done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ "$KEEP" = 1 ]; then echo "logs kept in $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

free_port() {
  "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
wait_port() { # host:port, seconds[, the pid that should listen there, its log]
  local deadline=$((SECONDS + $2))
  while [ $SECONDS -lt $deadline ]; do
    if "$PY" -c "import socket,sys; socket.create_connection(('${1%:*}', ${1##*:}), 1)" 2>/dev/null; then
      return 0
    fi
    if [ -n "${3:-}" ] && ! kill -0 "$3" 2>/dev/null; then
      echo "FAIL: the process that should listen on $1 exited; the end of its log:" >&2
      log_tail "$4"
      return 2
    fi
    sleep 0.2
  done
  echo "FAIL: nothing listening on $1 after $2 s" >&2
  [ -z "${4:-}" ] || { echo "the end of its log:" >&2; log_tail "$4"; }
  return 1
}
log_tail() { # a log, its colours and other control characters removed
  tail -n 20 "$1" | sed 's/\x1b\[[0-9;]*m//g' | tr -d '\000-\010\013-\037\177' | cut -c1-300 >&2
}

# --- a tiny local tokenizer (no downloads) -----------------------------------------------
MODEL="$WORK/model"
mkdir -p "$MODEL"
"$PY" - "$MODEL" <<'EOF'
import json, sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
d = sys.argv[1]
vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
vocab.update({f"t{i}": i for i in range(3, 32000)})
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tok.decoder = decoders.WordPiece(prefix="##")  # words joined by spaces
tok.add_special_tokens(["<s>", "</s>"])
tok.save(f"{d}/tokenizer.json")
template = ("{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
            "{% if add_generation_prompt %}assistant {% endif %}")
open(f"{d}/chat_template.jinja", "w").write(template)
json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
           "eos_token": "</s>", "unk_token": "<unk>", "model_max_length": 32768,
           "chat_template": template}, open(f"{d}/tokenizer_config.json", "w"), indent=1)
json.dump({"model_type": "llama", "vocab_size": 32000, "max_position_embeddings": 32768,
           "bos_token_id": 1, "eos_token_id": 2}, open(f"{d}/config.json", "w"), indent=1)
EOF

# --- sim, tokentap, smg -------------------------------------------------------------------
SIM="127.0.0.1:$(free_port)"
TT="127.0.0.1:$(free_port)"
TT_ADMIN="127.0.0.1:$(free_port)"

setsid "$TOKENTAP" sim --listen "$SIM" --models "$MODEL" --ttft "${TTFT_MS}ms" \
  --itl "${ITL_MS}ms" --tokens "$TOKENS" >"$WORK/sim.log" 2>&1 &
PIDS+=($!)
wait_port "$SIM" 20 "${PIDS[-1]}" "$WORK/sim.log"

cat >"$WORK/tokentap.yaml" <<EOF
listen: $TT
admin: $TT_ADMIN
upstream:
  url: http://$SIM
  http2: true
EOF
setsid "$TOKENTAP" --config "$WORK/tokentap.yaml" >"$WORK/tokentap.log" 2>&1 &
PIDS+=($!)
wait_port "$TT" 20 "${PIDS[-1]}" "$WORK/tokentap.log"
wait_port "$TT_ADMIN" 20 "${PIDS[-1]}" "$WORK/tokentap.log"

# IGW mode: the gRPC router with no startup workers; each engine is registered through
# POST /workers (first with its runtime detected, as --worker-urls grpc://... does).
# A port picked free may be taken again before smg binds it, and smg then exits at once
# ("failed to bind metrics server"): it is started again on fresh ports, at most 3 times.
for attempt in 1 2 3; do
  SMG_PORT="$(free_port)"
  SMG_PROM="$(free_port)"
  setsid smg launch --enable-igw --host 127.0.0.1 --port "$SMG_PORT" --prometheus-host 127.0.0.1 \
    --prometheus-port "$SMG_PROM" --model-path "$MODEL" \
    --log-level debug >"$WORK/smg.log" 2>&1 &
  SMG_PID=$!
  PIDS+=("$SMG_PID")
  status=0
  wait_port "127.0.0.1:$SMG_PORT" 120 "$SMG_PID" "$WORK/smg.log" || status=$?
  [ "$status" = 0 ] && break
  [ "$status" = 2 ] && [ "$attempt" -lt 3 ] || exit 1
  echo "smg exited while starting (attempt $attempt); again on fresh ports" >&2
done
echo "sim $SIM <- tokentap $TT (metrics $TT_ADMIN) <- smg 127.0.0.1:$SMG_PORT; model $MODEL"

# --- per engine: register it, a streamed chat completion, what tokentap measured ------------
"$PY" - "$SMG_PORT" "$TT" "$TT_ADMIN" "$MODEL" "$TOKENS" "$TTFT_MS" "$ITL_MS" "$WORK" <<'EOF'
import json, re, sys, time, urllib.error, urllib.request

port, tt, admin, model = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
tokens, ttft, itl, work = int(sys.argv[5]), int(sys.argv[6]) / 1000, int(sys.argv[7]) / 1000, sys.argv[8]
SMG = f"http://127.0.0.1:{port}"
# (runtime_type asked, the one smg must use, the gRPC path of its Generate, tokentap's dialect)
ENGINES = [
    (None, "sglang", "/sglang.grpc.scheduler.SglangScheduler/Generate", "sglang_grpc"),
    ("vllm", "vllm", "/vllm.grpc.engine.VllmEngine/Generate", "vllm_grpc"),
    ("trtllm", "trtllm", "/trtllm.TrtllmService/Generate", "trtllm_grpc"),
]
failed = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failed.append(what)


def call(method, path, body=None, timeout=10):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(SMG + path, data, {"content-type": "application/json"},
                                 method=method)
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read().decode()


def workers():
    return json.loads(call("GET", "/workers"))["workers"]


def metrics():
    with urllib.request.urlopen(f"http://{admin}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"([a-z_:]+)(?:\{(.*)\})? (\S+)$", line)
        if m:
            labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
            out[(m.group(1), labels)] = float(m.group(3))
    return out


def value(snapshot, name, **labels):
    want = set(labels.items())
    return sum(v for (n, l), v in snapshot.items() if n == name and want <= l)


def smg_log_tail():
    lines = open(f"{work}/smg.log", errors="replace").read().splitlines()[-30:]
    return "\n".join(re.sub(r"\x1b\[[0-9;]*m", "", l) for l in lines)


def wait(cond, seconds, what):
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            if cond():
                return True
        except (urllib.error.URLError, OSError, ValueError):
            pass
        time.sleep(0.3)
    check(False, what)
    return False


for asked, runtime, path, dialect in ENGINES:
    print(f"--- {runtime} ({'detected' if asked is None else 'runtime_type ' + asked})")
    spec = {"url": f"grpc://{tt}"}
    if asked:
        spec["runtime_type"] = asked
    if not wait(lambda: call("POST", "/workers", spec) and True, 30, "smg accepted the worker"):
        break
    if not wait(lambda: any(w["status"] == "ready" and w["is_healthy"] for w in workers()),
                60, f"the worker became ready\n{smg_log_tail()}"):
        break
    (worker,) = workers()
    check(worker["runtime_type"] == runtime and worker["connection_mode"] == "grpc",
          f"smg drives it as a {runtime} gRPC worker ({worker['runtime_type']}, {worker['connection_mode']})")
    before = metrics()
    body = {"model": model, "stream": True, "max_tokens": tokens,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "t5 t6"}]}
    events = None

    def stream():
        global events
        data = call("POST", "/v1/chat/completions", body, timeout=30)
        events = [l[6:] for l in data.splitlines() if l.startswith("data: ")]
        return True

    # the model's tokenizer loads in the background after the worker registers
    if not wait(stream, 30, f"smg streamed a chat completion\n{smg_log_tail()}"):
        break
    check(events[-1] == "[DONE]", "the stream ends with [DONE]")
    chunks = [json.loads(e) for e in events if e != "[DONE]"]
    content = [c["choices"][0]["delta"].get("content") for c in chunks if c.get("choices")]
    text = "".join(t for t in content if t)
    usage = next((c["usage"] for c in chunks if c.get("usage")), None)
    print(f"smg streamed {text!r}; usage "
          f"{usage and {k: usage[k] for k in ('prompt_tokens', 'completion_tokens')}}")
    check(text.split() == [f"t{100 + i}" for i in range(tokens)],
          f"smg detokenized the simulator's {tokens} token ids (t100 ...)")
    check(usage is not None and usage["completion_tokens"] == tokens,
          f"smg's usage says {tokens} completion tokens")

    time.sleep(0.3)  # tokentap records the call as its stream ends
    after = metrics()

    def delta(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    prompt = usage["prompt_tokens"] if usage else None
    check(delta("tokentap_requests_total", model=model, outcome="completed", status="2xx") == 1,
          "tokentap counted one completed Generate call for the model")
    check(delta("tokentap_output_tokens_total", model=model) == tokens,
          f"tokentap's output tokens +{tokens} (the token ids smg received)")
    check(delta("tokentap_event_tokens_total", model=model, accuracy="exact") == tokens,
          f"tokentap's exact event tokens +{tokens}")
    check(prompt is not None and delta("tokentap_input_tokens_total", model=model) == prompt,
          f"tokentap's input tokens +{prompt} (smg's prompt_tokens)")
    check(delta("tokentap_inter_token_latency_seconds_count", model=model) == tokens - 1,
          f"{tokens - 1} inter-token latencies")
    t = delta("tokentap_time_to_first_token_seconds_sum", model=model)
    check(ttft <= t < ttft + 0.1, f"TTFT {t:.3f} s (the sim's: {ttft} s)")
    s = delta("tokentap_inter_token_latency_seconds_sum", model=model)
    check((tokens - 1) * itl * 0.8 <= s < (tokens - 1) * (itl + 0.01),
          f"ITL sum {s:.3f} s (the sim's: {tokens - 1} x {itl} s)")
    log = open(f"{work}/tokentap.log", errors="replace").read()
    log = re.sub(r"\x1b\[[0-9;]*m", "", log)
    calls = [l for l in log.splitlines() if "access: request" in l and f"path={path} " in l]
    check(len(calls) == 1 and f'dialect="{dialect}"' in calls[0] and "grpc_status=0" in calls[0],
          f"tokentap's access log: one {path} call, dialect {dialect}, grpc_status 0")

    call("DELETE", f"/workers/{worker['id']}")
    if not wait(lambda: not workers(), 30, "smg removed the worker"):
        break

p = value(metrics(), "tokentap_passthrough_requests_total")
print(f"tokentap passthrough calls (smg's HealthCheck, GetModelInfo, GetServerInfo, GetLoads, "
      f"SubscribeKvEvents): {p:.0f}")
check(p >= 6, "smg's other engine RPCs passed through tokentap")
print("PASS" if not failed else f"{len(failed)} check(s) failed")
sys.exit(1 if failed else 0)
EOF
