#!/usr/bin/env python3
"""The tables of an interleaved A/B (scripts/bench/ab.sh's output): per round, each
target's CPU per event (total, user / system), and the per-round ratios asked for, with
their medians, for docs/PERFORMANCE.md and the perf log.

    python3 scripts/bench/ab_table.py RUN.txt new/old new/floor [new/new2 ...]

A pair of two names for one build (an A/A) shows what the instrument can resolve in that
run: its ratios are the noise that any other pair's carry too.
"""
import re
import statistics
import sys

LINE = re.compile(
    r"^c(\d+) r(\d+) (\S+)\s+cpu/event\s+([\d.]+) us \(user\s+([\d.]+) sys\s+([\d.]+)\)"
)


def rounds(path):
    """{round: {target: (total, user, sys)}} from one ab.sh output."""
    table = {}
    for line in open(path):
        m = LINE.match(line)
        if m:
            total, user, sys_ = (float(x) for x in m.group(4, 5, 6))
            table.setdefault(int(m.group(2)), {})[m.group(3)] = (total, user, sys_)
    return table


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    path, pairs = sys.argv[1], [p.split("/") for p in sys.argv[2:]]
    table = rounds(path)
    names = []
    for pair in pairs:
        names += [n for n in pair if n not in names]
    head = ["round"] + [f"{n} total (user / sys)" for n in names]
    head += [f"{kind} {a}/{b}" for a, b in pairs for kind in ("total", "user")]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    ratios = {(a, b, kind): [] for a, b in pairs for kind in ("total", "user")}
    for r in sorted(table):
        row = table[r]
        if any(n not in row for n in names):
            continue
        cells = [str(r)] + [f"{row[n][0]:.2f} ({row[n][1]:.2f} / {row[n][2]:.2f})" for n in names]
        for a, b in pairs:
            for kind, i in (("total", 0), ("user", 1)):
                ratio = row[a][i] / row[b][i] if row[b][i] else float("nan")
                ratios[(a, b, kind)].append(ratio)
                cells.append(f"{ratio:.2f}")
        print("| " + " | ".join(cells) + " |")
    print()
    for (a, b, kind), values in ratios.items():
        if values:
            print(f"- {kind} {a}/{b}: median {statistics.median(values):.3f}, "
                  f"range {min(values):.2f}-{max(values):.2f} over {len(values)} rounds")


if __name__ == "__main__":
    main()
