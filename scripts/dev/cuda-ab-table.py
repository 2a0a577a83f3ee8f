#!/usr/bin/env python3
"""The table of a scripts/dev/gpu-coll-ab.sh output folder: for each op,
rank count and size, the before and after trees' times (median over the
repetitions of bench-cuda.py's medians), NCCL's (median over all runs),
after / before, and each tree's ratio to the NCCL of its own runs (the
same processes; median over the repetitions; < 1: faster).

Usage: scripts/dev/cuda-ab-table.py DIR"""
import collections
import glob
import json
import os
import re
import statistics
import sys


def size(b):
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= div:
            return f"{b / div:g} {unit}"
    return f"{b} B"


def main() -> int:
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(sys.argv) == 2 else 2
    t = collections.defaultdict(list)
    for f in sorted(glob.glob(os.path.join(sys.argv[1], "*-n*-r*.json"))):
        m = re.match(r"(\w+)-n(\d+)-r\d+\.json", os.path.basename(f))
        if not m:
            continue
        tree, n = m.group(1), int(m.group(2))
        for r in json.load(open(f))["rows"]:
            t[(r["op"], n, r["bytes"], tree)].append(r["mep"])
            if r["nccl"]:
                t[(r["op"], n, r["bytes"], "nccl")].append(r["nccl"])
                t[(r["op"], n, r["bytes"], tree + "/nccl")].append(r["mep"] / r["nccl"])
    keys = sorted({k[:3] for k in t}, key=lambda k: (k[1], k[0], k[2]))
    last = None
    for op, n, b in keys:
        if (op, n) != last:
            print(f"\n### {op}, {n} ranks\n")
            print("| size | before us | after us | nccl us | after/before | before/nccl | after/nccl |")
            print("|---:|---:|---:|---:|---:|---:|---:|")
            last = (op, n)
        v = {x: statistics.median(t[(op, n, b, x)]) if t[(op, n, b, x)] else None
             for x in ("before", "after", "nccl")}

        def q(a, c):
            return f"{v[a] / v[c]:.2f}" if v[a] and v[c] else "-"

        def own(x):
            r = t[(op, n, b, x + "/nccl")]
            return f"{statistics.median(r):.2f}" if r else "-"

        def us(x):
            return f"{v[x]:.1f}" if v[x] else "-"
        print(f"| {size(b)} | {us('before')} | {us('after')} | {us('nccl')} | "
              f"{q('after', 'before')} | {own('before')} | {own('after')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
