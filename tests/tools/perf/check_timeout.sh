#!/usr/bin/env bash
# usage: check_timeout.sh MEP-PERF
# The communicator gets 30 s (MEP_CORE_TIMEOUT_MS) to form, but mep-perf's
# waits only -t 5 ms, in which a 64 MiB allreduce over loopback cannot
# finish: a rank must give up on its own at that deadline (not be killed by
# the launcher's backstop), name the operation and mep's reason, print no
# table row, and mep-perf must exit 1.
set -u
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac
out=$(MEP_CORE_TIMEOUT_MS=30000 "$1" -n 2 -t 5 -b 64M -e 64M -w 0 -i 1 2>&1)
rc=$?
echo "$out"
fail() { echo "check_timeout: $*"; exit 1; }
[ $rc -eq 1 ] || fail "exit status $rc, expected 1"
what="(allreduce of|barrier before timing) 67108864 bytes"
grep -qE "^mep-perf: rank [01]: $what failed: MEP_ERR_TIMEOUT: timed out: ." \
  <<<"$out" || fail "no rank reported its timed-out operation"
grep -q "killed" <<<"$out" && fail "a rank had to be killed"
grep -qE '^ *[0-9]' <<<"$out" && fail "a row was printed"
exit 0
