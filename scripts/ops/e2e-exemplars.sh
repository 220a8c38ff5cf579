#!/usr/bin/env bash
# Trace exemplars end to end: a real Prometheus (Debian's 2.42 or later), once classic and
# once with native histograms, scrapes tokentap with its own default `Accept` (so the
# OpenMetrics text, or the protobuf format with native histograms) and stores the
# exemplars; `/api/v1/query_exemplars` must return the trace id of a deliberately slow
# request with that request's own TTFT.
#
#   cargo build --release && scripts/ops/e2e-exemplars.sh
#   TOKENTAP_BIN=target/debug/tokentap scripts/ops/e2e-exemplars.sh
#
# What it does:
#   1. starts `tokentap sim` and tokentap in front of it with JSON access logs;
#   2. starts two Prometheus scraping tokentap every second,
#      `--enable-feature=exemplar-storage` (it asks for OpenMetrics) and
#      `--enable-feature=native-histograms,exemplar-storage` (it asks for protobuf);
#   3. sends REQUESTS streamed chat completions, each with its own valid `traceparent`,
#      and one with a malformed one (upper-case hex); then scrapes `/metrics` as
#      Prometheus asks for it: Content-Type must be OpenMetrics 1.0.0, and the body must
#      parse with prometheus_client's OpenMetrics parser (pip install prometheus-client;
#      skipped, and said so, where it cannot be installed), with exemplars on the four
#      traced histograms' buckets and nowhere else;
#   4. sends one slow request (its body held back 1.5 s, which tokentap counts in its
#      TTFT) with a known trace id;
#   5. in each Prometheus: the target is up with no scrape error, and
#      `/api/v1/query_exemplars` over the TTFT series returns the slow request's trace and
#      span id with a value equal to the access log's `ttft_ms` for it; every exemplar
#      names a trace that was sent, with `trace_id` and `span_id` only, and the malformed
#      trace appears nowhere.
# Every process is started here and ended by PID on exit. Last line:
# `e2e-exemplars: N passed, M failed[, K skipped]`; exit 1 on a failure, 2 if it could not
# run.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=scripts/ops/lib.sh
. "$ROOT/scripts/ops/lib.sh"
BIN=${TOKENTAP_BIN:-$ROOT/target/release/tokentap}
PROMETHEUS=${PROMETHEUS:-prometheus}
REQUESTS=${REQUESTS:-20}
MODEL=llama-3.1-8b

ops_init e2e-exemplars
[ -x "$BIN" ] || die "no tokentap binary at $BIN: run \`cargo build --release\` or set TOKENTAP_BIN"
for t in "$PROMETHEUS" curl python3; do
  command -v "$t" >/dev/null || die "$t not found (apt-get install -y prometheus curl)"
done
if ! python3 -c 'import prometheus_client.openmetrics.parser' 2>/dev/null; then
  python3 -m pip install --quiet prometheus-client >/dev/null 2>&1 || true
fi

read -r P_SIM P_PROXY P_ADMIN P_CLASSIC P_NATIVE < <(free_ports 5)
H=127.0.0.1
# The live view of every tokentap started here on a free port, not its default 9465.
export TOKENTAP_UI_LISTEN=$H:0

start sim "$BIN" sim --listen "$H:$P_SIM" --models "$MODEL" --ttft 120ms --itl 20ms --jitter 0.3 --tokens 20
start tokentap "$BIN" --upstream "http://$H:$P_SIM" --listen "$H:$P_PROXY" --admin "$H:$P_ADMIN" --log-format json
wait_http tokentap "http://$H:$P_ADMIN/readyz" 200 30 || die "tokentap not ready"

cat >"$TMP/prometheus.yaml" <<EOF
global: {scrape_interval: 1s}
scrape_configs:
  - job_name: tokentap
    static_configs: [{targets: ["$H:$P_ADMIN"]}]
