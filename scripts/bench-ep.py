#!/usr/bin/env python3
"""Benchmarks mep.ep's low-latency dispatch and combine against the same data
movement done with torch.distributed all_to_all_single over NCCL.

Spawns 2 ranks on 2 GPUs (no torchrun). The setting is DeepEP's low-latency
one: 128 tokens per rank, top-8 of 256 experts, FP8 dispatch (e4m3 with
per-128-channel float scales), BF16 combine; hidden 7168 and 4096 (--hidden).
For mep it times each call eagerly, as a replay of a CUDA graph holding
that one call (no Python overhead), and as a replay of a graph holding 10
calls in a row (time / 10: no skew between the ranks' start times); for NCCL, what a user of
all_to_all_single needs for the same result: quantising to FP8, ordering the
token copies by expert, exchanging the counts (all_to_all_single of counts,
and the host reading them for the split sizes), the exchange, and the
unpacking into DeepEP's [experts, ranks * tokens, hidden] layout; for
combine the gather back into send order, the exchange and the weighted sum.
Each time is the median over --iters (>= 200) calls, each timed with CUDA
events. The bandwidth is what one rank sends: per token copy H + H/128*4
bytes for FP8 dispatch, 2H for combine (as DeepEP counts), next to the
GPU 0 -> GPU 1 copy bandwidth (1 GiB) as the limit. Before timing, both
paths are checked: each one's dispatch against the senders' tokens (the
same rows, each element at most one e4m3 code off), each one's combine of the
same expert outputs against a dense float64 reference (within bf16
rounding); a failure is printed, flagged in the table, and makes the exit
status 1, but every hidden size is still timed.

--hosts makes each rank a host of its own (MEP_HOST_ID per rank), as two
hosts without RDMA: mep then reaches the other GPU through the proxy over
tcp, and NCCL is kept to sockets (NCCL_P2P_DISABLE=1, NCCL_SHM_DISABLE=1,
NCCL_IB_DISABLE=1), so both move the bytes as they would across hosts.

--tcp runs mep over the TCP transport (MEP_TRANSPORTS=tcp: the proxy path,
GPU memory staged by a CPU thread), for the record.

Example: PYTHONPATH=build/frontends/c10d/python scripts/bench-ep.py --json ep.json
"""
import argparse
import importlib.util
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def _bench_cuda():
    """scripts/bench-cuda.py (time_op, peer_copy_gbps), loaded by path: its
    name is not a module name."""
    spec = importlib.util.spec_from_file_location("bench_cuda", os.path.join(HERE, "bench-cuda.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


bc = _bench_cuda()


class NcclPath:
    """Dispatch and combine with all_to_all_single, in DeepEP's layouts."""

    def __init__(self, rank, world, tokens, hidden, experts, group):
        self.rank, self.R, self.T, self.H, self.E = rank, world, tokens, hidden, experts
        self.L, self.G = experts // world, hidden // 128
        self.group = group

    def quantize(self, x):
        """e4m3 [n, H] and scales [n, H/128]: max(amax, 1e-4) / 448."""
        import torch
        n = x.shape[0]
        xf = x.float().view(n, self.G, 128)
        s = xf.abs().amax(-1).clamp(min=1e-4) / 448.0
        q = (xf / s[..., None]).view(n, self.H).to(torch.float8_e4m3fn)
        return q, s

    def dispatch(self, x, idx):
        import torch
        import torch.distributed as dist
        dev, H, G, L, R, T = x.device, self.H, self.G, self.L, self.R, self.T
        k = idx.shape[1]
        q, s = self.quantize(x)
        flat = idx.flatten()
        # token copies ordered by expert (so by rank); -1 sorts last, unsent
        key = torch.where(flat >= 0, flat, torch.full_like(flat, self.E))
        order = torch.argsort(key, stable=True)
        e = key[order]
        send_counts = torch.bincount(e, minlength=self.E + 1)[:self.E].view(R, L).sum(1)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=self.group)
        sc, rc = torch.stack([send_counts, recv_counts]).tolist()  # the host needs them
        m = sum(sc)
        order, e = order[:m], e[:m]
        tok = order // k
        payload = torch.cat([q[tok].view(torch.uint8), s[tok].view(torch.uint8),
                             (e % L).to(torch.int32)[:, None].view(torch.uint8),
                             tok.to(torch.int32)[:, None].view(torch.uint8)], dim=1)
        recv = torch.empty((sum(rc), payload.shape[1]), dtype=torch.uint8, device=dev)
        dist.all_to_all_single(recv, payload, rc, sc, group=self.group)
        # unpack: by local expert, by source rank within (recv is in rank order)
        le = recv[:, H + 4 * G:H + 4 * G + 4].contiguous().view(torch.int32).flatten().long()
        src_tok = recv[:, H + 4 * G + 4:].contiguous().view(torch.int32).flatten()
        order2 = torch.argsort(le, stable=True)
        le_s = le[order2]
        cnt = torch.bincount(le, minlength=L)
        start = torch.cumsum(cnt, 0) - cnt
        slot = torch.arange(le.numel(), device=dev) - start[le_s]
        recv_x = torch.empty((L, R * T, H), dtype=torch.float8_e4m3fn, device=dev)
        recv_x.view(torch.uint8)[le_s, slot] = recv[order2, :H]
        scales = torch.empty((L, G, R * T), dtype=torch.float32, device=dev)
        scales[le_s, :, slot] = recv[order2, H:H + 4 * G].contiguous().view(torch.float32)
        src_info = torch.empty((L, R * T), dtype=torch.int32, device=dev)
        src_info[le_s, slot] = src_tok[order2]
        handle = (order, sc, rc, order2, le_s, slot, k)
        return (recv_x, scales.transpose(1, 2)), cnt.to(torch.int32), src_info, handle

    def combine(self, y, w, handle, num_tokens):
        import torch
        import torch.distributed as dist
        order, sc, rc, order2, le_s, slot, k = handle
        back = torch.empty((order2.numel(), self.H), dtype=torch.bfloat16, device=y.device)
        back[order2] = y[le_s, slot]
        ret = torch.empty((sum(sc), self.H), dtype=torch.bfloat16, device=y.device)
        dist.all_to_all_single(ret, back, sc, rc, group=self.group)
        out = torch.zeros((num_tokens, self.H), dtype=torch.float32, device=y.device)
        out.index_add_(0, order // k, ret.float() * w.flatten()[order][:, None])
        return out.to(torch.bfloat16)


def graph_of(fn, calls=1):
    """A CUDA graph of `calls` calls of fn in a row (after 3 warm-up calls
    on a side stream, as torch asks). thread_local capture mode: other
    threads' CUDA calls during the capture (mep's TCP proxy thread, NCCL's
    watchdog) must not invalidate it."""
    import torch
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, capture_error_mode="thread_local"):
        for _ in range(calls):
            fn()
    torch.cuda.synchronize()
    return g


def make_inputs(r, T, H, E, K):
    """Rank r's tokens x [T, H] bf16, topk_idx [T, K] int64 and weights
    [T, K] float32, on the CPU: every rank can make every rank's."""
    import torch
    g = torch.Generator(device="cpu").manual_seed(100 + r)
    x = torch.randn(T, H, generator=g).to(torch.bfloat16)
    idx = torch.topk(torch.rand(T, E, generator=g), K, dim=-1).indices
    w = torch.rand(T, K, generator=g)
    return x, idx, w


def expert_factor(E, dev):
    """Expert e's output for token row v is bf16(float(v) * c[e]): c spans
    0.25 .. 4 in steps of 1/16, equal only for experts 61 apart (not for
    neighbours, nor for local expert l on the other rank, 128 apart by
    default), so a row combined with the wrong expert or weight shows."""
    import torch
    e = torch.arange(E, device=dev)
    return 0.25 + ((e * 7919) % 61).float() / 16


def check_dispatch(name, q, scales, count, src_rank, src_tok, X, idx_all, rank):
    """One path's FP8 dispatch against the senders' tokens: this rank's
    local expert l must hold exactly the (source rank, token) pairs whose
    topk_idx names expert rank * L + l, once each, and each element, q *
    scale, must be at most one e4m3 code from x / scale rounded to
    nearest (with the path's own scale), as the EP C tests allow: another
    rounding (e.g. x * (1/scale) instead of x / scale) moves an element
    to the neighbouring code (a step, up to ~12% of that element); a
    wrong row, channel or scale moves most elements far more. Returns a
    problem or None."""
    import torch
    L, S, H = q.shape
    R, T = X.shape[0], X.shape[1]
    dev = q.device
    local = rank * L + torch.arange(L, device=dev)
    hit = (idx_all[:, :, :, None] == local).any(2)  # [R, T, L]
    want = hit.permute(2, 0, 1).reshape(L, R * T).int()
    cnt = count.long()
    if not torch.equal(cnt.cpu(), want.sum(1).cpu()):
        return (f"{name} recv_count {count.tolist()} != expected "
                f"{want.sum(1).tolist()}")
    valid = torch.arange(S, device=dev)[None, :] < cnt[:, None]  # [L, S]
    lv, sv = valid.nonzero(as_tuple=True)
    rv, tv = src_rank[lv, sv].long(), src_tok[lv, sv].long()
    if rv.numel() and (int(rv.min()) < 0 or int(rv.max()) >= R or int(tv.min()) < 0
                       or int(tv.max()) >= T):
        return (f"{name} source rank/token out of range: ranks {int(rv.min())}.."
                f"{int(rv.max())}, tokens {int(tv.min())}..{int(tv.max())}")
    got = torch.zeros_like(want)
    got.index_put_((lv, rv * T + tv), torch.ones_like(lv, dtype=torch.int32),
                   accumulate=True)
    if not torch.equal(got, want):
        bad = (got != want).nonzero()[:5].tolist()
        return (f"{name} rows differ from the expected (expert, source rank, token) set; "
                f"first (local expert, rank, token, received, expected): " +
                ", ".join(f"({l}, {k // T}, {k % T}, {int(got[l, k])}, {int(want[l, k])})"
                          for l, k in bad))
    s = scales[lv, sv].float()  # [n, H/128]
    if not bool(torch.isfinite(s).all() and (s > 0).all()):
        return f"{name} has scales that are not positive and finite"
    se = s.repeat_interleave(128, -1)
    # gathered as bytes (indexing float8 tensors needs a recent torch)
    code = q.view(torch.uint8)[lv, sv]
    ref = X[rv, tv].float()
    want_code = (ref / se).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8)

    def ordinal(c):  # e4m3 codes in value order: magnitude bits, signed
        mag = (c & 0x7F).int()
        return torch.where(c >= 0x80, -mag, mag)
    if bool(((code & 0x7F) == 0x7F).any()):
        return f"{name} has NaN codes (0x7f / 0xff)"
    dist_ = (ordinal(code) - ordinal(want_code)).abs()
    deq = code.view(torch.float8_e4m3fn).float() * se
    worst = int(dist_.argmax())
    i, c = divmod(worst, H)
    d = int(dist_.view(-1)[worst])
    if d > 1:
        return (f"{name} element {d} e4m3 codes from the correctly rounded one "
                f"({int((dist_ > 1).sum())} such; max abs diff over all elements "
                f"{float((deq - ref).abs().max()):.4g}); worst: local expert {int(lv[i])} "
                f"slot {int(sv[i])} (rank {int(rv[i])} token {int(tv[i])}) channel {c}: "
                f"{float(deq[i, c]):.6g} vs {float(ref[i, c]):.6g}, scale "
                f"{float(se[i, c]):.4g}")
    return None


