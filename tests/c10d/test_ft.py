"""Fault tolerance through the c10d API: a rank exits after the first
all_reduce, or is SIGKILLed in the middle of one; the survivors' next
all_reduce returns within the timeout over the survivors, the active ranks
show the loss, a replacement joins with is_extension=True, the survivors
poll get_peer_state and call recover_ranks, and a full-group all_reduce is
right again. Mooncake's recovery recipe, run as Mooncake's users write it
(`import mep as ep`, the backend object, the truth of a peer state). A
group that grows beyond its initial size. A rank that forked a child and
died (its loss must not wait for the child), and forks while collectives
run. A group destroyed at once after a death while its store does not
answer."""
import ctypes
import datetime
import os
import signal
import time

import pytest
import torch
import torch.distributed as dist

from harness import Ranks, run_ranks

TIMEOUT_S = 20  # the process group's timeout: the core's deadline
BIG = 1 << 20   # elements of the all_reduces a rank is killed among


def full(world, ranks, n=64):
    """What an all_reduce of torch.full((n,), rank + 1) gives over `ranks`."""
    return torch.full((n,), float(sum(r + 1 for r in ranks)))


def init(ctx, **opts):
    import mep
    dist.init_process_group("mep", store=ctx.store, rank=ctx.rank, world_size=ctx.world,
                            timeout=datetime.timedelta(seconds=TIMEOUT_S),
                            pg_options=mep.BackendOptions(**opts))
    return mep


def member(ctx, victim, mode):
    act = torch.zeros(ctx.world, dtype=torch.int32)
    mep = init(ctx, active_ranks=act)
    everyone = range(ctx.world)
    survivors = [r for r in everyone if r != victim]
    x = torch.full((64,), float(ctx.rank + 1))
    dist.all_reduce(x)
    assert torch.equal(x, full(ctx.world, everyone)) and act.tolist() == [1] * ctx.world
    if mode == "exit" and ctx.rank == victim:
        os._exit(0)
    if mode == "kill":
        # Large all_reduces back to back until the victim is gone: the parent
        # kills it while they run, so it dies inside one.
        big = torch.empty(BIG)
        ctx.store.set(f"in_big/{ctx.rank}", "1")
        deadline = time.monotonic() + 60
        while act[victim] == 1:
            assert time.monotonic() < deadline, "the victim was never lost"
            big.fill_(ctx.rank + 1)
            dist.all_reduce(big)
            # Finished before the kill (all ranks), or over the survivors.
            assert big[0].item() in (full(ctx.world, everyone, 1).item(),
                                     full(ctx.world, survivors, 1).item())
            assert big[0].item() == big[-1].item()
        assert ctx.rank != victim
    # The survivors' next all_reduce: within the timeout, over the survivors.
    y = torch.full((64,), float(ctx.rank + 1))
    t0 = time.monotonic()
    dist.all_reduce(y)
    elapsed = time.monotonic() - t0
    assert elapsed < TIMEOUT_S, f"all_reduce after the failure took {elapsed:.1f} s"
    assert torch.equal(y, full(ctx.world, survivors)), y
    want = [int(r != victim) for r in everyone]
    assert act.tolist() == want, f"active_ranks option tensor {act.tolist()}"
    assert mep.get_active_ranks().tolist() == want
    assert mep.get_dropped_ranks() == [victim]
    ctx.store.set(f"lost_seen/{ctx.rank}", "1")
    # A replacement is started by the parent; admit it once all see it.
    pg = dist.group.WORLD
    deadline = time.monotonic() + 60
    while mep.get_peer_state(pg, [victim]) != [mep.PeerState.JOINING]:
        assert time.monotonic() < deadline, "the replacement never showed up"
        time.sleep(0.05)
    mep.recover_ranks(pg, [victim])
    return after_recovery(ctx, mep, act)


def after_recovery(ctx, mep, act=None):
    z = torch.full((64,), float(ctx.rank + 1))
    dist.all_reduce(z)
    assert torch.equal(z, full(ctx.world, range(ctx.world))), z
    assert mep.get_active_ranks().tolist() == [1] * ctx.world
    if act is not None:
        assert act.tolist() == [1] * ctx.world
    outs = [torch.empty(2) for _ in range(ctx.world)]
    dist.all_gather(outs, torch.full((2,), float(ctx.rank)))
    assert [o[0].item() for o in outs] == [float(r) for r in range(ctx.world)]
    dist.destroy_process_group()
    return "ok"


