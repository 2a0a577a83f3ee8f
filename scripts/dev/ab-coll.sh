#!/usr/bin/env bash
# A/B of the host collectives on tcp over loopback: this tree against
# another source tree of the project (BEFORE_DIR, e.g. made with
# `git archive REV | tar -x -C DIR`), both built release without CUDA;
# mep-perf's all-reduce and reduce-scatter (or the operations OPS names) on
# 2 and 4 ranks from 1 MiB to 64 MiB, the two builds interleaved REPS times
# (default 2), at the default chunk and at CHUNK_B (default 4 MiB). Prints mep-perf's rows under a
# header naming build, ranks, op, chunk and repetition.
# Usage: scripts/dev/ab-coll.sh BEFORE_DIR [REPS]
set -uo pipefail
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac
cd "$(dirname "$0")/../.."
[ $# -ge 1 ] || { echo "usage: $0 BEFORE_DIR [REPS]" >&2; exit 2; }
before=$(cd "$1" && pwd) reps=${2:-2}
if ! pkg-config --exists inih 2>/dev/null; then
  export PKG_CONFIG_PATH=$PWD/.carry/inih/lib/pkgconfig
  export LD_LIBRARY_PATH=$PWD/.carry/inih/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
opts=(-Dtests=false -Dc10d=disabled -Dcuda=disabled -Dverbs=disabled
      -Dibgda=disabled -Dbuildtype=release)
for v in before after; do
  src=$PWD
  [ $v = before ] && src=$before
  (cd "$src" && meson setup "/tmp/ab-$v" "${opts[@]}" >/dev/null &&
     ninja -C "/tmp/ab-$v" >/dev/null) || { echo "build $v failed" >&2; exit 1; }
done
export MEP_TCP_IFNAME=lo MEP_TRANSPORTS=tcp MEP_LOG=error
for ((i = 1; i <= reps; i++)); do
  for n in 2 4; do for op in ${OPS:-allreduce reduce_scatter}; do
    for ch in 1048576 "${CHUNK_B:-4194304}"; do for v in before after; do
      echo "== $v n=$n $op chunk=$ch rep=$i"
      MEP_CORE_CHUNK_BYTES=$ch MEP_PLUGIN_PATH=/tmp/ab-$v/plugins/tcp \
        "/tmp/ab-$v/tools/perf/mep-perf" -n "$n" -o "$op" -b 1M -e 64M -f 4 \
        -w 2 -i 8 | grep -E '^ +[0-9]'
    done; done
  done; done
done
