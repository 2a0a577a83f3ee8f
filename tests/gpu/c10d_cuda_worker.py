"""One rank of tests/gpu/test_c10d_cuda.py: the "mep" group (WORLD) and a
reference group ("nccl" with one GPU per rank, "gloo" on CPU copies when the
ranks share a GPU) over the same ranks, and the scenarios the parent names.

Inputs are drawn from generators seeded by (case, rank), so every rank can
also rebuild every other rank's input and compute the expected result
locally (in float64 / int64), independently of both backends."""
import datetime
import os
import zlib

import torch
import torch.distributed as dist

R = dist.ReduceOp
SIZES = [1, 7, 1000, 65537, (1 << 20) + 3]
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int32,
          torch.int64, torch.uint8, torch.bool]
FLOATS = (torch.float32, torch.float16, torch.bfloat16)


class Ctx:
    def __init__(self, rank, world, dev, ref, ref_cpu):
        self.rank, self.world, self.dev = rank, world, dev
        self.ref, self.ref_cpu = ref, ref_cpu
        self.passed, self.failed, self.notes = 0, [], []

    def check(self, name, fn):
        try:
            fn()
            self.passed += 1
        except Exception as e:  # one failed case must not hide the others
            self.failed.append(f"rank {self.rank}: {name}: {type(e).__name__}: {e}")


def gen(case, rank, n, dtype, kind="any"):
    g = torch.Generator().manual_seed(zlib.crc32(f"{case}/{rank}".encode()))
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if dtype in FLOATS:
        if kind == "prod":
            x = torch.rand(n, generator=g, dtype=torch.float64) * 0.5 + 0.75
        else:
            x = torch.randn(n, generator=g, dtype=torch.float64) * 10
        return x.to(dtype)
    lo, hi = (0, 256) if dtype == torch.uint8 else (-1000, 1000)
    if kind == "prod":
        lo, hi = (0, 4) if dtype == torch.uint8 else (-3, 4)
    return torch.randint(lo, hi, (n,), generator=g).to(dtype)


def expect_reduce(inputs, op, dtype):
    """The reduction of the ranks' inputs, and a tolerance per element."""
    n = len(inputs)
    if op in (R.MIN, R.MAX):  # exact in any order
        st = torch.stack(inputs)
        res = st.amin(0) if op == R.MIN else st.amax(0)
        return res, None
    if dtype in FLOATS:
        st = torch.stack([x.double() for x in inputs])
        ref = st.prod(0) if op == R.PRODUCT else st.sum(0)
        # Each of the n-1 additions (multiplications) in the reduced dtype
        # rounds by at most eps/2 of a partial result, which is bounded by
        # sum|x| (prod |x|); the final rounding adds eps/2 of |ref|: 2 n eps
        # of that bound covers any reduction order.
        bound = st.abs().prod(0) if op == R.PRODUCT else st.abs().sum(0)
        eps = torch.finfo(dtype).eps
        tol = 2 * n * eps * bound + torch.finfo(dtype).tiny
        if op == R.AVG:
            ref, tol = ref / n, tol / n + eps * ref.abs() / n
        return ref, tol
    st = torch.stack([x.long() for x in inputs])
    res = st.prod(0) if op == R.PRODUCT else st.sum(0)
    if dtype == torch.uint8:
        res = res & 0xFF  # the wrap of the 8-bit sum / product
    return res.to(dtype), None


def same(got, want, tol, what):
    # results and the NCCL reference may sit on the GPU: compare on the host
    got, want = got.cpu(), want.cpu()
    tol = None if tol is None else tol.cpu()
    if tol is None:
        if not torch.equal(got, want.to(got.dtype)):
            bad = (got != want.to(got.dtype)).nonzero()[:3].flatten().tolist()
            raise AssertionError(f"{what}: differs at {bad}: got "
                                 f"{got.flatten()[bad].tolist()} want "
                                 f"{want.flatten()[bad].tolist()}")
        return
    err = (got.double() - want.double()).abs()
    over = err > tol.double()
    if over.any():
        i = int(over.nonzero()[0])
        raise AssertionError(f"{what}: element {i}: got {float(got[i])}, want "
                             f"{float(want[i])} (tolerance {float(tol[i])})")


