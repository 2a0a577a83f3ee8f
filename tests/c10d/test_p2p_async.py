"""Point-to-point, the asynchronous Work API (is_completed, wait with a
timeout, get_future completing without wait), subgroups, the stores torch
hands a backend (TCPStore, FileStore, PrefixStore) and a torchrun launch."""
import datetime
import os
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

from harness import run_ranks
from refs import make

HERE = os.path.dirname(os.path.abspath(__file__))


def init(ctx, store=None):
    import mep  # noqa: F401
    dist.init_process_group("mep", store=store or ctx.store, rank=ctx.rank,
                            world_size=ctx.world, timeout=ctx.timeout)


def p2p_ring(ctx):
    """Each rank sends to the next and receives from the previous, for
    several sizes, dtypes, tags and a non-contiguous tensor; then a batch."""
    init(ctx)
    nxt, prv = (ctx.rank + 1) % ctx.world, (ctx.rank - 1) % ctx.world
    n_checked = 0
    for n, dt in ((0, torch.float32), (1, torch.int64), (7, torch.float16),
                  (100003, torch.float32), (3 << 20, torch.uint8)):
        name = f"p2p/{n}/{dt}"
        mine, theirs = make(name, ctx.rank, (n,), dt), make(name, prv, (n,), dt)
        got = torch.empty(n, dtype=dt)
        # Even ranks send first, odd ranks receive first: blocking calls
        # that cannot all wait on each other.
        if ctx.rank % 2 == 0:
            dist.send(mine, nxt, tag=n % 5)
            dist.recv(got, prv, tag=n % 5)
        else:
            dist.recv(got, prv, tag=n % 5)
            dist.send(mine, nxt, tag=n % 5)
        assert torch.equal(got, theirs), name
        n_checked += 1
    # Two tags in flight between the same pair, received in the other order.
    a, b = make("tagA", ctx.rank, (5,), torch.float64), make("tagB", ctx.rank, (9,), torch.float64)
    sends = [dist.isend(a, nxt, tag=1), dist.isend(b, nxt, tag=2)]
    gb, ga = torch.empty(9, dtype=torch.float64), torch.empty(5, dtype=torch.float64)
    rb, ra = dist.irecv(gb, prv, tag=2), dist.irecv(ga, prv, tag=1)
    for w in sends + [rb, ra]:
        w.wait()
    assert torch.equal(ga, make("tagA", prv, (5,), torch.float64))
    assert torch.equal(gb, make("tagB", prv, (9,), torch.float64))
    # Non-contiguous send and receive buffers.
    src = make("nc", ctx.rank, (4, 6), torch.float32)[:, ::3]
    dst = torch.zeros(6, 4).t()[:, :2]
    ops = [dist.P2POp(dist.isend, src, nxt), dist.P2POp(dist.irecv, dst, prv)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    assert torch.equal(dst, make("nc", prv, (4, 6), torch.float32)[:, ::3])
    dist.destroy_process_group()
    return n_checked + 2


@pytest.mark.parametrize("world", [2, 3])
def test_send_recv(world):
    assert run_ranks(p2p_ring, world, timeout_s=90) == [7] * world


def work_api(ctx):
    init(ctx)
    world = ctx.world
    # A future completes by itself, with the result tensors as its value.
    x = make("fut", ctx.rank, (1000,), torch.float32)
    want = sum(make("fut", r, (1000,), torch.float32) for r in range(world))
    w = dist.all_reduce(x, async_op=True)
    fut = w.get_future()
    doubled = fut.then(lambda f: f.value()[0] * 2)
    deadline = time.monotonic() + 20
    while not fut.done() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert fut.done(), "the future did not complete without wait()"
    torch.testing.assert_close(fut.value()[0], want)
    torch.testing.assert_close(doubled.wait(), want * 2)
    assert w.is_completed() and w.is_success()
    assert w.wait()
    # is_completed and wait(timeout) on a receive whose sender is late.
    dist.barrier()
    if ctx.rank == 1:
        buf = torch.empty(3)
        r = dist.irecv(buf, 0, tag=7)
        assert not r.is_completed()
        with pytest.raises(RuntimeError, match="Timed out waiting 200ms: .*still running"):
            r.wait(timeout=datetime.timedelta(milliseconds=200))
        ctx.store.set("go", "1")
        assert r.wait(timeout=datetime.timedelta(seconds=20))
        assert r.is_completed()
        assert torch.equal(buf, torch.tensor([1.0, 2.0, 3.0]))
    elif ctx.rank == 0:
        ctx.store.wait(["go"])
        dist.send(torch.tensor([1.0, 2.0, 3.0]), 1, tag=7)
    # Many collectives in flight at once finish in order, right.
    ts = [torch.full((11,), float(ctx.rank + i)) for i in range(20)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    futs = [w.get_future() for w in works[::2]]
    for w in works:
        w.wait()
    for f in futs:
        f.wait()
    for i, t in enumerate(ts):
        assert torch.equal(t, torch.full((11,), float(sum(range(world)) + world * i)))
    dist.destroy_process_group()
    return True


def test_work_and_future():
    assert run_ranks(work_api, 3, timeout_s=90) == [True] * 3


def subgroups(ctx):
    """A group of ranks 0 and 2 beside the world; rank 1 is not a member."""
    init(ctx)
    sub = dist.new_group([0, 2], backend="mep")
    other = dist.new_group([1, 2], backend="mep")
    x = torch.full((5,), float(ctx.rank))
    if ctx.rank in (0, 2):
        dist.all_reduce(x, group=sub)
        assert torch.equal(x, torch.full((5,), 2.0))
        assert dist.get_world_size(sub) == 2
    if ctx.rank in (1, 2):
        y = torch.full((3,), float(ctx.rank * 10))
        dist.broadcast(y, group_src=0, group=other)  # rank 1 is its root
        assert torch.equal(y, torch.full((3,), 10.0))
    z = torch.ones(4)
    dist.all_reduce(z)
    assert torch.equal(z, torch.full((4,), 3.0))
    dist.destroy_process_group()
    return True


def test_subgroups():
    assert run_ranks(subgroups, 3, timeout_s=90) == [True] * 3


def other_stores(ctx, path):
    """Rendezvous through a FileStore, then through a PrefixStore of the
    test's TCPStore."""
    import mep  # noqa: F401
    fs = dist.FileStore(path, ctx.world)
    dist.init_process_group("mep", store=fs, rank=ctx.rank, world_size=ctx.world,
                            timeout=ctx.timeout)
    x = torch.full((3,), float(ctx.rank + 1))
    dist.all_reduce(x)
    dist.destroy_process_group()
    ps = dist.PrefixStore("job-7", ctx.store)
    dist.init_process_group("mep", store=ps, rank=ctx.rank, world_size=ctx.world,
                            timeout=ctx.timeout)
    y = torch.full((2,), float(ctx.rank + 1))
    dist.all_reduce(y, op=dist.ReduceOp.MAX)
    dist.destroy_process_group()
    return x.tolist(), y.tolist()


def test_file_and_prefix_store(tmp_path):
    res = run_ranks(other_stores, 2, str(tmp_path / "filestore"), timeout_s=90)
    assert res == [([3.0] * 3, [2.0] * 2)] * 2


def test_torchrun():
    """The backend under torchrun (env:// rendezvous on a free port), in a
    script that exits without destroy_process_group."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", "2", os.path.join(HERE, "torchrun_script.py")]
    env = dict(os.environ, OMP_NUM_THREADS="1", MEP_TCP_IFNAME="lo")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    for r in range(2):
        assert f"rank {r} of 2: all_reduce ok" in p.stdout, p.stdout + p.stderr


def ddp_step(ctx):
    """DistributedDataParallel (its parameter broadcast, its bucketed
    all_reduce through futures) gives the same step on mep as on gloo."""
    init(ctx)
    gloo = dist.new_group(backend="gloo")
    params = []
    for pg in (dist.group.WORLD, gloo):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
        with torch.no_grad():  # ranks start apart; DDP broadcasts rank 0's
            for p in model.parameters():
                p.add_(ctx.rank)
        ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=pg)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for step in range(2):
            opt.zero_grad()
            ddp(make(f"ddp/{step}", ctx.rank, (4, 8), torch.float32)).square().sum().backward()
            opt.step()
        params.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*params):
        torch.testing.assert_close(a, b)
    # A leaf that requires grad, not contiguous: reduced in place all the same.
    leaf = torch.full((3, 5), float(ctx.rank + 1)).t().requires_grad_()
    dist.all_reduce(leaf)
    assert torch.equal(leaf.detach(), torch.full((5, 3), float(sum(range(1, ctx.world + 1)))))
    dist.destroy_process_group()
    return [p.sum().item() for p in params[0]]


def test_ddp_matches_gloo():
    res = run_ranks(ddp_step, 2, timeout_s=90)
    assert res[0] == res[1], "ranks ended with different parameters"

