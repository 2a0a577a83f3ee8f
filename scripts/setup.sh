#!/usr/bin/env bash
# Installs what mep needs to build (Debian packages) and builds it into
# build/, installed into _install/ (with the out-of-tree shm example plugin);
# then, for Python users, mep's wheel into the virtual environment .venv
# (scripts/venv.sh, docs/install.md).
# Usage: scripts/setup.sh            (idempotent; re-running only rebuilds)
set -euo pipefail
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac
cd "$(dirname "$0")/.."

# libibverbs-dev builds the verbs plugin; rdma-core and ibverbs-providers
# are the RDMA userland its tests run with (Soft-RoCE in the VM of
# scripts/rdma-vm.sh, which installs what else it needs itself).
need=()
for pkg in meson ninja-build pkg-config gcc libinih-dev iperf3 \
           libibverbs-dev rdma-core ibverbs-providers; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if ((${#need[@]})); then
  echo "setup: installing ${need[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

# The c10d backend builds against the torch of python3 (docs/c10d.md): torch,
# and pytest for its tests (numpy only silences torch's warning), from PyPI
# when python3 cannot import them. Without them the backend is not built.
if command -v python3 >/dev/null 2>&1; then
  py_need=()
  for mod in torch pytest numpy; do
    python3 -c "import $mod" >/dev/null 2>&1 || py_need+=("$mod")
  done
  if ((${#py_need[@]})); then
    echo "setup: pip installing ${py_need[*]} for the c10d backend"
    python3 -m pip install -q "${py_need[@]}" ||
      echo "setup: pip install ${py_need[*]} failed; the c10d backend is not built"
  fi
fi

prefix="$PWD/_install"
if [ ! -f build/build.ninja ]; then
  meson setup build --prefix="$prefix" --libdir=lib
elif ((${#need[@]})); then
  # packages just installed (libibverbs) change what the build finds
  meson setup --reconfigure build >/dev/null
fi
ninja -C build
ninja -C build install >/dev/null

# The shm example is built the way a third party would: out of tree, against
# the installed headers, found through pkg-config.
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
if [ ! -f build-shm-example/build.ninja ]; then
  meson setup build-shm-example examples/plugin-shm --prefix="$prefix" --libdir=lib
fi
ninja -C build-shm-example
ninja -C build-shm-example install >/dev/null
echo "setup: built and installed into $prefix"

# Python users get mep from pip, in .venv. An earlier setup.sh pointed
# python3 at this tree's _install through a mep-c10d.pth file; it goes.
if command -v python3 >/dev/null 2>&1; then
  for site in $(python3 -c 'import site; print(*site.getsitepackages(), site.getusersitepackages())'); do
    pth=$site/mep-c10d.pth
    if [ -f "$pth" ] && [ "$(cat "$pth")" = "$prefix/lib/mep/python" ]; then
      rm -f "$pth" && echo "setup: removed $pth (mep is pip-installed into .venv now)"
    fi
  done
  ./scripts/venv.sh
fi
