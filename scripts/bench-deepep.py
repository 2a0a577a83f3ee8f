#!/usr/bin/env python3
"""mep.ep against DeepEP's low-latency mode, side by side in one run: the
same inputs in the same processes, outputs compared, time per call.

Needs deep_ep importable (scripts/deepep-side-by-side.sh builds a DeepEP
checkout and runs this) and mep.ep (PYTHONPATH as for scripts/bench-ep.py),
and 2 GPUs or more: one rank per GPU, an NCCL group as DeepEP's tests make.
The setting is the one of DeepEP's low-latency test: 128 tokens per rank,
top-8 of 256 experts; hidden 7168 and 4096 (--hidden).

For each hidden size both libraries first dispatch the same tokens (FP8
and BF16) and combine the same expert outputs (each library's BF16
dispatch output, as DeepEP's test does), and the results are compared:
the rows each local expert got, matched by (source rank, token) since
either library may order a source's rows within an expert differently,
FP8 codes and scales, and the combined tokens. Then each call is timed:
  eager  CUDA events around each call, calls back to back (median): what
         a program that does not capture graphs pays, host work included;
  graph  a CUDA graph of 10 calls in a row, replayed, per call.
Prints a markdown table with mep / DeepEP ratios; exits 1 if an output
differs beyond what the comparison allows (BF16 rows and FP8 codes and
scales exactly; combined tokens within one bf16 rounding step).

  scripts/bench-deepep.py [--ranks N] [--hidden 7168,4096] [--iters N]
                          [--json FILE]
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def _bench_ep_eager():
    """scripts/bench-ep-eager.py (timed_events, timed_graph), by path."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "bench_ep_eager", os.path.join(HERE, "bench-ep-eager.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def expert_rows(recv, recv_count, handle, world, tokens):
    """{local expert: rows sorted by (source, token)} of a dispatch output
    (recv: [local, world * tokens, ...]); the handle's src_info and
    layout_range are read as DeepEP lays them out ((begin << 32) | count)."""
    import torch
    src_info, layout_range = handle[0], handle[1]
    out = {}
    for e in range(recv.shape[0]):
        n = int(recv_count[e])
        src = torch.empty(n, dtype=torch.int64, device=recv.device)
        for s in range(world):
            v = int(layout_range[e, s])
            begin, count = v >> 32, v & 0xffffffff
            src[begin:begin + count] = s
        key = src * tokens + src_info[e, :n].long()
        out[e] = recv[e, :n][torch.argsort(key)]
    return out


def compare_dispatch(a, b, name):
    """Problems (strings) between two expert_rows results."""
    import torch
    bad = []
    for e in a:
        if a[e].shape != b[e].shape:
            bad.append(f"{name}: expert {e}: {tuple(a[e].shape)} rows against "
                       f"{tuple(b[e].shape)}")
        elif not torch.equal(a[e], b[e]):
            diff = (a[e] != b[e]).sum().item()
            bad.append(f"{name}: expert {e}: {diff} of {a[e].numel()} values differ")
    return bad


def bits(t):
    """A tensor's bytes as integers, for exact comparison of any dtype."""
    import torch
    return t.contiguous().view(torch.uint8)


def check(libs, x, idx, w, T, E, world):
    """Dispatches and combines with every library; returns problems."""
    import torch
    res = {}
    for name, buf in libs.items():
        r = {}
        for fp8 in (True, False):
            recv, cnt, handle, _, _ = buf.low_latency_dispatch(x, idx, T, E, use_fp8=fp8)
            if fp8:
                codes, scales = recv
                # scales [local, rows, H/128] as DeepEP's (a transposed view)
                rows = torch.cat([bits(codes), bits(scales.contiguous())], dim=-1)
                r["fp8"] = expert_rows(rows, cnt, handle, world, T)
            else:
                r["bf16"] = expert_rows(bits(recv), cnt, handle, world, T)
                out, _, _ = buf.low_latency_combine(recv, idx, w, handle)
                r["combine"] = out.float()
        torch.cuda.synchronize()
        res[name] = r
    (na, a), (nb, b) = res.items()
    bad = compare_dispatch(a["fp8"], b["fp8"], "FP8 codes and scales")
    bad += compare_dispatch(a["bf16"], b["bf16"], "BF16 rows")
    ca, cb = a["combine"], b["combine"]
    step = ca.abs().clamp(min=1e-30) * 2.0 ** -7  # one bf16 step
    over = ((ca - cb).abs() > step).sum().item()
    if over:
        bad.append(f"combine: {over} of {ca.numel()} values differ by more than a bf16 step")
    exact = torch.equal(ca, cb)
    return bad, exact