def ops_for(dtype):
    if dtype == torch.bool:
        return [R.MIN, R.MAX]
    ops = [R.SUM, R.PRODUCT, R.MIN, R.MAX]
    return ops + [R.AVG] if dtype in FLOATS else ops


def ref_allreduce(ctx, x, op):
    """The reference backend's all-reduce of x (None: it has no such op)."""
    if ctx.ref_cpu and (x.dtype in (torch.float16, torch.bfloat16, torch.bool)
                        or op == R.AVG):
        return None  # gloo lacks these
    if not ctx.ref_cpu and (x.dtype == torch.bool or op == R.AVG and
                            x.dtype not in FLOATS):
        return None
    y = x.cpu().clone() if ctx.ref_cpu else x.clone()
    try:
        dist.all_reduce(y, op=op, group=ctx.ref)
    except RuntimeError as e:  # the same dtype on every rank: all skip
        note = f"reference all_reduce {x.dtype} {op}: {str(e).splitlines()[0]}"
        if note not in ctx.notes:
            ctx.notes.append(note)
        return None
    return y.cpu()


def scenario_allreduce(ctx):
    n = ctx.world
    for dtype in DTYPES:
        for size in SIZES:
            for op in ops_for(dtype):
                case = f"ar/{dtype}/{size}/{op}"

                def run():
                    kind = "prod" if op == R.PRODUCT else "any"
                    ins = [gen(case, r, size, dtype, kind) for r in range(n)]
                    x = ins[ctx.rank].to(ctx.dev)
                    dist.all_reduce(x, op=op)  # in place
                    want, tol = expect_reduce(ins, op, dtype)
                    same(x, want, tol, "vs the local reduction")
                    ref = ref_allreduce(ctx, ins[ctx.rank].to(ctx.dev), op)
                    if ref is not None:
                        same(x, ref, None if tol is None else 2 * tol,
                             "vs the reference backend")
                ctx.check(case, run)
    big = 16 << 20  # 64 MiB of float32

    def run_big():
        ins = [gen("ar-big", r, big, torch.float32) for r in range(n)]
        x = ins[ctx.rank].to(ctx.dev)
        dist.all_reduce(x)
        want, tol = expect_reduce(ins, R.SUM, torch.float32)
        same(x, want, tol, "64 MiB sum")
    ctx.check("all_reduce 64 MiB float32 sum", run_big)

    def run_strided():  # not contiguous: staged and copied back
        ins = [gen("ar-strided", r, 2 * 1001, torch.float32) for r in range(n)]
        x = ins[ctx.rank].to(ctx.dev).view(1001, 2).t()
        dist.all_reduce(x, op=R.MAX)
        want, _ = expect_reduce([i.view(1001, 2).t() for i in ins], R.MAX, None)
        same(x, want, None, "strided max")
    ctx.check("all_reduce of a strided tensor", run_strided)