def replacement(ctx):
    mep = init(ctx, is_extension=True)
    return after_recovery(ctx, mep)


@pytest.mark.parametrize("world,victim,mode", [(3, 1, "exit"), (4, 0, "kill")])
def test_lose_and_replace_a_rank(world, victim, mode):
    ranks = Ranks(member, world, (victim, mode), timeout_s=120)
    try:
        if mode == "kill":
            ranks.store.wait([f"in_big/{r}" for r in range(world)],
                             datetime.timedelta(seconds=60))
            time.sleep(0.2)
            ranks.kill(victim)
        survivors = [r for r in range(world) if r != victim]
        ranks.store.wait([f"lost_seen/{r}" for r in survivors],
                         datetime.timedelta(seconds=60))
        ranks.start(replacement, world, ranks=[victim])
    except BaseException:
        ranks.close()
        raise
    assert set(ranks.wait().values()) == {"ok"}


def mooncake_member(ctx, victim):
    """Mooncake's recovery recipe, verbatim, with mep in place of its module."""
    import mep as ep
    act = torch.zeros(ctx.world, dtype=torch.int32)
    # Mooncake passes its options positionally.
    dist.init_process_group("mep", store=ctx.store, rank=ctx.rank, world_size=ctx.world,
                            timeout=datetime.timedelta(seconds=TIMEOUT_S),
                            pg_options=ep.BackendOptions(act))
    x = torch.full((64,), float(ctx.rank + 1))
    dist.all_reduce(x)
    assert torch.equal(x, full(ctx.world, range(ctx.world)))
    if ctx.rank == victim:
        os._exit(0)
    survivors = [r for r in range(ctx.world) if r != victim]
    y = torch.full((64,), float(ctx.rank + 1))
    dist.all_reduce(y)  # over the survivors: the loss shows in act
    assert torch.equal(y, full(ctx.world, survivors)), y
    assert act[victim] == 0, act
    r = victim
    states, deadline = [], time.monotonic() + 60
    while act[r] == 0:  # the survivors loop on the recipe until r is back
        assert time.monotonic() < deadline, f"rank {r} never came back: {states}"
        backend = dist.group.WORLD._get_backend(torch.device("cpu"))
        (peer_state,) = ep.get_peer_state(backend, [r])
        if peer_state:
            ep.recover_ranks(backend, [r])
        states.append(peer_state)
        if len(states) == 3:  # seen lost a few times: the parent starts r
            ctx.store.set(f"saw_dropped/{ctx.rank}", "1")
        time.sleep(0.02)
    # Lost and no replacement: false (recover_ranks would refuse it); a
    # replacement waiting: true; the four states stay apart.
    assert states[0] == ep.PeerState.DROPPED and not states[0], states
    assert states[-1] == ep.PeerState.JOINING and states[-1], states
    assert set(states) == {ep.PeerState.DROPPED, ep.PeerState.JOINING}, states
    (peer_state,) = ep.get_peer_state(dist.group.WORLD, [r])
    assert peer_state == ep.PeerState.ACTIVE and peer_state, peer_state
    return after_recovery(ctx, ep, act)


def mooncake_replacement(ctx):
    import mep as ep
    act = torch.ones(ctx.world, dtype=torch.int32)
    dist.init_process_group("mep", store=ctx.store, rank=ctx.rank, world_size=ctx.world,
                            timeout=datetime.timedelta(seconds=TIMEOUT_S),
                            pg_options=ep.BackendOptions(act, True))
    # The survivors' first call after recover_ranks: get_peer_state.
    (peer_state,) = ep.get_peer_state(dist.group.WORLD, [ctx.rank])
    assert peer_state == ep.PeerState.ACTIVE, peer_state
    return after_recovery(ctx, ep, act)


def test_mooncake_recovery_recipe():
    world, victim = 3, 1
    ranks = Ranks(mooncake_member, world, (victim,), timeout_s=120)
    try:
        survivors = [r for r in range(world) if r != victim]
        ranks.store.wait([f"saw_dropped/{r}" for r in survivors],
                         datetime.timedelta(seconds=60))
        ranks.start(mooncake_replacement, world, ranks=[victim])
    except BaseException:
        ranks.close()
        raise
    assert set(ranks.wait().values()) == {"ok"}


