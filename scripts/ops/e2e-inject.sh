#!/usr/bin/env bash
# End to end for `tokentap inject` (issue 37), as processes on this machine:
#   1. a vLLM-like Deployment and its Service go through `tokentap inject`; the
#      injected sidecar's args and env, and nothing else (env from fieldRefs filled in
#      as the kubelet would), start tokentap in front of the simulator listening on the
#      engine's port; its startup and readiness probes, as the spec writes them, pass;
#      one streamed chat completion passes through to [DONE] and is counted completed
#      on /metrics, for the tenant its annotated header names; the Service was moved to tokentap's port; SIGTERM ends it cleanly;
#   2. `tokentap inject --serve` over TLS (a throwaway self-signed certificate): the
#      AdmissionReview of the same pod gets a JSON Patch which, applied, gives the CLI's
#      pod template; the injected pod is left alone; a body that is not a review gets
#      400; the admin port's /metrics counts all three.
# Every port is a free loopback port (the ports are pod-template annotations).
#
#   TOKENTAP_BIN=target/debug/tokentap scripts/ops/e2e-inject.sh   (built with --features inject)
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=scripts/ops/lib.sh
. "$ROOT/scripts/ops/lib.sh"
ops_init e2e-inject
BIN=${TOKENTAP_BIN:-$ROOT/target/debug/tokentap}
[ -x "$BIN" ] || die "no tokentap binary at $BIN"
printf '' | "$BIN" inject - >/dev/null 2>&1 || die "$BIN was built without --features inject"
H=127.0.0.1
read -r P_ENGINE P_HTTP P_ADMIN P_UI P_WH P_WH_ADMIN < <(free_ports 6)

cat >"$TMP/in.yaml" <<EOF
apiVersion: apps/v1
kind: Deployment
metadata:
  name: engine
spec:
  selector:
    matchLabels:
      app: engine
  template:
    metadata:
      labels:
        app: engine
      annotations:
        tokentap.dev/http-port: "$P_HTTP"
        tokentap.dev/metrics-port: "$P_ADMIN"
        tokentap.dev/ui-port: "$P_UI"
        tokentap.dev/tenant-header: x-team
    spec:
      terminationGracePeriodSeconds: 20
      containers:
        - name: engine
          image: vllm/vllm-openai:v0.11.0
          ports:
            - name: http
              containerPort: $P_ENGINE
---
apiVersion: v1
kind: Service
metadata:
  name: engine
spec:
  selector:
    app: engine
  ports:
    - name: http
      port: 80
      targetPort: http
EOF

if "$BIN" inject "$TMP/in.yaml" >"$TMP/out.yaml" 2>"$TMP/notes.txt"; then
  pass "tokentap inject wrote the injected manifests"
else
  fail "tokentap inject"; cat "$TMP/notes.txt"; summary; exit 1
fi

# The sidecar as the kubelet would run it: argv, env (fieldRefs resolved), probes.
python3 - "$TMP/out.yaml" "$TMP" <<'EOF' || die "cannot read the injected sidecar"
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
dep = next(d for d in docs if d["kind"] == "Deployment")
svc = next(d for d in docs if d["kind"] == "Service")
spec = dep["spec"]["template"]["spec"]
tok = next(c for c in spec["initContainers"] if c["name"] == "tokentap")
assert "command" not in tok, "the image's entrypoint runs tokentap"
fields = {"metadata.name": "engine-7d9f-x2x", "metadata.uid": "0b4e7c1e-0000-4000-8000-000000000001",
          "metadata.namespace": "default", "spec.nodeName": "node-1"}
env = []
for e in tok.get("env", []):
    value = e["value"] if "value" in e else fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
    env.append(f"{e['name']}={value}")
ports = {p["name"]: p["containerPort"] for p in tok["ports"]}
def probe(name):
    g = tok[name]["httpGet"]
    port = ports[g["port"]] if isinstance(g["port"], str) else g["port"]
    return f"{port} {g['path']}"
