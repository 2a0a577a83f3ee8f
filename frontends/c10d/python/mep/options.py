"""mep.BackendOptions: what a process group of the "mep" backend is made with."""
import torch


class BackendOptions:
    """Options of the "mep" backend, given as ``pg_options`` to
    ``init_process_group`` or ``new_group``. Positional as Mooncake's
    options (``BackendOptions(active_ranks)``, ``BackendOptions(active_ranks,
    True)`` for a replacement) or by name.

    active_ranks: an int32 CPU tensor with at least the group's size entries
        (``max_size`` entries to also see ranks the group grows to). The
        backend writes 1 for active and 0 for lost ranks into it after every
        operation, so a training loop can read it without a call. None: the
        backend keeps its own (``mep.get_active_ranks``).
    is_extension: this process joins a running group as ``rank``: either in
        place of a rank the group lost, or (rank >= the group's size, up to
        max_size) to grow it. ``init_process_group`` returns once the active
        ranks called ``mep.recover_ranks`` with that rank.
    max_size: the number of ranks the group may grow to; the same on every
        rank, the extensions included. None: the group's size (no growth).
    """

    def __init__(self, active_ranks: torch.Tensor | None = None,
                 is_extension: bool = False, max_size: int | None = None):
        if active_ranks is not None:
            if not isinstance(active_ranks, torch.Tensor):
                raise TypeError("active_ranks must be a torch.Tensor, not "
                                f"{type(active_ranks).__name__}")
            if (active_ranks.dtype != torch.int32 or active_ranks.device.type != "cpu"
                    or active_ranks.dim() != 1 or not active_ranks.is_contiguous()):
                raise ValueError("active_ranks must be a contiguous 1-D int32 CPU "
                                 f"tensor, got {active_ranks.dtype} of shape "
                                 f"{tuple(active_ranks.shape)} on {active_ranks.device}")
        if max_size is not None and (not isinstance(max_size, int) or max_size < 1):
            raise ValueError(f"max_size must be a positive int or None, got {max_size!r}")
        self.active_ranks = active_ranks
        self.is_extension = bool(is_extension)
        self.max_size = max_size

    def __repr__(self) -> str:
        return (f"mep.BackendOptions(active_ranks={self.active_ranks!r}, "
                f"is_extension={self.is_extension}, max_size={self.max_size})")