def test_peer_state_truth():
    """PeerState's truth is "a process is connected" (Mooncake's), its
    comparisons and numbers are the core's."""
    import mep
    S = mep.PeerState
    assert [bool(s) for s in S] == [True, False, True, False]
    assert [int(s) for s in S] == [0, 1, 2, 3]
    assert S.JOINING == 2 and S(2) is S.JOINING and S.ACTIVE == 0
    assert [S.JOINING] == [S(2)] and [S.DROPPED] != [S.JOINING]
    assert mep.BackendOptions(None, True).is_extension


def grow_member(ctx, max_size):
    mep = init(ctx, max_size=max_size)
    x = torch.full((8,), float(ctx.rank + 1))
    dist.all_reduce(x)
    assert torch.equal(x, full(ctx.world, range(ctx.world), 8))
    ctx.store.set(f"ready/{ctx.rank}", "1")
    pg = dist.group.WORLD
    new = list(range(ctx.world, max_size))
    deadline = time.monotonic() + 60
    while mep.get_peer_state(pg, new) != [mep.PeerState.JOINING] * len(new):
        assert time.monotonic() < deadline, "the new ranks never showed up"
        time.sleep(0.05)
    mep.recover_ranks(pg, new)
    # Before the backend is extended, size-dependent collectives refuse.
    with pytest.raises(ValueError, match="extend_group_size_to"):
        dist.all_gather([torch.empty(1) for _ in range(ctx.world)], torch.ones(1))
    mep.extend_group_size_to(pg, max_size)
    return grown(ctx, mep, max_size)


def grown(ctx, mep, size):
    z = torch.full((8,), float(ctx.rank + 1))
    dist.all_reduce(z)
    assert torch.equal(z, full(size, range(size), 8)), z
    outs = [torch.empty(3) for _ in range(size)]
    dist.all_gather(outs, torch.full((3,), float(ctx.rank)))
    assert [o[0].item() for o in outs] == [float(r) for r in range(size)]
    assert mep.get_active_ranks().tolist() == [1] * size
    # no rank leaves (a lost peer to the others) before all have looked
    dist.all_reduce(torch.ones(1))
    dist.destroy_process_group()
    return "ok"


def grow_joiner(ctx, max_size):
    mep = init(ctx, is_extension=True, max_size=max_size)
    return grown(ctx, mep, max_size)


def test_grow_group():
    world, max_size = 2, 3
    ranks = Ranks(grow_member, world, (max_size,), timeout_s=120)
    try:
        ranks.store.wait([f"ready/{r}" for r in range(world)], datetime.timedelta(seconds=60))
        ranks.start(grow_joiner, max_size, (max_size,), ranks=[2])
    except BaseException:
        ranks.close()
        raise
    assert set(ranks.wait().values()) == {"ok"}


def forking_member(ctx, victim, marker):
    """The victim forks a child that outlives it (as a DataLoader worker
    may), then dies; the survivors' next all_reduce must not wait for the
    child's end or the timeout."""
    init(ctx)
    x = torch.full((64,), float(ctx.rank + 1))
    dist.all_reduce(x)
    assert torch.equal(x, full(ctx.world, range(ctx.world)))
    if ctx.rank == victim:
        pid = os.fork()
        if pid == 0:  # lives until the survivors are done (30 s at most)
            end = time.monotonic() + 30
            while os.path.exists(marker) and time.monotonic() < end:
                time.sleep(0.05)
            os._exit(0)
        ctx.store.set("child", str(pid))
        os.kill(os.getpid(), signal.SIGKILL)
    child = int(ctx.store.get("child"))
    y = torch.full((64,), float(ctx.rank + 1))
    t0 = time.monotonic()
    dist.all_reduce(y)
    elapsed = time.monotonic() - t0
    os.kill(child, 0)  # still alive: it held copies of the victim's sockets
    survivors = [r for r in range(ctx.world) if r != victim]
    assert torch.equal(y, full(ctx.world, survivors)), y
    assert elapsed < TIMEOUT_S / 4, (
        f"all_reduce after the loss took {elapsed:.1f} s: the victim's forked "
        "child kept its connections up")
    dist.all_reduce(torch.ones(1))  # both survivors checked the child
    return "ok"


