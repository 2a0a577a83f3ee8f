"""PyTorch's own distributed test cases on the "mep" backend.

torch ships the test cases it runs for every backend in
torch.testing._internal.distributed.distributed_test (the class
DistributedTest._DistTestBase, on top of common_distributed's
MultiProcessTestCase); its test/distributed/test_distributed_spawn.py runs
them for gloo as ``class TestDistBackendWithSpawn(TestDistBackend,
DistributedTest._DistTestBase)`` with the environment variables BACKEND
(the backend's name), WORLD_SIZE (processes per case) and INIT_METHOD, all
read when the module is imported; each case starts WORLD_SIZE processes
that init_process_group(BACKEND) over a file:// store and run the case.

This runner does the same with BACKEND=mep, for the list RUN below: the CPU
cases that apply to a backend like mep. Processes are forked, not spawned,
so a case does not pay for importing torch again in every rank (the parent
itself never makes a process group). Some cases that apply carry a skip
that names gloo ("Only gloo backend supports timeouts", "Test requires
backend mep to be one of {'gloo'}"): for those listed in UNGATED the runner
lifts exactly that skip (and no other) and runs them as they are. EXCLUDED
says, for every other case of the class, why it does not run. A listed case
that fails, errors or is skipped fails the run.

usage: torch_suite.py [--pythonpath DIR] [--not-built WHY] [--world-size N]
                      [--list] [CASE...]
Exit 77 (skip) when the backend was not built or torch's test modules cannot
be imported (they need the package expecttest).
"""
import argparse
import os
import re
import sys
import tempfile
import time
import unittest

SKIP = 77

# ---------------------------------------------------------------- the list

RUN = [
    # process groups, ranks, backend names
    "test_get_rank", "test_get_backend", "test_Backend_enum_class",
    "test_destroy_group", "test_destroy_full_group", "test_get_rank_size_group",
    "test_get_rank_size_full_group", "test_dump_DDP_relevant_env_vars",
    # point-to-point
    "test_send_recv", "test_send_recv_autograd_profiler", "test_send_recv_with_tag",
    "test_send_recv_with_tag_autograd_profiler", "test_send_recv_any_source",
    "test_send_recv_any_source_autograd_profiler", "test_isend",
    "test_isend_autograd_profiler", "test_irecv", "test_batch_isend_irecv_gloo",
    "test_batch_isend_irecv_gloo_tags",
    # collectives
    "test_broadcast", "test_broadcast_full_group",
    "test_reduce_sum", "test_reduce_product", "test_reduce_min", "test_reduce_max",
    "test_reduce_full_group_sum",
    "test_reduce_full_group_product", "test_reduce_full_group_min",
    "test_reduce_full_group_max", "test_reduce_sum_twice",
    "test_all_reduce_sum", "test_all_reduce_sum_async", "test_all_reduce_sum_complex",
    "test_all_reduce_complex_unsupported_ops", "test_all_reduce_product",
    "test_all_reduce_min", "test_all_reduce_max", "test_all_reduce_full_group_sum",
    "test_all_reduce_full_group_product", "test_all_reduce_full_group_min",
    "test_all_reduce_full_group_max", "test_all_reduce_coalesced_sum",
    "test_all_reduce_coalesced_product", "test_all_reduce_coalesced_min",
    "test_all_reduce_coalesced_max", "test_all_reduce_coalesced_full_group_sum",
    "test_all_reduce_coalesced_full_group_product",
    "test_all_reduce_coalesced_full_group_min",
    "test_all_reduce_coalesced_full_group_max",
    "test_all_reduce_coalesced_max_complex_unsupported",
    "test_scatter_checks", "test_scatter", "test_scatter_complex", "test_scatter_full_group", "test_gather_checks", "test_gather", "test_gather_full_group", "test_all_gather", "test_all_gather_complex",
    "test_all_gather_full_group",
    "test_all_gather_coalesced_simple", "test_all_gather_coalesced_complex",
    "test_all_gather_coalesced_full_group",
    "test_all_gather_coalesced_with_empty",
    "test_all_to_all_single_equal_split", "test_all_to_all_single_equal_split_complex",
    "test_all_to_all_single_unequal_split", "test_all_to_all_single_unequal_split_complex",
    "test_all_to_all", "test_all_to_all_complex", "test_all_to_all_single_equal_split_full_group",
    "test_all_to_all_single_unequal_split_full_group", "test_all_to_all_full_group",
    "test_get_future",
    # barriers, monitored barriers, timeouts
    "test_barrier", "test_barrier_full_group",
    "test_barrier_timeout_full_group",
    "test_barrier_timeout_global",
    "test_monitored_barrier_gloo", "test_monitored_barrier_gloo_subgroup",
    "test_monitored_barrier_gloo_rank_0_timeout", # object collectives
    "test_all_gather_object_default_pg", "test_all_gather_object_subgroup",
    "test_scatter_object_list",
    # DistributedDataParallel on CPU modules
    "test_DistributedDataParallelCPU", "test_DistributedDataParallelCPU_grad_is_view",
    "test_DistributedDataParallel_requires_grad", "test_ddp_create_graph",
    "test_static_graph_api_cpu",
    "test_grads_same_across_ranks_with_no_sync",
]

