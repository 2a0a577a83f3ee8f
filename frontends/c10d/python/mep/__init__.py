"""mep's PyTorch distributed backend.

Importing this package registers the c10d backend ``"mep"`` for CPU and CUDA
tensors (CUDA tensors come with the CUDA build, ``mep.cuda_build``; a build
without it refuses them with a clear error), so ``torch.distributed.init_process_group("mep", ...)``,
``new_group(..., backend="mep")`` and ``torchrun`` scripts use it::

    import mep, torch.distributed as dist
    dist.init_process_group("mep", pg_options=mep.BackendOptions())

What importing runs (``import mep.ep`` runs it too: Python imports a
package before its subpackage): it imports torch, compares it with the torch
the extension ``mep._C`` was built against (``mep._build_info``) and
registers the backend. ``mep._C`` itself is loaded when the first "mep"
group is made, so ``import mep.ep`` never loads it. When the extension
cannot be used (built against another torch, or not built:
``mep.backend_problem()`` says why) the import still succeeds, so mep.ep
works; a different torch gives a RuntimeWarning at import, and making a
"mep" group raises RuntimeError with that reason instead of loading a
mismatched extension.

See docs/c10d.md for the options, the fault-tolerance helpers and the limits.
"""
import warnings

import torch.distributed as dist

from . import _build_info, _ext
from .ft import (PeerState, cuda_path, extend_group_size_to,
                 get_active_ranks, get_dropped_ranks, get_peer_state,
                 recover_ranks)
from .options import BackendOptions

__all__ = ["BackendOptions", "PeerState", "get_active_ranks", "get_peer_state",
           "recover_ranks", "extend_group_size_to", "get_dropped_ranks",
           "cuda_path", "cuda_build", "backend_problem"]
__version__ = _build_info.MEP_VERSION
cuda_build = _build_info.C10D_CUDA
backend_problem = _ext.problem

# torch calls the factory once per device type of a group ("cpu", then
# "cuda") and keeps the first backend for both (same backend type). One
# communicator serves both, so the second call of a group gets the backend
# the first made instead of a second rendezvous over the store.
_last_created = None


def _create_backend(dist_opts, backend_opts):
    """The factory torch calls (extended API) for every group using "mep"."""
    _C = _ext.load()
    opts = BackendOptions() if backend_opts is None else backend_opts
    if not isinstance(opts, BackendOptions):
        raise TypeError("pg_options of the 'mep' backend must be a "
                        f"mep.BackendOptions, not {type(opts).__name__}")
    if opts.active_ranks is not None and opts.active_ranks.numel() < dist_opts.group_size:
        raise ValueError(f"mep.BackendOptions.active_ranks has {opts.active_ranks.numel()} "
                         f"entries, the group has {dist_opts.group_size} ranks")
    global _last_created
    # The group's ProcessGroup object tells the calls of one creation apart
    # from a later group of the same name (torch without it: no sharing).
    pg = getattr(dist_opts, "process_group", None)
    key = (dist_opts.group_rank, dist_opts.group_size, id(backend_opts))
    last, _last_created = _last_created, None
    if pg is not None and last is not None and last[0] is pg and last[1] == key:
        return last[2]
    backend = _C.MepBackend(dist_opts.store, dist_opts.group_rank, dist_opts.group_size,
                            dist_opts.timeout.total_seconds(),
                            active_ranks=opts.active_ranks,
                            is_extension=opts.is_extension,
                            max_size=opts.max_size or 0)
    if pg is not None:
        _last_created = (pg, key, backend)
    return backend


_problem = _ext.problem()
if _problem and _build_info.C10D_BUILT:
    # Built, but not for this torch: loading it could crash the process.
    warnings.warn(f"mep: the 'mep' backend is disabled: {_problem}", RuntimeWarning,
                  stacklevel=2)
try:
    dist.Backend.register_backend("mep", _create_backend, extended_api=True,
                                  devices=["cpu", "cuda"])
except TypeError:
    # A torch without the extended API, which the backend needs: mep.ep
    # still works with it; the backend stays unregistered.
    if not _problem:
        raise
