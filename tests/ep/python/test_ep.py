"""mep.ep.Buffer on the CPU path, 2 and 4 ranks over tcp: dispatch against
the routing computed in one process (sets per expert via src_info), combine
against the dense single-process result, FP8 (float, power-of-two and
UE8M0 scales) within e4m3 rounding, the two-phase hooks, async_finish's
event, zero-copy combine, back-to-back calls (alternating halves), the
receive statistics, and a group of each backend (gloo, mep)."""
import pytest
import torch

import eptest
from eptest import check_combine, check_dispatch, expert_outputs, run_ranks

# (max tokens per rank T, hidden H, experts per rank L, top-k K)
CASES = [(5, 384, 3, 3), (1, 128, 1, 1), (3, 512, 8, 16), (17, 1152, 2, 4)]


class Counting(torch.overrides.TorchFunctionMode):
    """Counts what Python asks of tensors while it is on, as a mode such as
    torch.set_default_device's (DeepEP's tests turn that on) sees it."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.seen.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def under_mode(mep_ep, rank, R, data, T, E, L, buf, every):
    """Calls under a TorchFunctionMode give the same results, and through
    mep.ep._ops (its checked path) ask Python's torch for nothing."""
    x, idx, w = data[rank]
    stats = torch.zeros(L, dtype=torch.int32)
    with Counting() as mode:
        recv, count, handle, _, _ = buf.low_latency_dispatch(
            x, idx, T, E, cumulative_local_expert_recv_stats=stats, use_fp8=False)
    dispatch_seen = mode.seen
    check_dispatch(rank, R, data, E, recv, count, handle)
    assert torch.equal(stats, count)
    y = expert_outputs(recv, rank, L)
    with Counting() as mode:
        out, _, _ = buf.low_latency_combine(y, idx, w, handle)
    check_combine(out, data, rank, every)
    if mep_ep.ops_problem() is None:
        assert dispatch_seen == [] and mode.seen == [], (dispatch_seen, mode.seen)


def one_case(mep_ep, rank, R, case, T, H, L, K):
    Buffer, EventOverlap = mep_ep.Buffer, mep_ep.EventOverlap
    E = L * R
    data = eptest.case_inputs(f"case{case}", R, T, H, E, K)
    x, idx, w = data[rank]
    every = set(range(E))
    buf = Buffer(None, 0, Buffer.get_low_latency_rdma_size_hint(T, H, R, E),
                 low_latency_mode=True, num_qps_per_rank=L)
    stats = torch.zeros(L, dtype=torch.int32)

    # One call each, both phases inside.
    recv, count, handle, ev, hook = buf.low_latency_dispatch(
        x, idx, T, E, cumulative_local_expert_recv_stats=stats, use_fp8=False)
    assert hook is None and isinstance(ev, EventOverlap) and ev.event is None
    check_dispatch(rank, R, data, E, recv, count, handle)
    assert torch.equal(stats, count)
    out, ev, hook = buf.low_latency_combine(expert_outputs(recv, rank, L), idx, w, handle)
    assert hook is None
    check_combine(out, data, rank, every)
    under_mode(mep_ep, rank, R, data, T, E, L, buf, every)

    # Two phases through the hooks, with async_finish and a given `out`.
    recv, count, handle, ev, hook = buf.low_latency_dispatch(
        x, idx, T, E, cumulative_local_expert_recv_stats=stats, use_fp8=False,
        async_finish=True, return_recv_hook=True)
    assert callable(hook) and isinstance(ev, EventOverlap)
    ev.current_stream_wait()  # CPU: the call is done; a no-op
    with ev:
        pass
    hook()
    check_dispatch(rank, R, data, E, recv, count, handle)
    assert torch.equal(stats, 2 * count)
    with pytest.raises(RuntimeError, match="already called"):
        hook()
    given = torch.full(x.shape, float("nan"), dtype=torch.bfloat16)
    out, ev, hook = buf.low_latency_combine(expert_outputs(recv, rank, L), idx, w, handle,
                                            async_finish=True, return_recv_hook=True,
                                            out=given)
    assert out is given and callable(hook)
    hook()
    check_combine(out, data, rank, every)

    # Zero-copy: the experts write into the buffer's own memory.
    recv, count, handle, _, _ = buf.low_latency_dispatch(x, idx, T, E, use_fp8=False)
    check_dispatch(rank, R, data, E, recv, count, handle)
    zc = buf.get_next_low_latency_combine_buffer(handle)
    assert zc.shape == (L, R * T, H) and zc.dtype == torch.bfloat16
    zc.copy_(expert_outputs(recv, rank, L))
    out, _, _ = buf.low_latency_combine(zc, idx, w, handle, zero_copy=True)
    check_combine(out, data, rank, every)

    # FP8 dispatch: float scales, powers of two, packed exponents.
    for round_scale, ue8m0 in [(False, False), (True, False), (True, True)]:
        if ue8m0 and H % 512:
            continue
        (q, s), count, handle, _, _ = buf.low_latency_dispatch(
            x, idx, T, E, use_fp8=True, round_scale=round_scale, use_ue8m0=ue8m0)
        assert q.dtype == torch.float8_e4m3fn
        groups = H // 512 if ue8m0 else H // 128
        assert s.shape == (L, R * T, groups)
        assert s.dtype == (torch.int32 if ue8m0 else torch.float32)
        # DeepEP's layout: a transposed view of [L, groups, R*T].
        assert s.stride() == (groups * R * T, 1, R * T)
        check_dispatch(rank, R, data, E, (q, s), count, handle, fp8=(round_scale, ue8m0))
    buf.destroy()


def roundtrips(ctx, cases, backend):
    mep_ep = eptest.init(ctx, backend)
    for i in cases:
        one_case(mep_ep, ctx.rank, ctx.world, i, *CASES[i])
    return "ok"


@pytest.mark.parametrize("world", [2, 4])
def test_roundtrip(world):
    run_ranks(roundtrips, world, range(len(CASES)), "gloo", timeout_s=240)


def test_group_of_mep_backend():
    """Setup over a group of the "mep" backend itself."""
    run_ranks(roundtrips, 2, [0], "mep", timeout_s=120)


def test_moe_example():
    """examples/moe/moe.py, started by its own launcher (no torchrun), with
    BF16 and FP8 dispatch: every rank matches the dense result."""
    import os
    import subprocess
    import sys
    script = os.path.join(eptest.HERE, "..", "..", "..", "examples", "moe", "moe.py")
    for extra in ([], ["--fp8", "--hidden", "384"]):
        r = subprocess.run([sys.executable, script, "--nproc", "3", "--iters", "2",
                            "--timeout", "120"] + extra,
                           capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "every rank's output matched the dense reference (3 ranks)" in r.stdout
        assert r.stdout.count(": OK ") == 3, r.stdout
