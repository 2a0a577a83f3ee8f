#!/usr/bin/env bash
# On a 2-GPU device machine: the checks of reduce-mode combine through the
# device window's proxy, from prebuilt folders (scripts/dev/gpubin.sh).
#   --tests B   tests/gpu/run.sh --ep's EP tests over tcp, as two hosts,
#               mixed (two hosts of two ranks), faults, back-to-back calls,
#               and NVLink reduce/push, on build B; the kernels' registers
#   --bench A B the ep_bench A/B as two hosts and over NVLink
#               (scripts/dev/ab-ep.sh), then scripts/bench-ep.py --hosts on
#               A and B
# Both folders need the Python package (gpubin.sh copies it from a build
# with the c10d backend). Output under ${OUT:-/tmp/mep-val}.
# Usage: scripts/dev/val-proxy-reduce.sh --tests B | --bench A B
set -uo pipefail
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac
cd "$(dirname "$0")/../.."
export OUT=${OUT:-/tmp/mep-val}
mkdir -p "$OUT"
case ${1:-} in
--tests)
  b=$2
  ONLY=$(echo ep-cuda-hosts-2ranks ep-cuda-hosts-2ranks-reduce ep-cuda-tcp-3ranks-reduce-fault \
        ep-cuda-tcp-2ranks-reduce-repeat ep-cuda-2hosts-4ranks-reduce ep-cuda-tcp-2ranks \
        ep-cuda-tcp-3ranks-fault ep-cuda-2ranks-reduce ep-cuda-3ranks-reduce-fault \
        ep-cuda-hosts-2ranks-push ep-cuda-tcp-2ranks-repeat ep-cuda-2ranks-push \
        devwin-hosts-2ranks) MEP_GPU_PREBUILT=$b tests/gpu/run.sh --ep
  rc=$?
  command -v cuobjdump >/dev/null &&
    cuobjdump --dump-resource-usage "$b/frontends/ep/libmep-ep.so.0.1.0" 2>/dev/null |
    grep -A1 -E "Function .*(combine|dispatch)" | grep -o "Function [^:]*\|REG:[0-9]* STACK:[0-9]*" |
    paste - - | sort -u | head -20
  exit $rc ;;
--bench)
  a=$2 b=$3
  AB_ENV=MEP_LAUNCH_HOSTS=1 scripts/dev/ab-ep.sh "$a" "$b" 2
  scripts/dev/ab-ep.sh "$a" "$b" 1 | head -40
  for d in "$a" "$b"; do
    echo "== bench-ep.py --hosts on $d"
    env MEP_EP_OPS=0 MEP_EP_LIBRARY="$PWD/$d/frontends/ep/libmep-ep.so.0" \
      LD_LIBRARY_PATH="$PWD/.carry/inih/lib:$PWD/$d/core" \
      PYTHONPATH="$PWD/$d/frontends/c10d/python" MEP_TCP_IFNAME=lo NCCL_NVLS_ENABLE=0 \
      MEP_PLUGIN_PATH="$PWD/$d/plugins/tcp:$PWD/$d/plugins/nvlink" \
      timeout -k 5 300 python3 scripts/bench-ep.py --hosts --json "$OUT/bench-ep-hosts-${d##*/}.json" 2>&1 |
      grep -v "^mep\[\|RuntimeWarning\|from mep.ep" | grep "^|\|check"
  done ;;
*) echo "usage: $0 --tests B | --bench A B" >&2; exit 2 ;;
esac
