#!/usr/bin/env python3
"""Generate the PrometheusRule object from deploy/prometheus/rules.yaml.

deploy/prometheus/rules.yaml is the single source of the rules (plain Prometheus
loads it directly, promtool tests it). The Prometheus Operator needs the same
groups wrapped in a PrometheusRule; this script writes that wrapper so the two
never drift:

    scripts/ops/gen-prometheusrule.py            # rewrite the generated file
    scripts/ops/gen-prometheusrule.py --check    # exit 1 if it is out of date

Needs PyYAML.
"""
import argparse
import difflib
import pathlib
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
SRC = ROOT / "deploy/prometheus/rules.yaml"
DST = ROOT / "deploy/kubernetes/components/prometheus-rules/prometheusrule.yaml"

HEADER = """\
# GENERATED from deploy/prometheus/rules.yaml by scripts/ops/gen-prometheusrule.py.
# Do not edit: change rules.yaml and re-run the script (ops-check fails on drift).
"""


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper, value):
    # Multi-line expressions stay readable as literal blocks.
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render() -> str:
    rules = yaml.safe_load(SRC.read_text())
    if not isinstance(rules, dict) or not isinstance(rules.get("groups"), list):
        sys.exit(f"{SRC}: expected a mapping with a `groups` list")
    obj = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "tokentap",
            "labels": {"app.kubernetes.io/name": "tokentap"},
        },
        "spec": {"groups": rules["groups"]},
    }
    body = yaml.dump(obj, Dumper=_Dumper, sort_keys=False, width=1000, allow_unicode=True)
    return HEADER + body


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare instead of writing")
    args = ap.parse_args()
    want = render()
    if args.check:
        have = DST.read_text() if DST.exists() else ""
        if have != want:
            sys.stdout.writelines(
                difflib.unified_diff(have.splitlines(True), want.splitlines(True), str(DST), "generated")
            )
            print(f"{DST.relative_to(ROOT)} is out of date: run scripts/ops/gen-prometheusrule.py")
            return 1
        print(f"{DST.relative_to(ROOT)} matches {SRC.relative_to(ROOT)}")
        return 0
    DST.write_text(want)
    print(f"wrote {DST.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
