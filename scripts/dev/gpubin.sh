#!/usr/bin/env bash
# Copies what the GPU tests and benchmarks run from a CUDA build directory
# (built here: meson setup DIR -Dcuda=enabled) into OUT_DIR, keeping the
# build tree's layout (the binaries find libmep through $ORIGIN), so that
# a device call carries it (run's carry: an ignored folder, 64 MiB in all
# with .carry) and needs no build there, which costs about 4 of the 10
# minutes a call may take. Binaries: libmep, libmep-ep, the plugins, the
# C tests of tests/gpu/run.sh's --tests and --ep phases, mep-plugin-check;
# and the Python package without its extensions.
# The device has CUDA 13 and sm_90 GPUs: build with the same toolkit.
# Usage: scripts/dev/gpubin.sh BUILD_DIR OUT_DIR
set -euo pipefail
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac
[ $# -eq 2 ] || { echo "usage: $0 BUILD_DIR OUT_DIR" >&2; exit 2; }
src=$1 out=$2
rm -rf "$out"
mkdir -p "$out"
n=0
for f in core/libmep.so.0.1.0 frontends/ep/libmep-ep.so.0.1.0 \
  plugins/tcp/libmep-transport-tcp.so plugins/nvlink/libmep-transport-nvlink.so \
  plugins/ibgda/libmep-transport-ibgda.so tests/gpu/devwin/devwin_test \
  tests/gpu/ep/ep_cuda_test tests/gpu/ep/ep_bench \
  tools/plugin-check/mep-plugin-check plugins/nvlink/libmep-transport-peermap.so \
  tests/gpu/cuda_coll tests/gpu/devcoll_test tests/gpu/nvlink_pair \
  tests/gpu/ibgda_model_gpu; do
  [ -f "$src/$f" ] || { echo "skip $f: not built in $src"; continue; }
  mkdir -p "$out/$(dirname "$f")"
  cp "$src/$f" "$out/$f"
  n=$((n + 1))
done
[ -f "$out/core/libmep.so.0.1.0" ] && ln -s libmep.so.0.1.0 "$out/core/libmep.so.0"
[ -f "$out/frontends/ep/libmep-ep.so.0.1.0" ] &&
  ln -s libmep-ep.so.0.1.0 "$out/frontends/ep/libmep-ep.so.0"
# the Python package without its extensions (built against this machine's
# torch): mep.ep then goes through ctypes (MEP_EP_OPS=0, MEP_EP_LIBRARY)
py=frontends/c10d/python/mep
if [ -d "$src/$py" ]; then
  (cd "$src" && find "$py" -name '*.py') | while read -r f; do
    mkdir -p "$out/$(dirname "$f")"
    cp "$src/$f" "$out/$f"
  done
fi
echo "$n files in $out ($(du -sh "$out" | cut -f1))"
