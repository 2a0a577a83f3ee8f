#!/usr/bin/env python3
"""A small Mixture-of-Experts layer over mep.ep, checked against the dense
single-process result.

Each rank holds num_experts / world experts (a two-matmul FFN each) and a
batch of tokens. The layer routes every token (router linear -> softmax ->
top-k, weights renormalised), sends it to the ranks of its experts with
mep.ep.Buffer.low_latency_dispatch, runs the local experts on what arrived,
and brings the outputs back, weighted, with low_latency_combine. Every rank
also computes the same layer densely, in one process, from the same seeded
weights and inputs, and compares: it prints OK or FAIL with the largest
error, and the program exits nonzero when a rank fails.

Run it under torchrun:
    torchrun --standalone --nproc-per-node 4 examples/moe/moe.py --device cpu
or, without torchrun, let it start the ranks itself:
    python3 examples/moe/moe.py --nproc 4
(CUDA: --device cuda, one GPU per rank, or several ranks sharing GPUs.)
The python must import mep: pip install it (docs/install.md; scripts/setup.sh
installs it into .venv), or set PYTHONPATH to the build tree's package.
"""
import argparse
import datetime
import os
import socket
import subprocess
import sys
import time


def parse(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="where tensors live: cpu runs mep.ep's CPU path (default cpu)")
    ap.add_argument("--tokens", type=int, default=24,
                    help="tokens per rank at most; ranks get different counts (default 24)")
    ap.add_argument("--hidden", type=int, default=256,
                    help="hidden size, a multiple of 128 (default 256)")
    ap.add_argument("--ffn", type=int, default=384, help="expert FFN width (default 384)")
    ap.add_argument("--experts-per-rank", type=int, default=2,
                    help="experts each rank holds (default 2)")
    ap.add_argument("--topk", type=int, default=2, help="experts per token (default 2)")
    ap.add_argument("--fp8", action="store_true",
                    help="dispatch in FP8 (e4m3 with per-128-channel scales)")
    ap.add_argument("--iters", type=int, default=3,
                    help="layer calls, each on new tokens (default 3)")
    ap.add_argument("--seed", type=int, default=1234, help="seed of weights and inputs")
    ap.add_argument("--backend", default=None,
                    help="torch.distributed backend for the setup: gloo (default on cpu, "
                         "and on cuda when ranks share a GPU, which nccl refuses), nccl "
                         "(default on cuda) or mep")
    ap.add_argument("--nproc", type=int, default=4,
                    help="without torchrun: how many ranks to start (default 4)")
    ap.add_argument("--timeout", type=float, default=300,
                    help="seconds before started ranks are killed (default 300)")
    args = ap.parse_args(argv)
    if args.hidden <= 0 or args.hidden % 128:
        ap.error("--hidden must be a positive multiple of 128")
    if args.tokens < 1 or args.experts_per_rank < 1 or args.topk < 1 or args.iters < 1:
        ap.error("--tokens, --experts-per-rank, --topk and --iters must be at least 1")
    return args


# ------------------------------------------------------------------ layer

class MoE:
    """Router and every expert's weights, the same on every rank (seeded);
    a rank uses only its own experts in the distributed layer."""

    def __init__(self, hidden, ffn, experts, topk, seed, device):
        import torch
        g = torch.Generator().manual_seed(seed)
        self.topk = topk
        self.router = (torch.randn(hidden, experts, generator=g) / hidden ** 0.5).to(device)
        self.w1 = (torch.randn(experts, hidden, ffn, generator=g) / hidden ** 0.5).to(device)
        self.w2 = (torch.randn(experts, ffn, hidden, generator=g) / ffn ** 0.5).to(device)

    def route(self, x):
        """topk_idx [n, k] int64 and renormalised weights [n, k] float32."""
        import torch
        probs = torch.softmax(x.float() @ self.router, dim=-1)
        w, idx = torch.topk(probs, self.topk, dim=-1)
        return idx, w / w.sum(-1, keepdim=True)

    def expert(self, e, rows):
        """Expert e on rows [m, hidden]: bf16 in, bf16 out, float inside."""
        import torch
        h = torch.nn.functional.silu(rows.float() @ self.w1[e])
        return (h @ self.w2[e]).to(torch.bfloat16)

    def dense(self, x):
        """The reference: the whole layer in this process."""
        import torch
        idx, w = self.route(x)
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for e in range(self.w1.shape[0]):
            tok, k = (idx == e).nonzero(as_tuple=True)
            if tok.numel():
                out.index_add_(0, tok, w[tok, k, None] * self.expert(e, x[tok]).float())
        return out.to(torch.bfloat16)


