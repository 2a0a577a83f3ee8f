#!/usr/bin/env bash
# Fills .carry/rdma (ignored by git) with rdma-core's userland from this
# machine's Debian packages (libibverbs, libmlx5 and their headers, libnl),
# unpacked into a prefix of its own with a relocatable pkg-config file, for
# machines without them and without a network (the GPU machine): there the
# verbs and ibgda plugins build against it, and ibgda's model backend runs.
# Pass ".carry" as a carried path; tests/gpu/run.sh uses it when pkg-config
# finds no libibverbs.
#   scripts/carry-rdma.sh [-h|--help]
set -euo pipefail
case ${1:-} in -h | --help) sed -n '2,9p' "$0" | cut -c3-; exit 0 ;; esac
cd "$(dirname "$0")/.."
d=.carry/rdma
rm -rf "$d" && mkdir -p "$d/debs" "$d/root"
(cd "$d/debs" && apt-get download libibverbs-dev libibverbs1 ibverbs-providers \
   libnl-3-200 libnl-route-3-200 libnl-3-dev libnl-route-3-dev >/dev/null 2>&1) ||
  { echo "carry-rdma: apt-get download failed" >&2; exit 1; }
for f in "$d"/debs/*.deb; do dpkg -x "$f" "$d/root"; done
rm -rf "$d/debs"
arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
pc=$d/root/usr/lib/$arch/pkgconfig
# /usr relative to each .pc file, so the tree works wherever it lands
sed -i 's|^\([a-z_]*\)=/usr|\1=${pcfiledir}/../../..|' "$pc"/*.pc
echo "carry-rdma: $d ready ($(ls "$pc" | tr '\n' ' '))"