def expert_outputs(q, count, src_rank, src_tok, X, factor, rank):
    """The local experts' outputs in one path's layout: row (l, slot) from
    rank r's token t is bf16(float(X[r, t]) * factor[rank * L + l]), the
    same bits whichever path delivered it (the unquantised token, not the
    path's FP8 copy); the rows past count stay zero."""
    import torch
    L, S, H = q.shape
    dev = q.device
    valid = torch.arange(S, device=dev)[None, :] < count.long()[:, None]
    lv, sv = valid.nonzero(as_tuple=True)
    # clamped: a wrong index (the dispatch check says so) must not fault
    rv = src_rank[lv, sv].long().clamp(0, X.shape[0] - 1)
    tv = src_tok[lv, sv].long().clamp(0, X.shape[1] - 1)
    y = torch.zeros((L, S, H), dtype=torch.bfloat16, device=dev)
    y[lv, sv] = (X[rv, tv].float() * factor[rank * L + lv][:, None]).to(torch.bfloat16)
    return y


def check_combine(name, out, x, idx, w, factor):
    """One path's combine output against the dense result sum_k w[t, k] *
    bf16(float(x[t]) * factor[idx[t, k]]) computed in float64. Both paths
    sum the K products in float32 and round once to bf16: float32 adds at
    most K * 2^-24 (<= 2^-20 for K <= 16) of sum_k |w y|, bf16 rounding at
    most 2^-9 of the result; the tolerance, 2^-8 * |ref| + 2^-18 * sum_k
    |w y|, is twice that. A wrong row, weight or expert is off by >= 1/16
    of one term. Returns a problem or None."""
    import torch
    ok = (idx >= 0)
    y = (x.float()[:, None, :] * factor[idx.clamp(min=0)][..., None]).to(torch.bfloat16)
    terms = y.double() * (w.double() * ok)[..., None]
    ref = terms.sum(1)
    # MEP_EP_COMBINE_PARTIAL=bf16 rounds each rank's partial sum to bf16
    # first: up to 2^-9 of sum_k |w y| more, 2^-8 allowed
    part = 2.0 ** -8 if os.environ.get("MEP_EP_COMBINE_PARTIAL") == "bf16" else 2.0 ** -18
    tol = 2.0 ** -8 * ref.abs() + part * terms.abs().sum(1)
    diff = (out.double() - ref).abs()
    excess = diff - tol
    worst = int(excess.argmax())
    t, c = divmod(worst, out.shape[1])
    if float(excess.view(-1)[worst]) > 0:
        return (f"{name} combine differs from the dense reference beyond its tolerance "
                f"in {int((excess > 0).sum())} elements; max abs diff "
                f"{float(diff.max()):.4g}; worst at token {t} channel {c}: "
                f"{float(out[t, c]):.6g} vs {float(ref[t, c]):.6g} (tolerance "
                f"{float(tol[t, c]):.3g})")
    return None


