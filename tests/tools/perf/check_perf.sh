#!/usr/bin/env bash
# usage: check_perf.sh ROWS WRONG MEP-PERF [ARGS...]
# Runs mep-perf and checks its table against what the arguments imply:
# exactly ROWS rows, each with a numeric #wrong column; that column sums to
# WRONG, "# errors: WRONG" ends the output, and the exit status is 0 when
# WRONG is 0 and 1 otherwise.
set -u
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac
rows=$1 wrong=$2
shift 2
out=$("$@" 2>&1)
rc=$?
echo "$out"
fail() { echo "check_perf: $*"; exit 1; }

want_rc=0
[ "$wrong" -ne 0 ] && want_rc=1
[ $rc -eq $want_rc ] || fail "exit status $rc, expected $want_rc"

# Table rows start with blanks and a digit (CSV rows with a digit); mep-perf's
# own comments start with '#', other ranks' messages with a word.
table=$(grep -E '^ *[0-9]' <<<"$out")
got_rows=$(grep -c . <<<"$table")
[ "$got_rows" -eq "$rows" ] || fail "$got_rows rows, expected $rows"
sum=$(awk -F'[ ,]+' '{ w = $NF; if (w !~ /^[0-9]+$/) bad = 1; s += w }
                     END { print bad ? "bad" : s + 0 }' <<<"$table")
[ "$sum" = "$wrong" ] || fail "the #wrong column sums to $sum, expected $wrong"
grep -qx "# errors: $wrong" <<<"$out" || fail "no '# errors: $wrong' line"
grep -q '^# avg busbw: [0-9.]* GB/s$' <<<"$out" || fail "no '# avg busbw' line"
if [[ " $* " == *" --csv "* ]]; then
  head=size,count,type,redop,root,time_us,algbw_gbps,busbw_gbps,wrong
  grep -qx "$head" <<<"$out" || fail "no CSV header"
  [ "$(awk -F, 'NF != 9' <<<"$table")" = "" ] || fail "a CSV row without 9 fields"
fi
exit 0
