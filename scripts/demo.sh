#!/usr/bin/env bash
# The demo: builds mep (scripts/setup.sh), shows what it finds and the routes
# a 4-rank local group picks, then runs 4 ranks of examples/alltoall over
# the TCP transport, each checking every word it receives.
# Usage: scripts/demo.sh [RANKS] [BYTES]
set -euo pipefail
export MEP_TCP_IFNAME=${MEP_TCP_IFNAME:-lo}  # loopback: everything runs on this host
cd "$(dirname "$0")/.."
./scripts/setup.sh >/dev/null
n=${1:-4}
bytes=${2:-4194304}
bin="$PWD/_install/bin"
export MEP_TRANSPORTS=${MEP_TRANSPORTS:-tcp}
"$bin/mep-info" --size "$n"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
echo
echo "alltoall: $n ranks, $bytes bytes per pair, store on 127.0.0.1:$port"
pids=()
for ((r = 0; r < n; r++)); do
  timeout 120 "$bin/alltoall" --rank "$r" --size "$n" --store "127.0.0.1:$port" \
    --bytes "$bytes" &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
[ "$rc" = 0 ] && echo "demo: all $n ranks checked their data" || echo "demo: FAILED"
exit $rc