def agree(problem):
    """Every rank's problems (all_gather_object): every rank takes the same
    branches afterwards, so the collectives stay matched."""
    import torch.distributed as dist
    got = [None] * dist.get_world_size()
    dist.all_gather_object(got, problem)
    return [p for p in got if p]


def sanity(rank, world, buf, ref, x, idx, w, X, idx_all, disp):
    """Checks both paths once; returns (problem or None, mep's expert
    outputs, the NCCL path's, mep's handle, the NCCL path's handle)."""
    import torch
    T, L, dev = x.shape[0], ref.L, x.device
    factor = expert_factor(ref.E, dev)
    # Sanity check of both paths, each against the senders' data and a
    # dense reference (not against each other: their FP8 codes may differ
    # by a step). Both combine the same expert outputs, made from the
    # unquantised tokens of the rows each path's dispatch delivered.
    (mq, ms), count, handle, _, _ = disp()
    src_info, layout_range = handle[0], handle[1]
    begin, n_from = layout_range >> 32, layout_range & 0xFFFFFFFF
    slots = torch.arange(world * T, device=dev)[None, :]
    m_rank = torch.full((L, world * T), -1, dtype=torch.int32, device=dev)
    for r in range(world):
        m_rank[(slots >= begin[:, r:r + 1]) & (slots < (begin + n_from)[:, r:r + 1])] = r
    (rq, rs), rcount, r_tok, rhandle = ref.dispatch(x, idx)
    order2, le_s, slot = rhandle[3], rhandle[4], rhandle[5]
    from_rank = torch.repeat_interleave(torch.arange(world, device=dev),
                                        torch.tensor(rhandle[2], device=dev))
    r_rank = torch.full((L, world * T), -1, dtype=torch.int32, device=dev)
    r_rank[le_s, slot] = from_rank[order2].int()

    problems = []
    try:
        p = check_dispatch("mep", mq, ms, count, m_rank, src_info, X, idx_all, rank)
        if not p and not torch.equal(n_from.sum(1).cpu(), count.long().cpu()):
            p = (f"mep layout_range counts {n_from.sum(1).tolist()} do not add up to "
                 f"recv_count {count.tolist()}")
        problems.append(p)
        problems.append(check_dispatch("nccl", rq, rs, rcount, r_rank, r_tok, X, idx_all,
                                       rank))
    except Exception as e:  # a bug in the check: report it, keep the ranks in step
        problems.append(f"dispatch check raised {type(e).__name__}: {e}")
    y_mep = expert_outputs(mq, count, m_rank, src_info, X, factor, rank)
    y_ref = expert_outputs(rq, rcount, r_rank, r_tok, X, factor, rank)

    m_out = buf.low_latency_combine(y_mep, idx, w, handle)[0]
    r_out = ref.combine(y_ref, w, rhandle, T)
    # combine too after a dispatch problem (a wrong row there shows here,
    # on the rank that sent it)
    try:
        problems.append(check_combine("mep", m_out, x, idx, w, factor))
        problems.append(check_combine("nccl", r_out, x, idx, w, factor))
    except Exception as e:
        problems.append(f"combine check raised {type(e).__name__}: {e}")
    if not any(problems):
        d = (m_out.float() - r_out.float()).abs().max().item()
        print(f"bench-ep: rank {rank} hidden {x.shape[1]}: check passed (mep vs nccl "
              f"combine max abs diff {d:.3g})", file=sys.stderr, flush=True)
    problem = "; ".join(p for p in problems if p) or None
    if problem:
        problem = f"rank {rank}: {problem}"
    return problem, y_mep, y_ref, handle, rhandle