def rank_main(rank, world, store_path, args, q):
    import torch
    import torch.distributed as dist
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{store_path}", rank=rank,
                            world_size=world, device_id=torch.device("cuda", rank))
    import deep_ep
    import mep.ep
    be = _bench_ep_eager()
    T, E, K = args.tokens, args.experts, args.topk
    rows, problems = [], []
    for hidden in [int(h) for h in args.hidden.split(",")]:
        x, idx, w, g = be.inputs(rank, T, hidden, E, K, 11)
        hint = deep_ep.Buffer.get_low_latency_rdma_size_hint(T, hidden, world, E)
        libs = {
            "mep": mep.ep.Buffer(dist.group.WORLD, 0, hint, low_latency_mode=True,
                                 num_qps_per_rank=E // world, explicitly_destroy=True),
            "DeepEP": deep_ep.Buffer(dist.group.WORLD, 0, hint, low_latency_mode=True,
                                     num_qps_per_rank=E // world, explicitly_destroy=True),
        }
        bad, exact = check(libs, x, idx, w, T, E, world)
        problems += [f"rank {rank}, hidden {hidden}: {p}" for p in bad]
        for name, buf in libs.items():
            for call, fn in be.calls_of(buf, x, idx, w, T, E, world, g).items():
                dist.barrier()
                eager = be.timed_events(fn, args.warmup, args.iters)
                dist.barrier()
                graph = be.timed_graph(fn, 10, max(20, args.iters // 10))
                rows.append(dict(rank=rank, hidden=hidden, lib=name, call=call,
                                 eager_us=eager, graph_us=graph,
                                 combine_bit_identical=exact))
        torch.cuda.synchronize()
        dist.barrier()
        for buf in libs.values():
            buf.destroy()
    q.put((rows, problems))
    dist.barrier()
    dist.destroy_process_group()


def table(rows):
    """Markdown: per hidden and call, the slowest rank's time of each."""
    out = ["| hidden | call | mep eager (us) | DeepEP eager (us) | eager ratio | "
           "mep graph (us) | DeepEP graph (us) | graph ratio |",
           "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    keys = sorted({(r["hidden"], r["call"]) for r in rows}, key=lambda k: (-k[0], k[1]))
    for h, c in keys:
        def worst(lib, field):
            return max(r[field] for r in rows
                       if r["hidden"] == h and r["call"] == c and r["lib"] == lib)
        me, de = worst("mep", "eager_us"), worst("DeepEP", "eager_us")
        mg, dg = worst("mep", "graph_us"), worst("DeepEP", "graph_us")
        out.append(f"| {h} | {c} | {me:.1f} | {de:.1f} | {me / de:.2f} | "
                   f"{mg:.1f} | {dg:.1f} | {mg / dg:.2f} |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    be = _bench_ep_eager()
    be.add_setting_args(ap, 2)
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = ap.parse_args()
    import torch
    if torch.cuda.device_count() < args.ranks:
        print(f"bench-deepep: {args.ranks} ranks need {args.ranks} GPUs, "
              f"{torch.cuda.device_count()} here", file=sys.stderr)
        return 77
    got, ok = be.spawn(rank_main, args, timeout=600)
    rows = [r for part, _ in got for r in part]
    problems = [p for _, part in got for p in part]
    print(f"{torch.cuda.get_device_name(0)} x {args.ranks}, {args.tokens} tokens per rank, "
          f"top-{args.topk} of {args.experts} experts; slowest rank's median per call")
    print(table(rows))
    exact = all(r["combine_bit_identical"] for r in rows)
    print(f"combined tokens bit-identical to DeepEP's: {'yes' if exact else 'no'}")
    for p in problems:
        print("MISMATCH", p)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(rows=rows, problems=problems), f, indent=1)
    return 1 if problems or not ok else 0


if __name__ == "__main__":
    sys.exit(main())
