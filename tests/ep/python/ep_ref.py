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


def fp8_cast(x, round_scale):
    """DeepEP's per-(token, 128-group) FP8 cast, written from its formula,
    in float32 torch arithmetic: amax floored at 1e-4; scale_inv = amax *
    (1/448) and scale = 448 / amax, or with round_scale the powers of two
    2^e, 2^-e with e = ceil(log2(amax * (1/448))) read off the float's
    bits; codes = e4m3(x * scale) (torch's conversion: nearest, ties to
    even). x [n, H] bf16 -> (codes float8_e4m3fn [n, H], scale_inv [n, H/128])."""
    n = x.shape[0]
    xf = x.float().view(n, -1, 128)
    amax = torch.clamp(xf.abs().amax(-1), min=1e-4)
    inv448 = torch.tensor(1.0 / 448.0, dtype=torch.float32)
    if not round_scale:
        inv = amax * inv448
        scale = torch.tensor(448.0, dtype=torch.float32) / amax
    else:
        bits = (amax * inv448).view(torch.int32)
        e = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(torch.int32)
        scale = ((127 - e) << 23).view(torch.float32)
        inv = ((127 + e) << 23).view(torch.float32)
    codes = (xf * scale.unsqueeze(-1)).view(n, -1).to(torch.float8_e4m3fn)
    return codes, inv


def fp8_bound(x, scale):
    """The largest |dequantized - x| e4m3 rounding allows, per element:
    half a step of 3 mantissa bits (1/16 relative) for normal values, half
    the subnormal step (2^-10 of the scale) below them."""
    s = scale.repeat_interleave(128, dim=-1)
    return x.float().abs() / 16 + s * 2.0 ** -9
