#!/usr/bin/env bash
# Measures the collectives on the tcp transport over loopback, in one run:
#   - 8-byte all-reduce latency and all-reduce bus bandwidth from 4 KiB to
#     256 MiB, on 2 and 4 ranks (mep-perf);
#   - the one-shot / two-shot crossover on 3 and 4 ranks: all-reduce forced
#     one-shot and forced two-shot on the same sizes;
#   - the reference: the single-pair bandwidth mep-plugin-check --bench
#     measures for tcp, in the same run, one way and both ways at once.
#     An n-rank all-reduce moves n x busbw bytes per second over loopback
#     (each rank sends 2(n-1)/n N), both ways at once: where the CPUs, not
#     the links, are the limit, that is what to hold it against.
# Prints markdown for docs/perf.md. MEP_BUILD=DIR takes the binaries of
# an existing build (a device machine's, say) instead of scripts/setup.sh's.
# Usage: [MEP_BUILD=DIR] scripts/bench-coll.sh
set -euo pipefail
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac
export MEP_TCP_IFNAME=${MEP_TCP_IFNAME:-lo}  # loopback: everything runs on this host
cd "$(dirname "$0")/.."
b=${MEP_BUILD:-build}
[ -n "${MEP_BUILD:-}" ] || ./scripts/setup.sh >/dev/null
perf=$b/tools/perf/mep-perf
check=$b/tools/plugin-check/mep-plugin-check
tcp=$b/plugins/tcp/libmep-transport-tcp.so
MEP_PLUGIN_PATH=$(cd "$b/plugins/tcp" && pwd)
export MEP_PLUGIN_PATH
export MEP_TRANSPORTS=tcp

rows() { grep -E '^ +[0-9]' | awk '{printf "| %s | %s | %s |\n", $1, $6, $8}'; }

ref=$("$check" --bench --iters 5000 --iters-bw 20 "$tcp")
pair=$(awk '$1=="bandwidth" {print $8}' <<<"$ref")
both=$(awk '$1=="both_ways" {print $8}' <<<"$ref")
ratio() { python3 -c "print(f'{($1)/($2):.2f}')"; }
echo "Reference: tcp single-pair bandwidth (mep-plugin-check --bench, 64 MiB puts): $pair GB/s one way, $both GB/s both ways at once (both directions' bytes; half of it is $(ratio "$both/2" "$pair") x one way)"
echo
for n in 2 4; do
  lat=$("$perf" -n "$n" -o allreduce -b 8 -e 8 -w 100 -i 2000 | grep -E '^ +8 ' | awk '{print $6}')
  echo "### all-reduce, float32 sum, $n ranks (8 B latency: $lat us)"
  echo
  echo "| bytes | time (us) | busbw (GB/s) |"
  echo "| --- | --- | --- |"
  "$perf" -n "$n" -o allreduce -b 4K -e 256M -f 4 -w 3 -i 10 | rows
  best=$("$perf" -n "$n" -o allreduce -b 256M -e 256M -w 1 -i 5 | grep -E '^ +[0-9]' | awk '{print $8}')
  echo
  echo "256 MiB busbw $best GB/s = $(ratio "$best" "$pair") x the single-pair bandwidth (one way); it moves $n x $best GB/s = $(ratio "$n*$best" "$both") x the both-ways aggregate"
  echo
done
echo "### one-shot against two-shot, 3 and 4 ranks (time in us)"
echo
echo "| bytes | 3 ranks one-shot | 3 ranks two-shot | 4 ranks one-shot | 4 ranks two-shot |"
echo "| --- | --- | --- | --- | --- |"
declare -A t
for n in 3 4; do
  for mode in one two; do
    [ $mode = one ] && th=1G || th=0
    while read -r size time; do t[$n,$mode,$size]=$time; done < <(
      MEP_CORE_TWO_SHOT_BYTES=$th "$perf" -n "$n" -o allreduce -b 4K -e 16M -f 4 -w 3 -i 20 |
        grep -E '^ +[0-9]' | awk '{print $1, $6}')
  done
done
for size in 4096 16384 65536 262144 1048576 4194304 16777216; do
  echo "| $size | ${t[3,one,$size]} | ${t[3,two,$size]} | ${t[4,one,$size]} | ${t[4,two,$size]} |"
done