# Calls in a row in the back-to-back graph: the two ranks start each
# replay at different times (each host launches it when its previous one
# ended), and a one-call replay counts that skew in; calls in a row wait
# for each other only through the data, as the layers of a decoding step
# captured in one graph do.
B2B = 10


def bench_hidden(rank, world, hidden, args, dev):
    import torch
    import torch.distributed as dist
    from mep.ep import Buffer
    T, E, K = args.tokens, args.experts, args.topk
    L = E // world
    every = [make_inputs(r, T, hidden, E, K) for r in range(world)]
    X = torch.stack([v[0] for v in every]).to(dev)         # [R, T, H]: every rank's tokens
    idx_all = torch.stack([v[1] for v in every]).to(dev)   # [R, T, K]
    x, idx, w = X[rank].contiguous(), idx_all[rank].contiguous(), every[rank][2].to(dev)
    hint = Buffer.get_low_latency_rdma_size_hint(T, hidden, world, E)
    buf = Buffer(dist.group.WORLD, 0, hint, low_latency_mode=True, num_qps_per_rank=L)

    def disp():
        return buf.low_latency_dispatch(x, idx, T, E, use_fp8=True)

    ref = NcclPath(rank, world, T, hidden, E, None)
    problem, y_mep, y_ref, handle, rhandle = sanity(rank, world, buf, ref, x, idx, w, X,
                                                    idx_all, disp)
    if problem:
        print(f"bench-ep: hidden {hidden}: CHECK FAILED: {problem}", file=sys.stderr,
              flush=True)

    def comb():
        return buf.low_latency_combine(y_mep, idx, w, handle)

    row = {"hidden": hidden, "check_failures": agree(problem)}

    # timing, whatever the check said (every rank does the same calls)
    it, wu = args.iters, args.warmup
    dist.barrier()
    row["mep_dispatch_us"] = bc.time_op(disp, wu, it)
    dist.barrier()
    row["mep_combine_us"] = bc.time_op(comb, wu, it)
    dist.barrier()
    for key, fn in (("dispatch", disp), ("combine", comb)):
        for calls, name in ((1, f"mep_{key}_graph_us"), (B2B, f"mep_{key}_b2b_us")):
            err = None
            try:
                gr = graph_of(fn, calls)
            except Exception as e:  # report the eager numbers anyway
                gr, err = None, f"rank {rank}: {key}: {type(e).__name__}: {e}"
            errs = agree(err)
            if errs:
                row.setdefault("graph_error", []).extend(errs)
            else:
                dist.barrier()
                row[name] = bc.time_op(gr.replay, wu, it) / calls
            del gr
            torch.cuda.synchronize()
            dist.barrier()
    row["nccl_dispatch_us"] = bc.time_op(lambda: ref.dispatch(x, idx), wu, it)
    dist.barrier()
    row["nccl_combine_us"] = bc.time_op(lambda: ref.combine(y_ref, w, rhandle, T), wu, it)
    dist.barrier()
    sel = int((idx >= 0).sum())
    row["dispatch_bytes"] = sel * (hidden + hidden // 128 * 4)
    row["combine_bytes"] = sel * hidden * 2
    torch.cuda.synchronize()
    buf.destroy()
    return row


def rank_main(rank, world, port, args, results):
    bc.report_rank(rank, results, lambda: rank_rows(rank, world, port, args),
                   after=bc.leave_group)


def rank_rows(rank, world, port, args):
    """One rank's measurements: {"rows": [...]}."""
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    if args.hosts:
        os.environ["MEP_HOST_ID"] = f"bench-ep-host-{rank}"
    import torch
    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    bc.join_group("nccl", rank, world, port, device_id=dev)
    rows = [bench_hidden(rank, world, h, args, dev) for h in args.hidden]
    return {"rows": rows}


def table(rows, world, args, copy_gbps):
    def gbps(nbytes, us):
        return nbytes / (us * 1e-6) / 1e9 if us else None

    def f(v, fmt):
        return "-" if v is None else format(v, fmt)
    notes = []
    lines = ["| hidden | op | mep us | mep graph us | mep graph in a row us | nccl a2a us | "
             "nccl / mep graph | mep graph GB/s | nccl GB/s |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        for op, nbytes in (("dispatch (fp8)", r["dispatch_bytes"]),
                           ("combine (bf16)", r["combine_bytes"])):
            key = op.split()[0]
            m, mg, mb, n = (r.get(f"mep_{key}_us"), r.get(f"mep_{key}_graph_us"),
                            r.get(f"mep_{key}_b2b_us"), r.get(f"nccl_{key}_us"))
            best = mg or m
            lines.append(f"| {r['hidden']} | {op} | {f(m, '.1f')} | {f(mg, '.1f')} | "
                         f"{f(mb, '.1f')} | "
                         f"{f(n, '.1f')} | {f(n / best if n and best else None, '.2f')} | "
                         f"{f(gbps(nbytes, best), '.1f')} | {f(gbps(nbytes, n), '.1f')} |")
        for e in r.get("graph_error", []):
            notes.append(f"hidden {r['hidden']}: CUDA graph capture failed: {e}")
        for e in r.get("check_failures", []):
            notes.append(f"hidden {r['hidden']}: SANITY CHECK FAILED (its times are of "
                         f"wrong results): {e}")
    head = (f"# mep.ep vs all_to_all_single over NCCL, {world} ranks on {world} GPUs, "
            f"{args.tokens} tokens/rank, top-{args.topk} of {args.experts} experts, "
            f"median of {args.iters}; mep transports: "
            f"{os.environ.get('MEP_TRANSPORTS', 'default')}")
    tail = ("" if copy_gbps is None else
            f"\nGPU 0 -> GPU 1 copy (1 GiB, tensor.copy_, the limit): {copy_gbps:.1f} GB/s")
    return "\n".join([head, ""] + lines + [""] + notes) + "\n" + tail


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--hidden", default="7168,4096",
                    help="comma-separated hidden sizes (default 7168,4096)")
    ap.add_argument("--tokens", type=int, default=128, help="tokens per rank (default 128)")
    ap.add_argument("--experts", type=int, default=256, help="experts (default 256)")
    ap.add_argument("--topk", type=int, default=8, help="experts per token (default 8)")
    ap.add_argument("--iters", type=int, default=300,
                    help="timed calls per measurement, at least 200 (default 300)")
    ap.add_argument("--warmup", type=int, default=20, help="warm-up calls (default 20)")
    ap.add_argument("--tcp", action="store_true",
                    help="mep over the TCP transport (the proxy path)")
    ap.add_argument("--hosts", action="store_true",
                    help="each rank a host of its own: mep through the proxy over tcp, "
                         "NCCL over sockets")
    ap.add_argument("--timeout", type=float, default=900,
                    help="seconds before the ranks are killed (default 900)")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = ap.parse_args()
    args.hidden = [int(h) for h in args.hidden.split(",") if h]
    if args.iters < 200:
        ap.error("--iters must be at least 200")
    if any(h <= 0 or h % 128 for h in args.hidden):
        ap.error("hidden sizes must be positive multiples of 128")
    if args.experts % 2 or args.topk > min(16, args.experts):
        ap.error("--experts must be even (2 ranks) and --topk at most min(16, experts)")
    import torch
    ngpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if ngpu < 2:
        print(f"bench-ep: needs 2 GPUs (this machine shows {ngpu})", file=sys.stderr)
        return 2
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    if args.tcp:
        os.environ["MEP_TRANSPORTS"] = "tcp"
    if args.tcp or args.hosts:
        os.environ.setdefault("MEP_TCP_IFNAME", "lo")
    if args.hosts:
        os.environ.update(NCCL_P2P_DISABLE="1", NCCL_SHM_DISABLE="1", NCCL_IB_DISABLE="1")
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    world = 2
    got, rc = bc.run_ranks("bench-ep", rank_main, world, args)
    if rc:
        return rc
    copy = bc.peer_copy_gbps()
    # a call ends when both ranks are done: the slower rank's median counts
    rows = []
    for r0, r1 in zip(got[0]["rows"], got[1]["rows"]):
        row = dict(r0)
        for key, v in r1.items():
            if key.endswith("_us") and v is not None and row.get(key) is not None:
                row[key] = max(row[key], v)
        rows.append(row)
    print(table(rows, world, args, copy))
    failed = [r["hidden"] for r in rows if r.get("check_failures")]
    if failed:
        print(f"bench-ep: the sanity check failed for hidden {failed}", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ranks": world, "tokens": args.tokens, "experts": args.experts,
                       "topk": args.topk, "iters": args.iters, "tcp": args.tcp,
                       "hosts": args.hosts,
                       "transports": os.environ.get("MEP_TRANSPORTS"), "rows": rows,
                       "per_rank": {r: got[r]["rows"] for r in got},
                       "peer_copy_gbps": copy}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
