#!/usr/bin/env bash
# Builds mep with CUDA on a GPU machine and runs every GPU test, then the
# CUDA benchmark against NCCL when two GPUs are present. One script, so a
# lent machine does it all in one go:
#   tests/gpu/run.sh [--build] [--tests] [--python] [--ep] [--normal] [--probe]
# (none: all but --probe; --build: only the build; --tests: the C tests;
# --python: the PyTorch backend's test and the benchmark; --ep: the device
# window's and the EP frontend's tests and benchmarks; --normal: the EP
# normal mode's tests on CUDA; --probe: the CUDA
# collectives' timing probe; a lent machine runs 10 minutes a call)
# inih comes from .carry/inih (scripts/carry-inih.sh) where the system has
# none, rdma-core from .carry/rdma (scripts/carry-rdma.sh). Logs and
# tables go to ${OUT:-/tmp/mep-gpu}. Prints one line per
# test and "N passed, N failed" at the end; exits 1 on any failure.
# SKIP="name ..." leaves tests out, ONLY="name ..." runs those alone (of
# the phases asked for); BENCH_ARGS go to scripts/bench-cuda.py.
# MEP_GPU_PREBUILT=DIR runs binaries built elsewhere (scripts/dev/gpubin.sh)
# instead of building here: no build, a test whose binary DIR lacks is
# skipped, and mep.ep goes through ctypes (its torch extension is not
# carried).
set -uo pipefail
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac
cd "$(dirname "$0")/../.."
phases=
for a in "$@"; do
  case $a in
  --build | --tests | --python | --ep | --normal | --probe) phases="$phases ${a#--}" ;;
  *) echo "run.sh: unknown argument $a" >&2; exit 2 ;;
  esac
done
[ -n "$phases" ] || phases="tests python ep normal"
want() { case " $phases " in *" $1 "*) return 0 ;; esac; return 1; }
out=${OUT:-/tmp/mep-gpu}
mkdir -p "$out"
# NVLink multicast stays off on shared machines.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if ! pkg-config --exists inih 2>/dev/null; then
  export PKG_CONFIG_PATH=$PWD/.carry/inih/lib/pkgconfig
  export LD_LIBRARY_PATH=$PWD/.carry/inih/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