def test_lose_a_rank_that_forked(tmp_path):
    world, victim = 3, 1
    marker = tmp_path / "child-may-live"
    marker.touch()
    # The child, orphaned by the victim's death, is reparented here and
    # reaped below.
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    PR_SET_CHILD_SUBREAPER = 36
    assert prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    child = None
    try:
        ranks = Ranks(forking_member, world, (victim, str(marker)), timeout_s=90)
        try:
            got = ranks.wait(expect_dead=(victim,))
        finally:
            child = ranks.store.get("child") if ranks.store.check(["child"]) else None
    finally:
        marker.unlink()
        if child is not None:
            pid, deadline = int(child), time.monotonic() + 10
            while os.waitpid(pid, os.WNOHANG) == (0, 0):
                if time.monotonic() > deadline:
                    os.kill(pid, signal.SIGKILL)
                time.sleep(0.05)
        prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
    assert set(got.values()) == {"ok"}


def busy_forker(ctx, forks):
    """A thread runs all_reduces while the main thread forks again and
    again (DataLoader workers started mid-training): the fork handlers take
    the transports' locks, which must neither deadlock with the progress
    thread nor disturb the connections the parent keeps."""
    import threading
    init(ctx)
    n, errors, stop = 1 << 16, [], threading.Event()

    def reduce_loop():
        try:
            for i in range(1, 1000000):
                x = torch.full((n,), float(ctx.rank + i))
                dist.all_reduce(x)
                want = float(sum(r + i for r in range(ctx.world)))
                assert x[0].item() == want and x[-1].item() == want, (i, x[0])
                # every rank stops at the same call
                flag = torch.tensor([float(stop.is_set())])
                dist.all_reduce(flag, op=dist.ReduceOp.MAX)
                if flag.item():
                    return
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    t = threading.Thread(target=reduce_loop)
    t.start()
    for _ in range(forks):
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    stop.set()
    t.join(timeout=TIMEOUT_S)
    assert not t.is_alive(), "the all_reduce thread hangs"
    if errors:
        raise errors[0]
    dist.destroy_process_group()
    return "ok"


def test_fork_while_collectives_run():
    assert run_ranks(busy_forker, 3, 40, timeout_s=120) == ["ok"] * 3


def frozen_store_member(ctx, victim, marks):
    """Survives a death while the store does not answer, then destroys
    the group at once: the coordinator's claim, stuck in torch's store,
    is cancelled rather than waited for (torch's store timeout, 60 s)."""
    init(ctx)
    x = torch.full((64,), float(ctx.rank + 1))
    dist.all_reduce(x)
    assert torch.equal(x, full(ctx.world, range(ctx.world)))
    (marks / f"ready.{ctx.rank}").touch()
    deadline = time.monotonic() + 30
    while not (marks / "go").exists():
        assert time.monotonic() < deadline, "never told to go on"
        time.sleep(0.01)
    survivors = [r for r in range(ctx.world) if r != victim]
    x = torch.full((64,), float(ctx.rank + 1))
    dist.all_reduce(x)
    assert torch.equal(x, full(ctx.world, survivors)), x[:4]
    t0 = time.monotonic()
    dist.destroy_process_group()
    return time.monotonic() - t0


def test_destroy_with_the_store_frozen(tmp_path):
    """The store's host cut off (its process stopped: connections are not
    refused, nothing is answered), then a rank killed."""
    import subprocess
    import sys
    server = subprocess.Popen(
        [sys.executable, "-c",
         "import datetime, sys, time, torch.distributed as d\n"
         "s = d.TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False,"
         " timeout=datetime.timedelta(seconds=60))\n"
         "print(s.port, flush=True)\n"
         "time.sleep(600)\n"],
        stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        store = dist.TCPStore("127.0.0.1", port, is_master=False,
                              timeout=datetime.timedelta(seconds=60))
        world, victim = 3, 2
        ranks = Ranks(frozen_store_member, world, (victim, tmp_path),
                      timeout_s=60, store=store)
        try:
            deadline = time.monotonic() + 60
            while not all((tmp_path / f"ready.{r}").exists() for r in range(world)):
                assert time.monotonic() < deadline, "the ranks never got ready"
                time.sleep(0.01)
            server.send_signal(signal.SIGSTOP)
            ranks.kill(victim)
            (tmp_path / "go").touch()
        except BaseException:
            ranks.close()
            raise
        took = ranks.wait(expect_dead=(victim,))
    finally:
        server.kill()
        server.wait()
    print("destroy_process_group took", {r: f"{t:.3f} s" for r, t in took.items()})
    assert all(took[r] < 5 for r in took), took