EOF
for kind in classic native; do
  if [ "$kind" = classic ]; then port=$P_CLASSIC features=exemplar-storage
  else port=$P_NATIVE features=native-histograms,exemplar-storage; fi
  start "prometheus-$kind" "$PROMETHEUS" --config.file="$TMP/prometheus.yaml" \
    --storage.tsdb.path="$TMP/tsdb-$kind" --web.listen-address="$H:$port" \
    --enable-feature="$features" --log.level=warn
done
for kind in classic native; do
  if [ "$kind" = classic ]; then port=$P_CLASSIC; else port=$P_NATIVE; fi
  wait_http "prometheus-$kind" "http://$H:$port/-/ready" 200 30 || die "Prometheus ($kind) not ready"
done

python3 - "$H" "$P_PROXY" "$P_ADMIN" "$P_CLASSIC" "$P_NATIVE" "$REQUESTS" "$MODEL" "$TMP" <<'EOF'
import json, os, secrets, socket, sys, time, urllib.parse, urllib.request

host, proxy, admin, p_classic, p_native, requests, model, tmp = sys.argv[1:]
requests = int(requests)
passed = failed = skipped = 0
# What Prometheus 2.42 sends by default (it asks for protobuf first with native histograms).
OPENMETRICS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
                      "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")

def check(ok, what):
    global passed, failed
    passed, failed = passed + bool(ok), failed + (not ok)
    print(("PASS " if ok else "FAIL ") + what)

def traceparent():
    return secrets.token_hex(16), secrets.token_hex(8)

def body(i):
    return json.dumps({"model": model, "stream": True,
                       "messages": [{"role": "user", "content": f"request {i}"}]}).encode()

def chat(i, tenant, header):
    req = urllib.request.Request(f"http://{host}:{proxy}/v1/chat/completions", body(i),
                                 {"content-type": "application/json", "x-tenant-id": tenant,
                                  "traceparent": header})
    with urllib.request.urlopen(req, timeout=30) as response:
        response.read()

sent = set()
for i in range(requests):
    trace, span = traceparent()
    sent.add(trace)
    chat(i, "e2e", f"00-{trace}-{span}-01")
malformed = secrets.token_hex(16)
chat(requests, "e2e-malformed", f"00-{malformed.upper()}-{secrets.token_hex(8)}-01")

# 3. The OpenMetrics scrape, as Prometheus asks for it.
req = urllib.request.Request(f"http://{host}:{admin}/metrics", headers={"accept": OPENMETRICS_ACCEPT})
with urllib.request.urlopen(req, timeout=10) as response:
    content_type = response.headers.get("content-type")
    text = response.read().decode()
check(content_type == "application/openmetrics-text; version=1.0.0; charset=utf-8",
      f"OpenMetrics Content-Type ({content_type})")
check(text.endswith("# EOF\n"), "the body ends with # EOF")
try:
    from prometheus_client.openmetrics.parser import text_string_to_metric_families
except ImportError:
    skipped += 1
    print("SKIP prometheus_client's OpenMetrics parser (pip install prometheus-client failed)")
else:
    try:
        families = list(text_string_to_metric_families(text))
        error = None
    except Exception as e:  # the parser raises ValueError (and others) on any flaw
        families, error = [], e
    check(error is None, f"prometheus_client parses the body ({len(families)} families; {error})")
    with_exemplar = {(f.name, f.type) for f in families for s in f.samples if s.exemplar}
    check({t for _, t in with_exemplar} == {"histogram"} and
          {n for n, _ in with_exemplar} >= {"tokentap_time_to_first_token_seconds",
                                            "tokentap_inter_token_latency_seconds",
                                            "tokentap_time_per_output_token_seconds",
                                            "tokentap_request_duration_seconds"},
          f"exemplars on the four traced histograms' buckets only ({sorted(with_exemplar)})")
    labels = {tuple(sorted(s.exemplar.labels)) for f in families for s in f.samples if s.exemplar}
    check(labels == {("span_id", "trace_id")}, f"exemplar labels are trace_id and span_id ({labels})")
check(malformed not in text.lower(), "the malformed traceparent left no exemplar")

# 4. The slow request, with both Prometheus scraping.
servers = {"classic": p_classic, "native": p_native}

