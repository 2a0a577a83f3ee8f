#!/usr/bin/env python3
"""Benchmarks the "mep" c10d backend against NCCL on CUDA tensors.

Spawns 2 ranks (--ranks N: N; one GPU each; --share-gpu puts them all on
GPU 0) without torchrun. Each rank has a "mep" group and an "nccl" group over the same
ranks (with --share-gpu the reference is left out: NCCL cannot run two ranks
on one GPU). For all_reduce, all_gather, reduce_scatter, all_to_all and
broadcast over sizes 8 B .. 1 GiB it times both backends with CUDA events
(warm-up, then the median of N iterations, fewer for large sizes) and prints
a markdown table per operation: size, mep us, nccl us, ratio, and the bus
bandwidths as nccl-tests define them (all_reduce 2(n-1)/n, all_gather,
reduce_scatter and all_to_all (n-1)/n, broadcast 1). Also times a 1 GiB
copy from GPU 0 to GPU 1. NCCL_NVLS_ENABLE stays 0.

Example: PYTHONPATH=build/frontends/c10d/python scripts/bench-cuda.py --json out.json
"""
import argparse
import datetime
import json
import multiprocessing as mp
import os
import queue
import statistics
import sys
import time

OPS = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"]
BUSBW = {"all_reduce": lambda n: 2 * (n - 1) / n,
         "all_gather": lambda n: (n - 1) / n,
         "reduce_scatter": lambda n: (n - 1) / n,
         "all_to_all": lambda n: (n - 1) / n,
         "broadcast": lambda n: 1.0}


def sizes(max_bytes):
    out, s = [], 8
    while s <= max_bytes:
        out.append(s)
        s *= 4
    for extra in (256 << 10, 64 << 20, max_bytes):
        if extra <= max_bytes and extra not in out:
            out.append(extra)
    return sorted(out)


def iters_for(nbytes, base):
    """Fewer iterations as sizes grow: about base up to 1 MiB."""
    if nbytes <= 1 << 20:
        return base
    return max(5, int(base * (1 << 20) / nbytes))


def time_op(fn, warmup, iters):
    """Median microseconds of fn, each call timed with CUDA events."""
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0)
    return statistics.median(times)


