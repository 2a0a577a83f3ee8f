#!/usr/bin/env bash
# On the device machine: A/B of the low-latency EP benchmark (ep_bench,
# 2 ranks over NVLink, calls in a row: reduce and push combine) from two
# prebuilt folders (scripts/dev/gpubin.sh), interleaved ROUNDS times
# (default 2), then, where B has the ibgda plugin, B's EP and device-window
# tests over ibgda with the GPUs as two hosts. Plugins come from B (a
# plugin of a newer ABI minor loads in an older core). inih and rdma-core
# from .carry, as tests/gpu/run.sh takes them. AB_ENV: VAR=VALUE words
# for the A/B runs (MEP_LAUNCH_HOSTS=1: the GPUs as two hosts, the
# window's proxy over tcp between them). AB_GRAPH=1: instead of ep_bench,
# scripts/bench-ep-eager.py on each build (through ctypes, 2 ranks; eager
# and CUDA-graph time per call, hidden 7168 and 4096), and no ibgda set.
# Usage: [AB_ENV=...] [AB_GRAPH=1] scripts/dev/ab-ep.sh DIR_A DIR_B [ROUNDS]
set -uo pipefail
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac
cd "$(dirname "$0")/../.."
[ $# -ge 2 ] || { echo "usage: $0 DIR_A DIR_B [ROUNDS]" >&2; exit 2; }
a=$(cd "$1" && pwd) b=$(cd "$2" && pwd) rounds=${3:-2}
lib=$PWD/.carry/inih/lib
rdma=$PWD/.carry/rdma/root
if [ -d "$rdma/usr/lib" ]; then
  ma=$(ls "$rdma/usr/lib" | grep -m1 -- -linux-gnu)
  lib=$lib:$rdma/usr/lib/$ma
fi
export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export MEP_TCP_IFNAME=lo MEP_LOG=warn NCCL_NVLS_ENABLE=0
export MEP_PLUGIN_PATH=$b/plugins/tcp:$b/plugins/nvlink
run() { # limit, command...
  local to=$1
  shift
  echo "== $*"
  timeout -k 3 "$to" "$@" 2>&1 | grep -v "^mep\[" | tail -4
  echo "rc ${PIPESTATUS[0]}"
}
graph() { # build dir
  echo "== bench-ep-eager.py on $1"
  env ${AB_ENV:-} MEP_EP_OPS=0 MEP_EP_LIBRARY="$1/frontends/ep/libmep-ep.so.0" \
    LD_LIBRARY_PATH="$1/core:$LD_LIBRARY_PATH" PYTHONPATH="$1/frontends/c10d/python" \
    timeout -k 3 240 python3 scripts/bench-ep-eager.py --ranks 2 --iters 1000 2>&1 |
    grep -v "^mep\["
  echo "rc ${PIPESTATUS[0]}"
}
for ((i = 1; i <= rounds; i++)); do
  for d in "$a" "$b"; do
    [ "${AB_GRAPH:-0}" = 1 ] && { graph "$d"; continue; }
    run 60 env ${AB_ENV:-} "$d/tests/gpu/ep/ep_bench" -n 2 --burst 10
    run 60 env ${AB_ENV:-} MEP_EP_COMBINE_REDUCE=0 "$d/tests/gpu/ep/ep_bench" -n 2 --burst 10
  done
done
[ "${AB_GRAPH:-0}" = 1 ] && exit 0
[ -f "$b/plugins/ibgda/libmep-transport-ibgda.so" ] || exit 0
export MEP_PLUGIN_PATH=$MEP_PLUGIN_PATH:$b/plugins/ibgda
ib=(env MEP_TRANSPORTS=ibgda,nvlink MEP_LAUNCH_HOSTS=1 MEP_IBGDA_BACKEND=model
    MEP_IBGDA_BOOTSTRAP_IFNAME=lo)
run 60 "${ib[@]}" "$b/tests/gpu/devwin/devwin_test" -n 3 --expect mlx5
run 120 "${ib[@]}" "$b/tests/gpu/ep/ep_cuda_test" -n 2 --quick
run 60 "${ib[@]}" "$b/tests/gpu/ep/ep_cuda_test" -n 3 --case fault
run 60 "${ib[@]}" "$b/tests/gpu/ep/ep_bench" -n 2 --iters 10
