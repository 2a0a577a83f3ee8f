#!/usr/bin/env python3
"""mep.ep's normal mode (prefill/training dispatch and combine) on 2 GPUs
(--ranks N: N GPUs, a rank each), against all_to_all_single over NCCL
moving the same rows, same run.

Each rank has --tokens tokens (default 4096) of --hidden values (default
7168), each routed to --topk of --experts experts (default top-8 of 256,
as DeepEP's test_intranode). mep: the cached dispatch (a handle: no count
exchange, what DeepEP's test times), BF16 and FP8, and the combine, with
Config(--sms, ...) (default 24 SMs). NCCL: one all_to_all_single of the
rows each rank sends each rank (already gathered: only the movement is
timed), and the same back for combine; and, as a user would dispatch
over NCCL, with the count exchange and the gather of the rows (against
mep's dispatch with its count exchange) and combine with the sum of the
rows per token. Per call: the slower rank's median
of CUDA-event times; GB/s = bytes received / time (DeepEP's "NVL" figure);
the peer copy bandwidth (cudaMemcpyPeer, one GPU to the other) of this
machine for scale. Before timing, every rank checks its dispatched rows
and its combined tokens against its own inputs (exits 1 on a difference).

With --kernels N, N more calls of each run under torch's profiler and
each kernel's mean time is printed per rank (the receive's includes its
wait for the peer's send).

Usage: scripts/bench-ep-normal.py [--ranks N] [--tokens N] [--hidden H] [--kernels N]
                                  [--json FILE]"""
import argparse
import json
import os
import sys

from importlib import util

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = util.spec_from_file_location("bench_cuda", os.path.join(HERE, "bench-cuda.py"))
bc = util.module_from_spec(_spec)
_spec.loader.exec_module(bc)


