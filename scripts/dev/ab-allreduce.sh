#!/usr/bin/env bash
# A/B: one-shot against two-shot all-reduce on tcp over loopback, 2 and 4
# ranks, 1 MiB to 64 MiB, at chunks of 1 and 4 MiB (mep-perf). Builds
# this tree release without CUDA in ${AB_BUILD:-/tmp/ab-allreduce} (never
# in a build directory of the tree), with inih from .carry/inih when the
# system has none.
# Usage: scripts/dev/ab-allreduce.sh
set -uo pipefail
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac
cd "$(dirname "$0")/../.."
b=${AB_BUILD:-/tmp/ab-allreduce}
. scripts/dev/lib.sh
carried_inih
[ -f "$b/build.ninja" ] || meson setup "$b" -Dtests=false -Dc10d=disabled -Dcuda=disabled \
  -Dverbs=disabled -Dibgda=disabled -Dbuildtype=release >/dev/null || exit 1
ninja -C "$b" >/dev/null || exit 1
export MEP_PLUGIN_PATH=$b/plugins/tcp MEP_TCP_IFNAME=lo MEP_LOG=error
for n in 2 4; do for ts in 262144 1099511627776; do for ch in 1048576 4194304; do
  echo "n=$n two_shot_bytes=$ts chunk=$ch"
  MEP_CORE_CHUNK_BYTES=$ch MEP_CORE_TWO_SHOT_BYTES=$ts "$b/tools/perf/mep-perf" -n $n \
    -o allreduce -b 1M -e 64M -f 4 -w 3 -i 10 | grep -E "^ +[0-9]"
done; done; done
