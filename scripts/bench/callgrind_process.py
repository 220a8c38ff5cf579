#!/usr/bin/env python3
"""The figures of `budget.sh --process`, read from its two callgrind dumps (and the
dump reader, `totals`, that the benches' part of `budget.sh` uses too).

The counters were zeroed after a warm-up, dumped after R requests of S token events
(`PATH.out.1`) and again after R requests of L (`PATH.out.2`). Per request = the first
dump / R; per token event = (the second - the first) / ((L - S) R).

With --lines N it also prints the code each event and each request runs, in 64-byte
lines (the unit the instruction cache holds), from a run with `--dump-instr=yes`: the
lines the second dump ran at least once per two of its events (the per-event code), and
those it ran at least 0.9 times per request but less often than that (the per-request
code), then the N functions with the most per-event lines. Those sizes, set beside the
L1 instruction cache (32-64 KiB), say whether an event's code stays in it between two
events; misses per event say the rest.

    callgrind_process.py OUT PATH REQUESTS SHORT LONG [--lines N]
"""

import collections
import glob
import re
import sys


def totals(path):
    """The event counts of a whole dump (its `totals:` or `summary:` line)."""
    names = values = None
    for line in open(path):
        if line.startswith("events:"):
            names = line.split()[1:]
        elif line.startswith("totals:") or line.startswith("summary:"):
            values = [int(v) for v in line.split()[1:]]
    if names is None or values is None:
        sys.exit(f"callgrind_process.py: no totals in {path}")
    values += [0] * (len(names) - len(values))
    return dict(zip(names, values))


def figures(d, n):
    d1 = d["D1mr"] + d["D1mw"]
    ll = d["ILmr"] + d["DLmr"] + d["DLmw"]
    text = f"{d['Ir'] / n:10.0f} Ir {d['I1mr'] / n:8.1f} I1 {d1 / n:8.1f} D1 {ll / n:7.1f} LL misses"
    if "Bcm" in d:
        # Conditional and indirect branches the simulated predictor got wrong.
        text += f" {d['Bcm'] / n:7.1f} cond {d['Bim'] / n:6.1f} indirect mispredicted"
    return text


def executions(path):
    """How often each 64-byte line of code ran, by function: {function: {line: runs}}.

    Reads callgrind's format with `positions: instr line`: names and files are
    compressed to `(id)` after their first use, positions may be relative (`+3`, `-8`)
    or repeated (`*`), and the cost line after `calls=` is a call's inclusive cost,
    which belongs to the callee.
    """
    names = {}
    ran = collections.defaultdict(collections.Counter)
    positions = ["line"]
    last = [0, 0]
    function = None
    after_call = False
    for raw in open(path, errors="replace"):
        line = raw.rstrip("\n")
        if line.startswith("positions:"):
            positions = line.split()[1:]
            continue
        if line.startswith(("fn=", "cfn=")):
            m = re.match(r"c?fn=\((\d+)\)(?: (.*))?", line)
            if m and m.group(2):
                names[m.group(1)] = m.group(2)
            if line.startswith("fn=") and m:
                function = m.group(1)
            continue
        if line.startswith("calls="):
            after_call = True
            continue
        if not line or line[0] not in "0123456789+-*":
            continue
        parts = line.split()
        for i, p in enumerate(parts[: len(positions)]):
            if p != "*":
                last[i] = last[i] + int(p, 0) if p[0] in "+-" else int(p, 0)
        if after_call:
            after_call = False
            continue
        cost = parts[len(positions) :]
        if cost and positions[0] == "instr":
            # A line ran as often as its most run instruction.
            lines = ran[function]
            lines[last[0] // 64] = max(lines[last[0] // 64], int(cost[0]))
    return {names.get(f, f): lines for f, lines in ran.items()}


def code_lines(path, requests, events, top):
    ran = executions(path)
    per_event, per_request = {}, {}
    for function, lines in ran.items():
        per_event[function] = {l for l, n in lines.items() if n >= events / 2}
        per_request[function] = {
            l for l, n in lines.items() if requests * 0.9 <= n < events / 2
        }
    every_event = set().union(*per_event.values())
    every_request = set().union(*per_request.values()) - every_event
    print(
        f"  code run per event:   {len(every_event):5d} lines of 64 bytes, "
        f"{len(every_event) * 64 / 1024:6.1f} KiB"
    )
    print(
        f"  code run per request: {len(every_request):5d} lines of 64 bytes, "
        f"{len(every_request) * 64 / 1024:6.1f} KiB (besides the per-event code)"
    )
    if not every_event:
        print("  (no per-event lines: was the run made with --dump-instr=yes?)")
    print(f"  the {top} functions with the most per-event lines:")
    for function, lines in sorted(per_event.items(), key=lambda kv: -len(kv[1]))[:top]:
        print(f"    {len(lines):5d}  {function[:140]}")


def main():
    args = sys.argv[1:]
    top = 0
    if "--lines" in args:
        i = args.index("--lines")
        top = int(args[i + 1])
        del args[i : i + 2]
    out, path = args[0], args[1]
    requests, short, long_ = (int(v) for v in args[2:5])
    dumps = sorted(glob.glob(f"{out}/{path}.out.*"), key=lambda f: int(f.rsplit(".", 1)[1]))
    a, b = totals(dumps[0]), totals(dumps[1])
    print(f"process/{path}: per request ({short} token events) {figures(a, requests)}")
    per_event = {k: b[k] - a[k] for k in a}
    pad = " " * (len(str(short)) + 15)
    print(f"process/{path}: per token event {pad}{figures(per_event, (long_ - short) * requests)}")
    if top:
        code_lines(dumps[1], requests, long_ * requests, top)


if __name__ == "__main__":
    main()