def scenario_move(ctx):
    """all_gather (list and into tensor), reduce_scatter (list and tensor),
    all_to_all_single with equal splits, broadcast from every root; the
    other collectives are in scenario_rooted and scenario_uneven."""
    n = ctx.world
    for dtype in DTYPES:
        for size in SIZES:
            tag = f"{dtype}/{size}"
            ins = [gen("mv/" + tag, r, size, dtype) for r in range(n)]
            mine = ins[ctx.rank].to(ctx.dev)

            def gather_list():
                outs = [torch.empty_like(mine) for _ in range(n)]
                dist.all_gather(outs, mine)
                for r in range(n):
                    same(outs[r], ins[r], None, f"block {r}")
            ctx.check("all_gather/" + tag, gather_list)

            def gather_flat():
                out = torch.empty(n * size, dtype=dtype, device=ctx.dev)
                dist.all_gather_into_tensor(out, mine)
                same(out, torch.cat(ins), None, "flat")
            ctx.check("all_gather_into_tensor/" + tag, gather_flat)

            def alltoall():
                full = [gen("a2a/" + tag, r, n * size, dtype) for r in range(n)]
                out = torch.empty(n * size, dtype=dtype, device=ctx.dev)
                dist.all_to_all_single(out, full[ctx.rank].to(ctx.dev))
                lo = ctx.rank * size
                want = torch.cat([full[r][lo:lo + size] for r in range(n)])
                same(out, want, None, "all_to_all_single")
            ctx.check("all_to_all_single/" + tag, alltoall)

            def bcast():
                for root in range(n):
                    x = ins[ctx.rank].to(ctx.dev)
                    dist.broadcast(x, src=root)
                    same(x, ins[root], None, f"root {root}")
            ctx.check("broadcast/" + tag, bcast)

            if dtype == torch.bool:
                continue
            for op in (R.SUM, R.MAX):
                def rs_flat():
                    full = [gen(f"rs/{tag}/{op}", r, n * size, dtype) for r in range(n)]
                    out = torch.empty(size, dtype=dtype, device=ctx.dev)
                    dist.reduce_scatter_tensor(out, full[ctx.rank].to(ctx.dev), op=op)
                    lo = ctx.rank * size
                    want, tol = expect_reduce([f[lo:lo + size] for f in full], op, dtype)
                    same(out, want, tol, "reduce_scatter_tensor")
                ctx.check(f"reduce_scatter_tensor/{tag}/{op}", rs_flat)

                def rs_list():
                    full = [gen(f"rsl/{tag}/{op}", r, n * size, dtype) for r in range(n)]
                    out = torch.empty(size, dtype=dtype, device=ctx.dev)
                    mine_l = list(full[ctx.rank].to(ctx.dev).split(size))
                    dist.reduce_scatter(out, mine_l, op=op)
                    lo = ctx.rank * size
                    want, tol = expect_reduce([f[lo:lo + size] for f in full], op, dtype)
                    same(out, want, tol, "reduce_scatter")
                ctx.check(f"reduce_scatter/{tag}/{op}", rs_list)

    def p2p_refused():
        x = torch.zeros(3, device=ctx.dev)
        try:
            dist.send(x, (ctx.rank + 1) % n)
        except TypeError as e:
            if "not supported on CUDA tensors yet" not in str(e):
                raise
            return
        raise AssertionError("send of a CUDA tensor did not raise TypeError")
    ctx.check("send on CUDA tensors refuses", p2p_refused)


def ref_op(ctx, name, fn, *tensors):
    """fn(*copies) on the reference group with copies of the tensors (CPU
    copies for gloo); returns the copies, or None when the reference lacks
    the operation for this dtype (the same on every rank, so all skip).
    None entries pass through."""
    def cp(t):
        if t is None:
            return None
        if isinstance(t, list):
            return [cp(x) for x in t]
        return t.detach().cpu().clone() if ctx.ref_cpu else t.detach().clone()
    copies = [cp(t) for t in tensors]
    try:
        fn(*copies)
    except (RuntimeError, ValueError, TypeError) as e:
        note = f"reference {name}: {str(e).splitlines()[0]}"
        if note not in ctx.notes:
            ctx.notes.append(note)
        return None
    return copies


def ref_reduces(ctx, dtype, op):
    """Whether the reference backend can reduce dtype with op."""
    if ctx.ref_cpu:
        return dtype not in (torch.float16, torch.bfloat16, torch.bool) and op != R.AVG
    return dtype != torch.bool and not (op == R.AVG and dtype not in FLOATS)


ROOTED_SIZES = [0, 1, 7, 65537]
MOVE_DTYPES = DTYPES + [torch.float64]


