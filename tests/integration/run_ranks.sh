#!/usr/bin/env bash
# Runs an example program (examples/alltoall, examples/ep) as N separate
# processes, the way a user launches ranks, and checks that every rank
# reported its data checked.
# usage: run_ranks.sh BINARY NRANKS [ARGS...]   (each rank also gets
#        --rank R --size N --store 127.0.0.1:PORT, PORT picked free)
set -u
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac
bin=$1 n=$2
shift 2
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
pids=()
for ((r = 0; r < n; r++)); do
  timeout 60 "$bin" --rank "$r" --size "$n" --store "127.0.0.1:$port" "$@" \
    >"$out/$r" 2>&1 &
  pids+=($!)
done
fail=0
for ((r = 0; r < n; r++)); do
  if ! wait "${pids[$r]}"; then
    echo "rank $r failed:"; cat "$out/$r"; fail=1
  elif ! grep -q "checked" "$out/$r"; then
    echo "rank $r printed no result:"; cat "$out/$r"; fail=1
  fi
done
cat "$out"/*
exit $fail
