#!/usr/bin/env bash
# On a 2-GPU device machine: EP across "hosts" (MEP_LAUNCH_HOSTS=1: the
# window's proxy over tcp between the GPUs) under settings given as env
# assignments, from one prebuilt folder (scripts/dev/gpubin.sh): ep_bench
# -n 2 --burst 10 (reduce and push combine) for each setting, interleaved
# ROUNDS times, then scripts/bench-ep.py --hosts (against NCCL kept to
# sockets) once per setting. A setting is VAR=VALUE[,VAR=VALUE...]; "-"
# is the defaults.
# Usage: scripts/dev/ep-hosts-env.sh DIR ROUNDS SETTING...
# Example: scripts/dev/ep-hosts-env.sh .gpubin/B 2 - MEP_TCP_SEND_THREAD=on
set -uo pipefail
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac
cd "$(dirname "$0")/../.."
[ $# -ge 3 ] || { echo "usage: $0 DIR ROUNDS SETTING..." >&2; exit 2; }
d=$(cd "$1" && pwd) rounds=$2
shift 2
export LD_LIBRARY_PATH=$PWD/.carry/inih/lib:$d/core${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export MEP_TCP_IFNAME=lo MEP_LOG=warn NCCL_NVLS_ENABLE=0
export MEP_PLUGIN_PATH=$d/plugins/tcp:$d/plugins/nvlink
envof() { [ "$1" = - ] && return; echo "${1//,/ }"; }
for ((i = 1; i <= rounds; i++)); do
  for s in "$@"; do
    for mode in 1 0; do
      echo "== round $i, $s, MEP_EP_COMBINE_REDUCE=$mode"
      # shellcheck disable=SC2046
      timeout -k 3 60 env MEP_LAUNCH_HOSTS=1 MEP_EP_COMBINE_REDUCE=$mode $(envof "$s") \
        "$d/tests/gpu/ep/ep_bench" -n 2 --burst 10 2>&1 | grep -v "^mep\[" | tail -3
    done
  done
done
for s in "$@"; do
  echo "== bench-ep.py --hosts, $s"
  # shellcheck disable=SC2046
  env $(envof "$s") MEP_EP_OPS=0 MEP_EP_LIBRARY="$d/frontends/ep/libmep-ep.so.0" \
    PYTHONPATH="$d/frontends/c10d/python" \
    timeout -k 5 200 python3 scripts/bench-ep.py --hosts 2>&1 |
    grep -v "^mep\[\|RuntimeWarning\|from mep.ep" | grep "^|\|check\|rror"
done
