"""The c10d backend over verbs, in a form the emulated VM can afford.

tests/c10d starts each rank as a fresh interpreter (multiprocessing
"spawn"), and under the VM's software emulation importing torch takes a
minute or two per process, past those tests' deadlines. Here torch and mep
are imported once and the ranks are forked from this process, before any
backend thread exists. Each rank runs the collectives and point-to-point of
the backend on odd sizes and compares every result with a reference
computed here from the same seeded inputs (not by mep, not by gloo).

usage: c10d_verbs.py WORLD TIMEOUT_S     (with MEP_TRANSPORTS=verbs)
Exits 0 when every rank checked every result, 1 otherwise, 77 (skip) when
torch or the built backend is missing.
"""
import datetime
import os
import signal
import socket
import sys
import time
import traceback

SKIP = 77


def inputs(rank, n, salt):
    """Rank `rank`'s deterministic input of n float64 values."""
    import torch
    g = torch.Generator().manual_seed(1000 * salt + rank)
    return torch.randint(-1000, 1000, (n,), generator=g, dtype=torch.int64).double()


def check(what, got, want):
    import torch
    if not torch.equal(got, want):
        bad = (got != want).nonzero()[0].item()
        raise AssertionError(f"{what}: element {bad} is {got[bad].item()}, "
                             f"want {want[bad].item()}")


def run_rank(rank, world, port, timeout_s):
    import torch
    import torch.distributed as dist
    import mep  # noqa: F401  registers the backend
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
    dist.init_process_group("mep", store=store, rank=rank, world_size=world,
                            timeout=timeout)
    n = 1001
    # all_reduce
    t = inputs(rank, n, 1)
    dist.all_reduce(t)
    check("all_reduce", t, sum(inputs(r, n, 1) for r in range(world)))
    # broadcast from the last rank
    t = inputs(rank, n, 2)
    dist.broadcast(t, src=world - 1)
    check("broadcast", t, inputs(world - 1, n, 2))
    # all_gather
    out = [torch.empty(n, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(out, inputs(rank, n, 3))
    for r in range(world):
        check(f"all_gather block {r}", out[r], inputs(r, n, 3))
    # reduce_scatter_tensor: rank r gets the sum of everyone's block r
    full = inputs(rank, n * world, 4)
    mine = torch.empty(n, dtype=torch.float64)
    dist.reduce_scatter_tensor(mine, full)
    want = sum(inputs(r, n * world, 4) for r in range(world))[rank * n:(rank + 1) * n]
    check("reduce_scatter_tensor", mine, want)
    # all_to_all_single with uneven splits: r sends s+1+r elements to s
    splits_out = [s + 1 + rank for s in range(world)]
    splits_in = [rank + 1 + s for s in range(world)]
    send = inputs(rank, sum(splits_out), 5)
    recv = torch.empty(sum(splits_in), dtype=torch.float64)
    dist.all_to_all_single(recv, send, splits_in, splits_out)
    at = 0
    for s in range(world):
        theirs = inputs(s, sum(x + 1 + s for x in range(world)), 5)
        off = sum(x + 1 + s for x in range(rank))
        check(f"all_to_all_single from {s}", recv[at:at + splits_in[s]],
              theirs[off:off + splits_in[s]])
        at += splits_in[s]
    # send / recv around the ring
    t = inputs(rank, n + rank, 6)
    got = torch.empty(n + (rank - 1) % world, dtype=torch.float64)
    if rank % 2 == 0:
        dist.send(t, (rank + 1) % world)
        dist.recv(got, (rank - 1) % world)
    else:
        dist.recv(got, (rank - 1) % world)
        dist.send(t, (rank + 1) % world)
    check("recv", got, inputs((rank - 1) % world, n + (rank - 1) % world, 6))
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main():
    world, timeout_s = int(sys.argv[1]), int(sys.argv[2])
    try:
        import torch  # noqa: F401
        import torch.distributed as dist
        import mep  # noqa: F401
    except ImportError as e:
        print(f"skip: torch or the mep backend does not import: {e}")
        return SKIP
    port = free_port()
    pids = {}
    for rank in range(world):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                run_rank(rank, world, port, timeout_s)
                print(f"rank {rank}: every result checked", flush=True)
            except BaseException:
                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        pids[pid] = rank
    # after the forks: the store's server thread stays in this process
    store = dist.TCPStore("127.0.0.1", port, is_master=True,
                          timeout=datetime.timedelta(seconds=timeout_s))
    deadline = time.monotonic() + timeout_s + 30
    failed = 0
    while pids:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            if time.monotonic() > deadline:
                for p, r in pids.items():
                    print(f"rank {r}: killed at the deadline")
                    os.kill(p, signal.SIGKILL)
                    os.waitpid(p, 0)
                return 1
            time.sleep(0.2)
            continue
        rank = pids.pop(pid)
        if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
            print(f"rank {rank}: failed (status {status:#x})")
            failed += 1
    del store
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
