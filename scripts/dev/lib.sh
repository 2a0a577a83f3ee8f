#!/usr/bin/env bash
# Functions the development scripts source (`. scripts/dev/lib.sh` from the
# repository root):
#   carried_inih   where the system has no inih, points pkg-config and the
#                  loader at .carry/inih (scripts/carry-inih.sh);
#   two_trees BEFORE_DIR PREFIX [MESON_OPTION...]
#                  builds BEFORE_DIR and this tree, release, without tests,
#                  CUDA, verbs or ibgda, into /tmp/PREFIX-before and
#                  /tmp/PREFIX-after; returns 1 if either build fails.
# Run on its own, it defines them and does nothing.
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "${BASH_SOURCE[0]}" | cut -c3-; exit 0 ;; esac

carried_inih() {
  pkg-config --exists inih 2>/dev/null && return 0
  export PKG_CONFIG_PATH=$PWD/.carry/inih/lib/pkgconfig
  export LD_LIBRARY_PATH=$PWD/.carry/inih/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
}

two_trees() {
  local before=$1 prefix=$2 v src
  shift 2
  carried_inih
  for v in before after; do
    src=$PWD
    [ $v = before ] && src=$before
    rm -rf "/tmp/$prefix-$v"
    (cd "$src" && meson setup "/tmp/$prefix-$v" -Dtests=false -Dcuda=disabled \
      -Dverbs=disabled -Dibgda=disabled -Dbuildtype=release "$@" >/dev/null &&
      ninja -C "/tmp/$prefix-$v" >/dev/null) || { echo "build $v failed" >&2; return 1; }
  done
}
