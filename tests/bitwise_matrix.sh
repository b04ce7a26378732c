#!/usr/bin/env bash
# One cell of the bitwise matrix: runs a bitwise test under one OpenBLAS
# kernel family (OPENBLAS_CORETYPE) and, where the test takes it, one count of
# threads per device (TROUPE_TEST_THREADS, read by the test scripts and
# tests/actors/runtime_test_options.hpp). A family this CPU cannot execute is a skip
# (exit 77), never a pass. Each cell leaves a line in RECORD_DIR for the
# summary `./setup.sh test` prints.
# usage: bitwise_matrix.sh FAMILY THREADS RECORD_DIR NAME -- COMMAND...  (THREADS 0: the test's own)
set -u
family=$1 threads=$2 records=$3 name=$4
shift 4
[ "${1:-}" = "--" ] && shift
cell="$family t$threads"
[ "$threads" = 0 ] && cell="$family"
record() {
  mkdir -p "$records"
  printf '%s\t%s\t%s\t%s\n' "$family" "$threads" "$name" "$1" > "$records/$name.$family.t$threads"
}
source "$(dirname "$0")/cli_test_lib.sh"  # family_flags, cpu_lacks
need=$(family_flags "$family") || { echo "bitwise_matrix.sh: unknown kernel family $family" >&2; exit 2; }
# shellcheck disable=SC2086  # the flags are words
missing=$(cpu_lacks $need)
if [ -n "$missing" ]; then
  record "skipped (this CPU lacks $missing)"
  echo "skipped: $family kernels need $missing, which this CPU lacks"
  exit 77
fi
export OPENBLAS_CORETYPE=$family
[ "$threads" = 0 ] || export TROUPE_TEST_THREADS=$threads
echo "bitwise matrix cell: $name under OpenBLAS $cell"
"$@"
rc=$?
if [ $rc -eq 0 ]; then record passed; else record "FAILED (exit $rc)"; fi
exit $rc
