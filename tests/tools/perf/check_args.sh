#!/usr/bin/env bash
# usage: check_args.sh MEP-PERF
# Every bad command line exits 2 with a message on stderr, before starting
# any rank; --help exits 0 and lists every option.
set -u
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac
perf=$1
status=0
bad() {
  err=$("$perf" "$@" 2>&1 >/dev/null)
  rc=$?
  if [ $rc -ne 2 ] || [ -z "$err" ]; then
    echo "FAIL: mep-perf $* exited $rc with message '$err'"
    status=1
  else
    echo "ok: mep-perf $*: $(head -1 <<<"$err")"
  fi
}
bad --bogus
bad -n 0
bad -n two
bad -o nosuch
bad -d float128
bad -r xor
bad -b 12X
bad -b -8
bad -e 1T
bad -b 2M -e 1M
bad -f 1
bad -w -1
bad -i 0
bad -t 0
bad -o pingpong -n 1
bad -o broadcast -n 2 --root 2
bad -d bool -r avg
bad --inject-error
bad -o alltoall --in-place
bad --store 127.0.0.1:1234
bad --store 127.0.0.1 --rank 0 --size 2
bad --store 127.0.0.1:70000 --rank 0 --size 2
bad --store 127.0.0.1:0 --rank 1 --size 2
bad --store 127.0.0.1:1234 --rank 2 --size 2
bad --store 127.0.0.1:1234 --rank 0 --size 2 -n 2
bad --rank 1
bad -n 2 extra

help=$("$perf" --help)
rc=$?
[ $rc -eq 0 ] || { echo "FAIL: --help exited $rc"; status=1; }
for opt in -n --store --rank --size -o -b -e -f -d -r --root -w -i -c -t \
           --csv allreduce broadcast reduce allgather reduce_scatter alltoall \
           alltoallv gather scatter barrier sendrecv pingpong; do
  grep -q -- "$opt" <<<"$help" || { echo "FAIL: --help lacks $opt"; status=1; }
done
exit $status
