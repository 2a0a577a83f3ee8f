#!/usr/bin/env bash
# Builds a DeepEP checkout (its v1 line, on NVSHMEM) and runs it beside
# mep.ep on this machine's GPUs, in one go:
#   1. DeepEP's tests/test_low_latency.py as it is, on DeepEP;
#   2. the same file with only `import deep_ep` changed to
#      `import mep.ep as deep_ep`, on mep;
#   3. scripts/bench-deepep.py: both libraries on the same inputs, outputs
#      compared, time per call (eager and CUDA graph) as a table;
#   4. with --intranode, DeepEP's tests/test_intranode.py likewise (its
#      normal mode) on each library; --no-ll leaves out 2 and 3 (the
#      low-latency mode's test and benchmark), --bench-only leaves out all
#      but 3.
# Usage: scripts/deepep-side-by-side.sh DEEPEP_DIR [--ranks N] [--intranode] [--no-ll]
#                                       [--bench-only] [--no-build | --build-only]
# DeepEP is not part of mep: DEEPEP_DIR is a checkout of it, copied to
# ${DEEPEP_BUILD:-/tmp/deepep-build} (the checkout is not touched) and built
# there with torch's extension builder (setup.py build_ext --inplace);
# --no-build reuses an earlier build, --build-only stops after it. mep must
# be built with CUDA first (tests/gpu/run.sh --build makes build-gpu, whose
# Python packages are used), or MEP_GPU_PREBUILT names a folder built
# elsewhere (scripts/dev/gpubin.sh; mep.ep then goes through ctypes, whose
# eager calls cost more host time than its torch extension's). Needs 2
# GPUs (--ranks, default 2), NVSHMEM from pip (nvidia-nvshmem-cu12 or
# -cu13; DeepEP's setup finds it) and rdma-core's headers (the system's,
# or .carry/rdma from scripts/carry-rdma.sh): DeepEP includes mlx5dv.h.
# For hosts whose GPUs talk over NVLink only (no InfiniBand NIC), the copy
# is relaxed as DeepEP's NVLink-only users relax it: NVSHMEM's IBGDA
# transport stays off (its buffer.py turns it on) and the low-latency
# kernel's assertion of one RC QP per local expert goes (there are no QPs);
# NVSHMEM_REMOTE_TRANSPORT=none. Logs go to ${OUT:-/tmp/mep-deepep}; BENCH_ARGS
# go to scripts/bench-deepep.py (e.g. "--hidden 4096").
# Prints one line per step and "N passed, N failed"; exits 1 on a failure.
set -uo pipefail
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac
src='' ranks=2 intranode=0 ll=1 lltest=1 build=1
while [ $# -gt 0 ]; do
  case $1 in
  --ranks) ranks=$2; shift ;;
  --intranode) intranode=1 ;;
  --no-ll) ll=0 ;;
  --bench-only) lltest=0 intranode=0 ;;
  --no-build) build=0 ;;
  --build-only) build=2 ;;
  -*) echo "deepep-side-by-side.sh: unknown argument $1" >&2; exit 2 ;;
  *) src=$1 ;;
  esac
  shift
done
[ -n "$src" ] || { echo "deepep-side-by-side.sh: DEEPEP_DIR is required (--help)" >&2; exit 2; }
if [ ! -f "$src/setup.py" ] || [ ! -f "$src/deep_ep/buffer.py" ]; then
  echo "deepep-side-by-side.sh: $src is not a DeepEP checkout" >&2
  exit 2
