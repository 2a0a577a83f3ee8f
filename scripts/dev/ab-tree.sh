#!/usr/bin/env bash
# A/B of two source trees of the project on this machine's CPUs (loopback
# tcp): this tree ("after") against BEFORE_DIR ("before", e.g. `git
# archive REV | tar -x -C DIR`), both built release with the c10d backend
# and without CUDA (inih from .carry/inih where the system has none).
# REPS times, the builds interleaved: mep-perf's OPS (default allreduce)
# on RANKS (default 2 4) ranks from 1 MiB to 64 MiB with PERF_ARGS (e.g.
# --in-place), at each of CHUNKS ([core] chunk_bytes; default: the
# default), then scripts/bench-c10d.py --quick $C10D_ARGS (mep against
# gloo; default --ops all_reduce; C10D_ARGS=- skips it). The mep-perf rows
# go under headers scripts/dev/ab-table.py reads (build,chunk=N n=RANKS
# OP rep=I, ",chunk=N" where CHUNKS is set).
# Usage: scripts/dev/ab-tree.sh BEFORE_DIR [REPS]
set -uo pipefail
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac
cd "$(dirname "$0")/../.."
[ $# -ge 1 ] || { echo "usage: $0 BEFORE_DIR [REPS]" >&2; exit 2; }
before=$(cd "$1" && pwd) reps=${2:-2}
. scripts/dev/lib.sh
c10d=enabled
[ "${C10D_ARGS:-}" = - ] && c10d=disabled
two_trees "$before" ab -Dc10d=$c10d || exit 1
export MEP_TCP_IFNAME=lo MEP_TRANSPORTS=tcp MEP_LOG=error
echo "# $(nproc) CPUs:$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
for ((i = 1; i <= reps; i++)); do
  for n in ${RANKS:-2 4}; do for op in ${OPS:-allreduce}; do for ch in ${CHUNKS:--}; do
    for v in before after; do
      tag=$v chunk=()
      [ "$ch" = - ] || { tag="$v,chunk=$ch"; chunk=(MEP_CORE_CHUNK_BYTES="$ch"); }
      echo "== $tag n=$n $op rep=$i"
      env "${chunk[@]}" MEP_PLUGIN_PATH="/tmp/ab-$v/plugins/tcp" timeout 120 \
        "/tmp/ab-$v/tools/perf/mep-perf" -n "$n" -o "$op" -b 1M -e 64M -f 4 -w 2 -i 8 \
        ${PERF_ARGS:-} | grep -E '^ +[0-9]'
    done
  done; done; done
done
[ "${C10D_ARGS:-}" = - ] && exit 0
for ((i = 1; i <= reps; i++)); do
  for v in before after; do
    echo "== bench-c10d.py $v rep=$i"
    # shellcheck disable=SC2086
    MEP_PLUGIN_PATH=/tmp/ab-$v/plugins/tcp PYTHONPATH=/tmp/ab-$v/frontends/c10d/python \
      timeout 300 python3 scripts/bench-c10d.py --quick ${C10D_ARGS:---ops all_reduce} 2>&1 |
      grep -E '^\||rror'
  done
done
