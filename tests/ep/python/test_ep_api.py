"""mep.ep.Buffer's surface: DeepEP's constructor arguments accepted, the
size hint, the num_rdma_bytes check, the properties, and clear errors
(TypeError/ValueError before anything is sent, RuntimeError with mep's
message from the C library, NotImplementedError for use_logfmt)."""
import ctypes
import os

import pytest
import torch

import eptest
from eptest import run_ranks


def test_size_hint():
    """Positive, at least the receive areas of the layout, growing with
    every parameter; ValueError for parameters no buffer fits."""
    import mep.ep
    hint = mep.ep.Buffer.get_low_latency_rdma_size_hint
    T, H, R, E = 128, 7168, 2, 256
    L = E // R
    n = hint(T, H, R, E)
    # dispatch receive [2][R][T] messages of >= 2H bytes, the dispatch
    # index [2][L][R][T] int32, combine receive [2][E][T] rows of 2H bytes
    assert n >= 2 * R * T * 2 * H + 2 * L * R * T * 4 + 2 * E * T * 2 * H
    assert hint(T + 1, H, R, E) > n and hint(T, H + 128, R, E) > n
    assert hint(T, H, R, 2 * E) > n
    assert hint(1, 128, 1, 1) > 0
    for bad in [(T, 100, R, E), (T, H, 3, 256), (0, H, R, E), (T, H, R, 2 * 1025)]:
        with pytest.raises(ValueError, match="no low-latency buffer fits"):
            hint(*bad)


def raises(exc, match, fn, *a, **kw):
    with pytest.raises(exc, match=match):
        fn(*a, **kw)


