#!/usr/bin/env bash
# One GPU call for two kernels at once: the device all-reduce (two-shot)
# and the low-latency dispatch. Builds mep (tests/gpu/run.sh --build) and,
# beside it, a DeepEP checkout (DEEPEP_DIR, as scripts/deepep-side-by-side.sh
# builds it; "-": none, the all-reduce only); then the device-collective
# tests that cover the all-reduce (devcoll, cuda_coll on the kernel path
# with 2 ranks, a killed rank, 64 MiB messages; TESTS=0 leaves them out),
# scripts/bench-cuda.py's all_reduce against NCCL at each workspace size
# WS names (default "default 33554432": the default and 32 MiB, more and
# smaller rounds), and scripts/bench-deepep.py REPS times (default 3;
# BENCH_ARGS go to it, e.g. "--hidden 4096"). Needs 2 GPUs. Logs and
# tables under $OUT (default /tmp/gpu-ar-ll).
# Usage: scripts/dev/gpu-ar-ll.sh DEEPEP_DIR [REPS]
set -uo pipefail
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac
[ $# -ge 1 ] || { echo "usage: $0 DEEPEP_DIR [REPS]" >&2; exit 2; }
cd "$(dirname "$0")/../.."
deepep=$1 reps=${2:-3}
out=${OUT:-/tmp/gpu-ar-ll}
mkdir -p "$out"
dp=''
if [ "$deepep" != - ]; then
  (OUT=$out/deepep scripts/deepep-side-by-side.sh "$deepep" --build-only \
     > "$out/deepep-build.log" 2>&1) &
  dp=$!
fi
tests/gpu/run.sh --build > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
[ "${TESTS:-1}" = 0 ] || OUT=$out SKIP="nvlink-pair plugin-check-nvlink plugin-check-peermap cuda-coll-staged-2ranks \
cuda-kill-staged-3ranks peermap-coll-kernel-2ranks ibgda-model-gpu plugin-check-ibgda-model \
cuda-coll-kernel-4ranks cuda-graph-2ranks" \
  tests/gpu/run.sh --tests
b=build-gpu
export MEP_PLUGIN_PATH=$PWD/$b/plugins/tcp:$PWD/$b/plugins/nvlink MEP_TCP_IFNAME=lo
export LD_LIBRARY_PATH=$PWD/$b/core${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONPATH=$PWD/$b/frontends/c10d/python NCCL_NVLS_ENABLE=0
if ! pkg-config --exists inih 2>/dev/null; then
  export LD_LIBRARY_PATH=$PWD/.carry/inih/lib:$LD_LIBRARY_PATH
fi
for ws in ${WS:-default 33554432}; do
  echo "== bench-cuda all_reduce, workspace $ws"
  if [ "$ws" = default ]; then
    timeout 200 python3 scripts/bench-cuda.py --ops all_reduce --iters 20
  else
    MEP_CORE_CUDA_WORKSPACE_BYTES=$ws timeout 200 python3 scripts/bench-cuda.py \
      --ops all_reduce --iters 20
  fi
done 2>&1 | tee "$out/bench-cuda.log"
[ -n "$dp" ] || exit 0
wait $dp || { echo "DeepEP build failed"; tail -20 "$out/deepep-build.log"; exit 1; }
for ((i = 1; i <= reps; i++)); do
  echo "== bench-deepep run $i"
  OUT=$out/deepep scripts/deepep-side-by-side.sh "$deepep" --no-build --bench-only |
    grep -E '^NVIDIA|^\||MISMATCH|FAIL|bit-identical'
done 2>&1 | tee "$out/bench-deepep.log"
