#!/usr/bin/env python3
"""mep vs gloo as c10d backends, in the same processes of the same run.

For 2 and 4 ranks on this machine (over loopback: MEP_TCP_IFNAME=lo), times
all_reduce, all_gather, reduce_scatter, all_to_all and broadcast at 8 B
(latency) and 4 KiB .. 64 MiB (bandwidth), and prints a markdown table with
the time per call of each backend and the ratio gloo time / mep time, i.e.
mep's speed relative to gloo (>= 1: mep faster). A backend's time is the
median over --rounds rounds (default 3) of the mean time per call in a
round (the slowest rank's); the rounds alternate between the backends, so
that a slow spell of the machine falls on both.

Sizes are per rank: all_reduce and broadcast buffers; all_gather's input
(its output is ranks x size); reduce_scatter's output (its input is
ranks x size); all_to_all's send buffer. Reductions use float32, the others
bytes. The tensor forms (all_gather_into_tensor, reduce_scatter_tensor,
all_to_all_single) are timed.

Usage: scripts/bench-c10d.py [--ranks 2 4] [--max-size 64M] [--quick]
[--rounds 3]
(the mep package must be importable: scripts/setup.sh, or PYTHONPATH at
build/frontends/c10d/python)."""
import argparse
import datetime
import multiprocessing as mp
import os
import platform
import sys
import time

os.environ.setdefault("MEP_TCP_IFNAME", "lo")
os.environ.setdefault("MEP_LOG", "error")

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")


def parse_size(s: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * mult[s[-1].upper()] if s[-1].upper() in mult else int(s)


def human(n: int) -> str:
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n // div} {unit}"
    return f"{n} B"


def iters_for(size: int, quick: bool) -> int:
    n = 200 if size <= 64 else 50 if size <= 64 << 10 else 20 if size <= 1 << 20 \
        else 6 if size <= 16 << 20 else 3
    return max(2, n // 4) if quick else n


def make_call(op, torch, dist, size, world, rank, group):
    """A function doing one call of `op` at `size`, with its buffers."""
    if op == "all_reduce":
        t = torch.ones(max(size // 4, 1))
        return lambda: dist.all_reduce(t, group=group)
    if op == "broadcast":
        t = torch.zeros(size, dtype=torch.uint8)
        return lambda: dist.broadcast(t, 0, group=group)
    if op == "all_gather":
        src = torch.zeros(size, dtype=torch.uint8)
        out = torch.empty(world * size, dtype=torch.uint8)
        return lambda: dist.all_gather_into_tensor(out, src, group=group)
    if op == "reduce_scatter":
        n = max(size // 4, 1)
        src, out = torch.ones(world * n), torch.empty(n)
        return lambda: dist.reduce_scatter_tensor(out, src, group=group)
    if op == "all_to_all":
        n = -(-size // world) * world
        src = torch.zeros(n, dtype=torch.uint8)
        out = torch.empty(n, dtype=torch.uint8)
        return lambda: dist.all_to_all_single(out, src, group=group)
    raise ValueError(op)


def rank_main(rank, world, port, sizes, ops, quick, rounds, results):
    import torch
    import torch.distributed as dist
    import mep  # noqa: F401  registers "mep"
    torch.set_num_threads(1)  # several ranks share few cores
    timeout = datetime.timedelta(seconds=300)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
    dist.init_process_group("mep", store=store, rank=rank, world_size=world,
                            timeout=timeout)
    groups = {"mep": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    gloo = groups["gloo"]
    for op in ops:
        for size in sizes:
            n = iters_for(size, quick)
            calls = {name: make_call(op, torch, dist, size, world, rank, group)
                     for name, group in groups.items()}
            for call in calls.values():
                for _ in range(max(2, n // 10)):
                    call()
            times = {name: [] for name in groups}
            for _ in range(rounds):
                for name, group in groups.items():
                    call = calls[name]
                    dist.barrier(group=group)
                    t0 = time.perf_counter()
                    for _ in range(n):
                        call()
                    dt = torch.tensor([(time.perf_counter() - t0) / n], dtype=torch.float64)
                    dist.all_reduce(dt, op=dist.ReduceOp.MAX, group=gloo)
                    times[name].append(dt.item())
            del calls
            med = {name: sorted(t)[len(t) // 2] for name, t in times.items()}
            if rank == 0:
                results.put((world, op, size, med["mep"], med["gloo"]))
    dist.destroy_process_group()
    if rank == 0:
        results.put(None)


def run_world(world, sizes, ops, quick, rounds):
    import torch.distributed as dist
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    procs = [ctx.Process(target=rank_main, args=(r, world, store.port, sizes, ops, quick,
                                                 rounds, results), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    rows = []
    deadline = time.monotonic() + 3600
    try:
        while time.monotonic() < deadline:
            item = results.get(timeout=deadline - time.monotonic())
            if item is None:
                break
            rows.append(item)
            w, op, size, tm, tg = item
            print(f"  {w} ranks {op:<15} {human(size):>8}: mep {tm * 1e6:10.1f} us, "
                  f"gloo {tg * 1e6:10.1f} us, ratio {tg / tm:5.2f}", file=sys.stderr, flush=True)
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
                p.join()
    if any(p.exitcode != 0 for p in procs):
        raise SystemExit(f"bench: ranks exited with {[p.exitcode for p in procs]}")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--max-size", default="64M")
    ap.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS)
    ap.add_argument("--quick", action="store_true", help="fewer iterations")
    ap.add_argument("--rounds", type=int, default=3,
                    help="timed rounds per backend, alternating; the median counts")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    top = parse_size(args.max_size)
    sizes = [8] + [s for s in (4 << 10 << 2 * i for i in range(8)) if s <= top]
    import torch
    import mep
    print(f"command: {' '.join(sys.argv)}")
    print(f"machine: {platform.node()}, {os.cpu_count()} cores, {platform.processor() or platform.machine()}; "
          f"torch {torch.__version__}, mep {mep.__version__}, MEP_TCP_IFNAME={os.environ['MEP_TCP_IFNAME']}")
    rows = []
    for w in args.ranks:
        rows += run_world(w, sizes, args.ops, args.quick, args.rounds)
    print()
    print("| op | ranks | size | mep (us) | gloo (us) | mep/gloo speed |")
    print("|---|---:|---:|---:|---:|---:|")
    for w, op, size, tm, tg in sorted(rows, key=lambda r: (OPS.index(r[1]), r[0], r[2])):
        print(f"| {op} | {w} | {human(size)} | {tm * 1e6:.1f} | {tg * 1e6:.1f} | {tg / tm:.2f} |")
    slower = [r for r in rows if r[4] / r[3] < 1.0]
    print(f"\n{len(rows) - len(slower)} of {len(rows)} points with mep at least as fast as gloo")


if __name__ == "__main__":
    main()