open(f"{sys.argv[2]}/argv", "w").write("\0".join(tok["args"]) + "\0")
open(f"{sys.argv[2]}/env", "w").write("\0".join(env) + "\0")
open(f"{sys.argv[2]}/probes", "w").write(f"{probe('startupProbe')}\n{probe('readinessProbe')}\n")
open(f"{sys.argv[2]}/service-target", "w").write(str(svc["spec"]["ports"][0]["targetPort"]))
EOF
mapfile -d '' ARGS <"$TMP/argv"
mapfile -d '' ENVS <"$TMP/env"
read -r STARTUP_PORT STARTUP_PATH < <(sed -n 1p "$TMP/probes")
read -r READY_PORT READY_PATH < <(sed -n 2p "$TMP/probes")
echo "  sidecar args: ${ARGS[*]}"

if [ "$(cat "$TMP/service-target")" = "$P_HTTP" ]; then pass "the Service now targets tokentap's port $P_HTTP"
else fail "the Service targets $(cat "$TMP/service-target"), not $P_HTTP"; fi

start sim "$BIN" sim --listen "$H:$P_ENGINE" --models e2e-model --ttft 20ms --itl 2ms --tokens 12
wait_http sim "http://$H:$P_ENGINE/health" 200 30 || die "simulator not ready"
start tokentap env -i PATH="$PATH" "${ENVS[@]}" "$BIN" "${ARGS[@]}"
if wait_http tokentap "http://$H:$STARTUP_PORT$STARTUP_PATH" 200 30 &&
   wait_http tokentap "http://$H:$READY_PORT$READY_PATH" 200 30; then
  pass "the sidecar started from its args and env alone; startup ($STARTUP_PATH) and readiness ($READY_PATH) probes pass"
else
  fail "the sidecar's probes"; log_tail tokentap
fi

curl -sS -N -m 20 "http://$H:$P_HTTP/v1/chat/completions" -H 'content-type: application/json' -H 'x-team: alpha' \
  -d '{"model":"e2e-model","stream":true,"messages":[{"role":"user","content":"hello"}]}' >"$TMP/stream.txt" 2>&1
events=$(grep -c '^data: {' "$TMP/stream.txt")
if [ "$events" -ge 12 ] && grep -q '^data: \[DONE\]' "$TMP/stream.txt"; then
  pass "one streamed request through tokentap to the engine port: $events events, [DONE]"
else
  fail "the streamed request"; head -c 600 "$TMP/stream.txt"
fi
metrics=$(curl -s -m 5 "http://$H:$P_ADMIN/metrics")
if grep -Eq '^tokentap_requests_total\{[^}]*outcome="completed"[^}]*\} 1$' <<<"$metrics" &&
   grep -Eq '^tokentap_requests_total\{[^}]*tenant="alpha"' <<<"$metrics" &&
   grep -Eq '^tokentap_inter_token_latency_seconds_count\{[^}]*model="e2e-model"' <<<"$metrics"; then
  pass "/metrics counts it: completed, tenant alpha from the annotated header, ITL for model e2e-model"
else
  fail "/metrics after the request"; grep -E '^tokentap_requests_total' <<<"$metrics" | head
fi
if curl -s -m 2 -o /dev/null "http://$H:$P_UI/ui"; then
  pass "the live view answers on loopback port $P_UI"
else
  fail "the live view on $H:$P_UI"
fi
kill -TERM "${PID_OF[tokentap]}"
for _ in $(seq 100); do kill -0 "${PID_OF[tokentap]}" 2>/dev/null || break; sleep 0.1; done
if ! kill -0 "${PID_OF[tokentap]}" 2>/dev/null; then
  wait "${PID_OF[tokentap]}"; rc=$?
  if [ "$rc" = 0 ]; then pass "SIGTERM: the sidecar drained and exited 0"; else fail "SIGTERM: exit $rc"; fi
else
  fail "SIGTERM: still running after 10 s"
fi

# ---- the webhook over TLS
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj "/CN=localhost" \
  -addext "subjectAltName=IP:127.0.0.1,DNS:localhost" -keyout "$TMP/tls.key" -out "$TMP/tls.crt" >/dev/null 2>&1 \
  || die "openssl could not make a certificate"
start webhook "$BIN" inject --serve --listen "$H:$P_WH" --admin "$H:$P_WH_ADMIN" \
  --tls-cert "$TMP/tls.crt" --tls-key "$TMP/tls.key" --image tokentap:0.1.0
