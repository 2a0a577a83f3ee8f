#!/usr/bin/env bash
# Measures the tcp transport against its references in one run, on loopback:
#   bandwidth of 64 MiB puts (mep-plugin-check --bench) vs iperf3, one stream;
#   8-byte put+signal round trip vs a plain TCP ping-pong (tools/bench).
# Each is run REPEAT times (default 3) and the median is reported, as a
# markdown table ready for docs/perf.md. Usage: scripts/bench-tcp.sh [REPEAT]
set -euo pipefail
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac
export MEP_TCP_IFNAME=${MEP_TCP_IFNAME:-lo}  # loopback: everything runs on this host
cd "$(dirname "$0")/.."
./scripts/setup.sh >/dev/null
repeat=${1:-3}
check=build/tools/plugin-check/mep-plugin-check
tcp=build/plugins/tcp/libmep-transport-tcp.so
ping=build/tools/tcp-pingpong

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

iperf_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
iperf3 -s -1 -p "$iperf_port" -B 127.0.0.1 >/dev/null 2>&1 &
srv=$!
trap 'kill $srv 2>/dev/null || true' EXIT
sleep 0.5

ib=(); mb=(); pr=(); ps=(); mr=()
for ((i = 0; i < repeat; i++)); do
  # iperf3 serves one client per start (-1); restart it for each round.
  if ((i > 0)); then
    iperf3 -s -1 -p "$iperf_port" -B 127.0.0.1 >/dev/null 2>&1 & srv=$!; sleep 0.5
  fi
  ib+=("$(iperf3 -c 127.0.0.1 -p "$iperf_port" -t 5 -J |
          python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/8e9)')")
  wait $srv 2>/dev/null || true
  out=$("$check" --bench --iters 20000 --iters-bw 50 "$tcp")
  mb+=("$(awk '$1=="bandwidth" {print $8}' <<<"$out")")
  mr+=("$(awk '$1=="latency" {print $4}' <<<"$out")")
  pr+=("$("$ping" --bytes 8 --iters 20000 | sed 's/.*rtt_median_us=\([0-9.]*\).*/\1/')")
  ps+=("$("$ping" --spin --bytes 8 --iters 20000 | sed 's/.*rtt_median_us=\([0-9.]*\).*/\1/')")
done
IB=$(printf '%s\n' "${ib[@]}" | median); MB=$(printf '%s\n' "${mb[@]}" | median)
PR=$(printf '%s\n' "${pr[@]}" | median); MR=$(printf '%s\n' "${mr[@]}" | median)
PS=$(printf '%s\n' "${ps[@]}" | median)
cat <<TABLE
| measure | mep tcp | reference | ratio | target |
| --- | --- | --- | --- | --- |
| bandwidth, 64 MiB puts (GB/s) | $MB | iperf3 1 stream: $(printf %.3f "$IB") | $(python3 -c "print(f'{$MB/$IB:.2f}')") (mep/iperf3) | >= 0.8 |
| 8 B put+signal round trip (us, median) | $MR | plain TCP ping-pong, blocking recv: $PR | $(python3 -c "print(f'{$MR/$PR:.2f}')") (mep/plain) | <= 1.5 |
| 8 B put+signal round trip (us, median) | $MR | plain TCP ping-pong, polled recv: $PS | $(python3 -c "print(f'{$MR/$PS:.2f}')") (mep/plain) | <= 1.5 |

runs: $repeat each; all samples: iperf3 ${ib[*]} GB/s; mep ${mb[*]} GB/s; ping-pong blocking ${pr[*]} us, polled ${ps[*]} us; mep ${mr[*]} us
TABLE
