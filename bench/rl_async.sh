#!/usr/bin/env bash
# Synchronous against decoupled RL on the same 2 devices, on the reasoning
# task (scratchpad addition, long-tailed completions; bench/results/reasoning.md),
# from its SFT checkpoint. Every run uses decoupled_ppo (the loss latest
# needs; on-policy its behaviour weight is 1) and continuous batching
# (rl.slots, model/continuous_batch.hpp). Runs:
#   sync_dp    rl.sync = "synchronous" data-parallel over both devices, one
#              core each (devices = data_parallel = 2): each device generates
#              half of a step's sequences (the same rollouts as one device),
#              then trains on half of its row buckets; the gradients are
#              summed. The baseline the others are compared with.
#   sync       rl.sync = "synchronous": one device with both cores
#              (threads_per_device = 2): generation (a step's sequences in
#              its slots, refilled as they finish), then training
#   eta1/eta2  rl.sync = "fixed_lag", max_staleness 1 / 2: the trainer on
#              device 0, one generator on device 1, one core each; the
#              generator fills slots freed by a step's tail with the next step
#   latest2    rl.sync = "latest", max_staleness 2: the same, the generator
#              taking each new version between two decode steps
# It prints steps/s, tokens/s, held-out exact match against wall time and the
# time to TARGET (bench/rl_curves.py), each device's idle share and the
# staleness histogram, and writes OUT/summary.json.
# ROW_BUCKETS (default 4) sorts each step's training rows by length into that
# many buckets (rl.row_buckets), each padded to its own longest row.
# usage: bench/rl_async.sh BUILD_DIR OUT_DIR [STEPS] [INIT] [TARGET] [SLOTS] [ROW_BUCKETS]
set -euo pipefail
build=$1
out=$2
steps=${3:-40}
init=${4:-runs/reasoning_sft/checkpoint}
target=${5:-0.75}
slots=${6:-0}
buckets=${7:-4}
here=$(cd "$(dirname "$0")/.." && pwd)
spec="$here/bench/results/reasoning_rl.toml"
[ -d "$init" ] || { echo "no SFT checkpoint at $init: run bench/results/reasoning_sft.toml first (bench/results/reasoning.md)"; exit 1; }
mkdir -p "$out"
common=(--set run.steps="$steps" --set run.eval_every=10 --set log.progress='"off"' --set log.rollouts=0
        --set rl.init="\"$init\"" --set rl.loss='"decoupled_ppo"' --set rl.slots="$slots" --set rl.row_buckets="$buckets")
run() {
  local name=$1; shift
  echo "== $name: $*"
  "$build/troupe" run "$spec" "${common[@]}" --set run.out_dir="\"$out/$name\"" "$@" 2>&1 |
    grep -E "actors:|done:" || true
}
run sync_dp --set topology.devices=2 --set topology.data_parallel=2 --set topology.threads_per_device=1
run sync --set topology.threads_per_device=2
for eta in 1 2; do
  run "eta$eta" --set rl.sync='"fixed_lag"' --set rl.max_staleness=$eta --set topology.devices=2 \
    --set topology.threads_per_device=1
done
run latest2 --set rl.sync='"latest"' --set rl.max_staleness=2 --set topology.devices=2 --set topology.threads_per_device=1
python3 "$here/bench/rl_curves.py" --target "$target" --json "$out/curves.json" \
  sync_dp="$out/sync_dp" sync="$out/sync" eta1="$out/eta1" eta2="$out/eta2" latest2="$out/latest2"
python3 "$here/bench/rl_async_summary.py" "$out" sync_dp sync eta1 eta2 latest2
