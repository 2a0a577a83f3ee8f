"""Runs a function on N ranks, each its own process, with a deadline.

The parent serves a TCPStore on a free port (bound to port 0, so the
kernel picks it); every rank connects to it, runs `fn(ctx, *args)` and
reports its return value or its traceback. Ranks still running at the
deadline are killed; every process is joined before run_ranks returns.
"""
import dataclasses
import datetime
import multiprocessing as mp
import os
import queue
import signal
import time
import traceback

import torch.distributed as dist

# Tests talk over loopback only, whatever the machine has.
os.environ.setdefault("MEP_TCP_IFNAME", "lo")


@dataclasses.dataclass
class Ctx:
    rank: int
    world: int
    port: int
    store: "dist.Store"
    timeout: datetime.timedelta

    def connect(self) -> "dist.Store":
        """Another client of the test's store (as a new process would)."""
        return dist.TCPStore("127.0.0.1", self.port, is_master=False,
                             timeout=self.timeout)


class RankFailed(AssertionError):
    pass


def _entry(fn, rank, world, port, timeout_s, args, results, env):
    # the parent's environment when it started this rank, as a spawned
    # process would have it (a forked one has the fork server's)
    os.environ.clear()
    os.environ.update(env)
    # MEP_LAUNCH_HOSTS=1: each rank a host of its own, as the C launcher
    # (tools/common/launch.c) makes them
    if os.environ.get("MEP_LAUNCH_HOSTS") == "1":
        os.environ["MEP_HOST_ID"] = f"mep-launch-host-{rank}"
    try:
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.TCPStore("127.0.0.1", port, is_master=False,
                              timeout=timeout)
        ctx = Ctx(rank, world, port, store, timeout)
        results.put((rank, "ok", fn(ctx, *args)))
    except BaseException:  # report everything, assertion or not
        results.put((rank, "error", traceback.format_exc()))
    finally:
        # Skip interpreter teardown: a rank's result is in; torch's atexit
        # handlers add nothing and may wait on dead peers.
        try:
            results.close()
            results.join_thread()
        finally:
            os._exit(0)


class Ranks:
    """Started ranks; `wait` collects them (see run_ranks)."""

    def __init__(self, fn, world, args=(), timeout_s=60.0, env=None,
                 ranks=None, store=None):
        # Ranks fork from a server process that imported torch once: a
        # spawned rank imports it again, seconds of CPU each, most of
        # these tests' time on a small machine.
        self.ctx = mp.get_context("forkserver")
        self.ctx.set_forkserver_preload(["torch", "torch.distributed"])
        self.results = self.ctx.Queue()
        self.store = store or dist.TCPStore("127.0.0.1", 0, is_master=True,
                                            wait_for_workers=False,
                                            timeout=datetime.timedelta(seconds=timeout_s))
        self.port = self.store.port
        self.timeout_s = timeout_s
        self.procs = {}
        self.start(fn, world, args, env, ranks)

    def start(self, fn, world, args=(), env=None, ranks=None):
        """Starts more ranks over the same store (replacements, growth)."""
        for r in (range(world) if ranks is None else ranks):
            p = self.ctx.Process(target=_entry, daemon=True,
                                 args=(fn, r, world, self.port, self.timeout_s,
                                       args, self.results, {**os.environ, **(env or {})}))
            p.start()
            self.procs.setdefault(r, []).append(p)

    def kill(self, rank, sig=signal.SIGKILL):
        for p in self.procs.get(rank, []):
            if p.is_alive():
                os.kill(p.pid, sig)

    def wait(self, deadline_s=None, expect_dead=()):
        """Results by rank. Ranks in expect_dead may die without one."""
        deadline = time.monotonic() + (deadline_s or self.timeout_s)
        want = {r for r in self.procs if r not in expect_dead}
        got, errors = {}, {}
        try:
            while want - got.keys() - errors.keys():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    rank, kind, val = self.results.get(timeout=min(left, 0.5))
                except queue.Empty:
                    # A rank that died without a result will never send one.
                    for r in want - got.keys() - errors.keys():
                        if all(p.exitcode is not None for p in self.procs[r]) \
                                and self.results.empty():
                            time.sleep(0.2)
                            if self.results.empty():
                                codes = [p.exitcode for p in self.procs[r]]
                                errors[r] = f"exited with {codes} and no result"
                    continue
                (got if kind == "ok" else errors)[rank] = val
        finally:
            self.close()
        missing = want - got.keys() - errors.keys()
        for r in sorted(missing):
            errors[r] = f"no result within {deadline_s or self.timeout_s:.0f} s"
        if errors:
            msg = "\n".join(f"--- rank {r}:\n{e}" for r, e in sorted(errors.items()))
            raise RankFailed(msg)
        return got

    def close(self):
        for ps in self.procs.values():
            for p in ps:
                if p.is_alive():
                    p.kill()
        for ps in self.procs.values():
            for p in ps:
                p.join(timeout=10)


def run_ranks(fn, world, *args, timeout_s=60.0, env=None):
    """Runs fn(ctx, *args) on `world` ranks; returns [result of rank r]."""
    got = Ranks(fn, world, args, timeout_s, env).wait()
    return [got[r] for r in range(world)]
