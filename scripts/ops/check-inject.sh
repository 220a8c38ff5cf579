#!/usr/bin/env bash
# `tokentap inject` against the Kubernetes schemas and its policy (issue 37):
#   * every expected output of the CLI fixtures (crates/inject/tests/fixtures/*.out.yaml;
#     `cargo test -p tokentap-inject` keeps them equal to what the code writes), List
#     items flattened: kubernetes-validate --strict against the oldest supported
#     Kubernetes (1.30) and the newest schema kubernetes-validate ships; kinds it has no
#     schema for (InferencePool) are listed and checked by the policy only;
#   * the same outputs through scripts/ops/check-inject.py injected (sidecar, ports,
#     probes, drain inside the grace period, Services and pools moved to tokentap);
#   * deploy/kubernetes/webhook rendered with kubectl kustomize: built-in objects with
#     kubernetes-validate --strict (both versions), the cert-manager objects against
#     their CRD schemas (scripts/ops/node/validate.mjs), check-inject.py webhook;
#   * with a binary built with `--features inject` (TOKENTAP_BIN): `tokentap inject`
#     writes each expected output, refuses two-ports.yaml with its expected message
#     and exit 2, and `--uninject` restores the input as data.
# Needs kubectl, kubernetes-validate, PyYAML, node with scripts/ops/node installed
# (scripts/ops-check.sh installs them). Ends with `check-inject: N passed, M failed`.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OPS=$ROOT/scripts/ops
FIX=$ROOT/crates/inject/tests/fixtures
# shellcheck source=scripts/ops/lib.sh
. "$OPS/lib.sh"
ops_init check-inject
cd "$ROOT" || exit 2

K8S_MIN=1.30.0
K8S_MAX=$(python3 - <<'PY'
import os, re, kubernetes_validate
d = os.path.join(os.path.dirname(kubernetes_validate.__file__), "kubernetes-json-schema")
vs = [tuple(map(int, m.groups())) for n in os.listdir(d) if (m := re.fullmatch(r"v(\d+)\.(\d+)\.(\d+)-local-strict", n))]
print(".".join(map(str, max(vs))))
PY
)

# validate NAME FILE: kubernetes-validate --strict at both versions; a WARN (no schema)
# fails too, since FILE holds built-in kinds only.
validate() {
  local v out rc
  for v in "$K8S_MIN" "$K8S_MAX"; do
    out=$(kubernetes-validate --strict -k "$v" "$2" 2>&1); rc=$?
    if [ $rc -eq 0 ] && ! grep -qE "^(WARN|ERROR)" <<<"$out" && grep -q passed <<<"$out"; then
      pass "kubernetes-validate --strict -k $v: $1"
    else
      fail "kubernetes-validate --strict -k $v: $1"; echo "$out" | tail -20
    fi
  done
}

outputs=()
for f in "$FIX"/*.out.yaml; do
  n=$(basename "$f")
  outputs+=("$f")
  python3 "$OPS/check-inject.py" split "$f" "$TMP/$n.builtin.yaml" "$TMP/$n.other.json" >"$TMP/split.log" 2>&1 \
    || { fail "split $n"; cat "$TMP/split.log"; continue; }
  validate "fixtures/$n" "$TMP/$n.builtin.yaml"
  others=$(python3 -c 'import json,sys; print(" ".join(sorted({d["kind"] for d in json.load(open(sys.argv[1]))})))' "$TMP/$n.other.json")
  [ -n "$others" ] && echo "  note: $n: no schema here for $others (checked by the policy only)"
done
if python3 "$OPS/check-inject.py" injected "${outputs[@]}" >"$TMP/policy.log" 2>&1; then
  pass "policy of every injected fixture ($(tail -1 "$TMP/policy.log"))"
else
  fail "policy of the injected fixtures"; grep -v '^PASS' "$TMP/policy.log"
fi

if kubectl kustomize deploy/kubernetes/webhook -o "$TMP/webhook.yaml" 2>"$TMP/kz.log"; then
  pass "kustomize: deploy/kubernetes/webhook renders"
  python3 "$OPS/split-objects.py" "$TMP/webhook.yaml" "$TMP/webhook-builtin.yaml" "$TMP/webhook-crds.json" webhook >/dev/null
  validate "deploy/kubernetes/webhook built-in objects" "$TMP/webhook-builtin.yaml"
  if (cd "$OPS/node" && node validate.mjs crds "$TMP/webhook-crds.json") >"$TMP/crd.log" 2>&1 &&
     grep -q "PASS webhook: Certificate" "$TMP/crd.log"; then
    pass "cert-manager objects: CRD schema + no unknown fields (@kubernetes-models/cert-manager, tsc)"
  else
    fail "cert-manager objects against their CRD schema"; cat "$TMP/crd.log"
  fi
  if python3 "$OPS/check-inject.py" webhook "$TMP/webhook.yaml" >"$TMP/wpolicy.log" 2>&1; then
    pass "policy: deploy/kubernetes/webhook ($(tail -1 "$TMP/wpolicy.log"))"
  else
    fail "policy: deploy/kubernetes/webhook"; grep -v '^PASS' "$TMP/wpolicy.log"
  fi
else
  fail "kustomize: deploy/kubernetes/webhook renders"; cat "$TMP/kz.log"
fi

BIN=${TOKENTAP_BIN:-$ROOT/target/debug/tokentap}
if [ -x "$BIN" ] && "$BIN" inject --help >/dev/null 2>&1 && printf '' | "$BIN" inject - >/dev/null 2>&1; then
  for f in "$FIX"/*.yaml; do
    case $f in *.out.yaml) continue ;; esac
    n=$(basename "$f" .yaml)
    if [ -f "$FIX/$n.out.yaml" ]; then
      if "$BIN" inject "$f" >"$TMP/$n.cli.yaml" 2>"$TMP/$n.cli.err" && cmp -s "$TMP/$n.cli.yaml" "$FIX/$n.out.yaml" &&
         "$BIN" inject --uninject "$TMP/$n.cli.yaml" >"$TMP/$n.back.yaml" 2>/dev/null &&
         python3 -c 'import sys, yaml
a, b = ([d for d in yaml.safe_load_all(open(p)) if d] for p in sys.argv[1:])
sys.exit(0 if a == b else 1)' "$TMP/$n.back.yaml" "$f"; then
        pass "tokentap inject $n.yaml writes $n.out.yaml; --uninject gives the input back"
      else
        fail "tokentap inject $n.yaml"; diff "$FIX/$n.out.yaml" "$TMP/$n.cli.yaml" | head -20; cat "$TMP/$n.cli.err"
      fi
    else
      "$BIN" inject "$f" >"$TMP/$n.cli.yaml" 2>"$TMP/$n.cli.err"; rc=$?
      if [ $rc -eq 2 ] && [ ! -s "$TMP/$n.cli.yaml" ] && diff <(sed 's/^tokentap inject: //' "$TMP/$n.cli.err") "$FIX/$n.err.txt" >/dev/null; then
        pass "tokentap inject $n.yaml refuses (exit 2) with $n.err.txt"
      else
        fail "tokentap inject $n.yaml: exit $rc"; cat "$TMP/$n.cli.err"
      fi
    fi
  done
else
  skip "the CLI against the expected outputs: no binary built with --features inject at $BIN"
fi

summary
[ "$FAILED" -eq 0 ]
