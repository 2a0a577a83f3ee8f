#!/bin/sh
# The shm plugin must export exactly one symbol, mep_transport_plugin_v1,
# and need nothing of libmep. Reads the plugin path from $1 or
# $MEP_TEST_SHM_PLUGIN; exits 77 (skip) when neither is given.
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac
plugin=${1:-$MEP_TEST_SHM_PLUGIN}
if [ -z "$plugin" ]; then
  echo "SKIP: set MEP_TEST_SHM_PLUGIN to the out-of-tree build of libmep-transport-shm.so"
  exit 77
fi
if ! command -v nm >/dev/null 2>&1; then
  echo "SKIP: nm (binutils) is not installed"
  exit 77
fi
[ -f "$plugin" ] || { echo "FAIL: $plugin does not exist"; exit 1; }
exports=$(nm -D --defined-only "$plugin" | awk '{print $NF}' | sort)
if [ "$exports" != "mep_transport_plugin_v1" ]; then
  echo "FAIL: $plugin exports:"; echo "$exports"; exit 1
fi
if nm -D --undefined-only "$plugin" | grep -q ' mep_'; then
  echo "FAIL: $plugin needs symbols of libmep:"
  nm -D --undefined-only "$plugin" | grep ' mep_'; exit 1
fi
if command -v readelf >/dev/null 2>&1 &&
   readelf -d "$plugin" | grep NEEDED | grep -q 'libmep\.'; then
  echo "FAIL: $plugin links libmep"; exit 1
fi
echo "PASS: $plugin exports only mep_transport_plugin_v1"
