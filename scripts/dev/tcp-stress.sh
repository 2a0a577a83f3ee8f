#!/usr/bin/env bash
# Runs the tcp plugin's multi-process tests again and again under a
# sanitizer, with the sender and receiver threads on (the tcp-*-senders
# environment of tests/meson.build), on a machine with more CPUs than CI's,
# where the threads really run at once: for races the 2-core CI seldom
# meets. Builds build-stress-SANITIZER (no CUDA, no c10d) first.
# SANITIZER: thread (ThreadSanitizer, the default) or address (with
# UndefinedBehaviorSanitizer). Stops at the first failure and prints its log.
# Usage: scripts/dev/tcp-stress.sh [ROUNDS [SANITIZER]]
set -uo pipefail
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac
cd "$(dirname "$0")/../.."
rounds=${1:-5} san=${2:-thread}
case $san in
thread) opt=thread ;;
address) opt=address,undefined ;;
*) echo "SANITIZER is thread or address, not '$san'" >&2; exit 2 ;;
esac
. scripts/dev/lib.sh
carried_inih
b=build-stress-$san
{ [ -d $b ] || meson setup $b -Db_sanitize=$opt -Db_lundef=false \
    -Dbuildtype=debug -Dcuda=disabled -Dc10d=disabled -Dverbs=disabled \
    -Dibgda=disabled >/dev/null; } && ninja -C $b >/dev/null ||
  { echo "build failed" >&2; exit 1; }
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1"
tests=$(meson test -C $b --list 2>/dev/null | grep -oE 'tcp-[a-z]+-senders' |
  sort -u | tr '\n' ' ')
[ -n "$tests" ] || { echo "no tcp-*-senders tests in $b" >&2; exit 1; }
for ((i = 1; i <= rounds; i++)); do
  if ! meson test -C $b -q --num-processes "$(nproc)" $tests >/dev/null; then
    echo "round $i of $rounds failed:"
    grep -E '^ *[0-9]+/[0-9]+ .*(FAIL|TIMEOUT)' $b/meson-logs/testlog.txt
    tail -n 80 $b/meson-logs/testlog.txt
    exit 1
  fi
  echo "round $i of $rounds: $tests passed"
done