def make_call(op, group, n, nbytes, dev):
    """A closure running op once on buffers of nbytes (the per-rank buffer:
    the result for all_reduce, all_gather and all_to_all, the input for
    reduce_scatter, as nccl-tests counts them)."""
    import torch
    import torch.distributed as dist
    elems = max(n, nbytes // 4 // n * n)  # float32, divisible by the ranks
    if op == "all_reduce":
        x = torch.ones(elems, device=dev)
        return lambda: dist.all_reduce(x, group=group)
    if op == "all_gather":
        x = torch.ones(elems // n, device=dev)
        y = torch.empty(elems, device=dev)
        return lambda: dist.all_gather_into_tensor(y, x, group=group)
    if op == "reduce_scatter":
        x = torch.ones(elems, device=dev)
        y = torch.empty(elems // n, device=dev)
        return lambda: dist.reduce_scatter_tensor(y, x, group=group)
    if op == "all_to_all":
        x = torch.ones(elems, device=dev)
        y = torch.empty(elems, device=dev)
        return lambda: dist.all_to_all_single(y, x, group=group)
    x = torch.ones(elems, device=dev)
    return lambda: dist.broadcast(x, src=0, group=group)


def peer_copy_gbps(nbytes=1 << 30):
    """GB/s of a GPU 0 -> GPU 1 copy (torch uses cudaMemcpyPeer)."""
    import torch
    if torch.cuda.device_count() < 2:
        return None
    src = torch.ones(nbytes // 4, device="cuda:0")
    dst = torch.empty(nbytes // 4, device="cuda:1")
    dst.copy_(src)
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


def rank_main(rank, world, port, args, results):
    report_rank(rank, results, lambda: rank_rows(rank, world, port, args))


def join_group(backend, rank, world, port, device_id=None):
    """In a rank process of run_ranks: joins a process group of `backend`
    over the spawner's TCPStore at `port` (device_id: the GPU bound to the
    group, as NCCL takes it)."""
    import torch.distributed as dist
    timeout = datetime.timedelta(seconds=120)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
    kw = {} if device_id is None else {"device_id": device_id}
    dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                            timeout=timeout, **kw)


def leave_group():
    import torch.distributed as dist
    dist.destroy_process_group()


def rank_rows(rank, world, port, args):
    """One rank's measurements: {"rows": [...], "path": the mep path}."""
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    import torch
    import torch.distributed as dist
    import mep
    dev = torch.device("cuda", 0 if args.share_gpu else rank)
    torch.cuda.set_device(dev)
    join_group("mep", rank, world, port)
    ref = None if args.share_gpu else dist.new_group(backend="nccl")
    path = mep.cuda_path()
    rows = []
    for op in args.ops:
        for nbytes in sizes(args.max_bytes):
            it = iters_for(nbytes, args.iters)
            wu = max(2, min(args.warmup, it))
            row = {"op": op, "bytes": nbytes}
            for name, group in (("mep", None), ("nccl", ref)):
                if name == "nccl" and group is None:
                    row[name] = None
                    continue
                fn = make_call(op, group, world, nbytes, dev)
                row[name] = time_op(fn, wu, it)
                del fn
                torch.cuda.empty_cache()
            rows.append(row)
    return {"rows": rows, "path": path}


def fmt_size(b):
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= div:
            return f"{b / div:g} {unit}"
    return f"{b} B"


def table(rows, n):
    lines = []
    for op in dict.fromkeys(r["op"] for r in rows):
        lines += [f"\n### {op} ({n} ranks)\n",
                  "| size | mep us | nccl us | ratio | mep busbw GB/s | nccl busbw GB/s |",
                  "|---:|---:|---:|---:|---:|---:|"]
        for r in (r for r in rows if r["op"] == op):
            f = BUSBW[op](n)

            def bw(us):
                return f"{r['bytes'] / (us * 1e-6) / 1e9 * f:.2f}" if us else "-"
            m, c = r["mep"], r["nccl"]
            ratio = f"{m / c:.2f}" if m and c else "-"
            lines.append(f"| {fmt_size(r['bytes'])} | {m:.1f} | "
                         f"{'-' if c is None else f'{c:.1f}'} | {ratio} | "
                         f"{bw(m)} | {bw(c)} |")
    return "\n".join(lines)


def report_rank(rank, results, body, after=None):
    """In a rank process: puts (rank, body()) on results, or (rank,
    {"error": its traceback}) when body raises, then runs after() (if
    any), and ends the process at once: os._exit, so that no teardown of
    CUDA, NCCL or mep can hang a rank that has reported."""
    try:
        results.put((rank, body()))
        if after:
            after()
    except BaseException:
        import traceback
        results.put((rank, {"error": traceback.format_exc()}))
    finally:
        try:
            results.close()
            results.join_thread()
        finally:
            os._exit(0)


def run_ranks(name, rank_main, world, args):
    """Spawns `world` processes running rank_main(rank, world, port, args,
    results) around a TCPStore, collects one result per rank (a dict; one
    with "error" is a failed rank) until args.timeout, reaps them all.
    Returns ({rank: result}, exit status)."""
    import torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, world, store.port, args, results))
             for r in range(world)]
    for p in procs:
        p.start()
    got, end, rc = {}, time.monotonic() + args.timeout, 0
    while len(got) < world:
        try:
            r, res = results.get(timeout=1.0)
            got[r] = res
        except queue.Empty:
            if time.monotonic() > end:
                print(f"{name}: ranks still running after {args.timeout} s; killed",
                      file=sys.stderr)
                rc = 1
                break
            if all(not p.is_alive() for p in procs) and results.empty():
                print(f"{name}: ranks exited without results", file=sys.stderr)
                rc = 1
                break
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join()
    for r, res in sorted(got.items()):
        if "error" in res:
            print(f"{name}: rank {r} failed:\n{res['error']}", file=sys.stderr)
            rc = 1
    if not rc and 0 not in got:
        rc = 1
    return got, rc


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--ops", default=",".join(OPS),
                    help="comma-separated subset of " + ", ".join(OPS))
    ap.add_argument("--max-bytes", type=int, default=1 << 30,
                    help="largest size in bytes (default 1 GiB)")
    ap.add_argument("--iters", type=int, default=50,
                    help="timed iterations for sizes up to 1 MiB (default 50)")
    ap.add_argument("--warmup", type=int, default=5, help="warm-up calls (default 5)")
    ap.add_argument("--ranks", type=int, default=2,
                    help="processes, one GPU each (default 2)")
    ap.add_argument("--share-gpu", action="store_true",
                    help="every rank on GPU 0 (no NCCL reference then)")
    ap.add_argument("--timeout", type=float, default=1800,
                    help="seconds before the ranks are killed (default 1800)")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = ap.parse_args()
    args.ops = [o for o in args.ops.split(",") if o]
    bad = [o for o in args.ops if o not in OPS]
    if bad:
        ap.error(f"unknown operation(s) {bad}; choose from {OPS}")
    import torch
    ngpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if args.ranks < 2:
        ap.error("--ranks must be at least 2")
    if ngpu < 1 or (ngpu < args.ranks and not args.share_gpu):
        print(f"bench-cuda: needs {args.ranks} GPUs (this machine shows {ngpu}); "
              "--share-gpu runs every rank on one", file=sys.stderr)
        return 2
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    world = args.ranks
    got, rc = run_ranks("bench-cuda", rank_main, world, args)
    if rc:
        return rc
    copy = None if args.share_gpu else peer_copy_gbps()
    res = got[0]
    print(f"# mep vs NCCL, {world} ranks, {'one shared GPU' if args.share_gpu else 'one GPU each'}, "
          f"mep path: {res['path'] or 'none'}")
    print(table(res["rows"], world))
    if copy is not None:
        print(f"\nGPU 0 -> GPU 1 copy (1 GiB, tensor.copy_): {copy:.1f} GB/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ranks": world, "share_gpu": args.share_gpu, "path": res["path"],
                       "rows": res["rows"], "peer_copy_gbps": copy}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
