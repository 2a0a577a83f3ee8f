#!/usr/bin/env bash
# Installs what mep needs to build (Debian packages) and builds it into
# build/, installed into _install/ (with the out-of-tree shm example plugin).
# Usage: scripts/setup.sh            (idempotent; re-running only rebuilds)
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
for pkg in meson ninja-build pkg-config gcc libinih-dev iperf3; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if ((${#need[@]})); then
  echo "setup: installing ${need[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

prefix="$PWD/_install"
if [ ! -f build/build.ninja ]; then
  meson setup build --prefix="$prefix" --libdir=lib
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
