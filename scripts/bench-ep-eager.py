#!/usr/bin/env python3
"""What an eager (not graph-captured) mep.ep call costs, and where the host
time goes.

For each setting (FP8 and BF16 dispatch, combine; hidden 7168 and 4096) it
measures, on every rank:
  eager   CUDA events around each call, back to back (the host's work per
          call shows when it is longer than the GPU's);
  host    wall time per call of the Python call alone, calls back to back
          without waiting for the GPU;
  graph   a CUDA graph of 10 calls in a row, replayed, per call.
With --profile it also prints cProfile's top entries of 200 eager calls;
with --parts the host time of a dispatch's pieces on rank 0 (its outputs'
allocations alone, the C++ call without Python's checks, a bare kernel
launch from Python for scale).

Ranks run as processes on the GPUs there are (several per GPU when there
are fewer GPUs: their kernels then share the GPU, so only the host numbers
mean much; one rank alone sends to itself and measures the host's part
exactly). Uses a gloo group for the setup, as a user's program would.

  scripts/bench-ep-eager.py [--ranks N] [--iters N] [--hidden 7168,4096]
                            [--profile] [--parts] [--json FILE]
"""
import argparse
import cProfile
import importlib.util
import io
import json
import os
import pstats
import sys
import tempfile
import time


