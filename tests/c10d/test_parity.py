"""What gloo offers on CPU, on "mep": all_gather_coalesced (any dtypes and
shapes, against a local reference), receives from any source (dist.recv
without src returns the sender, irecv's work names it; per-sender order and
bytes checked), monitored_barrier (success, the first or every rank that did
not arrive, rank 0's own timeout, a dead rank named at once, gloo's message
shapes), timeouts that say "Timed out", and the backend's reserved tags."""
import datetime
import os
import re
import time

import pytest
import torch
import torch.distributed as dist

from harness import Ranks, run_ranks
from refs import make

TIMEOUT_S = 20
S = datetime.timedelta(seconds=1)


def init(ctx, timeout_s=TIMEOUT_S):
    import mep
    dist.init_process_group("mep", store=ctx.store, rank=ctx.rank, world_size=ctx.world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    return mep


# ------------------------------------------------------ all_gather_coalesced

CASES = [((3,), torch.float32), ((2, 5), torch.float16), ((0,), torch.int64),
         ((7,), torch.bool), ((4, 3), torch.int8), ((1,), torch.float64),
         ((33,), torch.complex64)]


def gather_coalesced(ctx):
    init(ctx)
    for it, dt in enumerate((None, torch.float32)):
        cases = CASES if dt is None else [(s, dt) for s, _ in CASES]
        ins = [make(f"agc/{it}/{i}", ctx.rank, s, d) for i, (s, d) in enumerate(cases)]
        ins[1] = ins[1].t().contiguous().t()  # a non-contiguous input
        outs = [[torch.full(s, 7).to(d) for s, d in cases] for _ in range(ctx.world)]
        if dt is None:  # mixed dtypes: torch's Python refuses them, the backend not
            dist.group.WORLD.allgather_coalesced(outs, ins).wait()
        else:
            dist.all_gather_coalesced(outs, ins)
        for r in range(ctx.world):
            for i, (s, d) in enumerate(cases):
                want = make(f"agc/{it}/{i}", r, s, d)
                assert torch.equal(outs[r][i], want), (it, r, i, outs[r][i], want)
    # Its async work finishes with the outputs.
    outs = [[torch.empty(2)] for _ in range(ctx.world)]
    w = dist.all_gather_coalesced(outs, [torch.full((2,), float(ctx.rank))], async_op=True)
    w.wait()
    assert [o[0][0].item() for o in outs] == [float(r) for r in range(ctx.world)]
    # The object collectives torch builds on them.
    objs = [None, None]
    if ctx.rank == 0:
        objs = [{"a": [1, 2]}, "two"]
    dist.broadcast_object_list(objs, src=0)
    assert objs == [{"a": [1, 2]}, "two"], objs
    got = [None] * ctx.world
    dist.all_gather_object(got, ("r", ctx.rank))
    assert got == [("r", r) for r in range(ctx.world)], got
    with pytest.raises(ValueError, match="output 0 of rank 1 has"):
        dist.all_gather_coalesced([[torch.empty(2)], [torch.empty(3)]] +
                                  [[torch.empty(2)]] * (ctx.world - 2),
                                  [torch.ones(2)])
    dist.destroy_process_group()
    return "ok"


@pytest.mark.parametrize("world", [2, 3])
def test_all_gather_coalesced(world):
    assert run_ranks(gather_coalesced, world, timeout_s=90) == ["ok"] * world


# ------------------------------------------------------------- any source

PER = 6             # messages from each sender per tag
SIZES = {0: 5, 3: 100003}  # elements per tag (bytes must match the receiver's)


def any_source(ctx):
    init(ctx)
    if ctx.rank == 0:
        seen = {}  # (src, tag) -> messages received so far
        n = (ctx.world - 1) * PER
        for tag, size in SIZES.items():
            for i in range(n):
                t = torch.empty(size)
                if i % 2:
                    src = dist.recv(t, tag=tag)
                else:
                    w = dist.irecv(t, tag=tag)
                    w.wait()
                    src = w._source_rank()
                k = seen.get((src, tag), 0)
                seen[(src, tag)] = k + 1
                # The k-th message of (src, tag): order per sender holds.
                assert torch.equal(t, make(f"any/{src}/{tag}/{k}", src, (size,), torch.float32)), \
                    (src, tag, k)
        assert seen == {(s, t): PER for s in range(1, ctx.world) for t in SIZES}, seen
        # A recv naming its source reports it too; a send has none.
        t = torch.empty(1)
        w = dist.irecv(t, 1, tag=9)
        w.wait()
        assert w._source_rank() == 1 and t.item() == 42.0
        w = dist.isend(torch.ones(1), 1, tag=10)
        w.wait()
        with pytest.raises(RuntimeError):
            w._source_rank()
        dist.send(torch.ones(1), 1, tag=10)
    else:
        # Tags interleaved: the tag-3 messages go first, tag 0 after.
        for k in range(PER):
            for tag in sorted(SIZES, reverse=True):
                x = make(f"any/{ctx.rank}/{tag}/{k}", ctx.rank, (SIZES[tag],), torch.float32)
                dist.send(x, 0, tag=tag)
        if ctx.rank == 1:
            dist.send(torch.tensor([42.0]), 0, tag=9)
            t = torch.empty(1)
            dist.recv(t, 0, tag=10)
            dist.recv(t, 0, tag=10)
    dist.barrier()
    dist.destroy_process_group()
    return "ok"


@pytest.mark.parametrize("world", [2, 4])
def test_recv_any_source(world):
    assert run_ranks(any_source, world, timeout_s=120) == ["ok"] * world


# --------------------------------------------------------- monitored_barrier

def expect(fn, pattern):
    with pytest.raises(RuntimeError) as info:
        fn()
    msg = str(info.value)
    assert re.search(pattern, msg, re.S), msg
    return msg


def monitored(ctx):
    init(ctx)
    t = datetime.timedelta(seconds=1)
    # Everyone arrives, in both modes, again and again.
    for i in range(3):
        dist.monitored_barrier(timeout=t, wait_all_ranks=bool(i % 2))
    # Each case in a group of its own: a rank that skips a barrier leaves
    # its group's barrier count behind.
    g = dist.new_group(backend="mep")
    msgs = {}
    if ctx.rank == 0:  # rank 2 stays away: the first rank that failed
        msgs["first"] = expect(lambda: dist.monitored_barrier(g, timeout=t),
                               r"^\[Rank 0\]: Rank 2 failed to pass monitoredBarrier in 1000 ms")
    elif ctx.rank == 1:  # it arrived; rank 0 tells it the barrier failed
        t0 = time.monotonic()
        msgs["other"] = expect(
            lambda: dist.monitored_barrier(g, timeout=t),
            r"^Rank 1 successfully reached monitoredBarrier, but received errors while waiting "
            r"for send/recv from rank 0.*rank 0 reports that rank 2 failed")
        assert time.monotonic() - t0 < 10
    g = dist.new_group(backend="mep")
    if ctx.rank == 0:  # ranks 1 and 2 stay away: all named
        msgs["all"] = expect(lambda: dist.monitored_barrier(g, timeout=t, wait_all_ranks=True),
                             r"Ranks 1, 2 failed to pass monitoredBarrier in 1000 ms")
    g = dist.new_group(backend="mep")
    if ctx.rank == 0:
        msgs["rank0"] = expect(lambda: g.monitored_barrier(datetime.timedelta(0)),
                               "Rank 0 timed out in monitoredBarrier after 0 ms")
    dist.barrier()
    return msgs


def test_monitored_barrier():
    res = run_ranks(monitored, 3, timeout_s=120)
    assert set(res[0]) == {"first", "all", "rank0"} and set(res[1]) == {"other"}, res


def monitored_dead(ctx):
    init(ctx)
    dist.all_reduce(torch.ones(1))
    if ctx.rank == 2:
        os._exit(0)
    if ctx.rank == 0:
        # The core knows rank 2 is gone: named at once, not at the timeout.
        t0 = time.monotonic()
        msg = expect(lambda: dist.monitored_barrier(timeout=datetime.timedelta(seconds=60),
                                                    wait_all_ranks=True),
                     r"Ranks 2 failed to pass monitoredBarrier in 60000 ms")
        assert "rank 2" in msg and time.monotonic() - t0 < 20, msg
    else:
        msg = "ok"
        expect(lambda: dist.monitored_barrier(timeout=datetime.timedelta(seconds=60)),
               "rank 0 reports that rank 2 failed")
    ctx.store.set(f"done/{ctx.rank}", "1")
    ctx.store.wait(["done/0", "done/1"])
    return msg


def test_monitored_barrier_dead_rank():
    ranks = Ranks(monitored_dead, 3, timeout_s=90)
    got = ranks.wait(expect_dead=(2,))
    assert got[1] == "ok" and "PEER_FAILED" in got[0], got


# ------------------------------------------------------------- timeouts

def timeouts(ctx):
    init(ctx)
    g = dist.new_group(backend="mep", timeout=datetime.timedelta(seconds=2))
    h = dist.new_group(backend="mep")
    out = {}
    if ctx.rank == 0:
        # Alone in the barrier: the core's deadline, gloo's words.
        t0 = time.monotonic()
        out["group"] = expect(lambda: dist.barrier(g), r" Timed out waiting 2000ms: ")
        assert 1.9 < time.monotonic() - t0 < 15
        # barrier(timeout=): the wait gives up then.
        t0 = time.monotonic()
        out["arg"] = expect(lambda: dist.barrier(h, timeout=datetime.timedelta(milliseconds=300)),
                            "Timed out waiting 300ms")
        assert time.monotonic() - t0 < 5
    with pytest.raises(ValueError, match="tag 1073741824 is reserved"):
        dist.send(torch.ones(1), (ctx.rank + 1) % ctx.world, tag=1 << 30)
    with pytest.raises(ValueError, match="reserved"):
        dist.irecv(torch.ones(1), tag=(1 << 31) - 1)
    ctx.store.set(f"done/{ctx.rank}", "1")
    ctx.store.wait([f"done/{r}" for r in range(ctx.world)])
    return out


def test_timeouts_say_timed_out():
    res = run_ranks(timeouts, 2, timeout_s=90)
    assert set(res[0]) == {"group", "arg"}, res
