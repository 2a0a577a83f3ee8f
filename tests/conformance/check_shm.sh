#!/usr/bin/env bash
# The conformance suite on the third-party shm example, built out of tree by
# scripts/setup.sh; skipped (77) when $MEP_TEST_SHM_PLUGIN does not name it.
# usage: check_shm.sh MEP_PLUGIN_CHECK
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac
if [ -z "${MEP_TEST_SHM_PLUGIN:-}" ] || [ ! -r "$MEP_TEST_SHM_PLUGIN" ]; then
  echo "SKIP: MEP_TEST_SHM_PLUGIN does not name the built shm example plugin"
  exit 77
fi
exec "$1" --quick "$MEP_TEST_SHM_PLUGIN"
