#!/usr/bin/env bash
# CPU-side measurements on a quiet many-core machine (the device machine of
# docs/perf.md): the cost of [core] agreement on small all-reduces, and the
# time from a lost rank to the survivors' completion. Builds without tests
# in build-dev, with inih from .carry/inih (scripts/carry-inih.sh) when the
# system has none.
# Writes the full output to ${OUT:-/tmp}/bench-device-cpu.txt.
set -uo pipefail
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac
cd "$(dirname "$0")/.."
out=${OUT:-/tmp}/bench-device-cpu.txt
if ! pkg-config --exists inih 2>/dev/null; then
  export PKG_CONFIG_PATH=$PWD/.carry/inih/lib/pkgconfig
  export LD_LIBRARY_PATH=$PWD/.carry/inih/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
meson setup build-dev -Dtests=false -Dc10d=disabled -Dcuda=disabled \
  -Dbuildtype=release >/dev/null && ninja -C build-dev >/dev/null || exit 1
export MEP_PLUGIN_PATH=$PWD/build-dev/plugins/tcp MEP_TCP_IFNAME=lo MEP_LOG=error
perf=build-dev/tools/perf/mep-perf
{
  echo "# $(nproc) cores, $(uname -r)"
  for rep in 1 2 3; do
    for n in 2 4 8; do
      for ag in on off; do
        t=$(MEP_CORE_AGREEMENT=$ag $perf -n $n -o allreduce -b 8 -e 8 -w 500 \
              -i 5000 | awk '$1 == 8 {print $6}')
        echo "allreduce-8B n=$n agreement=$ag rep=$rep us=$t"
      done
    done
  done
  for n in 4 8; do
    build-dev/tools/mep-ft-bench -n $n -r 5
    build-dev/tools/mep-ft-bench -n $n -r 3 --stop
  done
} 2>&1 | tee "$out"