# Cases that need WORLD_SIZE=4 exactly: a second run (--world-size 4).
RUN_AT_4 = ["test_gather_object", "test_gather_object_subgroup",
            "test_new_subgroups_with_group_param"]

# Cases that torch runs only from WORLD_SIZE=8 up (skip_if_small_worldsize):
# a group of ranks [1, 2] beside the others, and barriers that several ranks
# skip. A third run (--world-size 8).
RUN_AT_8 = [
    "test_broadcast_group",
    "test_reduce_group_sum",
    "test_reduce_group_product",
    "test_reduce_group_min",
    "test_reduce_group_max",
    "test_all_reduce_group_sum",
    "test_all_reduce_group_product",
    "test_all_reduce_group_min",
    "test_all_reduce_group_max",
    "test_all_reduce_coalesced_group_sum",
    "test_all_reduce_coalesced_group_product",
    "test_all_reduce_coalesced_group_min",
    "test_all_reduce_coalesced_group_max",
    "test_scatter_group",
    "test_gather_group",
    "test_all_gather_group",
    "test_all_gather_coalesced_group",
    "test_all_to_all_single_equal_split_group",
    "test_all_to_all_single_unequal_split_group",
    "test_all_to_all_group",
    "test_barrier_group",
    "test_barrier_timeout_group",
    "test_monitored_barrier_failure_order",
    "test_monitored_barrier_wait_all_ranks"]

# Listed cases whose only obstacle is a skip that names another backend
# (what torch says, matched by its text): the runner lifts that skip.
UNGATED = {
    "Only gloo backend supports timeouts": [
        "test_barrier_timeout_group", "test_barrier_timeout_full_group",
        "test_barrier_timeout_global"],
    "GLOO Batch Send Recv CPU": [
        "test_batch_isend_irecv_gloo", "test_batch_isend_irecv_gloo_tags"],
    "Only MPI supports": [  # all_to_all on CPU tensors: mep has it
        n for n in RUN + RUN_AT_8 if n.startswith("test_all_to_all")],
    "Test requires backend mep to be one of": [  # gloo's, or every GPU backend's
        n for n in RUN + RUN_AT_8
        if n.startswith(("test_all_reduce_coalesced_", "test_monitored_barrier"))
        and n != "test_all_reduce_coalesced_max_complex_unsupported"]
        + ["test_scatter_object_list", "test_grads_same_across_ranks_with_no_sync",
           "test_all_gather_object_default_pg", "test_all_gather_object_subgroup",
           "test_gather_object", "test_gather_object_subgroup"],
    "does not support creating subgroups on CUDA devices": [  # CPU here
        "test_new_subgroups_with_group_param"],
    "does not support DistributedDataParallel": [
        "test_DistributedDataParallel_requires_grad"],
    "get_future is only supported on mpi, nccl and gloo": ["test_get_future"],
}