def median_us(fn, iters, warmup):
    """Median GPU time of fn's work: the calls are queued back to back
    between events, so that the host's own time per call is hidden where
    it is shorter than the GPU's (calls that wait on the host are not)."""
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(iters)]
    for a, b in ev:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    times = sorted(a.elapsed_time(b) * 1000 for a, b in ev)
    return times[len(times) // 2]


def kernel_us(fn, iters):
    """Mean GPU time of each mep kernel fn launches (torch's profiler):
    where a call's time goes between its send and its receive, whose time
    includes its wait for the peers' sends. The ranks meet once the
    profiler runs, whose start takes each a different time, so that no
    receive waits for a peer still starting it."""
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        dist.barrier()
        torch.cuda.synchronize()
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        if "mep::ep" in e.key and e.count:
            name = e.key.split("::")[-1].split("(")[0]
            out[name] = e.device_time_total / e.count
    return out


def rank_rows(rank, world, port, args):
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    import torch
    import torch.distributed as dist
    import mep.ep as ep
    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    bc.join_group("nccl", rank, world, port, device_id=dev)
    n, hidden, E, K = args.tokens, args.hidden, args.experts, args.topk
    size = ep.Buffer.get_normal_buffer_size_hint(n, hidden, world, K)
    buf = ep.Buffer(dist.group.WORLD, size, 0)
    g = torch.Generator(device=dev).manual_seed(rank + 1)
    x = torch.randn((n, hidden), device=dev, generator=g).to(torch.bfloat16)
    scores = torch.rand((n, E), device=dev, generator=g) + 1
    idx = torch.topk(scores, K, dim=-1, sorted=False)[1]
    w = torch.rand((n, K), device=dev, generator=g)
    xf = x.float().view(n, hidden // 128, 128)
    amax = xf.abs().amax(-1).clamp(min=1e-4)
    x8 = ((xf * (448.0 / amax).unsqueeze(-1)).view(n, hidden).to(torch.float8_e4m3fn),
          (amax / 448.0).T.contiguous().T)
    cfg = ep.Config(args.sms, 8, 256)
    ntr, _, nte, itr, _ = buf.get_dispatch_layout(idx, E)
    recv, _, _, _, handle, _ = buf.dispatch(x, num_tokens_per_rank=ntr, is_token_in_rank=itr,
                                            num_tokens_per_expert=nte, topk_idx=idx,
                                            topk_weights=w, config=cfg)
    # the check: the rows of every source in order; combine sums them back
    rpm = handle[0].cpu()
    out_split = [int(rpm[s, rank] - (rpm[s - 1, rank] if s else 0)) for s in range(world)]
    in_split = [int(itr[:, r].sum()) for r in range(world)]
    nrecv = sum(out_split)
    sent = torch.cat([x[itr[:, r]] for r in range(world)])
    back = torch.empty((nrecv, hidden), dtype=x.dtype, device=dev)
    dist.all_to_all_single(back, sent, out_split, in_split)
    bad = int(not torch.equal(recv, back))
    combined, _, _ = buf.combine(recv, handle, config=cfg)
    want = (x.float() * itr.sum(1, keepdim=True)).to(torch.bfloat16)
    bad += int(not torch.equal(combined, want))
    # the same movement over NCCL
    rows = []
    order = torch.cat([torch.nonzero(itr[:, r]).flatten() for r in range(world)])

    def nccl_dispatch():
        """A dispatch over NCCL: the count exchange, then the rows gathered
        per destination and moved."""
        got = torch.empty_like(ntr)
        dist.all_to_all_single(got, ntr)
        split = got.tolist()
        out = torch.empty((sum(split), hidden), dtype=x.dtype, device=dev)
        dist.all_to_all_single(out, x.index_select(0, order), split, in_split)
        return out

    full_mep = median_us(lambda: buf.dispatch(x, num_tokens_per_rank=ntr, is_token_in_rank=itr,
                                              num_tokens_per_expert=nte, config=cfg),
                         args.iters, args.warmup)
    full_nccl = median_us(nccl_dispatch, args.iters, args.warmup)
    rows.append({"call": "dispatch BF16 with its count exchange", "mep_us": full_mep,
                 "nccl_us": full_nccl, "bytes": nrecv * hidden * 2})
    for label, xin, es in (("dispatch BF16", x, 2), ("dispatch FP8", x8, 1 + 4 / 128)):
        mep_us = median_us(lambda: buf.dispatch(xin, handle=handle, config=cfg),  # noqa: B023
                           args.iters, args.warmup)
        src = torch.empty((sum(in_split), int(hidden * es)), dtype=torch.uint8, device=dev)
        dst = torch.empty((nrecv, int(hidden * es)), dtype=torch.uint8, device=dev)
        nccl_us = median_us(lambda: dist.all_to_all_single(dst, src, out_split, in_split),  # noqa: B023
                            args.iters, args.warmup)
        rows.append({"call": label, "mep_us": mep_us, "nccl_us": nccl_us,
                     "bytes": nrecv * hidden * es})
    y = recv
    mep_us = median_us(lambda: buf.combine(y, handle, config=cfg), args.iters, args.warmup)
    src = torch.empty((nrecv, hidden), dtype=torch.bfloat16, device=dev)
    dst = torch.empty((sum(in_split), hidden), dtype=torch.bfloat16, device=dev)
    nccl_us = median_us(lambda: dist.all_to_all_single(dst, src, in_split, out_split),
                        args.iters, args.warmup)
    rows.append({"call": "combine", "mep_us": mep_us, "nccl_us": nccl_us,
                 "bytes": nrecv * hidden * 2})

    def nccl_combine():
        """A combine over NCCL: the rows moved back, then summed per token."""
        dist.all_to_all_single(dst, y, in_split, out_split)
        return torch.zeros_like(x).index_add_(0, order, dst)

    rows.append({"call": "combine with its sum", "mep_us": mep_us,
                 "nccl_us": median_us(nccl_combine, args.iters, args.warmup),
                 "bytes": nrecv * hidden * 2})
    kernels = {}
    if args.kernels:
        for label, fn in (("dispatch BF16", lambda: buf.dispatch(x, handle=handle, config=cfg)),
                          ("dispatch FP8", lambda: buf.dispatch(x8, handle=handle, config=cfg)),
                          ("combine", lambda: buf.combine(y, handle, config=cfg))):
            kernels[label] = kernel_us(fn, args.kernels)
    dist.barrier()
    buf.destroy()
    return {"rows": rows, "check_failures": bad, "kernels": kernels}


def rank_main(rank, world, port, args, results):
    bc.report_rank(rank, results, lambda: rank_rows(rank, world, port, args),
                   after=bc.leave_group)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--ranks", type=int, default=2, help="ranks, a GPU each (default 2)")
    ap.add_argument("--tokens", type=int, default=4096, help="tokens per rank (default 4096)")
    ap.add_argument("--hidden", type=int, default=7168, help="hidden (default 7168)")
    ap.add_argument("--experts", type=int, default=256, help="experts (default 256)")
    ap.add_argument("--topk", type=int, default=8, help="experts per token (default 8)")
    ap.add_argument("--sms", type=int, default=24, help="Config's num_sms (default 24)")
    ap.add_argument("--iters", type=int, default=50, help="timed calls (default 50)")
    ap.add_argument("--warmup", type=int, default=5, help="warm-up calls (default 5)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds (default 600)")
    ap.add_argument("--kernels", type=int, default=0, metavar="N",
                    help="also profile N calls of each and print each kernel's mean time")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = ap.parse_args()
    R = args.ranks
    if (args.hidden <= 0 or args.hidden % 128 or R < 2 or args.experts % R
            or args.tokens < 1):
        ap.error("hidden must be a positive multiple of 128, ranks >= 2 dividing experts, "
                 "tokens >= 1")
    import torch
    ngpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if ngpu < R:
        print(f"bench-ep-normal: needs {R} GPUs (this machine shows {ngpu})", file=sys.stderr)
        return 2
    got, rc = bc.run_ranks("bench-ep-normal", rank_main, R, args)
    if rc:
        return rc
    copy = bc.peer_copy_gbps()
    name = torch.cuda.get_device_name(0)
    print(f"{name} x {R}, {args.tokens} tokens per rank, hidden {args.hidden}, top-{args.topk} "
          f"of {args.experts} experts, Config num_sms {args.sms}; slower rank's median; "
          f"peer copy {copy:.0f} GB/s")
    print("| call | mep (us) | mep GB/s | of peer copy | NCCL all_to_all_single (us) "
          "| mep / NCCL time |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    rows = []
    for per_rank in zip(*(got[r]["rows"] for r in range(R))):
        row = dict(per_rank[0], mep_us=max(p["mep_us"] for p in per_rank),
                   nccl_us=max(p["nccl_us"] for p in per_rank))
        gbps = row["bytes"] / row["mep_us"] / 1e3
        print(f"| {row['call']} | {row['mep_us']:.1f} | {gbps:.0f} | {gbps / copy:.2f} | "
              f"{row['nccl_us']:.1f} | {row['mep_us'] / row['nccl_us']:.2f} |")
        rows.append(row)
    if args.kernels:
        print("\n| call | kernel | " + " | ".join(f"rank {r} (us)" for r in range(R)) + " |")
        print("| --- | --- |" + " ---: |" * R)
        for label, times in got[0]["kernels"].items():
            for name in times:
                us = [got[r]["kernels"].get(label, {}).get(name, float("nan"))
                      for r in range(R)]
                print(f"| {label} | {name} | " + " | ".join(f"{u:.1f}" for u in us) + " |")
    bad = sum(got[r]["check_failures"] for r in got)
    if bad:
        print("bench-ep-normal: a rank's dispatched rows or combined tokens differ from "
              "its inputs", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows, "peer_copy_gbps": copy,
                       "device": name}, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
