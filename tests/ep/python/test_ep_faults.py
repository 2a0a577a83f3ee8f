"""A rank that stops dispatching: the others' dispatch returns within
timeout_us + MARGIN_S (counted from when all of them are ready) with the
rank cleared in their active_ranks and its tokens not received; their
combine leaves its experts out; later calls skip it without waiting. Also
with the caller's own active_ranks tensor, given to the constructor."""
import time

import pytest
import torch
import torch.distributed as dist

import eptest
from eptest import check_combine, check_dispatch, expert_outputs, run_ranks

TIMEOUT_US = 400_000
# Slack for a loaded 2-core CI machine: scheduling, tcp, Python.
MARGIN_S = 3.0


def silent_rank(ctx, victim, own_array):
    mep_ep = eptest.init(ctx)
    rank, R = ctx.rank, ctx.world
    T, H, L, K = 4, 256, 2, 3
    E = L * R
    data = eptest.case_inputs("faults", R, T, H, E, K)
    x, idx, w = data[rank]
    mine = torch.ones(R, dtype=torch.int32) if own_array else None
    # Generous for the calls every rank makes (the ranks reach them at
    # different times); the timed calls pass TIMEOUT_US.
    buf = mep_ep.Buffer(None, timeout_us=30_000_000, active_ranks=mine)
    assert buf.timeout_us == 30_000_000
    alive = set(range(R)) - {victim}
    survivors = dist.new_group(sorted(alive))  # collective over all ranks

    recv, count, handle, _, _ = buf.low_latency_dispatch(x, idx, T, E, use_fp8=False)
    check_dispatch(rank, R, data, E, recv, count, handle)
    out, _, _ = buf.low_latency_combine(expert_outputs(recv, rank, L), idx, w, handle)
    check_combine(out, data, rank, set(range(E)))

    if rank == victim:  # silent until the others are done
        time.sleep(TIMEOUT_US / 1e6 + 2 * MARGIN_S)
        buf.destroy()
        return None
    # The clock starts when every survivor is ready.
    dist.barrier(group=survivors)
    t0 = time.monotonic()
    recv, count, handle, _, _ = buf.low_latency_dispatch(x, idx, T, E, use_fp8=False,
                                                         timeout_us=TIMEOUT_US)
    took = time.monotonic() - t0
    act = buf.active_ranks
    if own_array:
        assert act is mine
    assert act.dtype == torch.int32 and act.shape == (R,)
    assert act.tolist() == [0 if r == victim else 1 for r in range(R)], act
    assert took <= TIMEOUT_US / 1e6 + MARGIN_S, f"dispatch took {took:.2f} s"
    check_dispatch(rank, R, data, E, recv, count, handle, active_src=alive)
    out, _, _ = buf.low_latency_combine(expert_outputs(recv, rank, L), idx, w, handle)
    live_experts = {e for e in range(E) if e // L != victim}
    check_combine(out, data, rank, live_experts)

    # Already inactive: skipped at once.
    dist.barrier(group=survivors)
    t0 = time.monotonic()
    recv, count, handle, _, _ = buf.low_latency_dispatch(x, idx, T, E, use_fp8=False,
                                                         timeout_us=TIMEOUT_US)
    again = time.monotonic() - t0
    assert again < TIMEOUT_US / 1e6, f"a known-inactive source cost {again:.2f} s"
    check_dispatch(rank, R, data, E, recv, count, handle, active_src=alive)
    out, _, _ = buf.low_latency_combine(expert_outputs(recv, rank, L), idx, w, handle)
    check_combine(out, data, rank, live_experts)
    buf.destroy()
    return took


@pytest.mark.parametrize("world,victim,own_array", [(2, 1, False), (4, 2, True)])
def test_silent_rank(world, victim, own_array):
    took = run_ranks(silent_rank, world, victim, own_array, timeout_s=120)
    print("dispatch with a silent source took", [f"{t:.2f} s" for t in took if t])
