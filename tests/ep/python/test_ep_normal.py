"""mep.ep.Buffer's normal (high-throughput) mode on the CPU path, 2, 3 and 4
ranks over tcp, against a reference computed with numpy alone from
DeepEP's semantics: get_dispatch_layout, the counts and prefix sums, the
received rows in DeepEP's order (source rank by rank, each source's tokens
in order), local top-k indices and weights, num_worst_tokens, the cached
mode, FP8 (codes and column-major scales), combine (unweighted sum over
the ranks, plus bias, weights summed), zero and one token on a rank, odd
counts, hidden 128, 2688 and 7168, DeepEP's own test_intranode checks, the
buffer-too-small error; and a rank killed in the middle of a dispatch.

MEP_TEST_EP_DEVICE=cuda runs the same checks on the CUDA path (rank r on
GPU r mod the GPUs; tests/gpu/run.sh --normal), the reference still
numpy's, plus the cached dispatch and the combine replayed from a CUDA
graph."""
import os
import signal
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist

import eptest
from eptest import Ranks, run_ranks

CUDA = os.environ.get("MEP_TEST_EP_DEVICE", "cpu") == "cuda"


def dev_of(rank):
    """The device of a rank's tensors."""
    if not CUDA:
        return torch.device("cpu")
    d = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(d)
    return d


def npy(t):
    return t.cpu().numpy()


# (tokens of rank 0, hidden, experts per rank, top-k, expert_alignment)
CASES = [(6, 128, 2, 2, 1), (1, 256, 1, 1, 1), (17, 2688, 3, 4, 4), (9, 7168, 4, 8, 1),
         (0, 128, 2, 3, 1), (33, 512, 5, 6, 8)]


