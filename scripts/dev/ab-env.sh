#!/usr/bin/env bash
# A/B of settings on this machine, one release build without CUDA
# (build-dev-c10d, as scripts/bench-device-c10d.sh makes it): each
# VARIANT is a comma-separated list of environment assignments (a mep
# setting: MEP_TCP_SEND_THREAD=on,MEP_CORE_COLL_SLOTS=4; "-" for none).
# mep-perf's operations (OPS; default sendrecv allreduce alltoall broadcast
# allgather reduce_scatter) run on RANKS (default 2 4) ranks over the sweep
# SWEEP (default "-b 1M -e 64M -f 4 -w 2 -i 8": 1 MiB to 64 MiB), with
# PERF_ARGS (e.g. --in-place) if set, under each variant,
# interleaved REPS times; then, when
# C10D is set to a variant, scripts/bench-c10d.py --quick (mep against
# gloo) under it. Prints mep-perf's rows under a header naming the variant,
# ranks, op and repetition (scripts/dev/ab-table.py makes a table of them);
# the c10d table goes to ${OUT:-/tmp}/bench-c10d.md as well.
# Usage: scripts/dev/ab-env.sh REPS VARIANT...
set -uo pipefail
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac
cd "$(dirname "$0")/../.."
[ $# -ge 2 ] || { echo "usage: $0 REPS VARIANT..." >&2; exit 2; }
reps=$1
shift
. scripts/dev/lib.sh
carried_inih
b=build-dev-c10d
c10d=enabled
[ -z "${C10D:-}" ] && c10d=disabled
{ [ -d $b ] || meson setup $b -Dtests=false -Dc10d=$c10d -Dcuda=disabled \
    -Dverbs=disabled -Dibgda=disabled -Dbuildtype=release >/dev/null; } &&
  ninja -C $b >/dev/null || { echo "build failed" >&2; exit 1; }
export MEP_TCP_IFNAME=lo MEP_TRANSPORTS=tcp MEP_LOG=error
export MEP_PLUGIN_PATH=$PWD/$b/plugins/tcp
# runs "$@" with the assignments of variant $1
under() {
  local v=$1 a
  shift
  local -a env=()
  [ "$v" = - ] || { IFS=, read -ra a <<<"$v"; env=("${a[@]}"); }
  env "${env[@]}" "$@"
}
echo "# $(nproc) CPUs:$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
for ((i = 1; i <= reps; i++)); do
  for n in ${RANKS:-2 4}; do
    for op in ${OPS:-sendrecv allreduce alltoall broadcast allgather reduce_scatter}; do
      for v in "$@"; do
        echo "== $v n=$n $op rep=$i"
        under "$v" timeout 120 "$b/tools/perf/mep-perf" -n "$n" -o "$op" \
          ${SWEEP:--b 1M -e 64M -f 4 -w 2 -i 8} ${PERF_ARGS:-} |
          grep -E '^ +[0-9]'
      done
    done
  done
done
[ -z "${C10D:-}" ] && exit 0
export PYTHONPATH=$PWD/$b/frontends/c10d/python
under "$C10D" timeout 400 python3 scripts/bench-c10d.py --quick |
  tee "${OUT:-/tmp}/bench-c10d.md"
