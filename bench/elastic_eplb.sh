#!/usr/bin/env bash
# Static expert placement against the eplb policy on the real machine
# (bench/results/experts.md): launch/specs/elastic_experts.toml
# without its [[elastic]] events, 4 expert shards per MoE layer, 30 steps,
# balance = "none"; static and eplb (rebalance_every 5, the migration-cost
# gate on) run A/B interleaved ROUNDS times, then bench/elastic_summary.py
# prints each run's mean step time, max/mean shard load, and every
# rebalance (moves, bytes, migration time, stall against its neighbours, the
# gate's decision) and `cmp`s the final checkpoints (same math).
# usage: bench/elastic_eplb.sh BUILD_DIR OUT_DIR [ROUNDS]
set -euo pipefail
build=$1
out=$2
rounds=${3:-2}
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
# The example spec up to its [experts] table (no policy, no events), then the tail.
sed -n '1,/^# Between the events/p' "$here/launch/specs/elastic_experts.toml" | grep -v '^# Between the events' |
  sed -e 's/^steps = 60/steps = 30/' -e 's/^expert_shards = 2 .*/expert_shards = 4/' > "$out/static.toml"
printf '[checkpoint]\nevery = 0\n\n[log]\nlevel = "info"\nprogress = "off"\n' >> "$out/static.toml"
sed 's/^\[checkpoint\]/[experts]\npolicy = "eplb"\nrebalance_every = 5\n\n[checkpoint]/' "$out/static.toml" > "$out/eplb.toml"
echo "load before: $(uptime)"
for i in $(seq 1 "$rounds"); do
  for k in static eplb; do
    "$build/troupe" run "$out/$k.toml" --set run.out_dir="\"$out/r$i$k\"" > "$out/r$i$k.log" 2>&1
  done
done
echo "load after: $(uptime)"
python3 "$here/bench/elastic_summary.py" "$out"