wait_http webhook "http://$H:$P_WH_ADMIN/readyz" 200 30 || die "webhook not ready"
python3 - "$TMP/in.yaml" "$TMP/out.yaml" "$TMP" <<'EOF' || die "cannot build the reviews"
import json, sys, yaml
def template(path):
    d = next(d for d in yaml.safe_load_all(open(path)) if d and d["kind"] == "Deployment")
    t = d["spec"]["template"]
    return {"apiVersion": "v1", "kind": "Pod", **t}
def review(pod, uid):
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": "default",
        "operation": "CREATE", "userInfo": {"username": "e2e"}, "object": pod, "dryRun": False}}
json.dump(review(template(sys.argv[1]), "uid-1"), open(f"{sys.argv[3]}/review.json", "w"))
json.dump(template(sys.argv[2]), open(f"{sys.argv[3]}/cli-pod.json", "w"))
json.dump(review(template(sys.argv[2]), "uid-2"), open(f"{sys.argv[3]}/review-injected.json", "w"))
EOF
post() {
  curl -sS -m 10 --cacert "$TMP/tls.crt" -o "$TMP/$2" -w '%{http_code}' \
    -H 'content-type: application/json' --data-binary "@$1" "https://$H:$P_WH/mutate"
}
code=$(post "$TMP/review.json" answer.json)
if [ "$code" = 200 ] && python3 - "$TMP/review.json" "$TMP/answer.json" "$TMP/cli-pod.json" <<'EOF'
import base64, copy, json, sys
review, answer, cli = (json.load(open(p)) for p in sys.argv[1:])
r = answer["response"]
assert answer["kind"] == "AdmissionReview" and r["uid"] == "uid-1" and r["allowed"] is True, r
assert r["patchType"] == "JSONPatch", r
ops = json.loads(base64.b64decode(r["patch"]))
def walk(doc, path):
    parts = [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]
    for p in parts[:-1]:
        doc = doc[int(p)] if isinstance(doc, list) else doc[p]
    return doc, parts[-1]
pod = copy.deepcopy(review["request"]["object"])
for op in ops:  # RFC 6902 add / remove / replace, what the webhook sends
    parent, key = walk(pod, op["path"])
    if isinstance(parent, list):
        i = len(parent) if key == "-" else int(key)
        if op["op"] == "add": parent.insert(i, op["value"])
        elif op["op"] == "remove": del parent[i]
        else: parent[i] = op["value"]
    else:
        if op["op"] == "remove": del parent[key]
        else: parent[key] = op["value"]
assert pod == cli, json.dumps([pod, cli])[:2000]
print(f"{len(ops)} patch operations")
EOF
then
  pass "webhook over TLS: the patch applied to the pod gives the CLI's pod template"
else
  fail "webhook answer (HTTP $code)"; head -c 800 "$TMP/answer.json"; log_tail webhook
fi
code=$(post "$TMP/review-injected.json" answer2.json)
if [ "$code" = 200 ] && python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["response"]; sys.exit(0 if r["allowed"] and "patch" not in r else 1)' "$TMP/answer2.json"; then
  pass "webhook: an injected pod is admitted unchanged"
else
  fail "webhook on an injected pod (HTTP $code)"; head -c 400 "$TMP/answer2.json"
fi
printf '{"kind": "AdmissionRev' >"$TMP/garbage.json"
code=$(post "$TMP/garbage.json" answer3.json)
if [ "$code" = 400 ]; then pass "webhook: a body that is not a review gets 400"; else fail "webhook on garbage: HTTP $code"; fi
wm=$(curl -s -m 5 "http://$H:$P_WH_ADMIN/metrics")
if grep -q '^tokentap_inject_reviews_total{result="injected"} 1$' <<<"$wm" &&
   grep -q '^tokentap_inject_reviews_total{result="already_injected"} 1$' <<<"$wm" &&
   grep -q '^tokentap_inject_bad_requests_total 1$' <<<"$wm"; then
  pass "webhook /metrics: injected 1, already_injected 1, bad requests 1"
else
  fail "webhook /metrics"; echo "$wm" | grep -v '^#'
fi
if command -v promtool >/dev/null; then
  if promtool check metrics <<<"$wm" >"$TMP/promtool.log" 2>&1; then pass "promtool check metrics: the webhook's /metrics"
  else fail "promtool check metrics"; cat "$TMP/promtool.log"; fi
fi

summary
[ "$FAILED" -eq 0 ]
