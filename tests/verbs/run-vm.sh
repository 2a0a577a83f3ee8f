#!/usr/bin/env bash
# tests/verbs/run-vm.sh [BUILD_DIR]
#
# The verbs transport's tests that need RDMA, as one set in ONE boot of the
# project's Soft-RoCE VM (scripts/rdma-vm.sh): a rank asleep on the event
# fd woken by a put+signal (test_verbs_wake), signals carried in the put's
# immediate and applied by the receiver (test_verbs_inband), the plugin
# conformance suite
# (twice: defaults, and four striped queue pairs with tiny queues), routes
# with MEP_TRANSPORTS=verbs,tcp, mep-perf -c on 2, 3 and 4 ranks for every
# collective and send/recv from 1 B to 16 MiB (2 ranks) or 1 MiB in 64 KiB
# chunks (3 and 4), put/signal at odd sizes and
# offsets, the fault tests (a rank killed mid-collective, one SIGSTOPped
# past the deadline, a replacement that rejoins, a rank killed while a
# child it forked lives on, a fork during a dial), the queue pairs each
# rank holds (against docs/scaling.md), the EP CPU path and the
# c10d backend, all with MEP_TRANSPORTS=verbs; and the ibgda plugin's
# answer where the RDMA device is not mlx5. Prints one line per test
# (PASS/FAIL/SKIP name, its seconds) and last "N passed, N failed".
#
# Where this host has an RDMA device (a NIC, or rxe already up) the set
# runs here, without a VM; where it has none and no VM can run, it prints
# one SKIP line and exits 77. Logs: BUILD_DIR/verbs-vm-logs/NAME.log.
# Environment: MEP_VM_TIMEOUT (s, whole VM, default 1500).
set -u
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac
cd "$(dirname "$0")/../.."
build=${1:-build}

have_device() {
  local d
  for d in /sys/class/infiniband/*; do [ -e "$d" ] && return 0; done
  return 1
}

if [ "${RUN_VM_INSIDE:-0}" != 1 ]; then
  [ -x "$build/tools/plugin-check/mep-plugin-check" ] &&
    [ -f "$build/plugins/verbs/libmep-transport-verbs.so" ] || {
    echo "SKIP verbs VM tests: $build has no verbs plugin (libibverbs-dev missing at setup?)"
    exit 77
  }
  export RUN_VM_INSIDE=1
  if have_device; then
    echo "# an RDMA device is present: the set runs on it, without a VM"
    exec "$0" "$build"
  fi
  if ! why=$(scripts/rdma-vm.sh --check); then
    echo "SKIP verbs VM tests: ${why#rdma-vm: }"
    exit 77
  fi
  MEP_VM_TIMEOUT=${MEP_VM_TIMEOUT:-1500} exec scripts/rdma-vm.sh "$0" "$build"
fi

# --------------------------------------------------------- in the VM
B=$PWD/$build
logs=$B/verbs-vm-logs
rm -rf "$logs" && mkdir -p "$logs"
export MEP_PLUGIN_PATH=$B/plugins/verbs:$B/plugins/tcp
export MEP_LOG=warn MEP_TCP_IFNAME=lo
unset MEP_TRANSPORTS MEP_CONFIG
passed=0 failed=0 skipped=0
t_all=$(date +%s)

# run NAME SECONDS CMD...: one line for the test, its log kept. CMD may
# be one of the functions below (exported, run by a bash of its own).
run() {
  local name=$1 limit=$2 t0 rc ms secs
  shift 2
  declare -F "$1" >/dev/null && set -- bash -c '"$@"' bash "$@"
  t0=$(date +%s%N)
  timeout -k 10 "$limit" "$@" >"$logs/$name.log" 2>&1
  rc=$?
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  secs=$((ms / 1000)).$((ms % 1000 / 100))
  if [ $rc = 0 ]; then
    echo "PASS $name (${secs}s)"
    passed=$((passed + 1))
  elif [ $rc = 77 ]; then
    echo "SKIP $name: $(grep -m1 -i skip "$logs/$name.log")"
    skipped=$((skipped + 1))
  else
    echo "FAIL $name (exit $rc$([ $rc = 124 ] && echo ": timed out after ${limit}s"), ${secs}s); log $logs/$name.log:"
    tail -15 "$logs/$name.log" | sed 's/^/    /'
    failed=$((failed + 1))
  fi
}

P=$B/plugins/verbs/libmep-transport-verbs.so
check=$B/tools/plugin-check/mep-plugin-check
perf=$B/tools/perf/mep-perf

# every collective and send/recv, 1 B to MAX (16M) by factors of 16, each
# result checked, in chunks of CHUNK bytes (the default 1 MiB):
# perf_all NRANKS DTYPE [MAX [CHUNK]] (uint8: a true 1-byte call; float32
# is faster to check under emulation, its smallest call is 4 bytes)
perf_all() {
  local n=$1 dt=$2 max=${3:-16M} chunk=${4:-1048576} op
  for op in allreduce allgather reduce_scatter alltoall alltoallv broadcast sendrecv; do
    echo "## mep-perf -n $n -o $op -d $dt -e $max, chunks of $chunk B"
    MEP_TRANSPORTS=verbs MEP_CORE_CHUNK_BYTES=$chunk "$perf" -n "$n" -o "$op" -d "$dt" \
      -b 1 -e "$max" -f 16 -w 0 -i 1 -c -t 120000 ||
      return 1
  done
}

# The c10d backend: its collectives and point-to-point, checked
# (c10d_verbs.py: tests/c10d's own files spawn an interpreter per rank,
# which the emulated VM cannot start within their deadlines)
c10d() {
  local py=$B/frontends/c10d/python
  # the package is generated either way; _build_info says whether the
  # backend was built
  grep -qx "C10D_BUILT = True" "$py/mep/_build_info.py" 2>/dev/null ||
    { echo "skip: the c10d backend is not built here"; return 77; }
  MEP_TRANSPORTS=verbs PYTHONPATH=$py${PYTHONPATH:+:$PYTHONPATH} \
    python3 tests/verbs/c10d_verbs.py "$@"
}

# Queue pairs per rank against docs/scaling.md's count for verbs: one per
# peer and [verbs] qps_per_peer, counted per process in `rdma res show qp`
# while mep-scale-probe holds its group up: qp_count NRANKS QPS_PER_PEER
qp_count() {
  local n=$1 q=$2 out=$logs/qp-count-$1-$2.out i pids p got qps bad=0
  MEP_TRANSPORTS=verbs MEP_VERBS_QPS_PER_PEER=$q "$B/tools/mep-scale-probe" \
    -n "$n" -w 1 -i 2 --hold-ms 5000 -t 120000 >"$out" &
  local probe=$!
  for i in $(seq 900); do # every rank's line, 90 s at most
    [ "$(grep -c '^probe ' "$out")" -ge "$n" ] && break
    sleep 0.1
  done
  qps=$(rdma res show qp)
  wait $probe || { echo "mep-scale-probe failed"; cat "$out"; return 1; }
  pids=$(sed -n 's/^probe .* pid=\([0-9]*\) .*/\1/p' "$out")
  [ "$(echo $pids | wc -w)" = "$n" ] || { echo "not $n ranks' lines:"; cat "$out"; return 1; }
  for p in $pids; do
    got=$(echo "$qps" | grep -c " pid $p ")
    echo "pid $p: $got queue pairs, expected $(( (n - 1) * q )); resident" \
      "after creation $(sed -n "s/^probe .* pid=$p .*rss_comm_kb=\([0-9]*\) .*/\1/p" "$out") KiB"
    [ "$got" = $(( (n - 1) * q )) ] || bad=1
  done
  return $bad
}

