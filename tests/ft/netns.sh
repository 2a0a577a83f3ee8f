#!/bin/sh
# netns.sh - runs an ft scenario with every rank in a network namespace of
# its own, each joined by a veth pair to a bridge in this namespace, where
# the store listens on the bridge's address. The driver cuts a rank off by
# taking the bridge end of its veth down (ft_link_set). Every name carries
# this shell's pid, and the trap deletes what was made however the script
# ends (except SIGKILL).
#
#   netns.sh FT_TEST SCENARIO NRANKS [KEY=VALUE...]
#
# Exits 77 (skip) with the reason when namespaces, a bridge or veth pairs
# cannot be made here (not root, no iproute2, no kernel support).
set -u
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac
[ $# -ge 3 ] || { echo "usage: netns.sh FT_TEST SCENARIO NRANKS [KEY=VALUE...]" >&2; exit 2; }
ft=$1 scen=$2 n=$3
shift 3

skip() { echo "netns.sh: skipped: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "creating network namespaces needs root"
command -v ip >/dev/null 2>&1 || skip "no iproute2 ('ip' is not in PATH)"

p="mft$$"          # interface names stay under 15 characters
made_ns=""
cleanup() {
  for r in $(seq 0 $((n - 1))); do
    ip link del "${p}o$r" 2>/dev/null
  done
  ip link del "${p}b" 2>/dev/null
  for ns in $made_ns; do ip netns del "$ns" 2>/dev/null; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

# A /24 of 10/8 that no interface here uses yet.
a=$(( $$ % 200 + 20 )) b=$(( $$ / 200 % 250 + 1 ))
while ip -4 addr show | grep -q " 10\.$a\.$b\."; do b=$(( b % 250 + 1 )); done
net="10.$a.$b"

ip netns add "${p}n0" 2>/dev/null || skip "cannot create a network namespace"
made_ns="${p}n0"
ip link add "${p}b" type bridge 2>/dev/null || skip "cannot create a bridge"
# Frames between the namespaces must not meet the host's iptables rules.
ip link set "${p}b" type bridge forward_delay 0 nf_call_iptables 0 2>/dev/null
ip addr add "$net.1/24" dev "${p}b" && ip link set "${p}b" up || exit 1
for r in $(seq 0 $((n - 1))); do
  ns="${p}n$r"
  if [ "$r" != 0 ]; then
    ip netns add "$ns" || exit 1
    made_ns="$made_ns $ns"
  fi
  ip link add "${p}o$r" type veth peer name "${p}i$r" 2>/dev/null ||
    skip "cannot create a veth pair"
  ip link set "${p}i$r" netns "$ns" &&
    ip link set "${p}o$r" master "${p}b" up &&
    ip -n "$ns" addr add "$net.$((r + 2))/24" dev "${p}i$r" &&
    ip -n "$ns" link set "${p}i$r" up &&
    ip -n "$ns" link set lo up || exit 1
done

echo "netns.sh: $n namespaces ${p}n0.., veths ${p}i*/${p}o*, bridge ${p}b at $net.1"
"$ft" "$scen" "$n" "netns=$p" "store_host=$net.1" "$@"
rc=$?
exit $rc