# Every other case of _DistTestBase, by why it does not run here.
EXCLUDED = {
    "needs CUDA devices or NCCL (skip_if_no_gpu, skip_if_lt_x_gpu, requires_nccl_version, "
    "a CUDA body); mep's CUDA collectives are checked against NCCL in "
    "tests/gpu/test_c10d_cuda.py":
        r"cuda|_nccl|nccl_|multigpu|_gpu$|test_new_subgroups(?!_with_group_param)|"
        r"model_averager|"
        r"test_batch_isend_irecv_(op_err|op_list_err|mixed_backend_err)|"
        r"average_parameters|hierarchical|SyncBatchNorm|test_DistributedDataParallel$|"
        r"DistributedDataParallel_(non_default_stream|with_amp|SyncBatchNorm)|"
        r"test_ddp_(?!create_graph|logging_data_cpu)|post_localSGD|test_coalescing_manager|"
        r"test_DistributedSampler|sync_bn|test_different_graph|test_undefined_grad|"
        r"test_SyncBatchNorm_process_group|"
        r"test_verify_model|test_compute_bucket|test_output_unused|test_invalid_static|"
        r"test_skip_all_reduce|test_stateless_api|test_static_graph_multi|"
        r"test_get_data_parallel_params|test_detect_ddp|test_periodic|"
        r"test_monitored_barrier_allreduce_hang",
    "torch's DDP logger records every third-party backend as 'custom' "
    "(ProcessGroup::getBackendName) and the case compares that with "
    "dist.get_backend(), 'mep'": r"test_ddp_logging_data_cpu",
    "gloo-only internals: sparse tensors (mep reduces dense tensors only)":
        r"test_sparse_all_reduce",
    "written for gloo, mpi and nccl by name (the body builds its model only for those "
    "backends)": r"test_accumulate_gradients_no_sync",
    "skipped by torch itself on Linux or everywhere (known upstream failures)":
        r"test_barrier_timeout_arg|test_broadcast_object_list",
    "the torch profiler (kineto) variants of cases listed with the autograd profiler: "
    "the same operations, several times slower to start":
        r"_torch_profiler$",
}


def excluded_reason(name):
    for why, pattern in EXCLUDED.items():
        if re.search(pattern, name):
            return why
    return None


# --------------------------------------------------------------- set-up

def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pythonpath", default="",
                    help="the build directory holding the mep package")
    ap.add_argument("--not-built", default="", help="why the backend was not built")
    ap.add_argument("--world-size", type=int, default=3)
    ap.add_argument("--list", action="store_true",
                    help="print what runs and what is excluded, and why; run nothing")
    ap.add_argument("cases", nargs="*", help="a subset of RUN (default: all of it)")
    return ap.parse_args()


ARGS = parse() if __name__ == "__main__" else None

if ARGS is not None:
    if ARGS.not_built:
        print(f"skip: the c10d backend was not built: {ARGS.not_built}")
        sys.exit(SKIP)
    if ARGS.pythonpath:
        sys.path.insert(0, ARGS.pythonpath)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (ARGS.pythonpath, os.environ.get("PYTHONPATH")) if p)
    # What distributed_test reads when it is imported.
    os.environ["BACKEND"] = "mep"
    os.environ["WORLD_SIZE"] = str(ARGS.world_size)
    # test_barrier_timeout_global re-creates the default group through
    # INIT_METHOD; a file of its own for the run.
    _init_dir = tempfile.mkdtemp(prefix="mep-torch-suite-")
    os.environ["INIT_METHOD"] = f"file://{_init_dir}/init"
    os.environ.setdefault("MEP_TCP_IFNAME", "lo")  # loopback only, as every test
    # The profiler cases' kineto complains that it finds no GPU.
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    try:
        import torch  # noqa: F401
        import mep  # noqa: F401  registers "mep"
        from torch.testing._internal import common_distributed
        from torch.testing._internal.distributed import distributed_test as dt
    except ImportError as e:
        print(f"skip: torch's distributed test modules do not import: {e} "
              "(torch.testing._internal needs the package expecttest)")
        sys.exit(SKIP)


