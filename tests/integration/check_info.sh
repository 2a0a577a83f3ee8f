#!/usr/bin/env bash
# mep-info lists the tcp plugin as available and prints, for a local group of
# 3 ranks, a full route table: self on the diagonal, tcp elsewhere.
set -u
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac
out=$("$1" --size 3 --timeout-ms 30000 2>&1) || { echo "$out"; exit 1; }
echo "$out"
grep -q "^tcp$" <<<"$out" && grep -q "status:  available" <<<"$out" || exit 1
for r in 0 1 2; do
  want="rank $r:"
  for p in 0 1 2; do
    [ $p = $r ] && want+=" $p=self" || want+=" $p=tcp"
  done
  grep -qx "$want" <<<"$out" || { echo "missing line: $want"; exit 1; }
done