def tokens_of(case_tokens, rank):
    """Rank 0 has the case's tokens; the others 0, 1 or an odd count."""
    return [case_tokens, 1, 0, case_tokens // 2 + 1][rank % 4] if rank else case_tokens


def bf16_round(a):
    """float32 -> nearest bfloat16 (ties to even), as float32, in numpy."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def inputs(case, rank, n, hidden, experts, topk):
    """numpy x [n, hidden] (exact in bf16: k / 64, |k| < 256), topk_idx
    [n, topk] (distinct experts, some -1, every 5th token none), weights."""
    g = np.random.default_rng([case, rank, 7])
    x = g.integers(-255, 256, size=(n, hidden)).astype(np.float32) / 64
    idx = np.stack([g.permutation(experts)[:topk] for _ in range(n)]) if n else \
        np.zeros((0, topk), np.int64)
    idx = idx.astype(np.int64)
    idx[g.random((n, topk)) < 0.15] = -1
    idx[3::5] = -1
    w = g.random((n, topk)).astype(np.float32)
    return x, idx, w


def ref_layout(idx, experts, R):
    L = experts // R
    in_rank = np.zeros((idx.shape[0], R), bool)
    for t, row in enumerate(idx):
        for e in row:
            if e >= 0:
                in_rank[t, e // L] = True
    per_expert = np.array([(idx == e).sum() for e in range(experts)], np.int32)
    return in_rank.sum(0).astype(np.int32), per_expert, in_rank


def expert_fn(rank, x):
    """What rank `rank`'s experts do to a row: exact in bf16 (a power of 2)."""
    return x * float(2 ** rank)


def case_data(ci, R):
    n0, hidden, L, K, align = CASES[ci]
    E = L * R
    return [inputs(ci, r, tokens_of(n0, r), hidden, E, K) for r in range(R)], hidden, L, K, align


def one_case(mep_ep, buf, rank, R, ci, fp8):
    data, H, L, K, align = case_data(ci, R)
    E = L * R
    x_np, idx_np, w_np = data[rank]
    dev = dev_of(rank)
    x = torch.from_numpy(x_np).to(torch.bfloat16).to(dev)
    idx, w = torch.from_numpy(idx_np).to(dev), torch.from_numpy(w_np).to(dev)

    # layout
    ntr, ntrr, nte, itr, ev = buf.get_dispatch_layout(idx, E)
    want_ntr, want_nte, want_itr = ref_layout(idx_np, E, R)
    assert ntrr is None and isinstance(ev, mep_ep.EventOverlap)
    assert ntr.dtype == torch.int32 and nte.dtype == torch.int32 and itr.dtype == torch.bool
    assert np.array_equal(npy(ntr), want_ntr) and np.array_equal(npy(nte), want_nte)
    assert np.array_equal(npy(itr), want_itr)
    if dev.type == "cuda" and idx.numel():
        # on CUDA the layout does not stop the stream to check the indices:
        # one out of range counts as -1 there; the dispatch refuses it
        bad = idx.clone()
        bad[0, 0] = E
        none = idx_np.copy()
        none[0, 0] = -1
        b_ntr, _, b_nte, b_itr, _ = buf.get_dispatch_layout(bad, E)
        assert [npy(t).tolist() for t in (b_ntr, b_nte, b_itr)] == \
            [a.tolist() for a in ref_layout(none, E, R)]
        with pytest.raises(ValueError, match="experts are"):
            buf.dispatch(x, num_tokens_per_rank=b_ntr, is_token_in_rank=b_itr,
                         num_tokens_per_expert=b_nte, topk_idx=bad, topk_weights=w)

    if fp8:
        # DeepEP's test: per-token FP8 with column-major scales
        xf = x.float().view(x.shape[0], H // 128, 128)
        amax = xf.abs().amax(-1).clamp(min=1e-4)
        q = (xf * (448.0 / amax).unsqueeze(-1)).view(x.shape).to(torch.float8_e4m3fn)
        s = (amax / 448.0).T.contiguous().T
        x_in = (q, s)
    else:
        x_in = x
    recv, ridx, rw, counts, handle, ev = buf.dispatch(
        x_in, num_tokens_per_rank=ntr, is_token_in_rank=itr, num_tokens_per_expert=nte,
        topk_idx=idx, topk_weights=w, expert_alignment=align, async_finish=True)
    rpm, cpm, rcpm, src_idx, h_itr, send_head = handle
    ev.current_stream_wait()

    # the reference: every source's tokens for this rank, in rank order
    rows, srcs, widx, ww, bounds = [], [], [], [], []
    per_exp = np.zeros(L, np.int64)
    for s in range(R):
        sx, sidx, sw = data[s]
        _, _, s_itr = ref_layout(sidx, E, R)
        toks = np.nonzero(s_itr[:, rank])[0]
        rows.append(sx[toks])
        srcs.append(toks)
        loc = sidx[toks] - rank * L
        mine = (sidx[toks] >= rank * L) & (sidx[toks] < (rank + 1) * L)
        widx.append(np.where(mine, loc, -1))
        ww.append(np.where(mine, sw[toks], 0).astype(np.float32))
        bounds.append(sum(len(t) for t in srcs))
        for l in range(L):
            per_exp[l] += (sidx == rank * L + l).sum()
    want_x = np.concatenate(rows) if rows else np.zeros((0, H), np.float32)
    nrecv = want_x.shape[0]
    if fp8:
        rq, rs = recv
        assert rq.dtype == torch.float8_e4m3fn and rs.shape == (nrecv, H // 128)
        back = (rq.float().view(nrecv, H // 128, 128) * rs.unsqueeze(-1)).view(nrecv, H)
        err = (back.cpu() - torch.from_numpy(want_x)).abs()
        assert bool((err <= torch.from_numpy(np.abs(want_x)) / 16 + 1e-3).all())
    else:
        assert recv.dtype == torch.bfloat16 and recv.shape == (nrecv, H)
        assert np.array_equal(npy(recv.float()), want_x), "recv_x differs"
    assert np.array_equal(npy(src_idx), np.concatenate(srcs).astype(np.int32))
    assert ridx.dtype == torch.int64 and ridx.shape == (nrecv, K)
    assert np.array_equal(npy(ridx), np.concatenate(widx)), "recv_topk_idx"
    assert np.array_equal(npy(rw), np.concatenate(ww)), "recv_topk_weights"
    want_counts = [int(-(-c // align) * align) for c in per_exp]
    assert counts == want_counts, (counts, want_counts)
    # DeepEP's prefix matrix: [s][r] = tokens sources 0..s send rank r
    full = np.zeros((R, R), np.int64)
    for s in range(R):
        full[s] = ref_layout(data[s][1], E, R)[0]
    assert np.array_equal(npy(rpm), np.cumsum(full, 0)), "rank_prefix_matrix"
    assert [int(rpm[s, rank]) for s in range(R)] == bounds
    C = mep_ep.Buffer.num_sms // 2
    assert cpm.shape == (R, C) and rcpm.shape == (R, C) and send_head.shape == (x.shape[0], R)
    assert h_itr is itr
    # the channel matrices: DeepEP's channels are ranges of ceil(N / C)
    # tokens; cpm[r][c] counts this rank's tokens to r in channels 0..c,
    # rcpm[s][c] is where source s's channel c starts here
    for r in range(R):
        ends = [min((c + 1) * -(-x.shape[0] // C), x.shape[0]) for c in range(C)]
        assert npy(cpm)[r].tolist() == [int(want_itr[:e, r].sum()) for e in ends]
    for s in range(R):
        toks, first = srcs[s], (bounds[s - 1] if s else 0)
        ns = tokens_of(CASES[ci][0], s)
        starts = [min(c * -(-ns // C), ns) for c in range(C)]
        want = [first + int(np.searchsorted(toks, lo)) for lo in starts]
        assert npy(rcpm)[s].tolist() == want, f"recv_channel_prefix_matrix row {s}"
    # send_head: the row each token takes on each rank
    for r in range(R):
        before = int(rpm[rank - 1, r]) if rank else 0
        pos = np.cumsum(want_itr[:, r]) - 1 + before
        want = np.where(want_itr[:, r], pos, -1)
        assert np.array_equal(npy(send_head[:, r]), want), \
            f"send_head to {r}: {send_head[:, r].tolist()} want {want.tolist()} (case {ci})"

    # num_worst_tokens: padded outputs, an empty list
    worst = R * max(tokens_of(CASES[ci][0], r) for r in range(R)) + 1
    recv2, ridx2, rw2, counts2, _, _ = buf.dispatch(
        x_in, num_tokens_per_rank=ntr, is_token_in_rank=itr, num_tokens_per_expert=nte,
        topk_idx=idx, topk_weights=w, num_worst_tokens=worst)
    r2 = recv2[0] if fp8 else recv2
    assert counts2 == [] and r2.shape[0] == worst and ridx2.shape == (worst, K)
    assert torch.equal(ridx2[:nrecv], ridx) and bool((ridx2[nrecv:] == -1).all())
    assert torch.equal(rw2[:nrecv], rw) and bool((rw2[nrecv:] == 0).all())
    assert torch.equal(r2[:nrecv].view(torch.uint8), (recv[0] if fp8 else recv).view(torch.uint8))

    # cached: the same rows, nothing else
    out = buf.dispatch(x_in, handle=handle)
    assert out[1:5] == (None, None, None, None)
    c = out[0]
    if fp8:
        assert torch.equal(c[0].view(torch.uint8), recv[0].view(torch.uint8))
        assert torch.equal(c[1], recv[1])
    else:
        assert torch.equal(c, recv)

    # combine: the experts scale their rows; sums come back, with bias
    rx = recv[0].float() * recv[1].repeat_interleave(128, 1) if fp8 else recv.float()
    y = expert_fn(rank, rx).to(torch.bfloat16)
    bias = torch.from_numpy((np.arange(x.numel()) % 3).reshape(x.shape).astype(np.float32))
    bias = bias.to(torch.bfloat16).to(dev)
    combined, cw, ev = buf.combine(y, handle, topk_weights=rw, bias=(bias, None))
    if not fp8:
        acc = npy(bias.float()).copy()
        for r in range(R):
            acc += np.where(want_itr[:, r:r + 1], expert_fn(r, x_np), 0)
        assert np.array_equal(npy(combined.float()), bf16_round(acc)), "combined_x"
    assert cw.shape == (x.shape[0], K)
    want_w = np.where(idx_np >= 0, w_np, 0)
    assert np.array_equal(npy(cw), want_w), \
        f"combined weights (case {ci}, fp8 {fp8}): {npy(cw)} want {want_w}, idx {idx_np}"
    combined, cw, _ = buf.combine(y, handle)
    assert cw is None and combined.shape == x.shape
    if CUDA:
        # the cached dispatch and the combine captured in a CUDA graph,
        # replayed twice: the same results each time
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            g_recv = buf.dispatch(x_in, handle=handle)[0]
            g_comb = buf.combine(y, handle)[0]
        for _ in range(2):
            (g_recv[0] if fp8 else g_recv).view(torch.uint8).zero_()
            graph.replay()
            torch.cuda.synchronize()
            same = (torch.equal(g_recv[0].view(torch.uint8), recv[0].view(torch.uint8))
                    and torch.equal(g_recv[1], recv[1])) if fp8 else torch.equal(g_recv, recv)
            assert same, f"graph replay of the cached dispatch (case {ci}, fp8 {fp8})"
            assert torch.equal(g_comb, combined), f"graph replay of combine (case {ci})"


def deepep_checks(mep_ep, buf, rank, R):
    """DeepEP's test_intranode checks, for x = rank everywhere."""
    n, H, E, K = 20, 256, 4 * R, 3
    dev = dev_of(rank)
    g = torch.Generator().manual_seed(rank)
    scores = torch.rand((n, E), generator=g) + 1
    idx = torch.topk(scores, K, dim=-1, sorted=False)[1].to(dev)
    x = (torch.ones((n, H), dtype=torch.bfloat16) * rank).to(dev)
    w = (torch.ones((n, K), dtype=torch.float32) * rank).to(dev)
    ntr, _, nte, itr, _ = buf.get_dispatch_layout(idx, E)
    gbl = ntr.cpu().clone()
    dist.all_reduce(gbl)
    gbl_e = nte.cpu().clone()
    dist.all_reduce(gbl_e)
    recv, ridx, rw, counts, handle, _ = buf.dispatch(
        x, num_tokens_per_rank=ntr, is_token_in_rank=itr, num_tokens_per_expert=nte,
        topk_idx=idx, topk_weights=w, config=mep_ep.Config(24, 8, 256))
    rpm = handle[0]
    assert int(gbl[rank]) == recv.size(0)
    assert gbl_e.view(R, -1)[rank].tolist() == counts

    def check_data(cx):
        assert torch.allclose(cx.amin(dim=1), cx.amax(dim=1))
        start = 0
        for i in range(R):
            end = int(rpm[i][rank])
            assert (cx[start:end, :].int() - i).sum().item() == 0
            start = end
    check_data(recv)
    for i, c in enumerate(counts):
        assert ridx.eq(i).sum().item() == c
    rw[ridx.eq(-1)] = rw.amax(dim=1, keepdim=True).expand_as(rw)[ridx.eq(-1)]
    check_data(rw)
    combined, cw, _ = buf.combine(recv, handle, topk_weights=rw)
    per = itr.sum(dim=1).unsqueeze(1)
    assert torch.allclose(combined.float() / per.clamp(min=1), x.float() * (per > 0))
    assert torch.allclose(cw / per.clamp(min=1), w * (per > 0))


def roundtrips(ctx, cases):
    mep_ep = eptest.init(ctx)
    R = ctx.world
    dev_of(ctx.rank)  # the GPU is chosen before the Buffer, as DeepEP's tests do
    Buffer = mep_ep.Buffer
    size = Buffer.get_normal_buffer_size_hint(80, 7168, R, 8)
    buf = Buffer(None, size, 0)
    for ci in cases:
        for fp8 in (False, True):
            if fp8 and CASES[ci][1] % 128:
                continue
            one_case(mep_ep, buf, ctx.rank, R, ci, fp8)
    deepep_checks(mep_ep, buf, ctx.rank, R)
    # the low-latency mode still works on the same Buffer
    buf.destroy()
    return "ok"


@pytest.mark.parametrize("world", [2, 3, 4])
def test_roundtrip(world):
    run_ranks(roundtrips, world, range(len(CASES)), timeout_s=300)


def api(ctx):
    mep_ep = eptest.init(ctx)
    Buffer, Config = mep_ep.Buffer, mep_ep.Config
    R, rank = ctx.world, ctx.rank
    assert Buffer.get_dispatch_config(2).num_max_nvl_chunked_send_tokens == 24
    assert Buffer.get_combine_config(4).num_max_nvl_chunked_send_tokens == 9
    assert Buffer.get_dispatch_config(3).num_sms == Buffer.num_sms
    assert Config(24, 8, 256).get_nvl_buffer_size_hint(7168 * 2, R) > 0
    with pytest.raises(ValueError, match="even"):
        Buffer.set_num_sms(23)
    # num_nvl_bytes 0: a clear error at the first normal call
    buf0 = Buffer(None, 0, 0)
    idx = torch.zeros((4, 1), dtype=torch.int64)
    ntr, _, nte, itr, _ = buf0.get_dispatch_layout(idx, R)
    x = torch.ones((4, 128), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="num_nvl_bytes > 0"):
        buf0.dispatch(x, num_tokens_per_rank=ntr, is_token_in_rank=itr,
                      num_tokens_per_expert=nte)
    buf0.destroy()
    # too small: every rank raises, naming a size that works
    buf = Buffer(None, Buffer.get_normal_buffer_size_hint(2, 128, R, 1), 0)
    idx = torch.zeros((8, 1), dtype=torch.int64)  # all to expert 0 on rank 0
    ntr, _, nte, itr, _ = buf.get_dispatch_layout(idx, R)
    x = torch.ones((8, 128), dtype=torch.bfloat16) * rank
    with pytest.raises(ValueError, match="num_bytes must be at least") as e:
        buf.dispatch(x, num_tokens_per_rank=ntr, is_token_in_rank=itr,
                     num_tokens_per_expert=nte, topk_idx=idx,
                     topk_weights=torch.ones((8, 1)))
    need = int(str(e.value).split("at least ")[1].split()[0].rstrip(".,;"))
    buf.destroy()
    buf = Buffer(None, need, 0)
    recv, _, _, counts, handle, _ = buf.dispatch(
        x, num_tokens_per_rank=ntr, is_token_in_rank=itr, num_tokens_per_expert=nte,
        topk_idx=idx, topk_weights=torch.ones((8, 1)))
    assert recv.shape[0] == (8 * R if rank == 0 else 0)
    # bad arguments
    with pytest.raises(TypeError):
        buf.dispatch(x.float(), num_tokens_per_rank=ntr, is_token_in_rank=itr,
                     num_tokens_per_expert=nte)
    with pytest.raises(ValueError, match="num_tokens_per_rank"):
        buf.dispatch(x)
    with pytest.raises(ValueError, match="no topk_idx"):
        buf.dispatch(x, handle=handle, topk_idx=idx, topk_weights=torch.ones((8, 1)))
    with pytest.raises(ValueError, match="16 bytes"):
        buf.dispatch(torch.ones((8, 100), dtype=torch.bfloat16), num_tokens_per_rank=ntr,
                     is_token_in_rank=itr, num_tokens_per_expert=nte)
    with pytest.raises(ValueError, match="experts are"):
        buf.get_dispatch_layout(torch.full((2, 1), R, dtype=torch.int64), R)
    with pytest.raises(ValueError, match="shape"):
        buf.combine(torch.ones((3, 128), dtype=torch.bfloat16), handle)
    buf.destroy()
    return "ok"


def test_api():
    run_ranks(api, 2, timeout_s=120)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("n,experts,ranks,rph,topk", [
    (0, 16, 4, 2, 4), (1, 8, 8, 4, 3), (257, 256, 8, 2, 8), (4097, 64, 4, 1, 6),
    (1000, 24, 3, 3, 9), (333, 80, 10, 5, 2)])
def test_layout_cuda(n, experts, ranks, rph, topk):
    """The CUDA layout kernel on its own (no communication), hosts counted
    too (num_tokens_per_rdma_rank, which Buffer does not ask for): random
    indices with -1, repeats and out-of-range entries (which count as -1
    on CUDA) against the numpy reference, outputs poisoned first."""
    import ctypes
    from mep.ep import _c
    rng = np.random.default_rng(n * 131 + experts)
    idx_np = rng.integers(-1, experts, size=(n, topk), dtype=np.int64)
    if n:
        idx_np[0, 0] = experts  # out of range: none
        idx_np[-1, :] = idx_np[-1, 0]  # repeats: the expert counts each
    ref = np.where(idx_np >= experts, -1, idx_np)
    want_rank, want_expert, want_in = ref_layout(ref, experts, ranks)
    hosts = ranks // rph
    want_host = want_in.reshape(n, hosts, rph).any(2).sum(0).astype(np.int32)
    dev = torch.device("cuda", 0)
    idx = torch.from_numpy(idx_np).to(dev)
    per_rank = torch.full((ranks,), -7, dtype=torch.int32, device=dev)
    per_host = torch.full((hosts,), -7, dtype=torch.int32, device=dev)
    per_expert = torch.full((experts,), -7, dtype=torch.int32, device=dev)
    in_rank = torch.full((max(n, 1), ranks), True, dtype=torch.bool, device=dev)
    args = _c.LayoutArgs(struct_size=ctypes.sizeof(_c.LayoutArgs),
                         topk_idx=idx.data_ptr() if n else None, num_tokens=n,
                         num_topk=topk, num_experts=experts, num_ranks=ranks,
                         ranks_per_host=rph, num_tokens_per_rank=per_rank.data_ptr(),
                         num_tokens_per_rdma_rank=per_host.data_ptr(),
                         num_tokens_per_expert=per_expert.data_ptr(),
                         is_token_in_rank=in_rank.data_ptr(), flags=_c.CUDA,
                         stream=torch.cuda.current_stream(dev).cuda_stream)
    _c.check(_c.libs().ep_get_dispatch_layout(ctypes.byref(args)), "layout")
    torch.cuda.synchronize(dev)
    assert npy(per_rank).tolist() == want_rank.tolist()
    assert npy(per_host).tolist() == want_host.tolist()
    assert npy(per_expert).tolist() == want_expert.tolist()
    assert np.array_equal(npy(in_rank)[:n], want_in)


TIMEOUT_US = 1_000_000
def notify_errors(ctx):
    """The count exchange's errors, alike on every rank (on CUDA they come
    from its kernel): a buffer too small (the size named works), a rank
    whose is_token_in_rank disagrees with its num_tokens_per_rank, a rank
    with another hidden; after each, the next dispatch works."""
    mep_ep = eptest.init(ctx)
    Buffer = mep_ep.Buffer
    R, rank = ctx.world, ctx.rank
    dev = dev_of(rank)
    n, H = 8, 128
    idx = torch.zeros((n, 1), dtype=torch.int64, device=dev)  # all to rank 0
    w = torch.ones((n, 1), device=dev)
    x = (torch.ones((n, H), dtype=torch.bfloat16) * rank).to(dev)
    buf = Buffer(None, Buffer.get_normal_buffer_size_hint(2, H, R, 1), 0)
    ntr, _, nte, itr, _ = buf.get_dispatch_layout(idx, R)
    args = dict(num_tokens_per_rank=ntr, is_token_in_rank=itr,
                num_tokens_per_expert=nte, topk_idx=idx, topk_weights=w)
    with pytest.raises(ValueError, match="num_bytes must be at least") as e:
        buf.dispatch(x, **args)
    assert f"rank 0 sends rank 0 {n} tokens" in str(e.value), str(e.value)
    need = int(str(e.value).split("at least ")[1].split()[0].rstrip(".,;"))
    buf.destroy()
    buf = Buffer(None, need, 0)

    def works():
        recv, _, _, counts, _, _ = buf.dispatch(x, **args)
        got = npy(recv.float()) if recv.shape[0] else np.zeros((0, H), np.float32)
        want = np.repeat(np.arange(R, dtype=np.float32), n)[:, None] * np.ones(H) \
            if rank == 0 else np.zeros((0, H))
        assert np.array_equal(got, want)
        assert counts == [n * R if rank == 0 else 0]
    works()
    bad = ntr.clone()
    if rank == 1:
        bad[0] += 1
    with pytest.raises(ValueError, match="rank 1's is_token_in_rank does not agree"):
        buf.dispatch(x, **dict(args, num_tokens_per_rank=bad))
    works()
    wide = torch.ones((n, 2 * H), dtype=torch.bfloat16, device=dev) if rank == R - 1 else x
    other = 0 if rank == R - 1 else R - 1
    with pytest.raises(mep_ep._c.MepError,
                       match=rf"rank {other} dispatches {R} experts with \d+-byte"):
        buf.dispatch(wide, **args)
    works()
    buf.destroy()
    return "ok"


@pytest.mark.parametrize("world", [2, 3])
def test_notify_errors(world):
    run_ranks(notify_errors, world, timeout_s=120)


MARGIN_S = 4.0


def _die(*_):
    os.kill(os.getpid(), signal.SIGKILL)


def killed_member(ctx, victim, when="dispatch"):
    """`victim` dies inside the second dispatch (after the count exchange,
    before any token leaves) or, with when="combine", inside the combine
    after it; the survivors' calls complete without it, agree on it, and
    give the numpy reference over the others."""
    mep_ep = eptest.init(ctx)
    R, rank = ctx.world, ctx.rank
    dev_of(rank)
    Buffer = mep_ep.Buffer
    buf = Buffer(None, Buffer.get_normal_buffer_size_hint(40, 256, R, 3), 0,
                 timeout_us=30_000_000)
    H, L, K = 256, 2, 3
    E = L * R
    data = [inputs(99, r, 12, H, E, K) for r in range(R)]
    x_np, idx_np, w_np = data[rank]
    dev = dev_of(rank)
    x = torch.from_numpy(x_np).to(torch.bfloat16).to(dev)
    idx, w = torch.from_numpy(idx_np).to(dev), torch.from_numpy(w_np).to(dev)
    ntr, _, nte, itr, _ = buf.get_dispatch_layout(idx, E)
    recv, ridx, rw, counts, handle, _ = buf.dispatch(
        x, num_tokens_per_rank=ntr, is_token_in_rank=itr, num_tokens_per_expert=nte,
        topk_idx=idx, topk_weights=w)
    buf.combine(expert_fn(rank, recv.float()).to(torch.bfloat16), handle)
    dist.barrier()
    if rank == victim and when == "dispatch":
        buf._lib.ep_normal_dispatch = _die
    if rank == victim and when == "notify":
        buf._lib.ep_notify_dispatch = _die
    t0 = time.monotonic()
    recv, ridx, rw, counts, handle, _ = buf.dispatch(
        x, num_tokens_per_rank=ntr, is_token_in_rank=itr, num_tokens_per_expert=nte,
        topk_idx=idx, topk_weights=w, timeout_us=TIMEOUT_US)
    if CUDA:  # the call only queued the kernels
        torch.cuda.synchronize()
    took = time.monotonic() - t0
    act = buf.active_ranks
    lost = when != "combine"
    assert act.tolist() == [0 if r == victim and lost else 1 for r in range(R)], act
    assert took <= TIMEOUT_US / 1e6 + MARGIN_S, f"dispatch took {took:.2f} s"
    rpm, _, _, src_idx, _, _ = handle
    if lost:  # the victim's counts arrived, its rows did not: zero, src_idx -1
        lo = int(rpm[victim - 1, rank]) if victim else 0
        hi = int(rpm[victim, rank])
        if when == "notify":  # nor did its counts: it sends nothing
            assert lo == hi, (lo, hi)
        assert bool((src_idx[lo:hi] == -1).all()) and bool((ridx[lo:hi] == -1).all())
        assert bool((recv[lo:hi] == 0).all())
    start = 0
    for s in range(R):
        end = int(rpm[s, rank])
        if s != victim or not lost:
            toks = np.nonzero(ref_layout(data[s][1], E, R)[2][:, rank])[0]
            assert np.array_equal(npy(src_idx[start:end]), toks)
            assert np.array_equal(npy(recv[start:end].float()), data[s][0][toks])
        start = end
    y = expert_fn(rank, recv.float()).to(torch.bfloat16)
    if rank == victim:
        buf._lib.ep_normal_combine = _die
    t0 = time.monotonic()
    combined, _, _ = buf.combine(y, handle, timeout_us=TIMEOUT_US)
    if CUDA:
        torch.cuda.synchronize()
    took_c = time.monotonic() - t0
    assert took_c <= TIMEOUT_US / 1e6 + MARGIN_S, f"combine took {took_c:.2f} s"
    if lost:
        assert took_c < TIMEOUT_US / 1e6, "combine waited for the lost rank"
    assert buf.active_ranks.tolist() == [0 if r == victim else 1 for r in range(R)]
    want_itr = ref_layout(idx_np, E, R)[2]
    acc = np.zeros_like(x_np)
    for r in range(R):
        if r != victim:
            acc += np.where(want_itr[:, r:r + 1], expert_fn(r, x_np), 0)
    assert np.array_equal(npy(combined.float()), bf16_round(acc))
    t0 = time.monotonic()
    buf.destroy()
    # victim 0 served the store: its refusals end the claim at once, not
    # after the store's connect timeout
    took_d = time.monotonic() - t0
    assert took_d < 10, f"destroy took {took_d:.2f} s"
    return took if lost else took_c


@pytest.mark.parametrize("world,victim", [(3, 1), (4, 3), (2, 0), (3, 0)])
def test_killed_mid_dispatch(world, victim):
    ranks = Ranks(killed_member, world, (victim,), timeout_s=120)
    got = ranks.wait(expect_dead=(victim,))
    print("dispatch with a rank killed mid-call took",
          [f"{got[r]:.2f} s" for r in sorted(got)])


@pytest.mark.parametrize("world,victim", [(3, 1), (2, 0)])
def test_killed_in_count_exchange(world, victim):
    ranks = Ranks(killed_member, world, (victim, "notify"), timeout_s=120)
    got = ranks.wait(expect_dead=(victim,))
    print("dispatch with a rank killed before its count exchange took",
          [f"{got[r]:.2f} s" for r in sorted(got)])


@pytest.mark.parametrize("world,victim", [(3, 2), (2, 1)])
def test_killed_mid_combine(world, victim):
    ranks = Ranks(killed_member, world, (victim, "combine"), timeout_s=120)
    got = ranks.wait(expect_dead=(victim,))
    print("combine with a rank killed mid-call took",
          [f"{got[r]:.2f} s" for r in sorted(got)])
