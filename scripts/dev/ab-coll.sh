#!/usr/bin/env bash
# A/B of the host collectives on tcp over loopback: this tree against
# another source tree of the project (BEFORE_DIR, e.g. made with
# `git archive REV | tar -x -C DIR`), both built release without CUDA;
# mep-perf's all-reduce and reduce-scatter (or the operations OPS names) on
# 2 and 4 ranks from 1 MiB to 64 MiB, the two builds interleaved REPS times
# (default 2), at the default chunk (1 MiB) and at CHUNK_B (default 4 MiB):
# scripts/dev/ab-tree.sh without the c10d part.
# Usage: scripts/dev/ab-coll.sh BEFORE_DIR [REPS]
set -uo pipefail
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac
[ $# -ge 1 ] || { echo "usage: $0 BEFORE_DIR [REPS]" >&2; exit 2; }
OPS=${OPS:-allreduce reduce_scatter} CHUNKS="1048576 ${CHUNK_B:-4194304}" C10D_ARGS=- \
  exec "$(dirname "$0")/ab-tree.sh" "$@"