export B perf logs
export -f perf_all c10d qp_count
run verbs-init 60 "$B/tests/verbs/test_verbs_init"
run verbs-wake 180 "$B/tests/verbs/test_verbs_wake"
run verbs-inband 300 "$B/tests/verbs/test_verbs_inband"
run plugin-check 600 "$check" "$P"
run plugin-check-4qp 600 env MEP_VERBS_QPS_PER_PEER=4 MEP_VERBS_STRIPE_BYTES=4096 \
  MEP_VERBS_SEND_QUEUE=16 MEP_VERBS_SIGNAL_EVERY=4 MEP_VERBS_MAX_INLINE=0 \
  MEP_VERBS_INFLIGHT_BYTES=64K "$check" --quick "$P"
run select-verbs-tcp 300 "$B/tests/verbs/test_verbs_select"
# a rank killed while a child it forked lives on (plugins/common/fork_watch.c)
run fork-verbs 120 env MEP_TT_PLUGIN=verbs "$B/tests/unit/tcp/test_tcp_fork"
# a fork while another thread's connect() dials
run fork-dial-verbs 120 env MEP_TT_PLUGIN=verbs "$B/tests/unit/tcp/test_tcp_fork_dial"
run qp-count-4ranks 300 qp_count 4 1
run qp-count-3ranks-4qp 300 qp_count 3 4
run perf-check-2ranks-uint8 900 perf_all 2 uint8
# up to 1 MiB in 64 KiB chunks: calls of many chunks at a fraction of the
# emulated VM's time for 16 MiB ones
run perf-check-3ranks 900 perf_all 3 float32 1M 65536
run perf-check-4ranks 900 perf_all 4 float32 1M 65536
run putsignal-2ranks 300 env MEP_TRANSPORTS=verbs "$B/tests/integration/test_putsignal" 2 67108864
run putsignal-3ranks-4qp 300 env MEP_TRANSPORTS=verbs MEP_VERBS_QPS_PER_PEER=4 \
  "$B/tests/integration/test_putsignal" 3 4194304
# The fault tests' deadlines scale with the core's timeout; 6 s instead of
# their 3 s leaves room for the emulation's pauses under a loaded host.
ft=(env MEP_TRANSPORTS=verbs MEP_CORE_TIMEOUT_MS=6000 "$B/tests/ft/ft_test")
for s in kill-during stop grow; do run ft-$s-3ranks 300 "${ft[@]}" $s 3; done
run ft-kill-rank0-4ranks 300 "${ft[@]}" kill-rank0 4
run ep-host-2ranks 300 env MEP_TRANSPORTS=verbs "$B/tests/ep/test_ep_host" 2 basic
run ep-host-fault-3ranks 300 env MEP_TRANSPORTS=verbs "$B/tests/ep/test_ep_host" 3 fault
run c10d-2ranks 600 c10d 2 400
# ibgda where an RDMA device exists but no mlx5 one (rxe): unavailable,
# naming the devices it found; its model backend still runs
if [ -x "$B/tests/ibgda/test_ibgda_init" ]; then
  run ibgda-init-rxe 60 env MEP_PLUGIN_PATH="$B/plugins/ibgda" \
    "$B/tests/ibgda/test_ibgda_init"
fi

echo "# verbs VM tests took $(( $(date +%s) - t_all ))s, $skipped skipped"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
