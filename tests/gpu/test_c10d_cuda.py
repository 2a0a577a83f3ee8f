"""The "mep" c10d backend on CUDA tensors, against a reference backend.

With two or more GPUs: 2 ranks, one GPU each, reference NCCL. With one GPU:
2 and 3 ranks sharing it, reference gloo on CPU copies (NCCL cannot put two
ranks on one GPU). Every rank also checks each result against the reduction
of all ranks' inputs computed locally (c10d_cuda_worker.py says how).
Scenarios run in fresh processes with a deadline; the parent kills and reaps
what is late. Prints `N passed, N failed`; exits 1 on any failure, 77 (skip)
without a GPU or without the CUDA build of the backend.

Run: PYTHONPATH=<build>/frontends/c10d/python python3 tests/gpu/test_c10d_cuda.py
"""
import multiprocessing as mp
import os
import queue
import sys
import time

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
# (scenario, deadline in seconds)
SCENARIOS = [("allreduce", 420), ("move", 420), ("rooted", 420),
             ("uneven", 240), ("graph", 120),
             ("async", 120), ("kill", 90)]


def skip_reason():
    try:
        import torch
    except ImportError as e:
        return f"torch is not importable: {e}"
    if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
        return "no CUDA GPU is visible"
    try:
        import mep
    except ImportError as e:
        return f"the mep package is not importable (PYTHONPATH): {e}"
    if not mep.cuda_build:
        return "the mep backend was built without CUDA tensors"
    return None


def run_scenario(name, world, ref, one_gpu, deadline_s):
    """Runs one scenario on `world` ranks; returns (passed, failures, notes)."""
    import torch.distributed as dist
    sys.path.insert(0, HERE)
    import c10d_cuda_worker as worker
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    env = {"MEP_TCP_IFNAME": "lo", "NCCL_NVLS_ENABLE": "0"}
    if name == "kill":
        env["MEP_CORE_TIMEOUT_MS"] = "3000"
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=worker.entry,
                         args=(r, world, store.port, name, ref, one_gpu, env, results))
             for r in range(world)]
    for p in procs:
        p.start()
    expect = world - 1 if name == "kill" else world
    got, passed, failed, notes = 0, 0, [], []
    end = time.monotonic() + deadline_s
    while got < expect:
        left = end - time.monotonic()
        if left <= 0:
            failed.append(f"{name} on {world} ranks: {expect - got} rank(s) still "
                          f"running after {deadline_s} s (killed)")
            break
        try:
            _rank, p_ok, p_failed, p_notes = results.get(timeout=min(left, 1.0))
        except queue.Empty:
            if all(not p.is_alive() for p in procs) and results.empty():
                failed.append(f"{name} on {world} ranks: ranks exited without "
                              f"a result (exit codes {[p.exitcode for p in procs]})")
                break
            continue
        got += 1
        passed += p_ok
        failed += p_failed
        notes += p_notes
    for p in procs:
        p.join(timeout=max(0.0, min(10.0, end + 10 - time.monotonic())))
        if p.is_alive():
            p.kill()
            p.join()
    del store
    return passed, failed, notes


def main():
    why = skip_reason()
    if why:
        print(f"skip: {why}")
        return SKIP
    import torch
    ngpu = torch.cuda.device_count()
    configs = [(2, "nccl", False)] if ngpu >= 2 else [(2, "gloo", True), (3, "gloo", True)]
    only = os.environ.get("MEP_TEST_SCENARIOS")  # e.g. "allreduce,graph"
    passed, failed = 0, []
    for world, ref, one_gpu in configs:
        for name, deadline in SCENARIOS:
            if only and name not in only.split(","):
                continue
            t0 = time.monotonic()
            p, f, notes = run_scenario(name, world, ref, one_gpu, deadline)
            passed += p
            failed += f
            print(f"{name} on {world} ranks (reference {ref}): {p} passed, "
                  f"{len(f)} failed, {time.monotonic() - t0:.1f} s", flush=True)
            for n in sorted(set(notes)):
                print(f"  note: {n}")
            for msg in f[:20]:
                print(f"  FAIL {msg}")
    print(f"{passed} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
