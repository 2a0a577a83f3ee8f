#!/usr/bin/env python3
"""bench-scaling.py - what mep costs each rank against the number of ranks
(docs/scaling.md), on one machine, over the tcp transport on CPU.

For each N of --ranks (default 2,4,8,16) it runs tools/mep-scale-probe
(N forked ranks) --reps times and prints markdown tables of:
  - memory per rank: resident set after the communicator is made, and
    what an EP buffer of the CPU path adds, against the formulas below
    (the EP size hint, the point-to-point rings, the control channel, ...);
  - time per call: 8-byte all-reduce, barrier, all-to-all of 1 KiB per
    peer, EP dispatch + combine (each the median over --iters calls on
    each rank, the slowest rank's, the median over the repetitions);
  - sockets per rank (from /proc/<pid>/fd) against (N-1) x sockets_per_peer
    + 1 listening + 1 to the store, and the store requests each rank's
    mep_comm_create made (counted by the launcher's store) against
    2 (N-1) + 3;
then, at the largest N, the time from a SIGKILL of one rank to every
survivor's degraded completion of its in-flight all-reduce
(tools/mep-ft-bench, as docs/perf.md "Time from a lost rank ..." measures).

--project prints the formulas' projection to 64, 256 and 1024 ranks (and
the measured N) without running anything; --check-formulas compares the
formulas with the library (the test tests/tools/scaling runs it) and
docs/scaling.md's projection table with --project's.

Every child has a deadline and is killed with its process group after
it; the store and the transport listen on ports the system picks. Exits
nonzero when any run or check fails. It builds into --build-dir (release,
no tests) first; without inih on the system, run scripts/carry-inih.sh on
a machine that has it and bring .carry along.
"""
import argparse
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "scaling.md")

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
PAGE = 4096

# --------------------------------------------------------------- formulas
# Written from the code (docs/scaling.md cites each place); the test
# compares them with the library, so neither goes stale unnoticed.

# [core] defaults (core/src/config.c) and [tcp] sockets_per_peer.
CORE = {"buffer_bytes": 16 * MIB, "chunk_bytes": 1 * MIB,
        "sockets_per_peer": 1}

# Sizes of the per-rank structures the formulas use (checked against the
# build's sizeof by --check-formulas).
SIZEOF = {"ctl_hdr": 88, "ft_peer": 152, "peer": 24, "remote": 16,
          "p2p_pair": 544}

EP_ALIGN = 4096        # MEP_EP_ALIGN, frontends/ep/src/layout.h
EP_MSG_HEADER = 16     # MEP_EP_MSG_HEADER
EP_STAGE_TOPK = 16     # MEP_EP_STAGE_TOPK = MEP_EP_MAX_TOPK
EP_MAX_LOCAL = 1024    # MEP_EP_MAX_LOCAL_EXPERTS
TCP_RXBUF = 32 * KIB   # TCP_RXBUF_LEN, plugins/tcp/tcp.h
CORE_REGIONS = 9       # coll 3, p2p 3, control channel 3 (comm_state.c)


def up(v, a):
    return (v + a - 1) // a * a


def ep_layout_bytes(R, T, H, E):
    """mep_ep_size_hint(T, H, R, E): the areas of layout.h, in order, each
    rounded up to 4096 bytes; 0 for parameters create would refuse."""
    if (R < 1 or T < 1 or H < 128 or H % 128 or E < R or E % R or
            E // R > EP_MAX_LOCAL or T * R > 2**31 - 1 or
            2.0 * E * T * (16.0 + 2.0 * H) * 3 > float(1 << 50)):
        return 0
    L = E // R
    msg = EP_MSG_HEADER + 2 * H  # bf16 data is the larger
    areas = [
        2 * R * T * msg,                  # dispatch receive [2][R][T] msgs
        2 * R * L * 8,                    # dispatch counts [2][R][L]
        2 * L * R * T * 4,                # dispatch index [2][R][L][T]
        2 * E * T * 2 * H,                # combine receive [2][E][T][H] bf16
        2 * E * 8,                        # combine flags [2][E]
        2 * E * T * 4,                    # combine map [2][E][T]
        R * 8,                            # combine read-done [R]
        2 * R * T * EP_STAGE_TOPK * 8,    # combine weights
        2 * R * 8,                        # their flags
        2 * R * T * H * 4,                # combine partial sums, float
        2 * R * 8,                        # their per-rank flags
        2 * R * T * 8,                    # their per-token flags
        T * EP_STAGE_TOPK * msg,          # dispatch stage
        E * T * 4,                        # index stage [E][T]
        E * 8,                            # count stage [R][L]
        L * R * T * 2 * H,                # combine stage
    ]
    off = 0
    for a in areas:
        off = up(off + a, EP_ALIGN)
    return off


