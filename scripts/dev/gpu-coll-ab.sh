#!/usr/bin/env bash
# A/B of the CUDA collectives on a GPU machine, both trees in one call:
# builds BEFORE_DIR (a source tree, e.g. `git archive` of an earlier
# commit unpacked into .ab/before, carried) and this tree, each with
# tests/gpu/run.sh --build (in parallel; an existing build is reused);
# runs this tree's device-collective tests (TESTS: run.sh test names,
# default devcoll and cuda_coll on the kernel path with 2 and 4 ranks,
# graphs, 64 MiB messages and a killed rank; TESTS=- none); then
# scripts/bench-cuda.py of each tree against NCCL, for each rank count of
# RANKS (default "4 2"; counts above the GPUs there are are skipped),
# the trees alternating REPS times (default 1), ops OPS (default all),
# with BENCH_ARGS; and scripts/dev/cuda-ab-table.py's table of it all.
# Logs and JSON under ${OUT:-/tmp/gpu-coll-ab}.
# Usage: scripts/dev/gpu-coll-ab.sh BEFORE_DIR
set -uo pipefail
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac
[ $# -eq 1 ] || { echo "usage: $0 BEFORE_DIR" >&2; exit 2; }
cd "$(dirname "$0")/../.."
before=$(cd "$1" && pwd) after=$PWD
out=${OUT:-/tmp/gpu-coll-ab}
mkdir -p "$out"
# the before tree finds inih where this one does (.carry)
[ -e "$before/.carry" ] || ln -s "$after/.carry" "$before/.carry"
(cd "$before" && tests/gpu/run.sh --build > "$out/build-before.log" 2>&1) &
bp=$!
tests/gpu/run.sh --build > "$out/build-after.log" 2>&1 || { tail -30 "$out/build-after.log"; exit 1; }
wait $bp || { tail -30 "$out/build-before.log"; exit 1; }
tests=${TESTS:-devcoll cuda-coll-kernel-2ranks cuda-graph-2ranks cuda-kill-kernel-3ranks cuda-coll-kernel-4ranks cuda-coll-big-2ranks}
[ "$tests" = - ] || OUT=$out/tests ONLY="$tests" tests/gpu/run.sh --tests
ngpu=$(python3 -c 'import torch; print(torch.cuda.device_count())')
export NCCL_NVLS_ENABLE=0 MEP_TCP_IFNAME=lo
if ! pkg-config --exists inih 2>/dev/null; then
  export LD_LIBRARY_PATH=$after/.carry/inih/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
bench() { # tree label ranks rep
  local b=$1/build-gpu
  MEP_PLUGIN_PATH=$b/plugins/tcp:$b/plugins/nvlink \
    LD_LIBRARY_PATH=$b/core:$LD_LIBRARY_PATH PYTHONPATH=$b/frontends/c10d/python \
    timeout 400 python3 "$after/scripts/bench-cuda.py" --ranks "$3" \
    ${OPS:+--ops "$OPS"} --json "$out/$2-n$3-r$4.json" ${BENCH_ARGS:-} \
    > "$out/$2-n$3-r$4.log" 2>&1 || { echo "bench $2 n=$3 rep $4 failed:"; tail -20 "$out/$2-n$3-r$4.log"; }
}
for n in ${RANKS:-4 2}; do
  [ "$n" -le "$ngpu" ] || { echo "skip $n ranks: $ngpu GPUs"; continue; }
  for ((i = 1; i <= ${REPS:-1}; i++)); do
    bench "$before" before "$n" "$i"
    bench "$after" after "$n" "$i"
  done
done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sort | uniq -c
python3 scripts/dev/cuda-ab-table.py "$out" | tee "$out/table.md"
