#!/usr/bin/env bash
# usage: check_store.sh MEP-PERF
# Runs a group of 3 as separate processes with --store, the way it runs
# across hosts: rank 0 serves the store on a port it picks (port 0) and
# prints it; ranks 1 and 2 connect to it. Rank 0's table must show every
# size with 0 wrong elements, and every rank must exit 0.
set -u
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac
perf=$1
dir=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do
    kill -9 "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
  rm -rf "$dir"
}
trap cleanup EXIT
args=(-o allgather -b 1 -e 64K -f 4 -c -w 1 -i 3 -t 20000)

"$perf" --store 127.0.0.1:0 --rank 0 --size 3 "${args[@]}" \
  >"$dir/out0" 2>"$dir/err0" &
pids+=($!)
port=
for _ in $(seq 200); do    # up to 20 s for rank 0 to serve
  port=$(sed -n 's/^mep-perf: store at 127.0.0.1:\([0-9]*\)$/\1/p' "$dir/err0")
  [ -n "$port" ] && break
  sleep 0.1
done
if [ -z "$port" ]; then
  cat "$dir/err0"
  echo "rank 0 printed no store port"
  exit 1
fi
for r in 1 2; do
  "$perf" --store 127.0.0.1:"$port" --rank $r --size 3 "${args[@]}" \
    >"$dir/out$r" 2>"$dir/err$r" &
  pids+=($!)
done
status=0
for r in 0 1 2; do
  wait "${pids[$r]}"
  rc=$?
  echo "--- rank $r exited $rc"; cat "$dir/out$r" "$dir/err$r"
  [ $rc -eq 0 ] || status=1
done
pids=()
# Sizes 1, 4, ..., 65536: 9 rows, each with 0 wrong; others print nothing.
rows=$(grep -cE '^ *[0-9]+ ' "$dir/out0")
[ "$rows" -eq 9 ] || { echo "rank 0 printed $rows rows, expected 9"; status=1; }
awk '/^ *[0-9]/ && $NF != "0" { exit 1 }' "$dir/out0" ||
  { echo "wrong elements"; status=1; }
grep -qx "# errors: 0" "$dir/out0" || status=1
[ ! -s "$dir/out1" ] && [ ! -s "$dir/out2" ] ||
  { echo "ranks 1, 2 printed a table"; status=1; }
exit $status
