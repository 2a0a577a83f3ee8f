#!/usr/bin/env python3
"""The table of an scripts/dev/ab-env.sh log: for each op, ranks and size,
the best time of each variant over the repetitions, and its ratio to the
first variant's (< 1: faster).

Usage: scripts/dev/ab-table.py LOG"""
import collections
import re
import sys


def human(size: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size} B"


def main() -> int:
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(sys.argv) == 2 else 2
    times = collections.defaultdict(list)
    variants, hdr = [], None
    for line in open(sys.argv[1]):
        m = re.match(r"== (\S+) n=(\d+) (\w+) rep=\d+", line)
        if m:
            hdr = m.groups()
            if hdr[0] not in variants:
                variants.append(hdr[0])
            continue
        if line.startswith("command"):
            break
        if hdr and re.match(r"^ +\d", line):
            f = line.split()
            times[(hdr[2], int(hdr[1]), int(f[0]), hdr[0])].append(float(f[5]))
    rows = sorted({k[:3] for k in times})
    print("| op | ranks | size | " + " | ".join(f"{v} (us)" for v in variants) +
          " | " + " | ".join(f"{v} / first" for v in variants[1:]) + " |")
    print("|---|---:|---:|" + "---:|" * (2 * len(variants) - 1))
    for op, n, size in rows:
        best = [min(times.get((op, n, size, v), [float("nan")])) for v in variants]
        cells = [f"{t:.0f}" for t in best] + [f"{t / best[0]:.2f}" for t in best[1:]]
        print(f"| {op} | {n} | {human(size)} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
