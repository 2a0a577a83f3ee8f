#!/usr/bin/env bash
# Fills .carry/inih (ignored by git) with this machine's inih headers,
# library and a relocatable pkg-config file, for machines without inih
# (the device machine): pass ".carry" as a carried path; the
# scripts/bench-device-*.sh scripts use it when pkg-config finds no inih,
# tests/gpu/wheel.sh its static library (libinih.a, when this machine has it).
set -euo pipefail
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac
cd "$(dirname "$0")/.."
lib=$(pkg-config --variable=libdir inih)
inc=$(pkg-config --variable=includedir inih)
d=.carry/inih
rm -rf "$d" && mkdir -p "$d/include" "$d/lib/pkgconfig"
cp "$inc/ini.h" "$d/include/"
cp -a "$lib"/libinih.so* "$d/lib/"
[ -f "$lib/libinih.a" ] && cp "$lib/libinih.a" "$d/lib/"
cat > "$d/lib/pkgconfig/inih.pc" <<PC
prefix=\${pcfiledir}/../..
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: inih
Description: simple .INI file parser (carried)
Version: $(pkg-config --modversion inih)
Libs: -L\${libdir} -linih
Cflags: -I\${includedir}
PC
echo "carry-inih: $d ready"
