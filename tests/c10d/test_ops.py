"""Every collective of the "mep" backend on 2, 3 and 4 ranks, several dtypes
and reduce ops, random inputs of sizes 0, 1, odd and large: each result is
checked against a reference computed locally from every rank's inputs, and
against gloo run on the same inputs in the same processes."""
import pytest
import torch
import torch.distributed as dist

from harness import run_ranks
from refs import R, assert_same, make, reduce

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
I8, U8, I16, I32, I64 = torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64
BOOL, C64 = torch.bool, torch.complex64
OPS = (R.SUM, R.PRODUCT, R.MIN, R.MAX, R.AVG)


class Check:
    """One rank's view: runs cases on mep and on gloo, counts comparisons."""

    def __init__(self, ctx, gloo_pg):
        self.rank, self.world, self.gloo_pg = ctx.rank, ctx.world, gloo_pg
        self.counts = {}  # op -> [cases, of which compared with gloo]

    def gloo(self, fn):
        """fn(gloo group)'s result, or None where gloo lacks the case."""
        try:
            return fn(self.gloo_pg)
        except (RuntimeError, ValueError, TypeError) as e:
            text = str(e).lower()
            if any(k in text for k in ("support", "unsupported", "cannot use",
                                       "invalid", "not implemented", "be cast")):
                return None
            raise

    def done(self, op, compared):
        c = self.counts.setdefault(op, [0, 0])
        c[0] += 1
        c[1] += compared is not None

    def ins(self, name, shape, dtype, op=None):
        return [make(name, r, shape, dtype, op) for r in range(self.world)]


def same_exact(got, want, what):
    assert torch.equal(got, want), f"{what}: got {got}, want {want}"


def case_all_reduce(c):
    specs = [(F32, R.SUM, n) for n in (0, 1, 7, 1000, 262147)]
    specs += [(dt, op, 33) for dt in (F64, F16, BF16, I32, I64, I8, U8, BOOL)
              for op in OPS if not (dt == BOOL and op == R.AVG)]
    specs += [(F32, op, 4099) for op in OPS[1:]] + [(C64, R.SUM, 5)]
    for dt, op, n in specs:
        name = f"all_reduce/{dt}/{op}/{n}"
        ins = c.ins(name, (n,), dt, op)
        t = ins[c.rank].clone()
        dist.all_reduce(t, op=op)
        assert_same(t, reduce(ins, op), name)
        g = c.gloo(lambda pg: _ret(dist.all_reduce, x := ins[c.rank].clone(), op=op, group=pg) or x)
        if g is not None:
            assert_same(t, g, name + " vs gloo")
        c.done("all_reduce", g)
    # A non-contiguous tensor: the result lands in the user's strides.
    name = "all_reduce/noncontig"
    ins = [x.t() for x in c.ins(name, (7, 5), F32)]
    t = ins[c.rank].clone(memory_format=torch.preserve_format)
    assert not t.is_contiguous()
    dist.all_reduce(t)
    assert_same(t, reduce(ins, R.SUM), name)
    c.done("all_reduce", None)


def _ret(fn, *args, **kw):
    """Calls a collective and returns None (so `or x` yields the tensor)."""
    fn(*args, **kw)


def case_broadcast(c):
    for root in range(c.world):
        for dt, n in ((F32, 1000), (I64, 7), (F16, 0), (I16, 3), (C64, 5)):
            name = f"broadcast/{root}/{dt}/{n}"
            ins = c.ins(name, (n,), dt)
            t = ins[c.rank].clone()
            dist.broadcast(t, root)
            same_exact(t, ins[root], name)
            g = c.gloo(lambda pg: _ret(dist.broadcast, x := ins[c.rank].clone(), root, group=pg) or x)
            if g is not None:
                same_exact(t, g, name + " vs gloo")
            c.done("broadcast", g)
    name = "broadcast/noncontig"
    ins = [x[:, ::2] for x in c.ins(name, (3, 8), F32)]
    t = ins[c.rank].clone(memory_format=torch.preserve_format)
    dist.broadcast(t, c.world - 1)
    same_exact(t, ins[c.world - 1], name)