# rdma-core (verbs, and ibgda's model backend) from .carry/rdma
# (scripts/carry-rdma.sh) where the system has none.
rdma=$PWD/.carry/rdma/root
if ! pkg-config --exists libibverbs 2>/dev/null && [ -d "$rdma" ]; then
  ma=$(ls "$rdma/usr/lib" | grep -m1 -- -linux-gnu)
  export PKG_CONFIG_PATH=$rdma/usr/lib/$ma/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  export CPATH=$rdma/usr/include${CPATH:+:$CPATH}
  export LIBRARY_PATH=$rdma/usr/lib/$ma${LIBRARY_PATH:+:$LIBRARY_PATH}
  export LD_LIBRARY_PATH=$rdma/usr/lib/$ma${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
b=build-gpu
if [ -n "${MEP_GPU_PREBUILT:-}" ]; then
  # relative to the repository: the paths below are $PWD/$b
  b=$(realpath -m --relative-to=. "$MEP_GPU_PREBUILT")
  [ -f "$b/core/libmep.so.0" ] || { echo "run.sh: no libmep in $b" >&2; exit 2; }
  export MEP_EP_OPS=0 MEP_EP_LIBRARY=$PWD/$b/frontends/ep/libmep-ep.so.0
else
  if [ ! -f "$b/build.ninja" ]; then
    meson setup "$b" -Dcuda=enabled -Dc10d=enabled -Dbuildtype=debugoptimized \
      >"$out/setup.log" 2>&1 || { tail -30 "$out/setup.log"; echo "0 passed, 1 failed"; exit 1; }
  fi
  if ! ninja -C "$b" >"$out/build.log" 2>&1; then
    grep -E "error|FAILED" "$out/build.log" | head -30
    echo "0 passed, 1 failed"
    exit 1
  fi
fi
ngpu=$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
echo "GPUs: $ngpu; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
export MEP_PLUGIN_PATH=$PWD/$b/plugins/tcp:$PWD/$b/plugins/nvlink
export MEP_TCP_IFNAME=lo MEP_LOG=${MEP_LOG:-warn}
export LD_LIBRARY_PATH=$PWD/$b/core${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONPATH=$PWD/$b/frontends/c10d/python
pass=0 fail=0
t() { # name, timeout, command... ($SKIP: names not to run; $ONLY)
  local name=$1 to=$2
  shift 2
  case " ${SKIP:-} " in *" $name "*) echo "skip $name (SKIP)"; return ;; esac
  if [ -n "${ONLY:-}" ]; then
    case " $ONLY " in *" $name "*) ;; *) return ;; esac
  fi
  local a
  for a in "$@"; do
    case $a in "$b"/*) [ -e "$a" ] || { echo "skip $name: no $a"; return; } ;; esac
  done
  local t0=$SECONDS
  timeout -k 5 "$to" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  if [ $rc -eq 0 ]; then
    pass=$((pass + 1)); echo "ok   $name ($((SECONDS - t0)) s)"
  elif [ $rc -eq 77 ]; then
    echo "skip $name: $(tail -1 "$out/$name.log")"
  else
    fail=$((fail + 1)); echo "FAIL $name (rc $rc, $((SECONDS - t0)) s)"
    grep -E "FAIL|rror" "$out/$name.log" | head -8
    tail -3 "$out/$name.log"
    # frames of a crash (cuda_coll prints module+offset): to source lines
    grep -E '^  #[0-9]+ ' "$out/$name.log" | head -12 |
      while read -r _ loc _; do
        addr2line -f -C -i -e "${loc%+*}" "${loc##*+}" 2>/dev/null | paste -sd' '
      done
  fi
}
# ibgda over the software model of the NIC (where rdma-core's libmlx5 built
# it); ib: one machine's ranks as hosts of their own (MEP_LAUNCH_HOSTS=1),
# so that ibgda,nvlink picks ibgda between them
ibgda=
if [ -f "$b/plugins/ibgda/libmep-transport-ibgda.so" ]; then
  ibgda=1
  ib1=(env MEP_TRANSPORTS=ibgda,nvlink MEP_IBGDA_BACKEND=model
       MEP_IBGDA_BOOTSTRAP_IFNAME=lo MEP_PLUGIN_PATH="$MEP_PLUGIN_PATH:$PWD/$b/plugins/ibgda")
  ib=("${ib1[@]}" MEP_LAUNCH_HOSTS=1)
fi
if want tests; then
  t devcoll 300 "$b/tests/gpu/devcoll_test"
  t nvlink-pair 120 "$b/tests/gpu/nvlink_pair" "$b/plugins/nvlink/libmep-transport-nvlink.so"
  t plugin-check-nvlink 300 "$b/tools/plugin-check/mep-plugin-check" --quick "$b/plugins/nvlink/libmep-transport-nvlink.so"
  t plugin-check-peermap 300 "$b/tools/plugin-check/mep-plugin-check" --quick "$b/plugins/nvlink/libmep-transport-peermap.so"
  t cuda-coll-staged-2ranks 300 "$b/tests/gpu/cuda_coll" -n 2 --path staged
  t cuda-coll-kernel-2ranks 300 "$b/tests/gpu/cuda_coll" -n 2 --path kernel
  t cuda-graph-2ranks 120 "$b/tests/gpu/cuda_coll" -n 2 --path kernel --graph
  t cuda-kill-kernel-3ranks 120 env MEP_CORE_TIMEOUT_MS=3000 \
    "$b/tests/gpu/cuda_coll" -n 3 --path kernel --kill
  t cuda-kill-staged-3ranks 120 env MEP_CORE_TIMEOUT_MS=3000 \
    "$b/tests/gpu/cuda_coll" -n 3 --path staged --kill
  # ranks sharing a GPU (time-sliced unless MPS runs)
  t cuda-coll-kernel-4ranks 300 "$b/tests/gpu/cuda_coll" -n 4 --path kernel
  [ "$ngpu" -ge 8 ] &&
    t cuda-coll-kernel-8ranks 300 "$b/tests/gpu/cuda_coll" -n 8 --path kernel
  t cuda-coll-big-2ranks 300 "$b/tests/gpu/cuda_coll" -n 2 --big
  # GPU kernels' transports are chosen by what they declare, not by name:
  # nvlink's sources built as "peermap" serve the kernel path
  t peermap-coll-kernel-2ranks 300 env MEP_TRANSPORTS=peermap,tcp \
    "$b/tests/gpu/cuda_coll" -n 2 --path kernel
  # ibgda (built where rdma-core's libmlx5 is installed): GPU warps post
  # mlx5 WQEs that the software model of the NIC carries out; the plugin
  # over the model (host memory)
  if [ -x "$b/tests/gpu/ibgda_model_gpu" ]; then
    t ibgda-model-gpu 300 "$b/tests/gpu/ibgda_model_gpu"
    t plugin-check-ibgda-model 300 env MEP_IBGDA_BACKEND=model \
      MEP_IBGDA_BOOTSTRAP_IFNAME=lo "$b/tools/plugin-check/mep-plugin-check" \
      "$b/plugins/ibgda/libmep-transport-ibgda.so"
  else
    echo "skip ibgda: not built (no libmlx5 / infiniband/mlx5dv.h)"
  fi
fi
if want python; then
  t c10d-cuda 400 python3 tests/gpu/test_c10d_cuda.py
  if [ "$ngpu" -ge 2 ]; then
    t bench-cuda 200 python3 scripts/bench-cuda.py --json "$out/bench-cuda.json" \
      ${BENCH_ARGS:-}
    [ -f "$out/bench-cuda.log" ] && cat "$out/bench-cuda.log"
  fi
  for n in 4 8; do
    [ "$ngpu" -ge $n ] || continue
    t bench-cuda-${n}ranks 300 python3 scripts/bench-cuda.py --ranks $n \
      --json "$out/bench-cuda-${n}ranks.json" ${BENCH_ARGS:-}
    [ -f "$out/bench-cuda-${n}ranks.log" ] && cat "$out/bench-cuda-${n}ranks.log"
  done
fi
if want ep; then
  t devwin-2ranks 300 "$b/tests/gpu/devwin/devwin_test" -n 2 --expect ptr
  t devwin-4ranks 300 "$b/tests/gpu/devwin/devwin_test" -n 4
  t devwin-tcp-3ranks 300 env MEP_TRANSPORTS=tcp "$b/tests/gpu/devwin/devwin_test" -n 3 --expect proxy
  t devwin-peermap-2ranks 300 env MEP_TRANSPORTS=peermap,tcp "$b/tests/gpu/devwin/devwin_test" -n 2 --expect ptr
  t devwin-forced-tcp-2ranks 300 env MEP_CORE_DEVICE_TRANSPORT=tcp "$b/tests/gpu/devwin/devwin_test" -n 2 --expect proxy
  t ep-cuda-peermap-2ranks 300 env MEP_TRANSPORTS=peermap,tcp "$b/tests/gpu/ep/ep_cuda_test" -n 2 --quick
  t ep-cuda-2ranks 300 "$b/tests/gpu/ep/ep_cuda_test" -n 2
  t ep-cuda-4ranks-1gpu-quick 400 env CUDA_VISIBLE_DEVICES=0 "$b/tests/gpu/ep/ep_cuda_test" -n 4 --quick
  [ "$ngpu" -ge 4 ] &&
    t ep-cuda-4ranks-4gpus-quick 400 "$b/tests/gpu/ep/ep_cuda_test" -n 4 --quick
  [ "$ngpu" -ge 8 ] &&
    t ep-cuda-8ranks-8gpus-quick 400 "$b/tests/gpu/ep/ep_cuda_test" -n 8 --quick
  # combine's modes where the rule would not pick them (top-k > 2 x ranks
  # reduces): reduce on 2, 3 (a fault among them) and 4 ranks for every
  # shape, push on 2
  t ep-cuda-2ranks-reduce 300 env MEP_EP_COMBINE_REDUCE=1 "$b/tests/gpu/ep/ep_cuda_test" -n 2 --quick
  t ep-cuda-3ranks-reduce-fault 120 env MEP_EP_COMBINE_REDUCE=1 "$b/tests/gpu/ep/ep_cuda_test" -n 3 --case fault
  t ep-cuda-4ranks-reduce 400 env MEP_EP_COMBINE_REDUCE=1 "$b/tests/gpu/ep/ep_cuda_test" -n 4 --quick
  t ep-cuda-2ranks-reduce-bf16 300 env MEP_EP_COMBINE_REDUCE=1 MEP_EP_COMBINE_PARTIAL=bf16 "$b/tests/gpu/ep/ep_cuda_test" -n 2 --quick
  t ep-cuda-3ranks-reduce-bf16-fault 120 env MEP_EP_COMBINE_REDUCE=1 MEP_EP_COMBINE_PARTIAL=bf16 "$b/tests/gpu/ep/ep_cuda_test" -n 3 --case fault
  t ep-cuda-2ranks-push 300 env MEP_EP_COMBINE_REDUCE=0 "$b/tests/gpu/ep/ep_cuda_test" -n 2 --quick
  t ep-cuda-tcp-2ranks 300 env MEP_TRANSPORTS=tcp "$b/tests/gpu/ep/ep_cuda_test" -n 2 --quick
  t ep-cuda-tcp-3ranks-fault 120 env MEP_TRANSPORTS=tcp "$b/tests/gpu/ep/ep_cuda_test" -n 3 --case fault
  t ep-cuda-tcp-2ranks-repeat 120 env MEP_TRANSPORTS=tcp "$b/tests/gpu/ep/ep_cuda_test" -n 2 --case repeat
  # one machine as several hosts (MEP_LAUNCH_HOSTS=1: a host id per rank):
  # no NVLink between them, so the device window goes through the proxy
  t devwin-hosts-2ranks 300 env MEP_LAUNCH_HOSTS=1 "$b/tests/gpu/devwin/devwin_test" -n 2 --expect proxy
  t ep-cuda-hosts-2ranks 300 env MEP_LAUNCH_HOSTS=1 "$b/tests/gpu/ep/ep_cuda_test" -n 2 --quick
  # combine through the proxy in both modes, whatever the rule picks
  # (reduce needs 3 local experts: the sweep's smaller shapes push), a
  # fault and back-to-back calls in reduce mode, and a group with mapped
  # and proxied peers at once (two hosts of two ranks each)
  t ep-cuda-hosts-2ranks-reduce 300 env MEP_LAUNCH_HOSTS=1 MEP_EP_COMBINE_REDUCE=1 "$b/tests/gpu/ep/ep_cuda_test" -n 2 --quick
  t ep-cuda-hosts-2ranks-reduce-bf16 300 env MEP_LAUNCH_HOSTS=1 MEP_EP_COMBINE_REDUCE=1 MEP_EP_COMBINE_PARTIAL=bf16 "$b/tests/gpu/ep/ep_cuda_test" -n 2 --quick
  t ep-cuda-hosts-2ranks-push 300 env MEP_LAUNCH_HOSTS=1 MEP_EP_COMBINE_REDUCE=0 "$b/tests/gpu/ep/ep_cuda_test" -n 2 --quick
  t ep-cuda-tcp-3ranks-reduce-fault 120 env MEP_TRANSPORTS=tcp MEP_EP_COMBINE_REDUCE=1 "$b/tests/gpu/ep/ep_cuda_test" -n 3 --case fault
  t ep-cuda-tcp-2ranks-reduce-repeat 120 env MEP_TRANSPORTS=tcp MEP_EP_COMBINE_REDUCE=1 "$b/tests/gpu/ep/ep_cuda_test" -n 2 --case repeat
  t ep-cuda-2hosts-4ranks-reduce 400 env MEP_LAUNCH_RANKS_PER_HOST=2 MEP_EP_COMBINE_REDUCE=1 "$b/tests/gpu/ep/ep_cuda_test" -n 4 --quick
  # ibgda over the software model of the NIC between two such hosts:
  # ibgda,nvlink picks ibgda, and kernels post the mlx5 WQEs themselves
  # (kind mlx5); within one host nvlink's mapped kind wins though listed
  # second. ep-bench over the model records the model's cost, not a NIC's.
  if [ -n "$ibgda" ]; then
    t devwin-ibgda-onehost-2ranks 300 "${ib1[@]}" "$b/tests/gpu/devwin/devwin_test" -n 2 --expect ptr
    t devwin-ibgda-hosts-2ranks 300 "${ib[@]}" "$b/tests/gpu/devwin/devwin_test" -n 2 --expect mlx5
    t devwin-ibgda-hosts-3ranks 300 "${ib[@]}" "$b/tests/gpu/devwin/devwin_test" -n 3 --expect mlx5
    t ep-cuda-ibgda-hosts-2ranks 300 "${ib[@]}" "$b/tests/gpu/ep/ep_cuda_test" -n 2 --quick
    t ep-cuda-ibgda-hosts-3ranks-fault 120 "${ib[@]}" "$b/tests/gpu/ep/ep_cuda_test" -n 3 --case fault
    t cuda-coll-ibgda-hosts-2ranks 300 "${ib[@]}" "$b/tests/gpu/cuda_coll" -n 2 --path staged
    t ep-bench-ibgda-hosts 300 "${ib[@]}" "$b/tests/gpu/ep/ep_bench" -n 2 --iters 20
  fi
  eb="$b/tests/gpu/ep/ep_bench -n 2"
  t ep-bench-2ranks 120 $eb
  t ep-bench-split 120 $eb --split
  t ep-bench-row 120 $eb --burst 10
  # the same without the early receive launch, and combine's other modes
  # (A/B): pushed (no reduce); bf16 partial sums; zero-copy reduced, pulled and pushed
  t ep-bench-row-no-early 120 env MEP_EP_EARLY_RECV=0 $eb --burst 10
  t ep-bench-row-4096 120 $eb --burst 10 --hidden 4096
  t ep-bench-row-push 120 env MEP_EP_COMBINE_REDUCE=0 $eb --burst 10
  t ep-bench-row-push-4096 120 env MEP_EP_COMBINE_REDUCE=0 $eb --burst 10 --hidden 4096
  t ep-bench-row-bf16 120 env MEP_EP_COMBINE_PARTIAL=bf16 $eb --burst 10
  t ep-bench-row-bf16-4096 120 env MEP_EP_COMBINE_PARTIAL=bf16 $eb --burst 10 --hidden 4096
  t ep-bench-row-zero-copy 120 $eb --burst 10 --zero-copy
  t ep-bench-row-zero-copy-pull 120 env MEP_EP_COMBINE_REDUCE=0 $eb --burst 10 --zero-copy
  t ep-bench-row-zero-copy-push 120 env MEP_EP_COMBINE_REDUCE=0 MEP_EP_COMBINE_PULL=0 $eb --burst 10 --zero-copy
  t ep-bench-trace 120 env MEP_EP_TRACE=1 $eb --iters 30 --burst 10
  for f in "$out"/ep-bench-*.log; do echo "== $f"; cat "$f"; done
  if [ "$ngpu" -ge 2 ]; then
    t bench-ep 300 python3 scripts/bench-ep.py --json "$out/bench-ep.json" ${EP_BENCH_ARGS:-}
    [ -f "$out/bench-ep.log" ] && cat "$out/bench-ep.log"
    t bench-ep-bf16 300 env MEP_EP_COMBINE_PARTIAL=bf16 python3 scripts/bench-ep.py \
      --json "$out/bench-ep-bf16.json" ${EP_BENCH_ARGS:-}
    [ -f "$out/bench-ep-bf16.log" ] && cat "$out/bench-ep-bf16.log"
    # two GPUs as two hosts: mep through the proxy over tcp against NCCL
    # over sockets
    t bench-ep-hosts 300 python3 scripts/bench-ep.py --hosts --json "$out/bench-ep-hosts.json"
    [ -f "$out/bench-ep-hosts.log" ] && cat "$out/bench-ep-hosts.log"
  fi
fi
if want normal; then
  # the EP normal mode on the CUDA path: test_ep_normal.py's checks on CUDA
  # tensors (2, 3 and 4 ranks over the GPUs there are, ranks killed in the
  # count exchange, a dispatch and a combine, the exchange kernel's errors,
  # the layout kernel alone), and over the proxy (tcp)
  py_normal=(python3 -m pytest -x -q -p no:cacheprovider tests/ep/python/test_ep_normal.py)
  t ep-normal-cuda 600 env MEP_TEST_EP_DEVICE=cuda "${py_normal[@]}" \
    -k "roundtrip or killed or layout_cuda or notify"
  t ep-normal-cuda-tcp 300 env MEP_TEST_EP_DEVICE=cuda MEP_TRANSPORTS=tcp \
    "${py_normal[@]}" -k "roundtrip and 2 or killed and 3-1 or notify and 2"
  # and over ibgda between ranks as hosts: kernels post the WQEs
  [ -n "$ibgda" ] &&
    t ep-normal-cuda-ibgda-hosts 300 env MEP_TEST_EP_DEVICE=cuda "${ib[@]}" \
      "${py_normal[@]}" -k "roundtrip and 2 or killed and 3-1 or notify and 2"
  if [ "$ngpu" -ge 2 ]; then
    t bench-ep-normal 300 python3 scripts/bench-ep-normal.py --kernels 20 --json "$out/bench-ep-normal.json"
    [ -f "$out/bench-ep-normal.log" ] && cat "$out/bench-ep-normal.log"
  fi
  for n in 4 8; do
    [ "$ngpu" -ge $n ] || continue
    t bench-ep-normal-${n}ranks 300 python3 scripts/bench-ep-normal.py --ranks $n --kernels 20 \
      --json "$out/bench-ep-normal-${n}ranks.json"
    [ -f "$out/bench-ep-normal-${n}ranks.log" ] && cat "$out/bench-ep-normal-${n}ranks.log"
  done
fi
if want probe; then
  # the host's cost per call against the kernels' own (a / b / c columns),
  # and a small workspace (more rounds per launch)
  t coll-probe 300 "$b/tests/gpu/coll_probe"
  t coll-probe-small-ws 300 "$b/tests/gpu/coll_probe" --ws 4194304 \
    --sizes 2M,8M,64M
  for f in "$out"/coll-probe*.log; do echo "== $f"; cat "$f"; done
fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
