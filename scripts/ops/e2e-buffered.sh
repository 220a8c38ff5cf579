#!/usr/bin/env bash
# End-to-end measure of the buffered-response rule (docs/METRICS.md, "Buffered responses"):
# how often a stream that streams is flagged (false positives), and whether a real
# buffering hop is.
#
#   cargo build --release && scripts/ops/e2e-buffered.sh
#   TOKENTAP_BIN=/path/to/tokentap STREAMS=100 scripts/ops/e2e-buffered.sh
#
# What it does:
#   1. starts two simulators (40 tokens, first after 50 ms): `one` streams one token per
#      event, `batched` 1 to 3 tokens per event; each request sets its own inter-token
#      latency with x-sim-itl-ms and names a model for it (`itl-1ms`, ...), so
#      tokentap_buffered_responses_total{model} counts per speed;
#   2. starts Debian's nginx (nginx-light) in front of `one` with `gzip on` for
#      `text/event-stream`, a common setting that buffers a stream whole (gzip holds its
#      output until its buffer fills or the body ends; the clients here accept gzip).
#      nginx's default `proxy_buffering on` alone does not: measured with nginx 1.22, it
#      passes each event on as it arrives to a client that reads (tokentap does);
#   3. starts a tokentap in front of each: `one`, `batched`, and `nginx`;
#   4. sends STREAMS streamed chat requests (default 40) per speed through each, and
#      STREAMS non-streamed ones (`stream: false`) through `one`;
#   5. prints, per path and speed, the responses tokentap flagged against those it
#      recorded, and checks: nothing flagged at 2 ms per token or slower (500 tokens/s
#      per stream and below), nothing flagged of the `stream: false` answers, and every
#      response behind nginx flagged at every speed. STREAMS=200 for the figures in
#      docs/METRICS.md.
# Installs nginx-light (apt) when missing. Last line: `e2e-buffered: N passed, M failed`;
# exit 1 on a failure, 2 if it could not run.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OPS=$ROOT/scripts/ops
# shellcheck source=scripts/ops/lib.sh
. "$OPS/lib.sh"
BIN=${TOKENTAP_BIN:-$ROOT/target/release/tokentap}
STREAMS=${STREAMS:-40}
SPEEDS="1 2 3 5 20"
ops_init e2e-buffered

[ -x "$BIN" ] || die "no tokentap binary at $BIN: run \`cargo build --release\` or set TOKENTAP_BIN"
if ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ]; then
  apt-get update -qq >/dev/null 2>&1
  # The package's own service start may fail where no init system runs; only the binary
  # matters here, so its presence decides.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light >/dev/null 2>&1
  [ -x /usr/sbin/nginx ] || command -v nginx >/dev/null || die "cannot install nginx-light"
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

read -r P_ONE P_BATCHED P_NGINX T_ONE A_ONE T_BATCHED A_BATCHED T_NGINX A_NGINX < <(free_ports 9)
H=127.0.0.1
export TOKENTAP_UI_LISTEN=$H:0
MODELS=$(for s in $SPEEDS; do printf 'itl-%sms,' "$s"; done)
MODELS=${MODELS%,},stream-false

start sim-one "$BIN" sim --listen "$H:$P_ONE" --models "$MODELS" --ttft 50ms --tokens 40 --usage always
start sim-batched "$BIN" sim --listen "$H:$P_BATCHED" --models "$MODELS" --ttft 50ms --tokens 40 \
  --tokens-per-event 1-3 --usage always
mkdir -p "$TMP/nginx"
cat >"$TMP/nginx.conf" <<EOF
worker_processes 1;
pid $TMP/nginx/nginx.pid;
error_log $TMP/nginx/error.log warn;
daemon off;
events { worker_connections 256; }
http {
    access_log off;
    client_body_temp_path $TMP/nginx/body;
    proxy_temp_path $TMP/nginx/proxy;
    server {
        listen $H:$P_NGINX;
        gzip on;
        gzip_types text/event-stream;
        gzip_min_length 0;
        location / {
            proxy_pass http://$H:$P_ONE;
            proxy_http_version 1.1;
        }
    }
}
EOF
start nginx "$NGINX" -c "$TMP/nginx.conf" -e "$TMP/nginx/error.log"
for path in one batched nginx; do
  case $path in
    one) up=$P_ONE listen=$T_ONE admin=$A_ONE ;;
    batched) up=$P_BATCHED listen=$T_BATCHED admin=$A_BATCHED ;;
    nginx) up=$P_NGINX listen=$T_NGINX admin=$A_NGINX ;;
  esac
  start "tokentap-$path" "$BIN" --upstream "http://$H:$up" --listen "$H:$listen" --admin "$H:$admin"
