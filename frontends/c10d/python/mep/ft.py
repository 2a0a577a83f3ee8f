"""Fault tolerance of "mep" process groups: who is active, who waits to
join, admitting replacements and growing the group (docs/c10d.md)."""
import enum

import torch
import torch.distributed as dist

from . import _build_info, _ext


class PeerState(enum.IntEnum):
    """A rank slot as get_peer_state reports it.

    Its truth is Mooncake's peer state: "a process is connected for this
    rank", so ``if state:`` holds for ACTIVE and JOINING and not for DROPPED
    and EMPTY (the numbers are the core's: ACTIVE is 0 but true). Compare
    with the members (``state == PeerState.JOINING``) to tell the four
    apart; ``int(state)`` is the core's number.
    """
    ACTIVE = 0   # in the active set
    DROPPED = 1  # lost; no process waits to take its place
    JOINING = 2  # a process waits to join as this rank (recover_ranks admits it)
    EMPTY = 3    # a slot beyond the group that nobody asked for

    def __bool__(self) -> bool:
        return self in (PeerState.ACTIVE, PeerState.JOINING)


def _backend(pg=None, device: str = "cpu") -> "mep._C.MepBackend":
    """The "mep" backend of `pg`: a process group (None: the default one) or
    the backend object itself, as ``pg._get_backend(torch.device("cpu"))``
    returns it."""
    _C = _ext.load()
    if isinstance(pg, _C.MepBackend):
        return pg
    if isinstance(pg, torch._C._distributed_c10d.Backend):
        raise ValueError(f"mep: the backend object is a {type(pg).__name__}, "
                         "not the 'mep' backend")
    group = pg if pg is not None else dist.group.WORLD
    if group is None:
        raise RuntimeError("mep: no process group (call init_process_group first)")
    backend = group._get_backend(torch.device(device))
    if not isinstance(backend, _C.MepBackend):
        raise ValueError(f"mep: the process group uses {type(backend).__name__}, "
                         "not the 'mep' backend")
    return backend


def get_active_ranks(pg=None) -> torch.Tensor:
    """The group's active ranks as an int32 tensor (1 active, 0 lost), one
    entry per rank; the backend's live tensor (BackendOptions.active_ranks
    when given), refreshed now and after every operation."""
    return _backend(pg).active_ranks()


def get_peer_state(pg, ranks: list[int]) -> list[PeerState]:
    """The state of each of `ranks` (pg: a process group, None for the
    default one, or its "mep" backend object). Collective over the active
    ranks: every active rank calls it, and all get the same answer (a rank
    is JOINING only once every active rank sees its process). A state is
    true when a process is connected for the rank (ACTIVE, JOINING), as
    Mooncake's get_peer_state, so its recovery recipe runs unchanged::

        (peer_state,) = mep.get_peer_state(backend, [r])
        if peer_state:                  # a replacement waits (or r is back)
            mep.recover_ranks(backend, [r])
    """
    return [PeerState(s) for s in _backend(pg).peer_state(list(ranks))]


def recover_ranks(pg, ranks: list[int]) -> None:
    """Admits the joining processes of `ranks` (each JOINING): they become
    active, and their init_process_group returns. pg: a process group, None
    for the default one, or its "mep" backend object. Collective over the
    active ranks, with the same list everywhere; waits for running
    operations first."""
    _backend(pg).recover_ranks(list(ranks))


def extend_group_size_to(pg, size: int) -> None:
    """After recover_ranks admitted ranks beyond the group's size, makes the
    backend's collectives span `size` ranks (<= max_size). The ProcessGroup's
    own size() stays what it was created with."""
    _backend(pg).extend_group_size_to(int(size))


def get_dropped_ranks(pg=None) -> list[int]:
    """The ranks the latest degraded collective dropped (it succeeded over
    the survivors), in increasing order; [] if none was degraded yet."""
    return list(_backend(pg).dropped_ranks())


def cuda_path(pg=None) -> str:
    """Which path the group's collectives on CUDA tensors take: "kernel"
    (GPUs of one host reaching each other: kernels read and write the
    peers' memory; all_reduce may be captured in a CUDA graph) or "staged"
    (through pinned host memory); "" when this build or libmep has no CUDA.
    Collective: every rank of the group calls it (the first call sets the
    kernel path up)."""
    return _backend(pg, "cuda" if _build_info.C10D_CUDA else "cpu").cuda_path()
