#!/bin/sh
# Ranks of one host share the ephemeral ports: each rank connects to every
# other from the interface's address, and the port is picked by connect(),
# which may reuse it towards another destination (plugins/common/
# bind_source.c). In a network namespace of its own with 24 ephemeral
# ports, 8 ranks (9 listening sockets, 28 connections) must still connect
# and all-reduce correctly; with a port picked at bind() they run out
# ("Address already in use"). Skips (77) where no network namespace can be
# made (not root, no unshare or ip).
# Usage: port_sharing.sh MEP_PERF
set -u
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac
perf=${1:?usage: port_sharing.sh MEP_PERF}
if ! command -v unshare >/dev/null || ! command -v ip >/dev/null; then
  echo "skip: unshare or ip is missing"
  exit 77
fi
if ! unshare -n true 2>/dev/null; then
  echo "skip: cannot make a network namespace here"
  exit 77
fi
exec unshare -n sh -c '
  ip link set lo up || exit 1
  echo "40000 40023" >/proc/sys/net/ipv4/ip_local_port_range || exit 77
  out=$("$0" -n 8 -o allreduce -b 8 -e 65536 -w 1 -i 3 -c 2>&1)
  rc=$?
  echo "$out"
  # -c: every result checked; 1 for a failed or wrong call
  [ $rc -eq 0 ] || { echo "FAIL: mep-perf exited with $rc"; exit 1; }
  echo "8 ranks connected over 24 ephemeral ports"
' "$perf"