done
ok=1
wait_http sim-one "http://$H:$P_ONE/health" 200 20 || ok=0
wait_http sim-batched "http://$H:$P_BATCHED/health" 200 20 || ok=0
wait_http nginx "http://$H:$P_NGINX/health" 200 20 || ok=0
for admin in "$A_ONE" "$A_BATCHED" "$A_NGINX"; do
  wait_http - "http://$H:$admin/readyz" 200 30 || ok=0
done
[ "$ok" = 1 ] || die "a process did not start"

python3 - "$H" "$STREAMS" "$SPEEDS" "$T_ONE:$A_ONE" "$T_BATCHED:$A_BATCHED" "$T_NGINX:$A_NGINX" >"$TMP/result.txt" <<'PY'
import concurrent.futures as cf
import gzip
import http.client
import json
import sys
import urllib.request

host, streams, speeds = sys.argv[1], int(sys.argv[2]), [int(s) for s in sys.argv[3].split()]
paths = dict(zip(("one", "batched", "nginx"), (p.split(":") for p in sys.argv[4:7])))

def request(port, model, itl, stream=True):
    c = http.client.HTTPConnection(host, int(port), timeout=60)
    body = {"model": model, "stream": stream, "max_tokens": 40,
            "messages": [{"role": "user", "content": "hi"}]}
    c.request("POST", "/v1/chat/completions", body=json.dumps(body),
              headers={"content-type": "application/json", "x-sim-itl-ms": str(itl),
                       "accept-encoding": "gzip"})
    r = c.getresponse()
    data = r.read()
    if r.getheader("content-encoding") == "gzip":
        data = gzip.decompress(data)
    c.close()
    return r.status == 200 and (b"[DONE]" in data or not stream)

def scrape(admin):
    text = urllib.request.urlopen(f"http://{host}:{admin}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        for family in ("tokentap_buffered_responses_total", "tokentap_requests_total"):
            if line.startswith(family + "{"):
                labels = line[line.index("{") + 1:line.index("}")]
                model = labels.split('model="')[1].split('"')[0]
                key = (family, model)
                out[key] = out.get(key, 0) + float(line.rsplit(" ", 1)[1])
    return out

failed = 0
with cf.ThreadPoolExecutor(max_workers=8) as pool:
    jobs = [(path, f"itl-{itl}ms", itl, True) for path in paths for itl in speeds for _ in range(streams)]
    jobs += [("one", "stream-false", 20, False) for _ in range(streams)]
    done = list(pool.map(lambda j: request(paths[j[0]][0], j[1], j[2], j[3]), jobs))
failed = done.count(False)
rows = []
for path, (_, admin) in paths.items():
    m = scrape(admin)
    for model in [f"itl-{s}ms" for s in speeds] + (["stream-false"] if path == "one" else []):
        flagged = int(m.get(("tokentap_buffered_responses_total", model), 0))
        recorded = int(m.get(("tokentap_requests_total", model), 0))
        rows.append({"path": path, "model": model, "flagged": flagged, "recorded": recorded})
print(json.dumps({"client_failures": failed, "rows": rows}))
PY
[ -s "$TMP/result.txt" ] || die "the traffic did not run"
result=$(cat "$TMP/result.txt")
echo "path     model          flagged / recorded"
python3 -c '
import json, sys
for r in json.loads(sys.argv[1])["rows"]:
    print("%-8s %-14s %4d / %d" % (r["path"], r["model"], r["flagged"], r["recorded"]))
' "$result"
check() {  # check PY-EXPR-ON-r WHAT
  if python3 -c "
import json, sys
result = json.loads(sys.argv[1])
rows = result['rows']
sys.exit(0 if ($1) else 1)" "$result"; then pass "$2"; else fail "$2"; fi
}
check "result['client_failures'] == 0" "every request answered 200 and complete"
check "all(r['recorded'] == $STREAMS for r in rows)" "tokentap recorded every response ($STREAMS per path and speed)"
check "all(r['flagged'] == 0 for r in rows if r['path'] != 'nginx' and r['model'] not in ('itl-1ms',))" \
  "no stream flagged at 2 ms per token or slower, one token per event or 1-3, nor any stream: false answer"
check "all(r['flagged'] == r['recorded'] for r in rows if r['path'] == 'nginx')" \
  "every response behind nginx (gzip on for event streams) flagged, at every speed"
summary
[ "$FAILED" = 0 ]
