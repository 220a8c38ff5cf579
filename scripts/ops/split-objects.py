#!/usr/bin/env python3
"""Split rendered manifests: Kubernetes built-in kinds vs operator kinds (Prometheus Operator, cert-manager).

    split-objects.py RENDERED.yaml BUILTIN.yaml CRDS.json SOURCE-NAME

BUILTIN.yaml gets every object whose apiVersion is not monitoring.coreos.com or
cert-manager.io (for kubernetes-validate); CRDS.json gets the others as
[{"source": SOURCE-NAME, "object": {...}}] (for node/validate.mjs crds).
Prints the kinds found; exits 1 if the file holds no objects.
"""
import json
import sys

import yaml

src, builtin_out, crd_out, name = sys.argv[1:5]
with open(src) as f:
    docs = [d for d in yaml.safe_load_all(f) if d]
OPERATOR_GROUPS = ("monitoring.coreos.com/", "cert-manager.io/")
builtin = [d for d in docs if not str(d.get("apiVersion", "")).startswith(OPERATOR_GROUPS)]
crds = [{"source": name, "object": d} for d in docs if str(d.get("apiVersion", "")).startswith(OPERATOR_GROUPS)]
with open(builtin_out, "w") as f:
    yaml.safe_dump_all(builtin, f, sort_keys=False)
with open(crd_out, "w") as f:
    json.dump(crds, f)
print(f"{name}: built-in {[d['kind'] for d in builtin]}, operator {[c['object']['kind'] for c in crds]}")
sys.exit(0 if docs else 1)
