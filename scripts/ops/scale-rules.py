#!/usr/bin/env python3
"""Write a time-scaled copy of a Prometheus rules file, for end-to-end alert tests.

    scale-rules.py RULES OUT --factor 60

Divides every duration that decides when an alert fires by FACTOR: each alert's
`for:`, each group's `interval:`, and in every expression the range of a range
selector or subquery (`[5m]`, `[1h:1m]`) and an `offset`. With factor 60 a 5m window
becomes 5s, a 10m `for:` 10s and a 30d error budget 12h, so the alerts of the shipped
rules fire within seconds of what makes them fire in production, in the same order and
against the same thresholds. Names (`...:p99_5m`, `...:burn_rate:1h`) and annotation
texts stay as shipped: an alert that reaches a receiver reads exactly as in
production. Scale the Prometheus evaluation interval to match (a shipped 1m becomes
1s at factor 60). The input is never changed; the result must divide into whole
milliseconds, or the script refuses it.
"""
import argparse
import pathlib
import re
import sys

import yaml

UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000, "y": 31_536_000_000}
DURATION = r"(?:\d+(?:ms|s|m|h|d|w|y))+"
RANGE = re.compile(rf"\[\s*({DURATION})\s*(?::\s*({DURATION})?\s*)?\]")
OFFSET = re.compile(rf"\boffset\s+(-?)({DURATION})")


class _Dumper(yaml.SafeDumper):
    pass


# Multi-line expressions stay readable as literal blocks.
_Dumper.add_representer(str, lambda dumper, value: dumper.represent_scalar(
    "tag:yaml.org,2002:str", value, style="|" if "\n" in value else None))


def to_ms(text):
    return sum(int(n) * UNIT_MS[u] for n, u in re.findall(r"(\d+)(ms|s|m|h|d|w|y)", text))


def scaled(text, factor):
    ms = to_ms(text)
    if ms % factor:
        sys.exit(f"{text} / {factor} is not a whole number of milliseconds")
    ms //= factor
    if ms == 0:
        sys.exit(f"{text} / {factor} is zero")
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def scale_expr(expr, factor):
    def rng(m):
        step = f":{scaled(m.group(2), factor)}" if m.group(2) else (":" if ":" in m.group(0) else "")
        return f"[{scaled(m.group(1), factor)}{step}]"
    expr = RANGE.sub(rng, expr)
    return OFFSET.sub(lambda m: f"offset {m.group(1)}{scaled(m.group(2), factor)}", expr)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rules")
    ap.add_argument("out")
    ap.add_argument("--factor", type=int, required=True)
    a = ap.parse_args()
    if a.factor < 1:
        sys.exit("--factor must be a positive whole number")
    doc = yaml.safe_load(pathlib.Path(a.rules).read_text())
    exprs = fors = intervals = 0
    for group in doc["groups"]:
        if "interval" in group:
            group["interval"] = scaled(group["interval"], a.factor)
            intervals += 1
        for rule in group["rules"]:
            expr = str(rule["expr"])
            rule["expr"] = scale_expr(expr, a.factor)
            exprs += rule["expr"] != expr
            if "for" in rule:
                rule["for"] = scaled(rule["for"], a.factor)
                fors += 1
    pathlib.Path(a.out).write_text(yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=1000))
    print(f"wrote {a.out}: the windows of {exprs} expressions, {fors} `for:` and {intervals} group intervals "
          f"of {a.rules} divided by {a.factor}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
