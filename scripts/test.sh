#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs the whole test suite twice: in the
# normal build and in a build with AddressSanitizer + UndefinedBehaviorSanitizer
# (there without the suite many-ranks, the collectives on 6 to 9 ranks);
# then the tcp plugin's tests, whose sender and receiver threads share
# sockets and queues with the poll thread, under ThreadSanitizer; then the
# pip path against an installed wheel built without CUDA
# (tests/packaging/run.sh --no-cuda; MEP_TEST_PACKAGING=0 leaves it out);
# then the verbs transport's RDMA tests in one VM with Soft-RoCE
# (tests/verbs/run-vm.sh; one SKIP line where no VM can run). Ends with one
# line "N passed, N failed, N skipped".
# Usage: scripts/test.sh [--no-asan] [--no-tsan] [--no-vm]
set -uo pipefail
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac
cd "$(dirname "$0")/.."
# the time since the start, for CI's log: where its minutes went
elapsed() { echo "$((SECONDS / 60)) min $((SECONDS % 60)) s"; }
./scripts/setup.sh || { echo "0 passed, 1 failed"; exit 1; }
echo "# scripts/setup.sh took $(elapsed)"

asan=1 tsan=1 vm=1
for arg in "$@"; do
  case $arg in
    --no-asan) asan=0 ;;
    --no-tsan) tsan=0 ;;
    --no-vm) vm=0 ;;
  esac
done
prefix="$PWD/_install"
export MEP_TEST_SHM_PLUGIN="$prefix/lib/mep/plugins/libmep-transport-shm.so"

passed=0; failed=0; skipped=0 failures=
stage() { echo "=== tests: $1 (at $(elapsed))"; }  # stage TITLE
run_suite() {  # build-dir label [timeout-multiplier [meson test arguments...]]
  local dir=$1 label=$2
  stage "$label ($dir)"
  meson test -C "$dir" --print-errorlogs --num-processes 2 --timeout-multiplier "${3:-1}" \
    "${@:4}"
  local counts p f k
  counts=$(python3 - "$dir/meson-logs/testlog.json" "$label" <<'PY'
import json, sys
tests = [json.loads(l) for l in open(sys.argv[1])]
res = [t["result"] for t in tests]
ok = sum(r in ("OK", "EXPECTEDFAIL") for r in res)
skip = sum(r == "SKIP" for r in res)
print(ok, len(res) - ok - skip, skip)
# why each failure failed: its name and the last lines it wrote
for t in tests:
    if t["result"] not in ("OK", "EXPECTEDFAIL", "SKIP"):
        out = ((t.get("stdout") or "") + (t.get("stderr") or "")).splitlines()
        print(f"FAIL {sys.argv[2]}: {t['name']} ({t['result']})")
        print("\n".join("  | " + l for l in out[-6:]))
PY
)
  read -r p f k <<<"$(head -1 <<<"$counts")"
  failures+=$(tail -n +2 <<<"$counts")$'\n'
  skipped=$((skipped + k))
  passed=$((passed + p)); failed=$((failed + f))
}

run_suite build "normal build"
if [ "$asan" = 1 ]; then
  if [ ! -f build-asan/build.ninja ]; then
    # No CUDA here: nvcc objects and the static cudart do not take the
    # sanitizers, and without a GPU the CUDA code runs only its "no GPU"
    # answer, which the normal build's tests check.
    meson setup build-asan -Db_sanitize=address,undefined -Db_lundef=false \
      -Dbuildtype=debug -Dcuda=disabled >/dev/null
  fi
  if ninja -C build-asan >/dev/null; then
    # without the runs of 6 to 9 ranks (tests/coll/meson.build)
    ASAN_OPTIONS=detect_leaks=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      run_suite build-asan "ASan+UBSan" 3 --no-suite many-ranks
  else
    echo "ASan build failed"; failed=$((failed + 1))
  fi
fi
if [ "$tsan" = 1 ]; then
  [ -f build-tsan/build.ninja ] ||
    meson setup build-tsan -Db_sanitize=thread -Db_lundef=false -Dbuildtype=debug \
      -Dcuda=disabled -Dc10d=disabled -Dverbs=disabled -Dibgda=disabled >/dev/null
  if ninja -C build-tsan >/dev/null; then
    TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
      run_suite build-tsan "TSan (tcp)" 3 $(meson test -C build-tsan --list 2>/dev/null |
        grep -oE 'tcp-[a-z-]+' | sort -u)
  else
    echo "TSan build failed"; failed=$((failed + 1))
  fi
fi
if [ "${MEP_TEST_PACKAGING:-1}" != 0 ]; then
  stage "packaging (the wheel, installed into a new venv)"
  # Without CUDA: build/ compiled the kernels already, and the CUDA wheel
  # is tested where it can run them (tests/gpu/wheel.sh on a GPU machine).
  tests/packaging/run.sh --no-cuda | tee build/packaging.log
  read -r p f k < <(sed -nE 's/^([0-9]+) passed, ([0-9]+) failed, ([0-9]+) skipped$/\1 \2 \3/p' \
    build/packaging.log | tail -1)
  [ -n "${p:-}" ] || { p=0; f=1; k=0; }
  failures+=$(grep -A8 '^FAIL ' build/packaging.log)$'\n'
  passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + k))
fi
# The verbs set: one line per test and "N passed, N failed" last; exit
# 77 with a SKIP line where neither an RDMA device nor a VM is available.
run_vm() {
  stage "verbs over RDMA (tests/verbs/run-vm.sh)"
  local log=build/verbs-vm.log rc p f
  # the VM's console ends its lines with CR LF: the CRs go
  tests/verbs/run-vm.sh build 2>&1 | tr -d '\r' | tee "$log"
  rc=${PIPESTATUS[0]}
  skipped=$((skipped + $(grep -c '^SKIP ' "$log")))
  failures+=$(grep -A8 '^FAIL ' "$log")$'\n'
  if read -r p f < <(sed -n 's/^\([0-9]*\) passed, \([0-9]*\) failed$/\1 \2/p' "$log" | tail -1) &&
     [ -n "$p" ]; then
    passed=$((passed + p)); failed=$((failed + f))
  elif [ "$rc" != 77 ]; then
    echo "verbs VM tests ended without a summary (exit $rc)"; failed=$((failed + 1))
  fi
}
[ "$vm" = 1 ] && run_vm
# the reasons again at the end, where a log's tail shows them
[ -n "${failures//$'\n'/}" ] && printf '=== failures\n%s' "$failures"
echo "# scripts/test.sh took $(elapsed)"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" = 0 ]
