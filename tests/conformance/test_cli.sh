#!/bin/sh
# test_cli.sh - mep-plugin-check's command line: help, list, usage errors,
# plugins that cannot be loaded, and a short benchmark run.
# Usage: test_cli.sh TOOL BADABI.so NOSYM.so GOOD.so
set -u
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac
tool=$1 badabi=$2 nosym=$3 good=$4
fails=0

# run WANT_RC PATTERN ARGS...: runs the tool, expects exit status WANT_RC
# and a line of its output (stdout and stderr) matching PATTERN (grep -E).
run() {
  want=$1 pattern=$2
  shift 2
  out=$("$tool" "$@" 2>&1)
  rc=$?
  if [ "$rc" -ne "$want" ]; then
    echo "not ok: '$*' exited $rc, want $want"
    printf '%s\n' "$out" | sed 's/^/    /'
    fails=$((fails + 1))
  elif ! printf '%s\n' "$out" | grep -Eq -- "$pattern"; then
    echo "not ok: '$*': no line matches /$pattern/"
    printf '%s\n' "$out" | sed 's/^/    /'
    fails=$((fails + 1))
  else
    echo "ok: '$*'"
  fi
}

run 0 '^Usage: mep-plugin-check ' --help
run 0 '^Usage: mep-plugin-check ' -h
run 2 'which plugin' 
run 2 'exactly one plugin' "$good" "$good"
run 2 'no check named "nosuch"' --check nosuch "$good"
run 2 '--timeout-ms wants a number' --timeout-ms abc "$good"
run 2 'Try .mep-plugin-check --help' --no-such-option "$good"
run 2 '--memory wants host, cuda or auto, not "gpu"' --memory gpu "$good"
run 0 '^  -m, --memory KIND ' --help

# --list names every check, one per line.
for name in abi config-keys init-fini address reachable connect register \
    write-sizes signal-order completions bounds dereg peer-killed reconnect \
    descriptors; do
  run 0 "^$name " --list
done

missing=/nonexistent-dir/libmep-transport-nothing.so
run 1 "cannot load $missing: No such file or directory" "$missing"
run 1 "cannot load $badabi: MEP_ERR_ABI" "$badabi"
run 1 "cannot load $nosym: .*mep_transport_plugin_v1" "$nosym"

# One check, and the summary's format.
run 0 '^1 passed, 0 failed, 0 skipped$' --quick --check connect "$good"
run 0 '^PASS connect$' --quick --check connect "$good"

# The configuration keys, printed with -v.
run 0 '^PASS config-keys$' --check config-keys "$good"
run 0 '^  info:   sockets_per_peer: int, default "0"; ' -v --check config-keys "$good"
# Memory the plugin does not carry is skipped, saying so.
run 0 '^SKIP register: the transport does not handle CUDA memory \(mem_kinds 0x1\), which --memory asks for' \
  --quick --memory cuda --check register "$good"
run 0 '^PASS register$' --quick --memory host --check register "$good"

# The benchmark's table: a latency row, a bandwidth row (one way) and a
# both_ways row.
run 0 '^latency +8 +200 +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +-$' \
  --bench --quick --iters 200 --iters-bw 2 "$good"
run 0 '^bandwidth +4194304 +[0-9]+ +- +- +- +- +[0-9.]+$' \
  --bench --quick --iters 200 --iters-bw 2 "$good"
run 0 '^both_ways +4194304 +[0-9]+ +- +- +- +- +[0-9.]+$' \
  --bench --quick --iters 200 --iters-bw 2 "$good"
run 0 '^bandwidth +4096 +' \
  --bench --quick --sweep --iters 100 --iters-bw 1 "$good"

[ "$fails" -eq 0 ] || { echo "$fails failed"; exit 1; }
echo "all passed"