def surface(ctx):
    mep_ep = eptest.init(ctx)
    from mep.ep import _c as _ep_c
    Buffer = mep_ep.Buffer
    rank, R = ctx.rank, ctx.world
    T, H, L, K = 4, 256, 2, 2
    E = L * R
    hint = Buffer.get_low_latency_rdma_size_hint(T, H, R, E)

    # DeepEP's constructor, positional in its order (group, num_nvl_bytes,
    # num_rdma_bytes, low_latency_mode, num_qps_per_rank,
    # allow_nvlink_for_low_latency_mode, allow_mnnvl, use_fabric,
    # explicitly_destroy, enable_shrink, comm), extra keywords ignored.
    Buffer.set_num_sms(24)
    buf = Buffer(None, 1 << 20, hint, True, 12, True, False, False, True, False,
                 None, some_future_deepep_option=1)
    assert buf.explicitly_destroy and buf.group_size == R and buf.rank == rank
    assert mep_ep.topk_idx_t is torch.int64
    assert isinstance(Buffer.is_sm90_compiled(), bool)
    x, idx, w = eptest.case_inputs("api", R, T, H, E, K)[rank]
    x = x if x.shape[0] else torch.zeros(1, H, dtype=torch.bfloat16)
    idx = idx if idx.shape[0] else torch.full((1, K), -1, dtype=torch.int64)
    w = w if w.shape[0] else torch.ones(1, K)
    n = x.shape[0]

    # Before the first dispatch.
    raises(RuntimeError, "no low_latency_dispatch made it yet", lambda: buf.active_ranks)
    fake = (torch.zeros(L, R * T, dtype=torch.int32), torch.zeros(L, R, dtype=torch.int64),
            T, H, E)
    raises(RuntimeError, "combine before any low_latency_dispatch",
           buf.low_latency_combine, torch.zeros(L, R * T, H, dtype=torch.bfloat16), idx, w, fake)
    assert buf.timeout_us > 0  # the communicator's
    buf.timeout_us = 1234
    assert buf.timeout_us == 1234
    buf.timeout_us = None
    raises(ValueError, "positive", setattr, buf, "timeout_us", 0)
    raises(TypeError, "must be an int", setattr, buf, "timeout_us", 1.5)
    buf.clean_low_latency_buffer(T, H, E)  # a no-op

    # Refused before anything is sent (the same on every rank).
    d = buf.low_latency_dispatch
    raises(TypeError, "x must be torch.bfloat16", d, x.float(), idx, T, E)
    raises(TypeError, "x must be a torch.Tensor", d, x.tolist(), idx, T, E)
    raises(ValueError, "contiguous", d, x.repeat(1, 2)[:, ::2], idx, T, E)
    raises(TypeError, "topk_idx must be torch.int64", d, x, idx.int(), T, E)
    raises(ValueError, "topk_idx has shape", d, x, idx[:0], T, E)
    raises(ValueError, "1 to 16", d, x, torch.zeros(n, 17, dtype=torch.int64), T, E)
    raises(ValueError, "not a positive multiple of 128",
           d, torch.zeros(n, 200, dtype=torch.bfloat16), idx, T, E)
    raises(ValueError, "more than num_max_dispatch_tokens_per_rank",
           d, torch.zeros(T + 1, H, dtype=torch.bfloat16),
           torch.zeros(T + 1, K, dtype=torch.int64), T, E)
    raises(ValueError, "holds", d, x, torch.full((n, K), E, dtype=torch.int64), T, E)
    raises(ValueError, "holds", d, x, torch.full((n, K), -2, dtype=torch.int64), T, E)
    raises(ValueError, "use_ue8m0 needs use_fp8=True and round_scale", d, x, idx, T, E,
           use_ue8m0=True)
    raises(ValueError, "multiple of 512", d, x, idx, T, E, round_scale=True, use_ue8m0=True)
    raises(ValueError, "not a multiple of the group size", d, x, idx, T, E + 1)
    raises(ValueError, "active_ranks has shape", d, x, idx, T, E,
           active_ranks=torch.ones(R + 1, dtype=torch.int32))
    raises(TypeError, "active_ranks must be torch.int32", d, x, idx, T, E,
           active_ranks=torch.ones(R))
    raises(ValueError, "cumulative_local_expert_recv_stats has shape", d, x, idx, T, E,
           cumulative_local_expert_recv_stats=torch.zeros(L + 1, dtype=torch.int32))
    raises(ValueError, "positive", d, x, idx, T, E, timeout_us=-5)

    # The first dispatch makes the buffer; num_rdma_bytes too small is
    # DeepEP's assertion, naming both numbers.
    small = Buffer(None, 0, hint - 1)
    raises(ValueError, rf"num_rdma_bytes \({hint - 1}\) is smaller than the low-latency "
           rf"size hint \({hint}\)", small.low_latency_dispatch, x, idx, T, E)
    small.destroy()

    recv, count, handle, _, _ = d(x, idx, T, E, use_fp8=False, timeout_us=5_000_000)
    act = buf.active_ranks
    assert act.dtype == torch.int32 and act.tolist() == [1] * R

    # DeepEP's mask buffer is the active set seen the other way round.
    status = torch.full((R,), 7, dtype=torch.int32)
    buf.low_latency_query_mask_buffer(status)
    assert status.tolist() == [0] * R
    other = (rank + 1) % R
    buf.low_latency_update_mask_buffer(other, True)
    assert buf.active_ranks[other] == 0
    buf.low_latency_query_mask_buffer(status)
    assert status.tolist() == [int(r == other) for r in range(R)]
    buf.low_latency_update_mask_buffer(other)  # mask=False unmasks
    assert buf.active_ranks.tolist() == [1] * R
    buf.low_latency_update_mask_buffer(other, True)
    buf.low_latency_clean_mask_buffer()
    assert buf.active_ranks.tolist() == [1] * R
    raises(ValueError, "rank_to_mask must be a rank", buf.low_latency_update_mask_buffer, R)
    raises(TypeError, "mask_status must be torch.int32",
           buf.low_latency_query_mask_buffer, torch.zeros(R))
    raises(ValueError, "was made for num_max_dispatch_tokens_per_rank 4, hidden 256",
           d, x, idx, T + 1, E)
    raises(ValueError, "use one Buffer per setting", d, x, idx, T, 2 * E)

    c = buf.low_latency_combine
    y = torch.zeros(L, R * T, H, dtype=torch.bfloat16)
    raises(NotImplementedError, "use_logfmt", c, y, idx, w, handle, use_logfmt=True)
    raises(TypeError, "handle must be the 5-tuple", c, y, idx, w, handle[:3])
    raises(ValueError, "the handle is for", c, y, idx, w, handle[:2] + (T + 1, H, E))
    raises(ValueError, "x has shape", c, y[:, :-1], idx, w, handle)
    raises(TypeError, "x must be torch.bfloat16", c, y.float(), idx, w, handle)
    raises(TypeError, "topk_weights must be torch.float32", c, y, idx, w.double(), handle)
    raises(ValueError, "topk_weights has shape", c, y, idx, w[:, :1], handle)
    raises(ValueError, "out has shape", c, y, idx, w, handle,
           out=torch.empty(n + 1, H, dtype=torch.bfloat16))
    out, _, _ = c(y, idx, w, handle)
    assert torch.equal(out, torch.zeros_like(out))

    # A failure of the C library: RuntimeError with mep's message.
    lib = _ep_c.libs()
    args = _ep_c.DispatchArgs(struct_size=ctypes.sizeof(_ep_c.DispatchArgs))
    with pytest.raises(_ep_c.MepError, match=r"mep: probe: .*\(MEP_ERR_INVALID") as info:
        _ep_c.check(lib.ep_dispatch(None, ctypes.byref(args)), "probe")
    assert isinstance(info.value, RuntimeError) and info.value.code == -1

    buf.destroy()
    raises(RuntimeError, "destroyed", d, x, idx, T + 1, E)
    return "ok"


def test_call_path():
    """Where the c10d backend was built against this torch (the build tree
    these tests run in), the calls go through mep.ep._ops unless
    MEP_EP_OPS=0 asks for ctypes: a fast path that fails to load must not
    turn into a slow one silently."""
    import mep
    import mep.ep
    if os.environ.get("MEP_EP_OPS") == "0":
        assert mep.ep.ops_problem() == "MEP_EP_OPS=0"
    else:
        assert mep.backend_problem() is None
        assert mep.ep.ops_problem() is None


def test_surface():
    run_ranks(surface, 2, timeout_s=120)