def scenario_rooted(ctx):
    """reduce, gather and scatter against the local expectation and the
    reference backend, roots 0 and last. Every rank makes the same calls
    on both groups before it checks anything, so a failed check cannot
    leave a peer waiting."""
    n = ctx.world
    roots = sorted({0, n - 1})
    for dtype in DTYPES:
        for size in ROOTED_SIZES:
            for op in ops_for(dtype):
                for root in roots:
                    case = f"red/{dtype}/{size}/{op}/{root}"

                    def run():
                        kind = "prod" if op == R.PRODUCT else "any"
                        ins = [gen(case, r, size, dtype, kind) for r in range(n)]
                        x = ins[ctx.rank].to(ctx.dev, copy=True)
                        dist.reduce(x, dst=root, op=op)
                        ref = None
                        if size and ref_reduces(ctx, dtype, op):
                            ref = ref_op(ctx, "reduce", lambda y: dist.reduce(
                                y, dst=root, op=op, group=ctx.ref),
                                ins[ctx.rank].to(ctx.dev))
                        if ctx.rank != root:
                            same(x, ins[ctx.rank], None, "a non-root's tensor changed")
                            return
                        want, tol = expect_reduce(ins, op, dtype)
                        same(x, want, tol, "vs the local reduction")
                        if ref is not None:
                            same(x, ref[0], None if tol is None else 2 * tol,
                                 "vs the reference backend")
                    ctx.check(case, run)
    big = (1 << 20) + 3
    for root in roots:
        def run_big():
            ins = [gen(f"red-big/{root}", r, big, torch.float32) for r in range(n)]
            x = ins[ctx.rank].to(ctx.dev, copy=True)
            dist.reduce(x, dst=root, op=R.SUM)
            if ctx.rank == root:
                want, tol = expect_reduce(ins, R.SUM, torch.float32)
                same(x, want, tol, "large sum")
        ctx.check(f"reduce of {big} float32, root {root}", run_big)

    for dtype in MOVE_DTYPES:
        sizes = ROOTED_SIZES + ([(1 << 20) + 3] if dtype == torch.float32 else [])
        for size in sizes:
            for root in roots:
                tag = f"{dtype}/{size}/{root}"

                def gather():
                    ins = [gen("ga/" + tag, r, size, dtype) for r in range(n)]
                    mine = ins[ctx.rank].to(ctx.dev)
                    outs = ([torch.empty_like(mine) for _ in range(n)]
                            if ctx.rank == root else None)
                    dist.gather(mine, outs, dst=root)
                    ref = None
                    if size:
                        ref = ref_op(ctx, "gather", lambda i, o: dist.gather(
                            i, o, dst=root, group=ctx.ref), mine, outs)
                    if ctx.rank != root:
                        return
                    for r in range(n):
                        same(outs[r], ins[r], None, f"block {r}")
                        if ref is not None:
                            same(outs[r], ref[1][r], None, f"block {r} vs the reference")
                ctx.check("gather/" + tag, gather)

                def scatter():
                    blocks = [gen("sc/" + tag, r, size, dtype) for r in range(n)]
                    lst = ([b.to(ctx.dev) for b in blocks]
                           if ctx.rank == root else None)
                    out = torch.full((size,), 7, dtype=dtype, device=ctx.dev)
                    dist.scatter(out, lst, src=root)
                    ref = None
                    if size:
                        ref = ref_op(ctx, "scatter", lambda o, l: dist.scatter(
                            o, l, src=root, group=ctx.ref), out, lst)
                    same(out, blocks[ctx.rank], None, "own block")
                    if ref is not None:
                        same(out, ref[0], None, "vs the reference")
                ctx.check("scatter/" + tag, scatter)

    def strided():  # gather list and scatter output with gaps
        root = n - 1
        ins = [gen("ga-strided", r, 2 * 501, torch.float32) for r in range(n)]
        mine = ins[ctx.rank].to(ctx.dev).view(501, 2).t()
        outs = ([torch.zeros(501, 2, device=ctx.dev).t() for _ in range(n)]
                if ctx.rank == root else None)
        dist.gather(mine, outs, dst=root)
        out = torch.zeros(501, 2, device=ctx.dev).t()
        lst = ([x.to(ctx.dev).view(501, 2).t() for x in ins]
               if ctx.rank == root else None)
        dist.scatter(out, lst, src=root)
        same(out, ins[ctx.rank].view(501, 2).t(), None, "scatter")
        if ctx.rank == root:
            for r in range(n):
                same(outs[r], ins[r].view(501, 2).t(), None, f"gather block {r}")
    ctx.check("gather and scatter of strided tensors", strided)