def get(port, path, **params):
    url = f"http://{host}:{port}{path}" + ("?" + urllib.parse.urlencode(params) if params else "")
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)

slow_trace, slow_span = traceparent()
sent.add(slow_trace)
# Head first, body 1.5 s later: the upstream answers only once the body is in, and TTFT
# counts from the head, so this request's TTFT is about 1.5 s (the simulator's own TTFT,
# at most 156 ms, has passed by then, so its first token follows the body at once).
# Counted from the body instead it would be under 160 ms. The client starts its 1.5 s
# when its head is sent, tokentap its clock when it has read the head: on a loaded
# machine that is a few ms later, so the check leaves 100 ms.
payload = body("slow")
head = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}:{proxy}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(payload)}\r\n"
        f"x-tenant-id: e2e-slow\r\ntraceparent: 00-{slow_trace}-{slow_span}-01\r\n"
        "connection: close\r\n\r\n")
with socket.create_connection((host, int(proxy)), timeout=30) as conn:
    conn.sendall(head.encode())
    time.sleep(1.5)
    conn.sendall(payload)
    while conn.recv(65536):
        pass

def access_ttft(tenant):
    for line in open(os.path.join(tmp, "tokentap.log")):
        try:
            event = json.loads(line)
        except ValueError:
            continue
        fields = event.get("fields", event)
        if event.get("target") == "tokentap::access" and fields.get("tenant") == tenant:
            return fields.get("ttft_ms")
    return None

deadline = time.time() + 10
while time.time() < deadline and access_ttft("e2e-slow") is None:
    time.sleep(0.1)
slow_ttft = access_ttft("e2e-slow")
check(slow_ttft is not None and slow_ttft > 1400,
      f"the slow request's TTFT, counted from its head, is {slow_ttft} ms (over 1400)")

# 5. What each Prometheus stored.
def exemplars(port):
    found = []
    end = time.time() + 60
    for name in ("tokentap_time_to_first_token_seconds_bucket", "tokentap_time_to_first_token_seconds"):
        data = get(port, "/api/v1/query_exemplars", query=name, start=str(end - 600), end=str(end))
        for series in data.get("data") or []:
            found += [(series["seriesLabels"], e) for e in series["exemplars"]]
    return found

for kind, port in servers.items():
    deadline = time.time() + 30
    found = []
    while time.time() < deadline:
        found = exemplars(port)
        if any(e["labels"].get("trace_id") == slow_trace for _, e in found):
            break
        time.sleep(0.5)
    slow = [e for _, e in found if e["labels"].get("trace_id") == slow_trace]
    check(len(slow) >= 1, f"{kind}: query_exemplars returns the slow request's trace id")
    if slow and slow_ttft is not None:
        value = float(slow[0]["value"])
        check(abs(value * 1e3 - slow_ttft) <= 1e-9 * slow_ttft,
              f"{kind}: its value {value} s is the request's TTFT ({slow_ttft} ms)")
        check(slow[0]["labels"] == {"trace_id": slow_trace, "span_id": slow_span},
              f"{kind}: its labels are exactly trace_id and span_id")
    strangers = {e["labels"].get("trace_id") for _, e in found} - sent
    check(not strangers, f"{kind}: every exemplar names a trace that was sent ({len(found)} exemplars)")
    check(all(malformed not in json.dumps(e) for _, e in found), f"{kind}: no malformed trace")
    targets = get(port, "/api/v1/targets")["data"]["activeTargets"]
    check(targets and all(t["health"] == "up" and not t["lastError"] for t in targets),
          f"{kind}: the scrape is healthy ({[(t['health'], t['lastError']) for t in targets]})")
    requests_total = get(port, "/api/v1/query", query="sum(tokentap_requests_total)")["data"]["result"]
    check(requests_total and float(requests_total[0]["value"][1]) == requests + 2,
          f"{kind}: tokentap_requests_total counts every request ({requests_total})")

summary = f"e2e-exemplars: {passed} passed, {failed} failed"
print(summary + (f", {skipped} skipped" if skipped else ""))
sys.exit(1 if failed else 0)
EOF