def case_reduce(c):
    for root in range(c.world):
        for dt, op, n in ((F32, R.SUM, 257), (I32, R.PRODUCT, 9), (F64, R.MAX, 1)):
            name = f"reduce/{root}/{dt}/{op}/{n}"
            ins = c.ins(name, (n,), dt, op)
            t = ins[c.rank].clone()
            dist.reduce(t, root, op=op)
            g = c.gloo(lambda pg: _ret(dist.reduce, x := ins[c.rank].clone(), root, op=op, group=pg) or x)
            if c.rank == root:
                assert_same(t, reduce(ins, op), name)
                if g is not None:
                    assert_same(t, g, name + " vs gloo")
            c.done("reduce", g)


def case_all_gather(c):
    for dt, n in ((F32, 7), (I64, 1), (F16, 0), (BOOL, 33)):
        name = f"all_gather/{dt}/{n}"
        ins = c.ins(name, (n,), dt)
        outs = [torch.empty(n, dtype=dt) for _ in range(c.world)]
        dist.all_gather(outs, ins[c.rank])
        for r in range(c.world):
            same_exact(outs[r], ins[r], f"{name} block {r}")
        g = c.gloo(lambda pg: _ret(dist.all_gather, y := [torch.empty(n, dtype=dt) for _ in ins],
                                   ins[c.rank], group=pg) or y)
        if g is not None:
            for r in range(c.world):
                same_exact(outs[r], g[r], f"{name} vs gloo block {r}")
        c.done("all_gather", g)
    name = "all_gather/noncontig"
    ins = c.ins(name, (5,), F32)
    outs = [torch.zeros(5, 2)[:, 1] for _ in range(c.world)]
    dist.all_gather(outs, ins[c.rank])
    for r in range(c.world):
        same_exact(outs[r], ins[r], f"{name} block {r}")


def case_all_gather_into_tensor(c):
    for dt, n in ((F32, 1000), (I8, 1), (BF16, 5), (F64, 0)):
        name = f"all_gather_into_tensor/{dt}/{n}"
        ins = c.ins(name, (n,), dt)
        out = torch.empty(c.world * n, dtype=dt)
        dist.all_gather_into_tensor(out, ins[c.rank])
        same_exact(out, torch.cat(ins), name)
        g = c.gloo(lambda pg: _ret(dist.all_gather_into_tensor, y := torch.empty_like(out),
                                   ins[c.rank], group=pg) or y)
        if g is not None:
            same_exact(out, g, name + " vs gloo")
        c.done("all_gather_into_tensor", g)
    name = "all_gather_into_tensor/noncontig"
    ins = c.ins(name, (3,), F32)
    out = torch.zeros(3, c.world).t()  # [world, 3], not contiguous
    dist.all_gather_into_tensor(out, ins[c.rank])
    same_exact(out, torch.stack(ins), name)


def case_reduce_scatter(c):
    for dt, op, n in ((F32, R.SUM, 7), (I32, R.MAX, 33), (F64, R.AVG, 3), (F16, R.SUM, 1)):
        name = f"reduce_scatter/{dt}/{op}/{n}"
        ins = [[make(f"{name}/{b}", r, (n,), dt, op) for b in range(c.world)]
               for r in range(c.world)]
        out = torch.empty(n, dtype=dt)
        dist.reduce_scatter(out, ins[c.rank], op=op)
        assert_same(out, reduce([ins[r][c.rank] for r in range(c.world)], op), name)
        g = c.gloo(lambda pg: _ret(dist.reduce_scatter, y := torch.empty_like(out),
                                   ins[c.rank], op=op, group=pg) or y)
        if g is not None:
            assert_same(out, g, name + " vs gloo")
        c.done("reduce_scatter", g)