fi
src=$(cd "$src" && pwd)
cd "$(dirname "$0")/.." || exit 2
out=${OUT:-/tmp/mep-deepep}
work=${DEEPEP_BUILD:-/tmp/deepep-build}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export NVSHMEM_REMOTE_TRANSPORT=none
# Its compilers: NVSHMEM's headers include cuda/std (CUDA 13 keeps it in
# include/cccl); mlx5dv.h from rdma-core.
cuda=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
export CPATH=$cuda/include/cccl${CPATH:+:$CPATH}
[ -d .carry/rdma/root/usr/include ] && export CPATH=$PWD/.carry/rdma/root/usr/include:$CPATH
pass=0 fail=0
step() { # name, timeout, command...
  local name=$1 to=$2 t0=$SECONDS
  shift 2
  timeout -k 10 "$to" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  if [ $rc -eq 0 ]; then
    pass=$((pass + 1)); echo "ok   $name ($((SECONDS - t0)) s)"
  else
    fail=$((fail + 1)); echo "FAIL $name (rc $rc, $((SECONDS - t0)) s)"
    grep -E "Error|error|assert|MISMATCH" "$out/$name.log" | head -8
    tail -5 "$out/$name.log"
  fi
  return $rc
}
if [ $build != 0 ]; then
  rm -rf "$work" && mkdir -p "$work" && cp -r "$src"/. "$work"/
  sed -i "s/os.environ\['NVSHMEM_IB_ENABLE_IBGDA'\] = '1'/os.environ.setdefault('NVSHMEM_IB_ENABLE_IBGDA', '0')/" \
    "$work/deep_ep/buffer.py"
  sed -i '/EP_DEVICE_ASSERT(ibgda_get_state()->num_rc_per_pe >= num_local_experts);/d' \
    "$work/csrc/kernels/internode_ll.cu"
  step deepep-build 590 env -C "$work" TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS="$(nproc)" \
    python3 setup.py build_ext --inplace || { echo "$pass passed, $fail failed"; exit 1; }
  [ $build = 2 ] && { echo "$pass passed, $fail failed"; exit 0; }
fi
mb=$PWD/${MEP_GPU_PREBUILT:-build-gpu}
mb=${mb%/}
[ -n "${MEP_GPU_PREBUILT:-}" ] &&
  export MEP_EP_OPS=0 MEP_EP_LIBRARY=$mb/frontends/ep/libmep-ep.so.0
mep_py=$mb/frontends/c10d/python
export LD_LIBRARY_PATH=$mb/core${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# inih from .carry/inih (scripts/carry-inih.sh) where the system has none
pkg-config --exists inih 2>/dev/null ||
  export LD_LIBRARY_PATH=$PWD/.carry/inih/lib:$LD_LIBRARY_PATH
export MEP_PLUGIN_PATH=$mb/plugins/tcp:$mb/plugins/nvlink
# DeepEP's tests, and their copies with the one import changed
tests=$work/tests-mep
rm -rf "$tests" && cp -r "$work/tests" "$tests"
sed -i 's/^import deep_ep$/import mep.ep as deep_ep/' "$tests"/test_*.py
grep -q '^import mep.ep as deep_ep$' "$tests/test_low_latency.py" ||
  { echo "deepep-side-by-side.sh: no 'import deep_ep' line in test_low_latency.py"; exit 1; }
args=(--num-processes "$ranks" --num-tokens 128 --hidden 7168 --num-topk 8 --num-experts 256)
if [ $ll = 1 ] && [ $lltest = 1 ]; then
  step ll-deepep 300 env -C "$work/tests" PYTHONPATH="$work" python3 test_low_latency.py "${args[@]}"
  step ll-mep 300 env -C "$tests" PYTHONPATH="$mep_py" python3 test_low_latency.py "${args[@]}"
fi
if [ $ll = 1 ]; then
  step bench-deepep 400 env PYTHONPATH="$work:$mep_py" python3 scripts/bench-deepep.py \
    --ranks "$ranks" --json "$out/bench-deepep.json" ${BENCH_ARGS:-}
fi
if [ $intranode = 1 ]; then
  step intranode-deepep 300 env -C "$work/tests" PYTHONPATH="$work" \
    python3 test_intranode.py --num-processes "$ranks"
  step intranode-mep 300 env -C "$tests" PYTHONPATH="$mep_py" \
    python3 test_intranode.py --num-processes "$ranks"
fi
for f in ll-deepep ll-mep intranode-deepep intranode-mep; do
  [ -f "$out/$f.log" ] && { echo "== $f: timing lines"; grep -E "bandwidth|time|avg_t|tuning|layout" "$out/$f.log" | head -80; }
done
[ -f "$out/bench-deepep.log" ] && cat "$out/bench-deepep.log"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
