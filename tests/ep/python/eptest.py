"""What the mep.ep tests share: the c10d tests' rank harness (processes with
a deadline, every one reaped), group setup, and the checks of dispatch and
combine results against ep_ref's single-process reference."""
import datetime
import os
import sys

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..", "..", "c10d")))

import ep_ref  # noqa: E402
from harness import RankFailed, Ranks, run_ranks  # noqa: E402,F401

GROUP_TIMEOUT_S = 30


def init(ctx, backend="gloo"):
    """The default group over the harness's store; returns mep.ep."""
    if backend == "mep":
        import mep  # noqa: F401  registers the backend
    dist.init_process_group(backend, store=ctx.store, rank=ctx.rank, world_size=ctx.world,
                            timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
    import mep.ep
    return mep.ep


def tokens_per_rank(T, R):
    """Odd token counts: the maximum, none, one, and in between."""
    return [[T, 0, 1, max(T - 2, 0)][r % 4] for r in range(R)]


def case_inputs(case, R, T, H, E, K):
    """[(x, topk_idx, topk_weights) of rank r]: every rank makes all."""
    ns = tokens_per_rank(T, R)
    return [ep_ref.inputs(case, r, ns[r], H, E, K) for r in range(R)]


def unpack_scales(s, ue8m0):
    """Scales of some rows as floats [rows, H/128]: ue8m0 int32 words hold
    the exponents of groups 4j..4j+3 in bytes 0..3."""
    if not ue8m0:
        return s.float()
    v = s.to(torch.int64)
    ex = torch.stack([(v >> (8 * i)) & 0xFF for i in range(4)], dim=-1)
    return torch.exp2(ex.flatten(-2).double() - 127).float()


def check_dispatch(rank, R, data, E, recv, count, handle, *, fp8=None,
                   active_src=None):
    """Every local expert received exactly the tokens routed to it (as sets
    per source, via src_info), packed by source in rank order, with their
    data: equal in bf16, within e4m3 rounding of x with FP8
    (fp8 = (round_scale, ue8m0)). Sources outside active_src send none."""
    src_info, layout, _, H, _ = handle
    L = E // R
    all_x = [d[0] for d in data]
    all_idx = [d[1] for d in data]
    q, scales = recv if fp8 else (recv, None)
    assert q.shape == (L, R * handle[2], H)
    assert count.dtype == torch.int32 and count.shape == (L,)
    for l in range(L):
        e = rank * L + l
        want = ep_ref.dispatch_sets(all_idx, e)
        begin = 0
        for src in range(R):
            if active_src is not None and src not in active_src:
                want[src] = []
            word = int(layout[l, src])
            b, n = word >> 32, word & 0xFFFFFFFF  # DeepEP's packing
            assert n == len(want[src]), (f"expert {e}, source {src}: {n} tokens, "
                                         f"expected {len(want[src])}")
            if n == 0:
                continue
            assert b == begin, f"expert {e}, source {src}: begins at {b}, not {begin}"
            toks = src_info[l, b:b + n].tolist()
            assert sorted(toks) == want[src], f"expert {e}, source {src}: {toks}"
            x = all_x[src][toks]
            if fp8 is None:
                assert torch.equal(q[l, b:b + n], x), f"expert {e}, source {src}: data"
            else:
                # the same bits as DeepEP's cast of the same rows
                round_scale, ue8m0 = fp8
                s = unpack_scales(scales[l, b:b + n], ue8m0)
                ref_q, ref_s = ep_ref.fp8_cast(x, round_scale)
                assert torch.equal(s.view(torch.int32), ref_s.view(torch.int32)), (
                    f"expert {e}, source {src}: scales differ from DeepEP's at "
                    f"{(s != ref_s).nonzero()[:4].tolist()}")
                got_q = q[l, b:b + n].contiguous().view(torch.uint8)
                diff = got_q != ref_q.view(torch.uint8)
                assert not bool(diff.any()), (
                    f"expert {e}, source {src}: {int(diff.sum())} FP8 codes differ "
                    f"from DeepEP's, first at {diff.nonzero()[0].tolist()}")
                deq = q[l, b:b + n].float() * s.repeat_interleave(128, dim=-1)
                err = (deq - x.float()).abs()
                bound = ep_ref.fp8_bound(x, ref_s)
                assert bool((err <= bound).all()), (
                    f"expert {e}, source {src}: FP8 error {float((err - bound).max())} "
                    "over the bound")
            begin += n
        assert int(count[l]) == begin, f"expert {e}: recv_count {int(count[l])}, expected {begin}"


def expert_outputs(recv_x, rank, L):
    """What this rank's experts return for the rows they received."""
    y = torch.empty_like(recv_x)
    for l in range(L):
        y[l] = ep_ref.expert_fn(rank * L + l, recv_x[l])
    return y


def check_combine(out, data, rank, experts):
    """out is the dense single-process result over `experts` (a set)."""
    x, idx, w = data[rank]
    ref = ep_ref.combine(x, idx, w, experts)
    assert out.dtype == torch.bfloat16 and out.shape == x.shape
    # One bf16 rounding of a float sum whose order may differ.
    torch.testing.assert_close(out.float(), ref.float(), rtol=2 ** -7, atol=1e-3)
