"""Run by test_p2p_async.test_torchrun under torchrun: the backend from a
plain env:// init_process_group, and a process that exits without
destroy_process_group (the backend is torn down at interpreter exit)."""
import torch
import torch.distributed as dist

import mep  # noqa: F401

dist.init_process_group("mep")
rank, world = dist.get_rank(), dist.get_world_size()
x = torch.full((1000,), float(rank + 1))
dist.all_reduce(x)
assert torch.equal(x, torch.full((1000,), float(world * (world + 1) // 2))), x
assert dist.get_backend() == "mep"
print(f"rank {rank} of {world}: all_reduce ok", flush=True)
