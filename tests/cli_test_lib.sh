# Helpers for the end-to-end CLI test scripts (sourced): a failure counter,
# expect_exit CODE CMD... (runs CMD, keeps its output in $out, checks the exit
# code), expect_output TEXT (TEXT is in $out) and finish (the summary and the
# script's exit code).
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
expect_exit() {
  local want=$1; shift
  out=$("$@" 2>&1); local got=$?
  [ "$got" -eq "$want" ] || fail "'$*' exited $got, expected $want; output:\n$out"
}
expect_output() {
  grep -qF -- "$1" <<<"$out" || fail "expected '$1' in output of the last command; got:\n$out"
}
finish() {
  if [ "$failures" -ne 0 ]; then
    echo "$failures failure(s)"
    exit 1
  fi
  echo "$1: all passed"
}
