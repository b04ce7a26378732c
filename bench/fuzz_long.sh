#!/usr/bin/env bash
# Long fuzz of every message decoder (issue 14): the ctest fuzzers
# (EnvelopeFuzz.*: random and mutated Envelope frames through decode and the
# sample checker, and CAF's deserializer; MoeMessages.FuzzedDispatchesNeverCrash:
# mutated Dispatch frames through the expert shard's checks) run over many
# seeds with ITERATIONS inputs each instead of the suite's 40,000. A crash,
# an out-of-bounds read caught by the checks, or a failed invariant fails the
# seed. Prints a table and writes JSON.
# usage: bench/fuzz_long.sh [BUILD_DIR=build] [SEEDS=4] [ITERATIONS=1000000] [JSON=fuzz_long.json]
set -uo pipefail
build=${1:-build}
seeds=${2:-4}
iterations=${3:-1000000}
json=${4:-fuzz_long.json}
bins=("$build/tests/messaging_test:EnvelopeFuzz.*" "$build/tests/moe_messages_test:MoeMessages.FuzzedDispatchesNeverCrash")
for b in "${bins[@]}"; do
  [ -x "${b%%:*}" ] || { echo "fuzz_long: ${b%%:*} is not built (cmake --build $build)" >&2; exit 2; }
done
printf '%-6s %-48s %12s %8s %s\n' seed test inputs seconds result
# Inputs = what the tests report on their "fuzz: A decoded|accepted, B rejected" lines.
rows=()
failures=0
for seed in $(seq 1 "$seeds"); do
  for b in "${bins[@]}"; do
    bin=${b%%:*} filter=${b#*:}
    start=$(date +%s.%N)
    out=$(TROUPE_FUZZ_SEED=$seed TROUPE_FUZZ_ITERATIONS=$iterations "$bin" --gtest_filter="$filter" 2>&1)
    rc=$?
    secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b - a}')
    inputs=$(echo "$out" | sed -n 's/^fuzz: \([0-9]*\) [a-z]*, \([0-9]*\) rejected.*/\1 \2/p' | awk '{n += $1 + $2} END {print n + 0}')
    result=$([ $rc -eq 0 ] && echo ok || echo FAILED)
    [ $rc -eq 0 ] || { failures=$((failures + 1)); echo "$out" | tail -n 20 >&2; }
    printf '%-6s %-48s %12s %8s %s\n' "$seed" "$filter" "$inputs" "$secs" "$result"
    rows+=("{\"seed\":$seed,\"test\":\"$filter\",\"inputs\":$inputs,\"seconds\":$secs,\"ok\":$([ $rc -eq 0 ] && echo true || echo false)}")
  done
done
(IFS=,; echo "{\"bench\":\"fuzz_long\",\"runs\":[${rows[*]}]}") > "$json"
echo "fuzz_long: $failures failure(s); JSON in $json"
exit $((failures > 0))
