#!/usr/bin/env bash
# How often a run of mep-perf fails at its end with [core] agreement = off:
# every rank destroys its communicator as soon as its last collective
# returned, while slower ranks may still be in it. This tree ("after")
# against BEFORE_DIR ("before", e.g. `git archive REV | tar -x -C DIR`),
# both built release without CUDA (inih from .carry/inih where the system
# has none), interleaved: RUNS runs (default 10) on each of RANKS (default
# "8 16") ranks of mep-perf's OP (default allreduce) over SWEEP (default
# "-b 8 -e 256K -f 4 -w 2 -i 20"). Prints the failed runs per tree and
# rank count, with the first error line of each failure.
# Usage: scripts/dev/leave-stress.sh BEFORE_DIR [RUNS]
set -uo pipefail
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac
cd "$(dirname "$0")/../.."
[ $# -ge 1 ] || { echo "usage: $0 BEFORE_DIR [RUNS]" >&2; exit 2; }
before=$(cd "$1" && pwd) runs=${2:-10}
. scripts/dev/lib.sh
two_trees "$before" leave -Dc10d=disabled || exit 1
export MEP_TCP_IFNAME=lo MEP_TRANSPORTS=tcp MEP_LOG=error MEP_CORE_AGREEMENT=off
echo "# $(nproc) CPUs:$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
declare -A failed
for ((i = 1; i <= runs; i++)); do
  for n in ${RANKS:-8 16}; do
    for v in before after; do
      log=/tmp/leave-$v-$n.log
      if ! MEP_PLUGIN_PATH=/tmp/leave-$v/plugins/tcp timeout 120 \
        "/tmp/leave-$v/tools/perf/mep-perf" -n "$n" -o "${OP:-allreduce}" \
        ${SWEEP:--b 8 -e 256K -f 4 -w 2 -i 20} >"$log" 2>&1; then
        failed[$v,$n]=$((${failed[$v,$n]:-0} + 1))
        echo "$v n=$n run $i: $(grep -m1 -iE 'error|fail' "$log")"
      fi
    done
  done
done
for n in ${RANKS:-8 16}; do
  for v in before after; do
    echo "$v n=$n: ${failed[$v,$n]:-0} of $runs runs failed"
  done
done