def case_reduce_scatter_tensor(c):
    for dt, op, n in ((F32, R.SUM, 1000), (BF16, R.SUM, 5), (I64, R.MIN, 1), (F32, R.MAX, 0)):
        name = f"reduce_scatter_tensor/{dt}/{op}/{n}"
        ins = c.ins(name, (c.world * n,), dt, op)
        out = torch.empty(n, dtype=dt)
        dist.reduce_scatter_tensor(out, ins[c.rank], op=op)
        want = reduce([x[c.rank * n:(c.rank + 1) * n] for x in ins], op)
        assert_same(out, want, name)
        g = c.gloo(lambda pg: _ret(dist.reduce_scatter_tensor, y := torch.empty_like(out),
                                   ins[c.rank], op=op, group=pg) or y)
        if g is not None:
            assert_same(out, g, name + " vs gloo")
        c.done("reduce_scatter_tensor", g)


def case_gather_scatter(c):
    for root in range(c.world):
        name = f"gather/{root}"
        ins = c.ins(name, (7,), F32)
        outs = [torch.empty(7) for _ in range(c.world)] if c.rank == root else None
        dist.gather(ins[c.rank], outs, dst=root)
        g = c.gloo(lambda pg: _ret(dist.gather, ins[c.rank],
                                   y := [torch.empty(7) for _ in ins] if c.rank == root else None,
                                   dst=root, group=pg) or y)
        if c.rank == root:
            for r in range(c.world):
                same_exact(outs[r], ins[r], f"{name} block {r}")
                if g is not None:
                    same_exact(outs[r], g[r], f"{name} vs gloo block {r}")
        c.done("gather", g)

        name = f"scatter/{root}"
        blocks = c.ins(name, (9,), I32)
        out = torch.empty(9, dtype=I32)
        dist.scatter(out, blocks if c.rank == root else None, src=root)
        same_exact(out, blocks[c.rank], name)
        g = c.gloo(lambda pg: _ret(dist.scatter, y := torch.empty(9, dtype=I32),
                                   blocks if c.rank == root else None, src=root, group=pg) or y)
        if g is not None:
            same_exact(out, g, name + " vs gloo")
        c.done("scatter", g)


def case_all_to_all(c):
    def count(src, dst):
        return (2 * src + dst) % 4  # uneven, some empty
    for dt in (F32, I64):
        name = f"all_to_all/{dt}"
        send = {s: [make(f"{name}/{s}/{d}", 0, (count(s, d),), dt) for d in range(c.world)]
                for s in range(c.world)}
        outs = [torch.empty(count(s, c.rank), dtype=dt) for s in range(c.world)]
        dist.all_to_all(outs, send[c.rank])
        for s in range(c.world):
            same_exact(outs[s], send[s][c.rank], f"{name} from {s}")
        g = c.gloo(lambda pg: _ret(dist.all_to_all, y := [torch.empty_like(o) for o in outs],
                                   send[c.rank], group=pg) or y)
        if g is not None:
            for s in range(c.world):
                same_exact(outs[s], g[s], f"{name} vs gloo from {s}")
        c.done("all_to_all", g)


def case_all_to_all_single(c):
    name = "all_to_all_single/even"
    ins = c.ins(name, (c.world * 5,), F32)
    out = torch.empty(c.world * 5)
    dist.all_to_all_single(out, ins[c.rank])
    same_exact(out, torch.cat([ins[s][c.rank * 5:(c.rank + 1) * 5] for s in range(c.world)]), name)
    g = c.gloo(lambda pg: _ret(dist.all_to_all_single, y := torch.empty_like(out), ins[c.rank],
                               group=pg) or y)
    if g is not None:
        same_exact(out, g, name + " vs gloo")
    c.done("all_to_all_single", g)

    def rows(src, dst):
        return (src + 2 * dst) % 3
    name = "all_to_all_single/uneven"
    ins = [make(name, s, (sum(rows(s, d) for d in range(c.world)), 3), F64) for s in range(c.world)]
    in_splits = [rows(c.rank, d) for d in range(c.world)]
    out_splits = [rows(s, c.rank) for s in range(c.world)]
    out = torch.empty(sum(out_splits), 3, dtype=F64)
    dist.all_to_all_single(out, ins[c.rank], out_splits, in_splits)
    want = []
    for s in range(c.world):
        off = sum(rows(s, d) for d in range(c.rank))
        want.append(ins[s][off:off + rows(s, c.rank)])
    same_exact(out, torch.cat(want), name)
    g = c.gloo(lambda pg: _ret(dist.all_to_all_single, y := torch.empty_like(out), ins[c.rank],
                               out_splits, in_splits, group=pg) or y)
    if g is not None:
        same_exact(out, g, name + " vs gloo")
    c.done("all_to_all_single", g)