def tokens_of(args, rank, it, device):
    """This rank's tokens of iteration `it`: a different count per rank."""
    import torch
    n = max(0, args.tokens - (rank * 7 + it * 3) % (args.tokens + 1))
    g = torch.Generator().manual_seed(args.seed * 1000003 + it * 1009 + rank)
    return torch.randn(n, args.hidden, generator=g).to(torch.bfloat16).to(device)


def distributed(buf, moe, x, args, rank, local):
    """The layer over mep.ep: dispatch, local experts, combine."""
    import torch
    idx, w = moe.route(x)
    experts = local * buf.group_size
    recv, count, handle, _, _ = buf.low_latency_dispatch(
        x, idx, args.tokens, experts, use_fp8=args.fp8)
    if args.fp8:
        q, scales = recv  # [L, R*T, H] e4m3, [L, R*T, H/128] float
        recv = (q.float() * scales.repeat_interleave(128, dim=-1)).to(torch.bfloat16)
    y = torch.empty_like(recv)
    for l, n in enumerate(count.tolist()):  # rows [0, n) of expert l are valid
        y[l, :n] = moe.expert(rank * local + l, recv[l, :n])
    out, _, _ = buf.low_latency_combine(y, idx, w, handle)
    return out


def rank_main(args):
    import torch
    import torch.distributed as dist
    from mep.ep import Buffer
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device(args.device)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            print(f"rank {rank}: --device cuda, but torch sees no GPU", flush=True)
            return 2
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank))
                              % torch.cuda.device_count())
        torch.cuda.set_device(device)
    # The group only sets mep.ep up (mep has its own communicator), so
    # gloo serves where nccl cannot: ranks sharing a GPU.
    own_gpu = args.device == "cuda" and world <= torch.cuda.device_count()
    backend = args.backend or ("nccl" if own_gpu else "gloo")
    if backend == "mep":
        import mep  # noqa: F401  registers the backend
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.timeout))
    local = args.experts_per_rank
    experts = local * world
    moe = MoE(args.hidden, args.ffn, experts, min(args.topk, experts), args.seed, device)
    hint = Buffer.get_low_latency_rdma_size_hint(args.tokens, args.hidden, world, experts)
    buf = Buffer(dist.group.WORLD, 0, hint, low_latency_mode=True,
                 num_qps_per_rank=local, explicitly_destroy=True)
    # bf16 rounding of the experts' outputs (and FP8 of the inputs) differ
    # between a batch of all routed tokens and the dense per-expert batch.
    tol = 0.12 if args.fp8 else 0.02
    worst, ntok = 0.0, 0
    for it in range(args.iters):
        x = tokens_of(args, rank, it, device)
        out = distributed(buf, moe, x, args, rank, local)
        ref = moe.dense(x)
        if x.shape[0]:
            err = ((out.float() - ref.float()).abs().max() /
                   ref.float().abs().max().clamp(min=1e-6)).item()
            worst = max(worst, err)
        ntok += x.shape[0]
    if device.type == "cuda":
        torch.cuda.synchronize()
    ok = worst <= tol
    # one write per line: the ranks share the terminal
    sys.stdout.write(f"rank {rank}/{world}: {'OK' if ok else 'FAIL'}  {ntok} tokens over "
                     f"{args.iters} calls, experts {rank * local}..{rank * local + local - 1}, "
                     f"max relative error {worst:.2e} (tolerance {tol:g}, "
                     f"{'fp8' if args.fp8 else 'bf16'} dispatch, {device})\n")
    sys.stdout.flush()
    oks = [None] * world
    dist.all_gather_object(oks, ok)
    buf.destroy()
    if rank == 0:
        bad = [r for r, v in enumerate(oks) if not v]
        print(f"moe: every rank's output matched the dense reference ({world} ranks)"
              if not bad else f"moe: FAILED on ranks {bad}", flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


# --------------------------------------------------------------- launcher

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args):
    """Starts --nproc ranks of this script (env:// rendezvous on a free
    port), waits up to --timeout, kills what is left, reaps all."""
    port = free_port()
    procs = []
    for r in range(args.nproc):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(args.nproc),
                   LOCAL_WORLD_SIZE=str(args.nproc), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)]
                                      + sys.argv[1:], env=env))
    end = time.monotonic() + args.timeout
    rc = 0
    try:
        for p in procs:
            left = max(0.1, end - time.monotonic())
            try:
                rc = max(rc, 1 if p.wait(timeout=left) else 0)
            except subprocess.TimeoutExpired:
                print(f"moe: ranks still running after {args.timeout:g} s; killed",
                      file=sys.stderr)
                rc = 1
                break
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    return rc


def main():
    args = parse()
    if "RANK" in os.environ:  # under torchrun, or started by launch()
        return rank_main(args)
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