def lift_gates():
    """Removes, from the listed UNGATED cases only, the skip whose reason
    names another backend; every other skip of theirs stays."""
    for reason, names in UNGATED.items():
        for name in names:
            fn, lifted = getattr(dt.DistributedTest._DistTestBase, name), False
            while fn is not None:
                why = getattr(fn, "__unittest_skip_why__", "")
                if getattr(fn, "__unittest_skip__", False) and reason in why:
                    fn.__unittest_skip__ = False
                    lifted = True
                fn = getattr(fn, "__wrapped__", None)
            if not lifted:
                raise SystemExit(f"torch_suite: {name} has no skip saying "
                                 f"'{reason}' to lift: torch changed; revisit the list")


def make_case_class():
    class TestMepBackend(dt.TestDistBackend, dt.DistributedTest._DistTestBase):
        """gloo's TestDistBackendWithSpawn, with forked ranks."""

        def setUp(self):
            super().setUp()
            import torch.multiprocessing as tmp
            self._start_processes(tmp.get_context("fork").Process)

    return TestMepBackend


class Result(unittest.TextTestResult):
    """One line per case: its outcome and how long it took."""

    def _line(self, test, what):
        took = time.monotonic() - self._t0
        self.stream.write(f"{what:5} {test.id().split('.')[-1]} ({took:.1f} s)\n")
        self.stream.flush()

    def startTest(self, test):
        self._t0 = time.monotonic()
        super().startTest(test)

    def addSuccess(self, test):
        super().addSuccess(test)
        self._line(test, "ok")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._line(test, "FAIL")

    def addError(self, test, err):
        super().addError(test, err)
        self._line(test, "ERROR")

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._line(test, "SKIP")


def main():
    # Each case's "Started process" lines are torch's INFO logs.
    import logging
    logging.getLogger(common_distributed.__name__).setLevel(logging.WARNING)
    base = dt.DistributedTest._DistTestBase
    every = sorted(n for n in dir(base) if n.startswith("test_"))
    listed = RUN + RUN_AT_4 + RUN_AT_8
    unknown = [n for n in listed if n not in every]
    if unknown:
        print(f"torch_suite: not in this torch's _DistTestBase: {unknown}")
        return 1
    unsorted = [n for n in every if n not in listed and not excluded_reason(n)]
    if unsorted:
        print(f"torch_suite: cases neither run nor excluded (add them to RUN or "
              f"EXCLUDED): {unsorted}")
        return 1
    lift_gates()  # checks that each lifted skip is still what torch says
    if ARGS.list:
        for world, names in ((3, RUN), (4, RUN_AT_4), (8, RUN_AT_8)):
            print(f"runs at WORLD_SIZE={world} ({len(names)}):")
            for n in names:
                print(f"  {n}")
        print("excluded:")
        for why in EXCLUDED:
            names = [n for n in every if n not in listed and excluded_reason(n) == why]
            print(f"  {why}:\n    " + "\n    ".join(names))
        return 0
    mine = {4: RUN_AT_4, 8: RUN_AT_8}.get(ARGS.world_size, RUN)
    cases = ARGS.cases or mine
    bad = [c for c in cases if c not in mine]
    if bad:
        print(f"torch_suite: not listed for WORLD_SIZE={ARGS.world_size}: {bad}")
        return 2
    cls = make_case_class()
    suite = unittest.TestSuite(cls(name) for name in cases)
    t0 = time.monotonic()
    res = unittest.TextTestRunner(verbosity=0, resultclass=Result,
                                  stream=sys.stdout).run(suite)
    took = time.monotonic() - t0
    skipped = [(t.id().split(".")[-1], why) for t, why in res.skipped]
    print(f"\n{res.testsRun} torch cases on mep in {took:.0f} s: "
          f"{len(res.failures)} failed, {len(res.errors)} errors, "
          f"{len(skipped)} skipped")
    for name, why in skipped:
        print(f"  skipped (a listed case must run): {name}: {why}")
    return 0 if res.wasSuccessful() and not skipped else 1


if __name__ == "__main__":
    sys.exit(main())
