#!/usr/bin/env bash
# The RL sim calibrated on this machine (issue 30, item 7), against real runs
# taken in the same minutes (this VM's speed moves 10-20% within the hour):
#   1. real sync_dp: the synchronous loop data-parallel over 2 devices
#   2. `troupe calibrate` on the same spec and settings (the synchronous loop
#      on one device, then data-parallel over 2, then the decoupled loop's
#      trainer; STEPS steps each, so it sees the runs' own lengths)
#   3. real eta1 / eta2: fixed_lag 1 / 2, trainer on device 0, a generator on 1
# The settings are bench/rl_async.sh's (its spec, rl.init, decoupled_ppo,
# row buckets, one core per device, STEPS steps, held-out evaluation only at
# the start and the end, taken out of steps/s). Then the RL sim with those
# costs on 2 devices (the runs' shape: 16 prompts x 4, STEPS steps) against
# the real step times, and on 1,024 and 16,384 devices (32 completions per
# device, as on 2; 20 steps). Writes OUT/costs.toml, OUT/sim_*.toml and their
# runs, the real runs, OUT/summary.json and OUT/compare.json.
# usage: bench/rl_sim_calibrated.sh BUILD_DIR OUT_DIR [INIT] [STEPS] [ROW_BUCKETS]
set -euo pipefail
build=$1
out=$2
init=${3:-runs/reasoning_sft/checkpoint}
steps=${4:-40}
buckets=${5:-4}
here=$(cd "$(dirname "$0")/.." && pwd)
spec="$here/bench/results/reasoning_rl.toml"
[ -d "$init" ] || { echo "no SFT checkpoint at $init: run bench/results/reasoning_sft.toml first (bench/results/reasoning.md)"; exit 1; }
mkdir -p "$out"
common=(--set rl.init="\"$init\"" --set rl.loss='"decoupled_ppo"' --set rl.row_buckets="$buckets"
        --set topology.devices=2 --set topology.threads_per_device=1)
real() {
  local name=$1; shift
  echo "== real $name: $*"
  "$build/troupe" run "$spec" "${common[@]}" --set run.steps="$steps" --set run.eval_every=0 --set log.progress='"off"' \
    --set log.rollouts=0 --set run.out_dir="\"$out/$name\"" "$@" 2>&1 | grep -E "actors:|done:" || true
}
real sync_dp --set topology.data_parallel=2
echo "== calibrate"
"$build/troupe" calibrate "$spec" --repeat $((steps - 2)) --out "$out/costs.toml" "${common[@]}" \
  --set topology.data_parallel=2 2>&1 | grep -E "^#|^\[sim\]|^rl_" || true
real eta1 --set rl.sync='"fixed_lag"' --set rl.max_staleness=1
real eta2 --set rl.sync='"fixed_lag"' --set rl.max_staleness=2
python3 "$here/bench/rl_async_summary.py" "$out" sync_dp eta1 eta2 > /dev/null
# sim_spec DEVICES STEPS FILE
sim_spec() {
  local prompts=$(( $1 * 8 ))  # x 4 completions = 32 per device
  {
    printf 'spec_version = 1\n[run]\nname = "sim_rl_calibrated_%s"\nmode = "rl"\nseed = 1\nsteps = %s\n' "$1" "$2"
    printf '[topology]\ndevice_kind = "sim"\ndevices = %s\n[rl]\nprompts_per_step = %s\ngroup_size = 4\n' "$1" "$prompts"
    cat "$out/costs.toml"
  } > "$3"
}
sim_spec 2 "$steps" "$out/sim_2.toml"
sim_spec 1024 20 "$out/sim_1024.toml"
sim_spec 16384 20 "$out/sim_16384.toml"
for n in 2 1024 16384; do
  echo "== sim, $n devices"
  "$build/troupe" run "$out/sim_$n.toml" --set run.out_dir="\"$out/sim_$n\"" --set log.progress='"off"' 2>&1 |
    sed -n '/sim RL summary/,$p'
done
python3 - "$out/sim_2/metrics.jsonl" "$out/summary.json" "$out/compare.json" <<'PY'
import json, sys
sim = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("type") == "sim_rl":
        sim[r["topology"].split(" G=")[0]] = r["step_seconds"]
real = json.load(open(sys.argv[2]))
pairs = [("sync_dp", "synchronous"), ("eta1", "decoupled eta=1"), ("eta2", "decoupled eta=2")]
rows = []
print("\n| real run | real s/step | sim | sim s/step | sim / real |")
print("|---|---|---|---|---|")
for label, mode in pairs:
    if label not in real or mode not in sim:
        continue
    r = 1.0 / real[label]["steps_per_s"]
    s = sim[mode]
    rows.append({"real": label, "real_step_s": r, "sim": mode, "sim_step_s": s, "ratio": s / r})
    print(f"| {label} | {r:.3f} | {mode} | {s:.3f} | {s / r:.2f} |")
json.dump(rows, open(sys.argv[3], "w"), indent=1)
PY
