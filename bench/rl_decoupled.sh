#!/usr/bin/env bash
# Colocated synchronous RL against decoupled fixed-lag RL on 2 devices, on
# the RL task of launch/specs/rl_addition.toml (docs/rl.md; results
# in bench/results/decoupled_rl.md). Runs, from the SFT starting point:
#   sync     rl.sync = "synchronous": one device with both cores
#            (threads_per_device = 2): generation, then training, both cores each
#   eta0     rl.sync = "fixed_lag", max_staleness 0: trainer on device 0, one
#            generator on device 1, one core each; they alternate
#   eta1/2   the same with max_staleness 1 / 2: the generator runs ahead
#   actors1  max_staleness 1 with the trainer on the actor runtime
#            (rl.trainer = "actors": DualPipe over both devices, 4 expert
#            shards per MoE layer, 2 optimizer shards, as the main job's
#            phase 2), the generator sharing the cores
# and prints held-out exact match against wall time (bench/rl_curves.py),
# time to the target, and each device's idle share (the rl_actors_end line).
# usage: bench/rl_decoupled.sh BUILD_DIR OUT_DIR [STEPS] [INIT] [TARGET]
set -euo pipefail
build=$1
out=$2
steps=${3:-100}
init=${4:-runs/sft_addition_split/checkpoint}
target=${5:-0.9}
here=$(cd "$(dirname "$0")/.." && pwd)
spec="$here/launch/specs/rl_addition.toml"
[ -d "$init" ] || { echo "no SFT checkpoint at $init: see the header of $spec"; exit 1; }
mkdir -p "$out"
common=(--set run.steps="$steps" --set run.eval_every=20 --set log.progress='"off"' --set rl.init="\"$init\"")
run() {
  local name=$1; shift
  echo "== $name: $*"
  "$build/troupe" run "$spec" "${common[@]}" --set run.out_dir="\"$out/$name\"" "$@" 2>&1 |
    grep -E "actors:|done:" || true
}
run sync --set topology.threads_per_device=2
for eta in 0 1 2; do
  run "eta$eta" --set rl.sync='"fixed_lag"' --set rl.max_staleness=$eta --set topology.devices=2 \
    --set topology.threads_per_device=1
done
run actors1 --set rl.sync='"fixed_lag"' --set rl.max_staleness=1 --set rl.trainer='"actors"' --set topology.devices=2 \
  --set topology.threads_per_device=1 --set topology.stages=2 --set topology.schedule='"dualpipe"' \
  --set topology.microbatches=4 --set topology.expert_shards=4 --set topology.optimizer_shards=2
python3 "$here/bench/rl_curves.py" --target "$target" --json "$out/curves.json" \
  sync="$out/sync" eta0="$out/eta0" eta1="$out/eta1" eta2="$out/eta2" actors1="$out/actors1"
echo "== idle shares (device 0: trainer, device 1: generator), staleness histogram"
for run_name in eta0 eta1 eta2 actors1; do
  python3 - "$out/$run_name/metrics.jsonl" "$run_name" <<'PY'
import json, sys
end = [json.loads(l) for l in open(sys.argv[1]) if '"rl_actors_end"' in l][-1]
print(f"{sys.argv[2]}: wall {end['wall_seconds']:.0f} s, trainer (device 0) idle {100*end['trainer_idle']:.1f}%, "
      f"generator (device 1) idle {100*end['generator_idle']:.1f}%, staleness {end['staleness']}, "
      f"weight syncs {end['weight_syncs']} ({end['weight_sync_bytes']/1e6:.0f} MB, {end['weight_sync_seconds']:.3f} s), "
      f"max buffer depth {end['max_buffer_depth']}, discarded {end['discarded']}")
PY
done
