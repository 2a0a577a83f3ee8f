"""Inputs every rank regenerates for every rank, and what dispatch and
combine must give, computed in one process with plain torch (no mep): the
independent reference of the mep.ep tests and of examples/moe."""
import hashlib

import torch


def inputs(case, rank, n, hidden, experts, topk):
    """x [n, hidden] bf16, topk_idx [n, topk] int64 (distinct experts, some
    -1, one token with none), topk_weights [n, topk] float32."""
    seed = hashlib.sha256(f"{case}/{rank}".encode()).digest()[:7]
    g = torch.Generator().manual_seed(int.from_bytes(seed, "little"))
    # Rows of very different magnitudes: FP8 scales per 128-group matter.
    mag = torch.exp2(torch.randint(-6, 7, (n, 1), generator=g).float())
    x = (torch.randn(n, hidden, generator=g) * mag).to(torch.bfloat16)
    idx = torch.empty(n, topk, dtype=torch.int64)
    for t in range(n):
        idx[t] = torch.randperm(experts, generator=g)[:topk]
    idx[torch.rand(n, topk, generator=g) < 0.15] = -1
    if n > 2:
        idx[n // 2] = -1
    w = torch.rand(n, topk, generator=g)
    return x, idx, w


def expert_fn(e, v):
    """What expert e does to its rows (elementwise, so a row's result does
    not depend on where it sits): a different affine map per expert."""
    return (v.float() * (1.0 + 0.25 * e) - 0.5 * e).to(torch.bfloat16)


def dispatch_sets(all_idx, expert):
    """{source rank: sorted token indices} of the tokens routed to `expert`."""
    return {src: sorted(int(t) for t in (idx == expert).any(1).nonzero().flatten())
            for src, idx in enumerate(all_idx)}


def combine(x, idx, w, active_experts):
    """out[t] = sum_k w[t,k] * expert_fn(idx[t,k], x[t]) over experts in
    active_experts, summed in float, rounded to bf16 once."""
    out = torch.zeros(x.shape, dtype=torch.float32)
    for t in range(x.shape[0]):
        for k in range(idx.shape[1]):
            e = int(idx[t, k])
            if e >= 0 and e in active_experts:
                out[t] += w[t, k] * expert_fn(e, x[t:t + 1])[0].float()
    return out.to(torch.bfloat16)


def fp8_scale(x, round_scale):
    """The per-(token, 128-group) scales of ep.h: max(amax, 1e-4) / 448,
    rounded up to a power of two with round_scale. x [n, H] -> [n, H/128]."""
    amax = x.float().abs().view(x.shape[0], -1, 128).amax(-1)
    s = torch.clamp(amax, min=1e-4) / 448.0
    if round_scale:
        s = torch.exp2(torch.ceil(torch.log2(s)))
    return s


def fp8_bound(x, scale):
    """The largest |dequantized - x| e4m3 rounding allows, per element:
    half a step of 3 mantissa bits (1/16 relative) for normal values, half
    the subnormal step (2^-10 of the scale) below them."""
    s = scale.repeat_interleave(128, dim=-1)
    return x.float().abs() / 16 + s * 2.0 ** -9
