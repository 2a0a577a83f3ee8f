#!/usr/bin/env bash
# Every shell script of the project (scripts/, scripts/dev/, tests/, .ci/run)
# answers --help with its header comment and exit status 0, and does nothing
# else: the --help case must come first, right after the header (and an
# optional `set` line), so that it is read before anything runs. A script
# without it is reported and never executed here (running it could build,
# benchmark or delete). Prints one line per script that fails, exits 1 if
# any did.
# Usage: check_help.sh SOURCE_ROOT
set -u
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac
root=${1:?usage: check_help.sh SOURCE_ROOT}
cd "$root" || exit 2
bad=0 n=0
while IFS= read -r f; do
  n=$((n + 1))
  # the first line that is neither the shebang, a comment nor `set ...`
  first=$(awk 'NR == 1 || /^#/ || /^set / {next} {print; exit}' "$f")
  case $first in
  "case \${1:-} in -h | --help)"*) ;;
  *) echo "FAIL $f: its first command is not the --help case: $first"; bad=$((bad + 1)); continue ;;
  esac
  out=$(timeout 10 bash "$f" --help 2>&1)
  rc=$?
  want=$(awk 'NR > 1 && !/^#/ {exit} NR > 1' "$f" | cut -c3- | head -1)
  if [ $rc -ne 0 ] || [ -z "$want" ] || [ "$(printf '%s\n' "$out" | head -1)" != "$want" ]; then
    echo "FAIL $f: --help exited $rc and printed: $(printf '%s' "$out" | head -2)"
    bad=$((bad + 1))
  fi
done < <({ ls scripts/*.sh scripts/dev/*.sh .ci/run; find tests -name '*.sh'; } | sort -u)
echo "$n scripts, $bad without a working --help"
[ $bad -eq 0 ] && [ $n -gt 0 ]
