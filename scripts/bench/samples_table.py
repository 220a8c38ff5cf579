#!/usr/bin/env python3
"""Where each target's user time goes, from the samples of `scripts/bench/ab.sh --samples`:
user time per event by function, summed over the rounds, side by side for the targets
named. A sample stands for the nanoseconds of the target's CPU in its period (`perf record
-c PERIOD` of the cpu-clock, 1 ms by default), so a function's nanoseconds per event are
its samples' periods summed over the events of the rounds (ab.sh writes them to
RUN_DIR/events.txt).

    python3 scripts/bench/samples_table.py RUN_DIR new old [floor ...] [--top N]

Functions are matched by name across the targets, so a function that one build inlines
and another does not shows apart in each; compare the totals and the groups, not one row.
"""
import argparse
import collections
import glob
import os
import subprocess
import sys


def user_ns(path):
    """{function: nanoseconds of user time} of one perf.data: its samples' periods."""
    out = subprocess.run(
        ["perf", "script", "-i", path, "-F", "period,ip,sym,dso"],
        capture_output=True, text=True, check=False,
    ).stdout
    found = collections.Counter()
    for line in out.splitlines():
        period, ip, rest = (line.strip().split(None, 2) + ["", ""])[:3]
        if not rest or ip.startswith("ffff"):
            continue
        sym, _, dso = rest.rpartition(" (")
        dso = os.path.basename(dso.rstrip(")"))
        # The target's own binary is named for its build: leave it off.
        lib = dso if dso.startswith(("lib", "[")) else ""
        found[f"{sym.strip()[:110]}  {lib}".rstrip()] += int(period)
    return found


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run", help="the run directory ab.sh --samples names at its end")
    parser.add_argument("names", nargs="+", help="the targets, side by side")
    parser.add_argument("--top", type=int, default=40, help="rows (functions) to print")
    args = parser.parse_args()
    run, names, top = args.run, args.names, args.top
    events = collections.Counter()
    for line in open(os.path.join(run, "events.txt")):
        name, _, count = line.split()
        events[name] += int(count)
    per = {}
    for name in names:
        total = collections.Counter()
        for path in sorted(glob.glob(os.path.join(run, f"{name}.r*.data"))):
            total.update(user_ns(path))
        if not events[name]:
            sys.exit(f"samples_table.py: no events recorded for {name} in {run}")
        per[name] = {f: ns / events[name] for f, ns in total.items()}
    print("| " + " | ".join(f"{n} (ns/event)" for n in names) + " | function |")
    print("|" + "---|" * (len(names) + 1))
    print("| " + " | ".join(f"**{sum(per[n].values()):.0f}**" for n in names) + " | all user time |")
    rows = sorted(
        {f for n in names for f in per[n]},
        key=lambda f: -max(per[n].get(f, 0) for n in names),
    )
    for f in rows[:top]:
        cells = " | ".join(f"{per[n].get(f, 0):.0f}" for n in names)
        print(f"| {cells} | `{f}` |")


if __name__ == "__main__":
    main()
