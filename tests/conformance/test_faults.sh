#!/bin/sh
# test_faults.sh - mep-plugin-check catches plugins that misbehave: the
# fault plugin wraps a good plugin and injects one fault per run; each run
# must FAIL the check meant to catch it, with a telling reason, while the
# wrapper without a fault passes.
# Usage: test_faults.sh TOOL FAULT.so GOOD.so
set -u
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac
tool=$1 fault=$2 good=$3
export MEP_FAULT_INNER="$good"
fails=0

# check FAULT CHECK WANT_RC PATTERN [ARGS...]
check() {
  f=$1 name=$2 want=$3 pattern=$4
  shift 4
  start=$(date +%s)
  out=$(MEP_FAULT=$f "$tool" --quick --check "$name" "$@" "$fault" 2>&1)
  rc=$?
  took=$(( $(date +%s) - start ))
  if [ "$rc" -ne "$want" ]; then
    echo "not ok: fault '$f', check $name: exit $rc, want $want"
    printf '%s\n' "$out" | sed 's/^/    /'
    fails=$((fails + 1))
  elif ! printf '%s\n' "$out" | grep -Eq -- "$pattern"; then
    echo "not ok: fault '$f', check $name: no line matches /$pattern/"
    printf '%s\n' "$out" | sed 's/^/    /'
    fails=$((fails + 1))
  else
    echo "ok: fault '$f' -> $(printf '%s\n' "$out" | grep -E -- "$pattern" | head -n 1) (${took}s)"
  fi
}

check none write-sizes 0 '^PASS write-sizes$'
check none abi 0 '^PASS abi$'
check propsall abi 1 \
  '^FAIL abi: props wrote byte [0-9]+ of a struct whose struct_size is [0-9]+ \(a core of ABI 1.4'
check oldenv abi 1 \
  '^FAIL abi: init called a typed configuration read \(ABI 1.3\) of an env whose struct_size'
check none signal-order 0 '^PASS signal-order$'
check none peer-killed 0 '^PASS peer-killed$'
check corrupt write-sizes 1 \
  '^FAIL write-sizes: rank [01]: byte [0-9]+ of [0-9]+ differs \(got 0x[0-9a-f]{2}, want 0x[0-9a-f]{2}\)'
check drop signal-order 1 '^FAIL signal-order: rank [01]: .*overtook its write'
check dup completions 1 '^FAIL completions: rank [01]: .*not in flight'
check nobounds bounds 1 '^FAIL bounds: rank [01]: a write whose .* was accepted'
check leakfd init-fini 1 '^FAIL init-fini: rank [01]: 20 init/address/fini cycles leaked 20 file descriptors'
check crash write-sizes 1 '^FAIL write-sizes: rank 1 died of signal 6 .* in write\(\)'
check hang write-sizes 1 '^FAIL write-sizes: rank 1: timed out after [0-9]+ ms in poll\(\)' \
  --timeout-ms 1000
check nofail peer-killed 1 \
  '^FAIL peer-killed: rank 0: 2000 ms after rank 1 was SIGKILLed .*no completion with MEP_ERR_PEER_FAILED'
check none reconnect 0 '^PASS reconnect$'
check latefail reconnect 1 \
  '^FAIL reconnect: rank 0: after close of its endpoint, poll reported a failure about rank 1'
check norecon reconnect 1 \
  '^FAIL reconnect: rank 0: connect to rank 1 failed after [0-9]+ ms: MEP_ERR_PEER_FAILED'

# Descriptors (the fault plugin wraps a host-memory plugin, so the parts
# are checked but no kernel dereferences them).
check none descriptors 0 '^SKIP descriptors: the plugin declares no device descriptor kind'
check desc descriptors 0 '^PASS descriptors$'
check desc register 0 '^PASS register$'
check descsize descriptors 1 \
  "^FAIL descriptors: rank [01]: device_descriptor returned 16 bytes \(\*len\) but the part's header says its size is 24 bytes"
check descover descriptors 1 \
  '^FAIL descriptors: rank [01]: device_descriptor given room for 15 bytes \(its part is 16\) wrote byte 15'

# A plugin of CUDA memory only: checks that register nothing run anyway;
# the others register CUDA memory, or skip saying why where there is none
# (a GPU machine gets CUDA memory, which the wrapped host plugin refuses).
check cudaonly connect 0 '^PASS connect$'
check cudaonly register 0 \
  '^SKIP register: the transport does not handle host memory \(mem_kinds 0x2\), which --memory asks for' \
  --memory host
out=$(MEP_FAULT=cudaonly "$tool" --quick --check register "$fault" 2>&1)
if printf '%s\n' "$out" | grep -q '^SKIP register: CUDA memory: '; then
  check cudaonly register 0 \
    '^SKIP register: CUDA memory: (this mep-plugin-check was built without CUDA|no CUDA device)'
else
  check cudaonly register 1 \
    '^FAIL register: rank [01]: reg of [0-9]+ bytes of CUDA memory failed'
fi

# Only a build with LeakSanitizer sees a leak: then the rank that passed
# must still be failed for its exit status.
out=$(MEP_FAULT=leakmem "$tool" --quick --check abi "$fault" 2>&1)
if printf '%s\n' "$out" | grep -q 'LeakSanitizer'; then
  check leakmem abi 1 '^FAIL abi: rank 0 passed but then exited with status'
else
  check leakmem abi 0 '^PASS abi$'
fi

[ "$fails" -eq 0 ] || { echo "$fails failed"; exit 1; }
echo "all passed"