def split_matrix(case, n, most, zeros=True):
    """S[p][q]: what rank p sends to rank q, in [0, most], the same on every
    rank; with `zeros` the first and last ranks send themselves nothing."""
    g = torch.Generator().manual_seed(zlib.crc32(case.encode()))
    s = torch.randint(0, most + 1, (n, n), generator=g).tolist()
    if zeros:
        s[0][0] = 0
        s[n - 1][n - 1] = 0
    return s


def scenario_uneven(ctx):
    """all_to_all (lists) and all_to_all_single with split sizes: random
    uneven splits with empty pieces, a skewed one, equal ones given
    explicitly, rows of several elements, strided and 0-element rows; and
    ranks that disagree on a size."""
    n, me = ctx.world, ctx.rank
    layouts = [("rand", 9, True), ("big", 40000, True), ("one", 1, False)]
    for dtype in MOVE_DTYPES:
        for lname, most, zeros in layouts:
            case = f"a2a/{dtype}/{lname}"
            s = split_matrix(case, n, most, zeros)
            if lname == "big":  # skewed: one piece far larger than the rest
                s[0][n - 1] = 3 * most + 1

            def single(row=3):
                pieces = [[gen(f"{case}/{p}/{q}", 0, s[p][q] * row, dtype)
                           .view(s[p][q], row) for q in range(n)] for p in range(n)]
                x = torch.cat(pieces[me]).to(ctx.dev)
                in_sp = s[me]
                out_sp = [s[q][me] for q in range(n)]
                out = torch.full((sum(out_sp), row), 3, dtype=dtype, device=ctx.dev)
                dist.all_to_all_single(out, x, out_sp, in_sp)
                ref = ref_op(ctx, "all_to_all_single", lambda o, i:
                             dist.all_to_all_single(o, i, out_sp, in_sp, group=ctx.ref),
                             out, x)
                want = torch.cat([pieces[q][me] for q in range(n)])
                same(out, want, None, "vs the pieces")
                if ref is not None:
                    same(out, ref[0], None, "vs the reference")
            ctx.check(f"all_to_all_single/{case}", single)

            def lists():
                pieces = [[gen(f"{case}/l/{p}/{q}", 0, s[p][q], dtype)
                           for q in range(n)] for p in range(n)]
                ins = [t.to(ctx.dev) for t in pieces[me]]
                outs = [torch.full((s[q][me],), 5, dtype=dtype, device=ctx.dev)
                        for q in range(n)]
                dist.all_to_all(outs, ins)
                ref = None
                if not ctx.ref_cpu:  # gloo may refuse empty pieces on one rank only
                    ref = ref_op(ctx, "all_to_all", lambda o, i:
                                 dist.all_to_all(o, i, group=ctx.ref), outs, ins)
                for q in range(n):
                    same(outs[q], pieces[q][me], None, f"piece from rank {q}")
                    if ref is not None:
                        same(outs[q], ref[0][q], None, f"piece from {q} vs the reference")
            ctx.check(f"all_to_all/{case}", lists)

    def equal_given():  # explicit equal splits: no packing, same result
        k, row = 5, 2
        full = [gen("a2a-eq", r, n * k * row, torch.float32).view(n * k, row)
                for r in range(n)]
        out = torch.empty(n * k, row, device=ctx.dev)
        dist.all_to_all_single(out, full[me].to(ctx.dev), [k] * n, [k] * n)
        want = torch.cat([full[q][me * k:(me + 1) * k] for q in range(n)])
        same(out, want, None, "equal splits given")
    ctx.check("all_to_all_single with equal splits given", equal_given)

    def strided_rows():  # a non-contiguous input and output
        s = split_matrix("a2a-strided", n, 6)
        cols = 4
        full = [gen(f"a2a-st/{p}", 0, sum(s[p]) * cols, torch.float32)
                .view(cols, sum(s[p])) for p in range(n)]
        x = full[me].to(ctx.dev).t()  # rows of `cols` with a stride
        out_sp = [s[q][me] for q in range(n)]
        out = torch.zeros(cols, sum(out_sp), device=ctx.dev).t()
        dist.all_to_all_single(out, x, out_sp, s[me])
        offs = [sum(s[q][:me]) for q in range(n)]
        want = torch.cat([full[q].t()[offs[q]:offs[q] + s[q][me]] for q in range(n)])
        same(out, want, None, "strided")
    ctx.check("all_to_all_single, strided tensors, uneven", strided_rows)

    def empty_rows():  # rows of 0 elements: nothing moves, nothing breaks
        s = split_matrix("a2a-empty", n, 4)
        x = torch.empty(sum(s[me]), 0, device=ctx.dev)
        out = torch.empty(sum(s[q][me] for q in range(n)), 0, device=ctx.dev)
        dist.all_to_all_single(out, x, [s[q][me] for q in range(n)], s[me])
    ctx.check("all_to_all_single of 0-element rows", empty_rows)

    def disagree():
        # Rank 0 expects one row more from rank 1 than rank 1 sends (and
        # one row fewer from itself, so its output size holds); it raises,
        # the others do not, and the group stays in step.
        s = [[v + 1 for v in row]
             for row in split_matrix("a2a-bad", n, 3, zeros=False)]
        x = torch.ones(sum(s[me]), device=ctx.dev)
        out_sp = [s[q][me] for q in range(n)]
        if me == 0:
            out_sp[0] -= 1
            out_sp[1] += 1
        out = torch.empty(sum(out_sp), device=ctx.dev)
        err = None
        try:
            dist.all_to_all_single(out, x, out_sp, s[me])
        except Exception as e:  # noqa: BLE001  checked below
            err = e
        y = torch.full((3,), float(me + 1), device=ctx.dev)
        dist.all_reduce(y)  # in step: the same collective on every rank
        same(y, torch.full((3,), float(n * (n + 1) // 2)), None, "the next all_reduce")
        if me == 0:
            if err is None or "which expects" not in str(err):
                raise AssertionError(f"rank 0 expected a disagreement error, got {err!r}")
        elif err is not None:
            raise err
    ctx.check("all_to_all_single whose ranks disagree on a size", disagree)


def scenario_graph(ctx):
    import mep
    path = mep.cuda_path()
    if path != "kernel":
        ctx.notes.append(f"graph capture not tested: mep.cuda_path() is {path!r}")
        return
    n, size = ctx.world, 4099

    def run():
        static = torch.zeros(size, device=ctx.dev)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):  # warm up outside the capture
            dist.all_reduce(static)
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        # thread_local: the core's progress thread may call CUDA meanwhile.
        with torch.cuda.graph(g, capture_error_mode="thread_local"):
            dist.all_reduce(static)
        for it in range(3):
            ins = [gen(f"graph/{it}", r, size, torch.float32) for r in range(n)]
            static.copy_(ins[ctx.rank].to(ctx.dev))
            g.replay()
            torch.cuda.synchronize()
            want, tol = expect_reduce(ins, R.SUM, torch.float32)
            same(static, want, tol, f"replay {it}")
    ctx.check("all_reduce captured in a CUDA graph, 3 replays", run)


def scenario_async(ctx):
    n, size = ctx.world, (4 << 20) + 1

    def run():
        ins = [gen("async", r, size, torch.float32) for r in range(n)]
        x = ins[ctx.rank].to(ctx.dev)
        w = dist.all_reduce(x, async_op=True)
        other = torch.cuda.Stream()
        with torch.cuda.stream(other):
            w.wait()  # orders `other` after the all-reduce, host goes on
            y = x * 2
        other.synchronize()
        want, tol = expect_reduce(ins, R.SUM, torch.float32)
        same(y, want * 2, 2 * tol, "used on another stream")
        if not w.is_completed():
            torch.cuda.synchronize()
    ctx.check("async all_reduce, wait, use on another stream", run)

    def run_future():
        ins = [gen("fut", r, 1000, torch.float32) for r in range(n)]
        x = ins[ctx.rank].to(ctx.dev)
        fut = dist.all_reduce(x, async_op=True).get_future()
        got = fut.wait()[0]
        want, tol = expect_reduce(ins, R.SUM, torch.float32)
        same(got, want, tol, "future value")
    ctx.check("async all_reduce through get_future", run_future)


def scenario_kill(ctx):
    """The last rank dies after a few all-reduces; the others go on."""
    import mep
    victim = ctx.world - 1
    survivors_ok = {"raised": None, "degraded": False}
    for it in range(200):
        if ctx.rank == victim and it == 5:
            os._exit(1)
        x = torch.ones(1000, device=ctx.dev)
        try:
            dist.all_reduce(x)
            torch.cuda.synchronize()
        except Exception as e:
            if "mep" not in str(e):
                ctx.failed.append(f"rank {ctx.rank}: kill: not a mep error: {e}")
                return
            survivors_ok["raised"] = str(e)
            break
        v = float(x[0])
        if v not in (ctx.world, ctx.world - 1):
            ctx.failed.append(f"rank {ctx.rank}: kill: iteration {it} gave {v}")
            return
        if v == ctx.world - 1:
            survivors_ok["degraded"] = True
    active = mep.get_active_ranks().tolist()
    if survivors_ok["raised"] or survivors_ok["degraded"] or active[victim] == 0:
        ctx.passed += 1
        ctx.notes.append(f"kill: raised={survivors_ok['raised']!r} "
                         f"degraded={survivors_ok['degraded']} active={active}")
    else:
        ctx.failed.append(f"rank {ctx.rank}: kill: 200 all-reduces after rank "
                          f"{victim} died and nothing noticed (active {active})")


SCENARIOS = {"allreduce": scenario_allreduce, "move": scenario_move,
             "rooted": scenario_rooted, "uneven": scenario_uneven,
             "graph": scenario_graph, "async": scenario_async,
             "kill": scenario_kill}


def entry(rank, world, port, scenario, ref_name, one_gpu, env, results):
    os.environ.update(env)
    try:
        import mep  # noqa: F401  registers "mep"
        dev = torch.device("cuda", 0 if one_gpu else rank)
        torch.cuda.set_device(dev)
        timeout = datetime.timedelta(seconds=60)
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
        dist.init_process_group("mep", store=store, rank=rank, world_size=world,
                                timeout=timeout)
        ref = dist.new_group(backend=ref_name)
        ctx = Ctx(rank, world, dev, ref, ref_name == "gloo")
        SCENARIOS[scenario](ctx)
        torch.cuda.synchronize()
        results.put((rank, ctx.passed, ctx.failed, ctx.notes))
    except BaseException as e:  # report, whatever it was
        import traceback
        results.put((rank, 0, [f"rank {rank}: {scenario}: "
                               f"{traceback.format_exc()}"], []))
        del e
    finally:
        # No interpreter teardown: the result is in, and a dead peer must
        # not keep this process in torch's atexit handlers.
        try:
            results.close()
            results.join_thread()
        finally:
            os._exit(0)
