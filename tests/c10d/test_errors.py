"""Bad input gives a clear Python error and no hang: unsupported dtypes and
reduce ops, wrong list lengths, sizes or collectives that differ across
ranks, a receive of the wrong size, a wrong world size, bad options, and
use after destroy_process_group."""
import datetime
import time

import pytest
import torch
import torch.distributed as dist

from harness import RankFailed, run_ranks

TIMEOUT_S = 8


def init(ctx, **kw):
    import mep
    dist.init_process_group("mep", store=kw.pop("store", ctx.store), rank=ctx.rank,
                            world_size=kw.pop("world_size", ctx.world),
                            timeout=datetime.timedelta(seconds=TIMEOUT_S), **kw)
    return mep


def bounded(fn, exc, match):
    """fn() raises `exc` matching `match`, well within the timeout."""
    t0 = time.monotonic()
    with pytest.raises(exc, match=match) as info:
        fn()
    took = time.monotonic() - t0
    assert took < TIMEOUT_S + 5, f"took {took:.1f} s"
    return str(info.value)


def local_errors(ctx):
    """Refused before anything is sent: the same on every rank."""
    init(ctx)
    bounded(lambda: dist.all_reduce(torch.ones(3, dtype=torch.int16)), TypeError,
            "all_reduce: cannot reduce int16")
    bounded(lambda: dist.all_reduce(torch.ones(3, dtype=torch.uint32)), TypeError,
            "cannot reduce")
    bounded(lambda: dist.all_reduce(torch.ones(3), op=dist.ReduceOp.BXOR), ValueError,
            "ReduceOp.BXOR is not supported")
    bounded(lambda: dist.all_reduce(torch.ones(3, dtype=torch.bool), op=dist.ReduceOp.AVG),
            TypeError, "AVG on bool")
    bounded(lambda: dist.all_gather([torch.empty(2)] * (ctx.world + 1), torch.ones(2)),
            ValueError, f"has {ctx.world + 1} entries, expected {ctx.world}")
    bounded(lambda: dist.all_gather_into_tensor(torch.empty(5), torch.ones(2)),
            ValueError, "all_gather_into_tensor: the output has 5")
    bounded(lambda: dist.all_to_all_single(torch.empty(4), torch.ones(4), [1] * ctx.world,
                                           [5] + [0] * (ctx.world - 1)),
            ValueError, "split sizes add up")
    # The group still works after refusals.
    x = torch.ones(4)
    dist.all_reduce(x)
    assert torch.equal(x, torch.full((4,), float(ctx.world)))
    return "ok"


def disagreements(ctx):
    """Ranks that disagree get MEP_ERR_MISMATCH (or a size error), not a hang."""
    init(ctx)
    msgs = []
    n = 5 + 2 * ctx.rank
    msgs.append(bounded(lambda: dist.all_reduce(torch.ones(n)), RuntimeError, "mep: "))
    if ctx.rank == 0:
        f = lambda: dist.all_reduce(torch.ones(4))  # noqa: E731
    else:
        f = lambda: dist.broadcast(torch.ones(4), 0)  # noqa: E731
    msgs.append(bounded(f, RuntimeError, "mep: "))
    if ctx.rank == 0:
        dist.send(torch.ones(5), 1)
    elif ctx.rank == 1:
        msgs.append(bounded(lambda: dist.recv(torch.empty(3), 0), RuntimeError,
                            "recv .*(20|12)"))
    return msgs


def after_destroy(ctx):
    init(ctx)
    pg = dist.group.WORLD
    dist.all_reduce(torch.ones(2))
    dist.destroy_process_group()
    bounded(lambda: pg.allreduce([torch.ones(2)]), RuntimeError,
            "process group was shut down")
    bounded(lambda: dist.all_reduce(torch.ones(2)), (RuntimeError, ValueError),
            "not been initialized|Default process group")
    return "ok"


def test_local_errors():
    assert run_ranks(local_errors, 2, timeout_s=60) == ["ok", "ok"]


def test_disagreeing_ranks():
    res = run_ranks(disagreements, 2, timeout_s=60)
    for msgs in res:
        assert any("MISMATCH" in m for m in msgs[:2]), msgs
    assert any("MEP_ERR" in m for m in res[1][2:]), res[1]


def test_use_after_destroy():
    assert run_ranks(after_destroy, 2, timeout_s=60) == ["ok", "ok"]


def short_world(ctx):
    """Two processes that claim a world of three."""
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="rank 2") as info:
        init(ctx, world_size=3)
    assert time.monotonic() - t0 < TIMEOUT_S + 10
    return str(info.value)


def test_wrong_world_size():
    for msg in run_ranks(short_world, 2, timeout_s=60):
        assert "MEP_ERR_TIMEOUT" in msg and "group of 3" in msg, msg


def bad_options(ctx):
    import mep
    with pytest.raises(ValueError, match="int32"):
        mep.BackendOptions(active_ranks=torch.zeros(2))
    with pytest.raises(ValueError, match="max_size"):
        mep.BackendOptions(max_size=0)
    with pytest.raises(TypeError, match="mep.BackendOptions"):
        init(ctx, pg_options={"active_ranks": None})
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match="active_ranks has 1 entries"):
        init(ctx, store=dist.PrefixStore("again", ctx.store),
             pg_options=mep.BackendOptions(active_ranks=torch.zeros(1, dtype=torch.int32)))
    return "ok"


def test_bad_options():
    assert run_ranks(bad_options, 2, timeout_s=60) == ["ok", "ok"]


def boom(ctx):
    raise AssertionError(f"boom on rank {ctx.rank}")


def test_failing_rank_is_reported():
    """The harness itself: an assertion in a rank reaches the test."""
    with pytest.raises(RankFailed, match="boom on rank 1"):
        run_ranks(boom, 2, timeout_s=30)