def case_coalesced(c):
    name = "all_reduce_coalesced"
    shapes = [((7,), F32), ((3,), F64), ((1,), F32), ((2, 3), I32)]
    ins = [c.ins(f"{name}/{i}", s, dt) for i, (s, dt) in enumerate(shapes)]
    mine = [x[c.rank].clone() for x in ins]
    with dist._coalescing_manager(async_ops=True) as cm:
        for t in mine:
            dist.all_reduce(t)
    cm.wait()
    for i, t in enumerate(mine):
        assert_same(t, reduce(ins[i], R.SUM), f"{name} tensor {i}")
    c.done(name, None)

    name = "all_gather_into_tensor_coalesced"
    ins = [c.ins(f"{name}/{i}", (n,), F32) for i, n in enumerate((4, 1, 9))]
    outs = [torch.empty(c.world * x[0].numel()) for x in ins]
    with dist._coalescing_manager(async_ops=True) as cm:
        for o, x in zip(outs, ins):
            dist.all_gather_into_tensor(o, x[c.rank])
    cm.wait()
    for o, x in zip(outs, ins):
        same_exact(o, torch.cat(x), name)
    c.done(name, None)

    name = "reduce_scatter_tensor_coalesced"
    ins = [c.ins(f"{name}/{i}", (c.world * n,), F32) for i, n in enumerate((2, 5))]
    outs = [torch.empty(x[0].numel() // c.world) for x in ins]
    with dist._coalescing_manager(async_ops=True) as cm:
        for o, x in zip(outs, ins):
            dist.reduce_scatter_tensor(o, x[c.rank])
    cm.wait()
    for o, x in zip(outs, ins):
        n = o.numel()
        assert_same(o, reduce([t[c.rank * n:(c.rank + 1) * n] for t in x], R.SUM), name)
    c.done(name, None)


def case_barrier(c):
    dist.barrier()
    c.done("barrier", None)


CASES = (case_all_reduce, case_broadcast, case_reduce, case_all_gather,
         case_all_gather_into_tensor, case_reduce_scatter, case_reduce_scatter_tensor,
         case_gather_scatter, case_all_to_all, case_all_to_all_single, case_coalesced,
         case_barrier)


def run_cases(ctx):
    import mep  # noqa: F401  registers the backend
    dist.init_process_group("mep", store=ctx.store, rank=ctx.rank,
                            world_size=ctx.world, timeout=ctx.timeout)
    c = Check(ctx, dist.new_group(backend="gloo"))
    for case in CASES:
        case(c)
    dist.destroy_process_group()
    return c.counts


# Operations gloo runs on CPU in this torch; for each, at least one case
# must have been compared with it.
WITH_GLOO = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
             "reduce_scatter", "reduce_scatter_tensor", "gather", "scatter",
             "all_to_all_single")


@pytest.mark.parametrize("world", [2, 3, 4])
def test_collectives_match_reference_and_gloo(world):
    counts = run_ranks(run_cases, world, timeout_s=150)
    for rank_counts in counts:
        assert rank_counts == counts[0], "ranks ran different cases"
    names = {case.__name__ for case in CASES}
    assert len(counts[0]) >= len(names), counts[0]
    for op in WITH_GLOO:
        assert counts[0][op][1] > 0, f"{op}: never compared with gloo ({counts[0]})"
