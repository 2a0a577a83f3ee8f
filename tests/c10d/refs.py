"""Inputs every rank can regenerate for every other rank, and the results
the collectives must give, computed locally from them (independently of any
backend), plus the comparison tolerances per dtype."""
import hashlib

import torch
import torch.distributed as dist

R = dist.ReduceOp

TOL = {  # (rtol, atol): float16/bfloat16 sums round differently per backend
    torch.float16: (1e-2, 2e-2),
    torch.bfloat16: (2e-2, 1e-1),
    torch.float32: (1e-5, 1e-5),
    torch.float64: (1e-12, 1e-12),
    torch.complex64: (1e-5, 1e-5),
}


def make(case: str, rank: int, shape, dtype, op=None) -> torch.Tensor:
    """Random tensor of a case and rank, the same wherever it is made."""
    seed = int.from_bytes(hashlib.sha256(f"{case}/{rank}".encode()).digest()[:7], "little")
    g = torch.Generator().manual_seed(seed)
    prod = op == R.PRODUCT
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point or dtype.is_complex:
        real = torch.float64 if dtype == torch.complex128 else torch.float32
        if dtype.is_complex:
            x = torch.rand(tuple(shape) + (2,), generator=g, dtype=real) * 2 - 1
            return torch.view_as_complex(x).to(dtype)
        x = torch.rand(shape, generator=g, dtype=torch.float64)
        return (x + 0.5 if prod else x * 2 - 1).to(dtype)
    lo, hi = (0, 4) if dtype == torch.uint8 else (-3, 4)
    if prod:
        lo, hi = (1, 3) if dtype == torch.uint8 else (-2, 3)
    return torch.randint(lo, hi, shape, generator=g).to(dtype)


def reduce(tensors: list, op) -> torch.Tensor:
    """The reduction of the tensors in rank order, in a wide type."""
    dtype = tensors[0].dtype
    if dtype == torch.bool:
        x = torch.stack(tensors)
        return (x.any(0) if op in (R.SUM, R.MAX) else x.all(0))
    wide = (torch.complex128 if dtype.is_complex else
            torch.float64 if dtype.is_floating_point else torch.int64)
    x = torch.stack([t.to(wide) for t in tensors])
    if op == R.SUM:
        out = x.sum(0)
    elif op == R.PRODUCT:
        out = x.prod(0)
    elif op == R.MIN:
        out = x.min(0).values
    elif op == R.MAX:
        out = x.max(0).values
    elif op == R.AVG:
        out = (x.sum(0) / len(tensors) if dtype.is_floating_point or dtype.is_complex
               else torch.div(x.sum(0), len(tensors), rounding_mode="trunc"))
    else:
        raise ValueError(op)
    return out.to(dtype)


def assert_same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Exact for integers and bool; dtype tolerances for floats."""
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    rtol, atol = TOL.get(got.dtype, (0, 0))
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol, equal_nan=True,
                               msg=lambda m: f"{what}: {m}")
