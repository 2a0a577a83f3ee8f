#!/usr/bin/env bash
# Runs examples/alltoall as N separate processes (the way a user launches
# ranks) and checks that every rank verified its data.
# usage: run_alltoall.sh ALLTOALL_BINARY NRANKS BYTES
set -u
bin=$1 n=$2 bytes=$3
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
pids=()
for ((r = 0; r < n; r++)); do
  timeout 60 "$bin" --rank "$r" --size "$n" --store "127.0.0.1:$port" \
    --bytes "$bytes" --iters 5 >"$out/$r" 2>&1 &
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