def _bench_ep():
    """scripts/bench-ep.py (graph_of, and bench-cuda.py's time_op as bc),
    loaded by path: its name is not a module name."""
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location("bench_ep", os.path.join(here, "bench-ep.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_be = _bench_ep()
timed_events = _be.bc.time_op  # CUDA events around each call, median us


def timed_host(fn, iters):
    """Microseconds per call of the host's work alone (no waiting)."""
    import torch
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    t = (time.perf_counter() - t0) / iters * 1e6
    torch.cuda.synchronize()
    return t


def timed_graph(fn, calls, iters):
    """Microseconds per call of a CUDA graph of `calls` calls, replayed."""
    return timed_events(_be.graph_of(fn, calls).replay, 5, iters) / calls


def profile(fn, calls=200, top=18):
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(calls):
        fn()
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(top)
    return s.getvalue()


def inputs(rank, T, hidden, E, K, seed):
    """One rank's tokens x [T, hidden] bf16, top-K of E experts and their
    weights, on the current GPU, and the generator they came from."""
    import torch
    g = torch.Generator(device="cpu").manual_seed(seed + rank)
    x = torch.randn(T, hidden, generator=g).to(torch.bfloat16).cuda()
    idx = torch.topk(torch.rand(T, E, generator=g), K, dim=-1).indices.cuda()
    w = torch.rand(T, K, generator=g).cuda()
    return x, idx, w, g


def calls_of(buf, x, idx, w, T, E, world, g):
    """The calls timed on buf (a mep.ep or deep_ep Buffer): FP8 and BF16
    dispatch, and combine of random expert outputs (g draws them) with
    the handle of a BF16 dispatch made here."""
    import torch
    _, _, handle, _, _ = buf.low_latency_dispatch(x, idx, T, E, use_fp8=False)
    y = torch.randn(E // world, world * T, x.shape[1], generator=g).to(torch.bfloat16).cuda()
    return {
        "dispatch FP8": lambda: buf.low_latency_dispatch(x, idx, T, E, use_fp8=True),
        "dispatch BF16": lambda: buf.low_latency_dispatch(x, idx, T, E, use_fp8=False),
        "combine": lambda: buf.low_latency_combine(y, idx, w, handle),
    }


def rank_main(rank, world, store_path, args, out):
    import torch
    import torch.distributed as dist
    ngpu = torch.cuda.device_count()
    torch.cuda.set_device(rank % ngpu)
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank,
                            world_size=world)
    from mep.ep import Buffer
    T, E, K = args.tokens, args.experts, args.topk
    rows = []
    for hidden in [int(h) for h in args.hidden.split(",")]:
        x, idx, w, g = inputs(rank, T, hidden, E, K, 7)
        hint = Buffer.get_low_latency_rdma_size_hint(T, hidden, world, E)
        buf = Buffer(dist.group.WORLD, 0, hint, low_latency_mode=True,
                     num_qps_per_rank=E // world)
        for name, fn in calls_of(buf, x, idx, w, T, E, world, g).items():
            dist.barrier()
            row = {"rank": rank, "hidden": hidden, "call": name}
            row["eager_us"] = timed_events(fn, args.warmup, args.iters)
            dist.barrier()
            row["host_us"] = timed_host(fn, args.iters)
            dist.barrier()
            row["graph_us"] = timed_graph(fn, 10, max(20, args.iters // 10))
            if args.profile and rank == 0 and hidden == int(args.hidden.split(",")[0]):
                row["profile"] = profile(fn)
            rows.append(row)
        if args.parts and rank == 0:
            rows += [dict(rank=rank, hidden=hidden, call=name, host_us=timed_host(fn, args.iters))
                     for name, fn in dispatch_parts(buf, x, idx, T, E, world).items()]
        torch.cuda.synchronize()
        buf.destroy()
    out.put(rows)
    dist.destroy_process_group()


def dispatch_parts(buf, x, idx, T, E, world):
    """Pieces of an FP8 dispatch's host time (--parts)."""
    import torch
    from mep.ep import _c, _ops_lookup
    local, hidden, dev = E // world, x.shape[1], x.device
    ops = _ops_lookup()[0]

    def allocs():
        torch.empty((local, world * T, hidden), dtype=torch.float8_e4m3fn, device=dev)
        torch.empty((local, hidden // 128, world * T), dtype=torch.float32, device=dev)
        torch.empty((local, world * T), dtype=torch.int32, device=dev)
        torch.empty((local, world), dtype=torch.int64, device=dev)
        torch.empty((local,), dtype=torch.int32, device=dev)
    parts = {" 5 empty()": allocs,
             " one launch": lambda: torch.cuda._sleep(1)}
    if ops is not None:
        parts[" _ops.dispatch"] = lambda: ops.dispatch(
            buf._buf.value, x, idx, local, world, T, _c.FP8, None, 0, None)
    return parts


def add_setting_args(ap, ranks):
    """The options of the setting, shared with scripts/bench-deepep.py."""
    ap.add_argument("--ranks", type=int, default=ranks, help=f"processes (default {ranks})")
    ap.add_argument("--tokens", type=int, default=128, help="tokens per rank (default 128)")
    ap.add_argument("--experts", type=int, default=256, help="experts (default 256)")
    ap.add_argument("--topk", type=int, default=8, help="experts per token (default 8)")
    ap.add_argument("--hidden", default="7168,4096", help="hidden sizes (default 7168,4096)")
    ap.add_argument("--iters", type=int, default=300, help="timed calls (default 300)")
    ap.add_argument("--warmup", type=int, default=30, help="warm-up calls (default 30)")


def spawn(rank_main, args, timeout=900):
    """Runs rank_main(rank, world, store_path, args, queue) in args.ranks
    processes (spawned; each puts one result on the queue); returns the
    results and whether every process exited 0. Every process is reaped."""
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    store = tempfile.NamedTemporaryFile(delete=False).name
    os.unlink(store)
    procs = [ctx.Process(target=rank_main, args=(r, args.ranks, store, args, q))
             for r in range(args.ranks)]
    for p in procs:
        p.start()
    got = []
    try:
        for _ in procs:
            got.append(q.get(timeout=timeout))
    finally:
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
                p.join()
    return got, all(p.exitcode == 0 for p in procs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    add_setting_args(ap, 1)
    ap.add_argument("--profile", action="store_true", help="print cProfile's top entries")
    ap.add_argument("--parts", action="store_true",
                    help="also time a dispatch's pieces on rank 0")
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = ap.parse_args()
    import torch
    if not torch.cuda.is_available():
        print("bench-ep-eager: no CUDA device", file=sys.stderr)
        return 77
    got, ok = spawn(rank_main, args)
    rows = [r for part in got for r in part]
    print(f"{'call':14} {'hidden':>6} {'rank':>4} {'eager us':>9} {'host us':>8} "
          f"{'graph us':>9}")
    for r in sorted(rows, key=lambda r: (r["hidden"], r["call"], r["rank"])):
        if "eager_us" in r:
            print(f"{r['call']:14} {r['hidden']:6d} {r['rank']:4d} {r['eager_us']:9.1f} "
                  f"{r['host_us']:8.1f} {r['graph_us']:9.1f}")
        else:
            print(f"{r['call']:14} {r['hidden']:6d} {r['rank']:4d} {'':9} {r['host_us']:8.1f}")
    for r in rows:
        if "profile" in r:
            print(f"\n== {r['call']}, hidden {r['hidden']}: cProfile of 200 calls\n"
                  + r["profile"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
