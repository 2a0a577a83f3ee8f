#!/usr/bin/env bash
# The demo: builds mep (scripts/setup.sh: the C install and, with pip, the
# virtual environment .venv), shows what it finds and the routes a local
# group picks, then runs a small Mixture-of-Experts layer (examples/moe) on
# RANKS CPU processes over the TCP transport, under torchrun from .venv:
# mep.ep dispatches the tokens to their experts' ranks and combines the
# results, and every rank checks its output against the dense
# single-process layer. Without the Python package (no torch) it runs the C
# all-to-all example instead (examples/alltoall), saying why.
# Usage: scripts/demo.sh [RANKS]
set -euo pipefail
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac
export MEP_TCP_IFNAME=${MEP_TCP_IFNAME:-lo}  # loopback: everything runs on this host
cd "$(dirname "$0")/.."
./scripts/setup.sh >/dev/null
n=${1:-4}
bin="$PWD/_install/bin"
py="$PWD/.venv/bin/python"  # mep installed with pip (scripts/venv.sh)
export MEP_TRANSPORTS=${MEP_TRANSPORTS:-tcp}
if [ -x "$PWD/.venv/bin/mep-info" ]; then
  "$PWD/.venv/bin/mep-info" --size "$n"  # the wheel's, as a Python user runs it
else
  "$bin/mep-info" --size "$n"
fi
echo

if ! why=$("$py" -c 'import mep.ep' 2>&1); then
  echo "demo: .venv cannot import mep.ep (${why##*$'\n'}); running the C all-to-all example"
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  pids=()
  for ((r = 0; r < n; r++)); do
    timeout 120 "$bin/alltoall" --rank "$r" --size "$n" --store "127.0.0.1:$port" \
      --bytes 4194304 &
    pids+=($!)
  done
  rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  [ "$rc" = 0 ] && echo "demo: all $n ranks checked their data" || echo "demo: FAILED"
  exit $rc
fi

echo "MoE layer: $n ranks on CPU over tcp, 2 experts each, top-2, BF16 then FP8 dispatch"
# One thread per rank: the ranks share this machine's cores.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
run() {  # .venv's torchrun
  timeout 300 "$PWD/.venv/bin/torchrun" --standalone --nproc-per-node "$n" \
    examples/moe/moe.py --device cpu "$@"
}
rc=0
run || rc=1
run --fp8 || rc=1
if [ "$rc" = 0 ]; then
  echo "demo: every rank's output matched the dense reference, BF16 and FP8 dispatch"
else
  echo "demo: FAILED"
fi
exit $rc