def ep_host_bytes(R, T, H, E):
    """The CPU path's region (ep_host.c): the layout, the size hint;
    zeroed at creation, so all resident."""
    return ep_layout_bytes(R, T, H, E)


def p2p_geometry(buffer_bytes, chunk_bytes, npeers):
    """mep__p2p_geometry (core/src/p2p_ring.c): (slot, nslots, ring)."""
    share = buffer_bytes // npeers
    slot = min(chunk_bytes, share // 2) & ~63
    slot = max(slot, 4096)
    nslots = max(share // slot, 2)
    return slot, nslots, slot * nslots


def core_bytes(N, cfg=CORE):
    """Per-rank bytes of a communicator of N ranks (max_size N), by part.
    'zeroed': written at creation, so resident from the start;
    'lazy': allocated, resident only as far as it is used."""
    chunk = cfg["chunk_bytes"] & ~63
    k = cfg["sockets_per_peer"]
    parts = {}
    # collectives (coll.c): send + receive staging, [N][2] slots of
    # 64 + chunk each; signal words, per-peer counters, the accumulator.
    parts["coll staging"] = ("lazy", 2 * N * 2 * (64 + chunk))
    parts["coll small"] = ("lazy", 16 * N + 24 * N + 2 * chunk)
    # point-to-point (p2p.c): rings + their send staging, both zeroed,
    # head/tail words, per-pair state.
    if N > 1:
        _, _, ring = p2p_geometry(cfg["buffer_bytes"], cfg["chunk_bytes"],
                                  N - 1)
        parts["p2p rings"] = ("zeroed", 2 * (N - 1) * ring + up(16 * N, 64))
    else:
        parts["p2p rings"] = ("zeroed", 0)
    parts["p2p pairs"] = ("zeroed", N * SIZEOF["p2p_pair"])
    # control channel (ft.c): in + out [N][2] snapshots of
    # slot_bytes(N) = roundup64(header + 2N), views N x N, per-peer state.
    slot = up(SIZEOF["ctl_hdr"] + 2 * N, 64)
    parts["control channel"] = (
        "lazy", 4 * N * slot + 8 * N + N * N + N * SIZEOF["ft_peer"] +
        up(4 * N, PAGE) + 4 * N + 4 * N + 2 * N + slot)
    # route table (comm.h): a peer entry each, incarnations, and each
    # region's per-peer remote keys.
    parts["route table"] = ("zeroed", N * SIZEOF["peer"] + 8 * N +
                            CORE_REGIONS * N * SIZEOF["remote"])
    # tcp (plugins/tcp): k sockets per peer, a receive buffer per socket
    # made on its first message.
    parts["tcp rx buffers"] = ("lazy", (N - 1) * k * TCP_RXBUF)
    return parts


def sockets_per_rank(N, k):
    """Sockets a rank of mep-scale-probe holds: k per peer, the tcp
    listener, the launcher's store connection."""
    return (N - 1) * k + 2


def agreement_traffic(N):
    """Control messages after one rank of N is lost (ft.c), S = N - 1
    survivors: the coordinator (the lowest unsuspected rank) queries the
    S-1 others (mark_all), each answers (up to twice: once on entering
    the agreement, once to the query), then every survivor announces the
    new epoch to every other (adopt -> mark_all): 3(S-1) + S(S-1). Each is
    a snapshot of slot_bytes(N) = roundup64(88 + 2N) bytes and an 8-byte
    signal. Returns (messages, bytes, the coordinator's sends, slot)."""
    S = N - 1
    msgs = 3 * (S - 1) + S * (S - 1)
    slot = up(SIZEOF["ctl_hdr"] + 2 * N, 64)
    return msgs, msgs * (slot + 8), 2 * (S - 1), slot


def setup_store_ops(N):
    """Store requests of one rank at creation (comm.c, region_state.c):
    the secret, its card and N-1 cards, its state (the 9 regions' keys in
    one value) and N-1 peers' states (read once each; the 6 imports per
    peer take their keys from it)."""
    return 1 + 1 + (N - 1) + 1 + (N - 1)


def decode_experts(N):
    """Experts for the DeepSeek-like projection: 256 rounded up to a
    multiple of N (one expert per rank beyond 256 ranks)."""
    return up(256, N)


def fmt_bytes(b):
    for unit, div in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if b >= div:
            return "%.1f %s" % (b / div, unit)
    return "%d B" % b


def projection(ranks, ep):
    """The projection table (markdown) for these N."""
    T, H, L = ep["tokens"], ep["hidden"], ep["local"]
    k = CORE["sockets_per_peer"]
    out = ["| ranks | p2p rings + staging (zeroed) | collective staging "
           "(allocated) | control channel | route table | tcp sockets / "
           "rx buffers | EP CPU buffer, T=%d H=%d %d experts/rank | EP "
           "buffer, T=128 H=7168 E=256 rounded up to a multiple of N | agreement after a loss: "
           "messages (coordinator sends) | agreement bytes, all ranks | store "
           "requests at creation, all ranks |" % (T, H, L),
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for N in ranks:
        p = core_bytes(N)
        msgs, byts, per_rank, _ = agreement_traffic(N)
        out.append("| %d | %s | %s | %s | %s | %d / %s | %s | %s | %d (%d) "
                   "| %s | %d |" % (
                       N, fmt_bytes(p["p2p rings"][1]),
                       fmt_bytes(p["coll staging"][1]),
                       fmt_bytes(p["control channel"][1]),
                       fmt_bytes(p["route table"][1] + p["p2p pairs"][1]),
                       (N - 1) * k + 1, fmt_bytes(p["tcp rx buffers"][1]),
                       fmt_bytes(ep_host_bytes(N, T, H, N * L)),
                       fmt_bytes(ep_layout_bytes(N, 128, 7168,
                                                 decode_experts(N))),
                       msgs, per_rank, fmt_bytes(byts),
                       N * setup_store_ops(N)))
    return "\n".join(out)


# ------------------------------------------------------------ processes

LIVE = set()  # process groups of running children


def kill_live(*_):
    for pg in list(LIVE):
        try:
            os.killpg(pg, signal.SIGKILL)
        except OSError:
            pass
    sys.exit(130)


def run(cmd, timeout, env=None):
    """Runs cmd in a session of its own; at the deadline its whole process
    group is killed. Returns (rc, stdout, stderr); rc 124 on timeout."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env, start_new_session=True)
    LIVE.add(p.pid)
    try:
        out, err = p.communicate(timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        rc, err = 124, err + "\n(killed after %d s)" % timeout
    finally:
        try:  # ranks a crashed launcher left behind
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        LIVE.discard(p.pid)
    return rc, out, err


def machine():
    model = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = "?"
    try:
        with open("/proc/meminfo") as f:
            mem = "%.0f GiB" % (int(f.readline().split()[1]) / MIB)
    except (OSError, ValueError, IndexError):
        pass
    return "%d cores (nproc), %s, %s, Linux %s, load %s" % (
        os.cpu_count() or 0, model, mem, os.uname().release,
        " ".join("%.1f" % x for x in os.getloadavg()))


def mem_available():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * KIB
    except (OSError, ValueError):
        pass
    return None


def build(bdir, args_jobs=0):
    """Builds what the script runs into bdir (release, no tests), with the
    carried inih (scripts/carry-inih.sh) when the system has none."""
    env = dict(os.environ)
    if subprocess.call(["pkg-config", "--exists", "inih"],
                       stderr=subprocess.DEVNULL) != 0:
        carry = os.path.join(ROOT, ".carry", "inih", "lib")
        env["PKG_CONFIG_PATH"] = os.path.join(carry, "pkgconfig")
        env["LD_LIBRARY_PATH"] = carry + ":" + env.get("LD_LIBRARY_PATH", "")
    if not os.path.exists(os.path.join(bdir, "build.ninja")):
        rc, out, err = run(["meson", "setup", bdir, "-Dtests=false",
                            "-Dc10d=disabled", "-Dcuda=disabled",
                            "-Dbuildtype=release"], 600, env)
        if rc:
            sys.exit("bench-scaling: meson setup failed:\n" + out + err)
    jobs = ["-j", str(args_jobs)] if args_jobs else []
    rc, out, err = run(["ninja", "-C", bdir] + jobs + ["tools/mep-scale-probe",
                        "tools/mep-ft-bench", "plugins/tcp/"
                        "libmep-transport-tcp.so"], 1800, env)
    if rc:
        sys.exit("bench-scaling: build failed:\n" + out + err)


def child_env(bdir):
    env = dict(os.environ)
    env.update({"MEP_PLUGIN_PATH": os.path.join(bdir, "plugins", "tcp"),
                "MEP_TRANSPORTS": "tcp", "MEP_TCP_IFNAME": "lo",
                "MEP_TCP_PORT_RANGE": "0", "MEP_LOG": "error",
                "MEP_TCP_SOCKETS_PER_PEER": str(CORE["sockets_per_peer"])})
    env.pop("MEP_CONFIG", None)  # the formulas assume the defaults
    for key in ("MEP_CORE_BUFFER_BYTES", "MEP_CORE_CHUNK_BYTES"):
        env.pop(key, None)
    carry = os.path.join(ROOT, ".carry", "inih", "lib")
    if os.path.isdir(carry):
        env["LD_LIBRARY_PATH"] = carry + ":" + env.get("LD_LIBRARY_PATH", "")
    return env


# -------------------------------------------------------------- the runs

def parse_probe(out, N):
    rows = []
    for line in out.splitlines():
        if not line.startswith("probe "):
            continue
        d = {}
        for kv in line.split()[1:]:
            key, _, val = kv.partition("=")
            d[key] = float(val) if "." in val else int(val)
        rows.append(d)
    ranks = sorted(r["rank"] for r in rows)
    if ranks != list(range(N)):
        raise ValueError("expected one line per rank 0..%d, got ranks %s"
                         % (N - 1, ranks))
    return rows


def refuse(ranks, args):
    """The reasons this machine cannot run these rank counts, if any."""
    why = []
    ncpu = os.cpu_count() or 1
    k = CORE["sockets_per_peer"]
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    avail = mem_available()
    for N in ranks:
        if N < 2:
            why.append("%d ranks: at least 2 are needed" % N)
        if N > 256:
            why.append("%d ranks: mep-ft-bench runs at most 256" % N)
        if N > 4 * ncpu and not args.oversubscribe:
            why.append("%d ranks on %d cores: more than 4 ranks per core "
                       "measures the scheduler, not mep (--oversubscribe "
                       "runs it anyway)" % (N, ncpu))
        if soft != resource.RLIM_INFINITY and (N - 1) * k + 32 > soft:
            why.append("%d ranks need about %d file descriptors per rank; "
                       "ulimit -n is %d" % (N, (N - 1) * k + 32, soft))
        if avail:
            p = core_bytes(N)
            # what the probe makes resident: the zeroed parts, the lazy
            # ones but the collective staging (small calls touch a page
            # of it per slot), libraries and stacks, the EP buffer and
            # the probe's own EP arrays
            need = N * (sum(v for key, (_, v) in p.items()
                            if key != "coll staging") +
                        4 * N * PAGE + 16 * MIB +
                        ep_host_bytes(N, args.tokens, args.hidden,
                                      N * args.experts_per_rank) * 2)
            if need > 0.7 * avail:
                why.append("%d ranks need about %s of memory; %s is "
                           "available" % (N, fmt_bytes(need),
                                          fmt_bytes(avail)))
    return why


def main_bench(args):
    ranks = args.ranks
    why = refuse(ranks, args)
    if why:
        sys.exit("bench-scaling: refusing to run:\n  " + "\n  ".join(why))
    bdir = os.path.abspath(args.build_dir)
    if not args.no_build:
        build(bdir, args.jobs)
    probe = os.path.join(bdir, "tools", "mep-scale-probe")
    ftb = os.path.join(bdir, "tools", "mep-ft-bench")
    for exe in (probe, ftb):
        if not os.access(exe, os.X_OK):
            sys.exit("bench-scaling: %s is missing (build without "
                     "--no-build)" % exe)
    env = child_env(bdir)
    k = CORE["sockets_per_peer"]
    lines, failures = [], []

    def say(s=""):
        lines.append(s)
        print(s, flush=True)

    say("# mep scaling on one machine (scripts/bench-scaling.py)")
    say()
    say("command: `%s`" % " ".join([os.path.relpath(sys.argv[0], ROOT)] +
                                    sys.argv[1:]))
    say("machine: %s" % machine())
    say("date: %s; tcp over loopback, MEP_TCP_SOCKETS_PER_PEER=%d, "
        "[core] defaults (buffer_bytes %s, chunk_bytes %s)" % (
            time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), k,
            fmt_bytes(CORE["buffer_bytes"]), fmt_bytes(CORE["chunk_bytes"])))
    say()
    T, H, L, K = args.tokens, args.hidden, args.experts_per_rank, args.topk
    results = {}
    for N in ranks:
        reps = []
        for rep in range(args.reps):
            cmd = [probe, "-n", str(N), "--tokens", str(T), "--hidden",
                   str(H), "--experts-per-rank", str(L), "--topk", str(K),
                   "--a2a-bytes", "1024", "-w", str(args.warmup), "-i",
                   str(args.iters), "-t", str(args.timeout * 1000)]
            t0 = time.time()
            rc, out, err = run(cmd, args.timeout + 30, env)
            if rc:
                failures.append("probe -n %d (rep %d): exit %d: %s" % (
                    N, rep + 1, rc, err.strip()[-2000:]))
                break
            try:
                reps.append(parse_probe(out, N))
            except ValueError as e:
                failures.append("probe -n %d: %s" % (N, e))
                break
            print("# %d ranks, repetition %d: %.1f s" % (
                N, rep + 1, time.time() - t0), file=sys.stderr, flush=True)
        if reps:
            results[N] = reps

    # memory
    say("## Memory per rank (KiB; resident set, the largest over ranks)")
    say()
    say("| ranks | before comm | after comm (all connected) | comm adds | "
        "formula, zeroed at creation | formula, all allocated | after EP "
        "buffer | EP adds | EP formula (the size hint) | "
        "mep_ep_size_hint | after the timed calls |")
    say("|---|---|---|---|---|---|---|---|---|---|---|")
    for N, reps in results.items():
        rows = reps[0]
        p = core_bytes(N)
        zeroed = sum(v for kind, v in p.values() if kind == "zeroed")
        alloc = sum(v for _, v in p.values())
        ep_f = ep_host_bytes(N, T, H, N * L)
        hint_f = ep_layout_bytes(N, T, H, N * L)
        start = max(r["rss_start_kb"] for r in rows)
        comm = max(r["rss_comm_kb"] for r in rows)
        epr = max(r["rss_ep_kb"] for r in rows)
        d_comm = max(r["rss_comm_kb"] - r["rss_start_kb"] for r in rows)
        d_ep = max(r["rss_ep_kb"] - r["rss_comm_kb"] for r in rows)
        d_ep_min = min(r["rss_ep_kb"] - r["rss_comm_kb"] for r in rows)
        say("| %d | %d | %d | %d | %d | %d | %d | %d | %d | %d | %d |" % (
            N, start, comm, d_comm, zeroed // KIB, alloc // KIB, epr, d_ep,
            ep_f // KIB, rows[0]["ep_hint"] // KIB,
            max(r["rss_end_kb"] for r in rows)))
        for r in rows:
            if r["ep_hint"] != hint_f:
                failures.append("%d ranks: mep_ep_size_hint %d, formula %d"
                                % (N, r["ep_hint"], hint_f))
        # the EP region is zeroed at creation: all of it resident
        if not (0.97 * ep_f / KIB <= d_ep_min and
                d_ep <= ep_f / KIB + 1024):
            failures.append("%d ranks: an EP buffer added %d..%d KiB, the "
                            "formula says %d KiB" % (N, d_ep_min, d_ep,
                                                     ep_f // KIB))
        low = min(r["rss_comm_kb"] - r["rss_start_kb"] for r in rows)
        if low < 0.97 * zeroed / KIB:
            failures.append("%d ranks: the communicator added %d KiB, less "
                            "than the %d KiB it zeroes" % (N, low,
                                                           zeroed // KIB))
    say()
    say("'comm adds' counts what creation wrote: the rings (zeroed), the "
        "tcp plugin and the progress thread; the collective staging is "
        "allocated but resident only as far as collectives use it "
        "(docs/scaling.md), which the last column shows after small "
        "collectives and EP calls.")
    say()

    # sockets
    say("## Connections per rank (sockets in /proc/<pid>/fd), and store "
        "requests at creation")
    say()
    say("| ranks | sockets (min..max over ranks) | expected (N-1) x %d + "
        "listener + store | file descriptors | store requests of "
        "mep_comm_create (min..max over ranks) | formula |" % k)
    say("|---|---|---|---|---|---|")
    for N, reps in results.items():
        rows = reps[0]
        s = sorted(r["socks"] for r in rows)
        fds = sorted(r["fds"] for r in rows)
        ops = sorted(r["create_store_ops"] for r in rows)
        say("| %d | %d..%d | %d | %d..%d | %d..%d | %d |" % (
            N, s[0], s[-1], sockets_per_rank(N, k), fds[0], fds[-1],
            ops[0], ops[-1], setup_store_ops(N)))
        if s[0] != s[-1] or s[0] != sockets_per_rank(N, k):
            failures.append("%d ranks: sockets %s, expected %d each" % (
                N, s, sockets_per_rank(N, k)))
        if ops[0] != ops[-1] or ops[0] != setup_store_ops(N):
            failures.append("%d ranks: store requests at creation %d..%d, "
                            "the formula says %d" % (
                                N, ops[0], ops[-1], setup_store_ops(N)))
    say()

    # time
    ops = [("allreduce_us", "all-reduce 8 B"), ("barrier_us", "barrier"),
           ("alltoall_us", "all-to-all 1 KiB/peer"),
           ("ep_us", "EP dispatch+combine T=%d H=%d top-%d, %d experts/rank"
            % (T, H, K, L))]
    say("## Time per call (us; per rank the median of %d calls, the "
        "slowest rank, the median of %d runs)" % (args.iters, args.reps))
    say()
    say("| ranks | " + " | ".join(name for _, name in ops) +
        " | mep_comm_create (ms) |")
    say("|---|" + "---|" * (len(ops) + 1))
    for N, reps in results.items():
        cells = []
        for key, _ in ops + [("create_ms", "")]:
            per_rep = [max(r[key] for r in rows) for rows in reps]
            cells.append("%.1f" % statistics.median(per_rep))
        say("| %d | %s |" % (N, " | ".join(cells)))
    say()

    # time against N: a + b (N - 1), least squares over the measured N
    if len(results) >= 2:
        say("Fitted a + b x (N - 1) (us) and extrapolated; one machine's "
            "loopback, so only the shape carries over:")
        say()
        say("| call | a | b (per peer) | 64 ranks | 256 ranks | 1024 "
            "ranks |")
        say("|---|---|---|---|---|---|")
        for key, name in ops:
            xs = [N - 1 for N in results]
            ys = [statistics.median([max(r[key] for r in rows)
                                     for rows in reps])
                  for reps in results.values()]
            mx, my = statistics.mean(xs), statistics.mean(ys)
            sxx = sum((x - mx) ** 2 for x in xs)
            b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
            a = my - b * mx
            say("| %s | %.1f | %.2f | %.0f | %.0f | %.0f |" % (
                name, a, b, a + 63 * b, a + 255 * b, a + 1023 * b))
        say()

    # failure
    if results:
        N = max(results)
        say("## Agreement after a failure at %d ranks (mep-ft-bench -n %d "
            "-r %d --timeout-ms %d: SIGKILL of the last rank)" % (
                N, N, args.ft_rounds, args.ft_timeout_ms))
        say()
        cmd = [ftb, "-n", str(N), "-r", str(args.ft_rounds),
               "--timeout-ms", str(args.ft_timeout_ms)]
        rc, out, err = run(cmd, 60 + args.ft_rounds * (10 + N), env)
        meds = []
        say("| round | survivors' min (ms) | median | max |")
        say("|---|---|---|---|")
        for line in out.splitlines():
            m = re.match(r"\s*(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$",
                         line)
            if m:
                meds.append(float(m.group(3)))
                say("| %s | %s | %s | %s |" % m.groups())
            elif line.strip() and not line.startswith("#") and \
                    "round" not in line:
                say("| %s |" % line.strip())
        say()
        if meds:
            say("median of medians %.1f ms, worst median %.1f ms; "
                "agreement traffic by the formula: %d messages, %s" % (
                    statistics.median(meds), max(meds),
                    agreement_traffic(N)[0],
                    fmt_bytes(agreement_traffic(N)[1])))
            say()
        if rc or len(meds) != args.ft_rounds:
            failures.append("mep-ft-bench -n %d: exit %d, %d of %d rounds "
                            "finished degraded: %s" % (
                                N, rc, len(meds), args.ft_rounds,
                                err.strip()[-2000:]))

    say("## Projection from the formulas")
    say()
    say(projection(sorted(set(list(results) + [64, 256, 1024])), {
        "tokens": T, "hidden": H, "local": L}))
    say()
    if failures:
        say("## FAILED CHECKS")
        say()
        for f in failures:
            say("- " + f)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
        print("# written to %s" % args.out, file=sys.stderr)
    return 1 if failures else 0


# --------------------------------------------------------------- checks

def check_formulas(args):
    bad = []
    # the core's accounting (tests/tools/scaling/accounting.c)
    rc, out, err = run([args.accounting], 60)
    if rc:
        bad.append("%s: exit %d: %s" % (args.accounting, rc, err))
    np2p = 0
    for line in out.splitlines():
        f = line.split()
        if f[0] == "sizeof":
            if SIZEOF.get(f[1]) != int(f[2]):
                bad.append("sizeof %s is %s; the formulas use %s" % (
                    f[1], f[2], SIZEOF.get(f[1])))
        elif f[0] == "p2p":
            b, c, n, slot, nslots, ring = map(int, f[1:])
            want = p2p_geometry(b, c, n)
            np2p += 1
            if want != (slot, nslots, ring):
                bad.append("p2p rings, buffer %d chunk %d %d peers: the "
                           "core has (slot, slots, ring) %s, the formula %s"
                           % (b, c, n, (slot, nslots, ring), want))
    if np2p < 10:
        bad.append("accounting printed %d ring geometries" % np2p)
    # the EP size hint, valid and invalid parameters
    cases = []
    for R in (1, 2, 3, 4, 8, 16, 64, 256, 1024):
        for T, H, L in ((1, 128, 1), (32, 512, 2), (128, 7168, 1),
                        (128, 7168, 4), (7, 384, 3), (256, 4096, 8)):
            cases.append((T, H, R, R * L))
    cases += [(128, 7168, 1024, 256), (0, 128, 2, 2), (8, 100, 2, 2),
              (8, 128, 3, 4), (8, 128, 2, 2 * 1025), (2**30, 128, 4, 4)]
    rc, out, err = run([args.probe, "--hint"] +
                       ["%d,%d,%d,%d" % c for c in cases], 60)
    if rc:
        bad.append("%s --hint: exit %d: %s" % (args.probe, rc, err))
    got = {}
    for line in out.splitlines():
        f = line.split()
        if f and f[0] == "hint":
            T, H, R, E, v = map(int, f[1:])
            got[(T, H, R, E)] = v
    for T, H, R, E in cases:
        want = ep_layout_bytes(R, T, H, E)
        if got.get((T, H, R, E)) != want:
            bad.append("mep_ep_size_hint(T=%d, H=%d, ranks=%d, experts=%d) "
                       "= %s, the formula %d" % (T, H, R, E,
                                                 got.get((T, H, R, E)),
                                                 want))
    # the store requests of creation, as the launcher's store counts them
    nops = 0
    for N in (2, 5):
        rc, out, err = run([args.probe, "-n", str(N), "-w", "1", "-i", "2",
                            "-t", "60000"], 90)
        try:
            rows = [] if rc else parse_probe(out, N)
        except ValueError as e:
            rc, err = 1, str(e)
        if rc:
            bad.append("%s -n %d: exit %d: %s" % (args.probe, N, rc, err))
        for r in rows:
            nops += 1
            if r["create_store_ops"] != setup_store_ops(N):
                bad.append("%d ranks: rank %d's mep_comm_create made %d store "
                           "requests, the formula %d" % (
                               N, r["rank"], r["create_store_ops"],
                               setup_store_ops(N)))
    # docs/scaling.md's projection table is --project's
    try:
        with open(DOC) as f:
            doc = f.read()
        m = re.search(r"<!-- projection:begin -->\n(.*?)\n"
                      r"<!-- projection:end -->", doc, re.S)
        want = projection(DOC_RANKS, DOC_EP)
        if not m:
            bad.append("%s has no projection block" % DOC)
        elif m.group(1).strip() != want.strip():
            bad.append("%s: the projection table differs from the formulas'; "
                       "regenerate it with scripts/bench-scaling.py "
                       "--project --doc-table" % DOC)
    except OSError as e:
        bad.append("%s: %s" % (DOC, e))
    for b in bad:
        print("FAIL: " + b)
    print("%d size hints, %d ring geometries, %d sizes, %d ranks' store "
          "requests and the doc's table checked: %s" % (
              len(cases), np2p, len(SIZEOF), nops, "FAILED" if bad else "ok"))
    return 1 if bad else 0


# The doc's projection table: these ranks and the probe's default EP sizes.
DOC_RANKS = [2, 4, 8, 16, 64, 256, 1024]
DOC_EP = {"tokens": 32, "hidden": 512, "local": 2}


def ranks_arg(s):
    try:
        v = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError("'%s' is not a comma list of "
                                         "numbers" % s)
    if not v:
        raise argparse.ArgumentTypeError("no rank counts")
    return v


def main():
    ap = argparse.ArgumentParser(
        description=__doc__,
        epilog="Example (a 16-core machine, about 3 minutes with the "
               "build): scripts/bench-scaling.py --out /tmp/scaling.md",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=ranks_arg, default=[2, 4, 8, 16],
                    help="comma list of rank counts (default 2,4,8,16)")
    ap.add_argument("--build-dir", default=os.path.join(ROOT,
                                                        "build-scaling"),
                    help="where to build (release, no tests) or find the "
                         "tools (default build-scaling)")
    ap.add_argument("--no-build", action="store_true",
                    help="use --build-dir as it is")
    ap.add_argument("--jobs", type=int, default=0,
                    help="ninja -j for the build (default: ninja's)")
    ap.add_argument("--tokens", type=int, default=32,
                    help="EP max tokens per rank (default 32)")
    ap.add_argument("--hidden", type=int, default=512,
                    help="EP hidden (default 512)")
    ap.add_argument("--experts-per-rank", type=int, default=2,
                    help="EP experts per rank (default 2)")
    ap.add_argument("--topk", type=int, default=2, help="EP top-k "
                    "(default 2)")
    ap.add_argument("--iters", type=int, default=1000,
                    help="timed calls per operation (default 1000)")
    ap.add_argument("--warmup", type=int, default=100,
                    help="untimed calls first (default 100)")
    ap.add_argument("--reps", type=int, default=3,
                    help="runs per rank count (default 3)")
    ap.add_argument("--ft-rounds", type=int, default=5,
                    help="rounds of the failure measurement (default 5)")
    ap.add_argument("--ft-timeout-ms", type=int, default=2000,
                    help="[core] timeout_ms of the failure measurement's "
                         "ranks (default 2000); it bounds every wait of "
                         "their creation too, so many ranks per core need "
                         "more")
    ap.add_argument("--timeout", type=int, default=300,
                    help="deadline of one probe run in s (default 300)")
    ap.add_argument("--oversubscribe", action="store_true",
                    help="allow more than 4 ranks per core")
    ap.add_argument("--out", help="also write the markdown here")
    ap.add_argument("--project", action="store_true",
                    help="print the formulas' projection for --ranks and "
                         "64, 256, 1024 ranks, run nothing")
    ap.add_argument("--doc-table", action="store_true",
                    help="with --project: the table of docs/scaling.md")
    ap.add_argument("--check-formulas", action="store_true",
                    help="compare the formulas with the library (needs "
                         "--accounting and --probe) and the doc's table")
    ap.add_argument("--accounting", help="tests/tools/scaling's "
                    "scaling_accounting")
    ap.add_argument("--probe", help="tools/mep-scale-probe")
    args = ap.parse_args()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, kill_live)
    if args.check_formulas:
        if not args.accounting or not args.probe:
            ap.error("--check-formulas needs --accounting and --probe")
        return check_formulas(args)
    if args.project:
        if args.doc_table:
            print(projection(DOC_RANKS, DOC_EP))
        else:
            print(projection(sorted(set(args.ranks + [64, 256, 1024])), {
                "tokens": args.tokens, "hidden": args.hidden,
                "local": args.experts_per_rank}))
        return 0
    if min(args.iters, args.reps, args.ft_rounds, args.timeout,
           args.ft_timeout_ms) < 1 or \
            args.warmup < 0:
        ap.error("--iters, --reps, --ft-rounds, --ft-timeout-ms and "
                 "--timeout must be positive")
    return main_bench(args)


if __name__ == "__main__":
    sys.exit(main())
