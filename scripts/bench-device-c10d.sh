#!/usr/bin/env bash
# The c10d benchmark (scripts/bench-c10d.py: mep against gloo in the same
# run) on a quiet many-core machine: builds the backend against the torch
# of its python3 in build-dev-c10d (inih from .carry/inih, made by
# scripts/carry-inih.sh, when the system has none) and writes the table to
# ${OUT:-/tmp}/bench-c10d.md.
set -uo pipefail
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac
cd "$(dirname "$0")/.."
if ! pkg-config --exists inih 2>/dev/null; then
  export PKG_CONFIG_PATH=$PWD/.carry/inih/lib/pkgconfig
  export LD_LIBRARY_PATH=$PWD/.carry/inih/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
meson setup build-dev-c10d -Dtests=false -Dc10d=enabled -Dcuda=disabled \
  -Dbuildtype=release >/dev/null && ninja -C build-dev-c10d >/dev/null || exit 1
export PYTHONPATH=$PWD/build-dev-c10d/frontends/c10d/python
export MEP_PLUGIN_PATH=$PWD/build-dev-c10d/plugins/tcp MEP_TCP_IFNAME=lo
python3 scripts/bench-c10d.py "$@" | tee "${OUT:-/tmp}/bench-c10d.md"
