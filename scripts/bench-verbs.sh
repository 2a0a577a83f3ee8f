#!/usr/bin/env bash
# Measures the verbs transport against perftest on the same RDMA device, in
# one run: bandwidth of 64 MiB puts (mep-plugin-check --bench) against
# ib_write_bw with 64 MiB messages, and the 8-byte put+signal round trip
# against ib_write_lat's (perftest reports half a round trip; it is doubled
# here, so both columns are round trips), and both against the raw verbs
# floor of tests/verbs/verbs_floor.c: the same ping-pong with one WRITE per
# message, with the two a one-sided put+signal needs (the data, then
# the flag word), and with one WRITE with immediate whose receive
# completion the peer takes (what a signal in band costs). Each is run REPEAT times (default
# 5), interleaved, and the medians are printed as a markdown table ready
# for docs/perf.md. perftest reports MB/s of 2^20 bytes; the table is in
# GB/s of 10^9 bytes, as mep-plugin-check prints. The round trip is also
# measured with [verbs] fuse_signals = off (each signal its own RDMA
# request, as before the signal rode in the put's immediate), in the same
# interleaved loop.
# Where this host has no RDMA device the whole run happens in the Soft-RoCE
# VM of scripts/rdma-vm.sh (rxe0, GID index 1): a software device under
# emulation, whose absolute numbers mean little; the ratios are the result.
# Usage: scripts/bench-verbs.sh [REPEAT]     (after scripts/setup.sh)
#        scripts/bench-verbs.sh --latency [REPEAT [ITERS]]
# --latency: the 8-byte round trip alone, for measuring changes to it:
# ib_write_lat, verbs_floor's WRITE with immediate and mep-plugin-check
# --bench (its bandwidth part cut to one small batch), interleaved, REPEAT
# times (default 15) of ITERS round trips each (default 3000); prints the
# medians, every sample and the ratios. BASE_DIR (optional): a second
# build tree (a copy of the build before a change) whose mep-plugin-check
# and plugin are measured in the same loop, for a before/after in one run.
# BUILD_DIR: the build tree to measure (default build).
set -euo pipefail
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac
cd "$(dirname "$0")/.."
mode=all
if [ "${1:-}" = --latency ]; then mode=latency; shift; fi
if [ $mode = latency ]; then repeat=${1:-15}; iters=${2:-3000}; else repeat=${1:-5}; fi
if [ "${RUN_VM_INSIDE:-0}" != 1 ] && ! ls /sys/class/infiniband/* >/dev/null 2>&1; then
  export RUN_VM_INSIDE=1
  if [ $mode = latency ]; then exec scripts/rdma-vm.sh "$0" --latency "$repeat" "$iters"; fi
  exec scripts/rdma-vm.sh "$0" "$repeat"
fi
dev=${BENCH_DEVICE:-$(ls /sys/class/infiniband | head -1)}
gid=${BENCH_GID_INDEX:-1}
bd=${BUILD_DIR:-build}
check=$bd/tools/plugin-check/mep-plugin-check
verbs=$bd/plugins/verbs/libmep-transport-verbs.so
floor=$bd/tests/verbs/verbs_floor
export MEP_VERBS_DEVICE=$dev

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

# perftest NAME ARGS...: its server, a wait for its port, its client;
# prints the client's result line (the one after the "#bytes" header)
perftest() {
  local tool=$1
  shift
  "$tool" -d "$dev" -x "$gid" "$@" >/dev/null 2>&1 &
  local srv=$! i
  for i in $(seq 300); do ss -ltn | grep -q ':18515 ' && break; sleep 0.1; done
  "$tool" -d "$dev" -x "$gid" "$@" 127.0.0.1 2>&1 | grep -A1 '#bytes' | tail -1
  wait "$srv" || true
}

ratio() { python3 -c "print(f'{$1 / $2:.2f}')"; }

if [ $mode = latency ]; then
  lat() { # CHECK PLUGIN: mep-plugin-check's median round trip
    "$1" --bench --quick --iters "$iters" --iters-bw 1 "$2" |
      awk '$1 == "latency" {print $4}'
  }
  base=${BASE_DIR:-}
  pl=(); f3=(); ml=(); mz=()
  for ((i = 0; i < repeat; i++)); do
    pl+=("$(perftest ib_write_lat -s 8 -n "$iters" | awk '{print 2 * $5}')")
    f3+=("$("$floor" 3 "$iters" "$dev" "$gid")")
    ml+=("$(lat "$check" "$verbs")")
    if [ -n "$base" ]; then
      mz+=("$(lat "$base/tools/plugin-check/mep-plugin-check" \
        "$base/plugins/verbs/libmep-transport-verbs.so")")
    fi
  done
  PL=$(printf '%s\n' "${pl[@]}" | median); F3=$(printf '%s\n' "${f3[@]}" | median)
  ML=$(printf '%s\n' "${ml[@]}" | median)
  echo "| 8 B round trip (us, median of $repeat x $iters) | mep put+signal | ib_write_lat -s 8 (2 x typical) | verbs_floor, 1 WRITE with imm. | mep/perftest | mep/floor | floor/perftest |"
  echo "| --- | --- | --- | --- | --- | --- | --- |"
  echo "| $bd | $ML | $PL | $F3 | $(ratio "$ML" "$PL") | $(ratio "$ML" "$F3") | $(ratio "$F3" "$PL") |"
  if [ -n "$base" ]; then
    MZ=$(printf '%s\n' "${mz[@]}" | median)
    echo "| $base (BASE_DIR) | $MZ | $PL | $F3 | $(ratio "$MZ" "$PL") | $(ratio "$MZ" "$F3") | $(ratio "$F3" "$PL") |"
  fi
  echo
  echo "samples, in run order: mep ${ml[*]} us;${base:+ BASE_DIR mep ${mz[*]} us;} ib_write_lat ${pl[*]} us; verbs_floor WRITE with immediate ${f3[*]} us"
  exit 0
fi

pl=(); pb=(); ml=(); mb=(); f1=(); f2=(); f3=(); mo=()
for ((i = 0; i < repeat; i++)); do
  pl+=("$(perftest ib_write_lat -s 8 -n 5000 | awk '{print 2 * $5}')")
  f1+=("$("$floor" 1 5000 "$dev" "$gid")")
  f2+=("$("$floor" 2 5000 "$dev" "$gid")")
  f3+=("$("$floor" 3 5000 "$dev" "$gid")")
  pb+=("$(perftest ib_write_bw -s 67108864 -n 8 | awk '{printf "%.4f", $4 * 1048576 / 1e9}')")
  out=$("$check" --bench --iters 5000 --iters-bw 8 "$verbs")
  ml+=("$(awk '$1 == "latency" {print $4}' <<<"$out")")
  mb+=("$(awk '$1 == "bandwidth" {print $8}' <<<"$out")")
  out=$(MEP_VERBS_FUSE_SIGNALS=off "$check" --bench --iters 5000 --iters-bw 1 "$verbs")
  mo+=("$(awk '$1 == "latency" {print $4}' <<<"$out")")
done
PL=$(printf '%s\n' "${pl[@]}" | median); PB=$(printf '%s\n' "${pb[@]}" | median)
ML=$(printf '%s\n' "${ml[@]}" | median); MB=$(printf '%s\n' "${mb[@]}" | median)
F1=$(printf '%s\n' "${f1[@]}" | median); F2=$(printf '%s\n' "${f2[@]}" | median)
MO=$(printf '%s\n' "${mo[@]}" | median); F3=$(printf '%s\n' "${f3[@]}" | median)
cat <<TABLE
| measure | mep verbs | perftest on $dev | ratio | target |
| --- | --- | --- | --- | --- |
| bandwidth, 64 MiB puts (GB/s) | $MB | ib_write_bw -s 64M -n 8: $PB | $(ratio "$MB" "$PB") (mep/perftest) | >= 0.8 |
| 8 B put+signal round trip (us, median) | $ML | ib_write_lat -s 8, 2 x typical: $PL | $(ratio "$ML" "$PL") (mep/perftest) | <= 1.5 |
| the same, fuse_signals = off (us, median) | $MO | ib_write_lat, as above: $PL | $(ratio "$MO" "$PL") (mep/perftest); on/off $(ratio "$ML" "$MO") | - |
| the same against raw verbs (us, median) | $ML | verbs_floor, 1 WRITE: $F1; WRITE + flag WRITE: $F2; 1 WRITE with immediate: $F3 | $(ratio "$ML" "$F3") (mep/WRITE with imm.); $(ratio "$F3" "$F1") (imm./1 WRITE); $(ratio "$F2" "$F1") (2 WRITEs/1) | - |

runs: $repeat each, interleaved; all samples: ib_write_bw ${pb[*]} GB/s; mep ${mb[*]} GB/s; ib_write_lat (round trip) ${pl[*]} us; mep ${ml[*]} us; mep with fuse_signals = off ${mo[*]} us; verbs_floor 1 WRITE ${f1[*]} us; 2 WRITEs ${f2[*]} us; WRITE with immediate ${f3[*]} us
TABLE

# The core over verbs (fuse_signals on and off) and over tcp on the same
# machine, same run: time per call (us, the slowest rank's mean) of
# mep-perf, median of REPEAT runs.
export MEP_PLUGIN_PATH=$PWD/$bd/plugins/verbs:$PWD/$bd/plugins/tcp MEP_TCP_IFNAME=lo
perf_us() { # TRANSPORT ARGS...: the time column of mep-perf's one row
  local t=$1
  shift
  MEP_TRANSPORTS=$t "$bd"/tools/perf/mep-perf "$@" -w 5 -i 50 | awk '$1 ~ /^[0-9]+$/ {print $6}'
}
echo
echo "| mep-perf, 2 ranks: op, bytes | verbs (us) | verbs, fuse_signals = off (us) | tcp (us) | verbs/tcp | on/off |"
echo "| --- | --- | --- | --- | --- | --- |"
for c in "pingpong 8" "allreduce 8" "allreduce 1M" "alltoall 1M"; do
  set -- $c
  v=(); o=(); t=()
  for ((i = 0; i < repeat; i++)); do
    v+=("$(perf_us verbs -n 2 -o "$1" -b "$2" -e "$2")")
    o+=("$(MEP_VERBS_FUSE_SIGNALS=off perf_us verbs -n 2 -o "$1" -b "$2" -e "$2")")
    t+=("$(perf_us tcp -n 2 -o "$1" -b "$2" -e "$2")")
  done
  V=$(printf '%s\n' "${v[@]}" | median); T=$(printf '%s\n' "${t[@]}" | median)
  O=$(printf '%s\n' "${o[@]}" | median)
  echo "| $1, $2 | $V | $O | $T | $(ratio "$V" "$T") | $(ratio "$V" "$O") |"
done
