#!/usr/bin/env bash
# A/B: one-shot vs two-shot all-reduce on 2 and 4 ranks, large sizes.
cd "$(dirname "$0")/../.."
export PKG_CONFIG_PATH=$PWD/.carry/inih/lib/pkgconfig LD_LIBRARY_PATH=$PWD/.carry/inih/lib
rm -rf build-dev; meson setup build-dev -Dtests=false -Dc10d=disabled -Dcuda=disabled -Dbuildtype=release >/dev/null || exit 1
ninja -C build-dev >/dev/null || exit 1
export MEP_PLUGIN_PATH=$PWD/build-dev/plugins/tcp MEP_TCP_IFNAME=lo MEP_LOG=error
for n in 2 4; do for ts in 262144 1099511627776; do for ch in 1048576 4194304; do
  echo "n=$n two_shot_bytes=$ts chunk=$ch"
  MEP_CORE_CHUNK_BYTES=$ch MEP_CORE_TWO_SHOT_BYTES=$ts build-dev/tools/perf/mep-perf -n $n -o allreduce -b 1M -e 64M -f 4 -w 3 -i 10 | grep -E "^ +[0-9]"
done; done; done
