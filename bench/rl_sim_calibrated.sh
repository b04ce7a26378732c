#!/usr/bin/env bash
# The RL sim calibrated on this machine (issue 30, item 7): `troupe calibrate`
# times the real synchronous loop on the reasoning task (the settings of
# bench/rl_async.sh: its spec, rl.init, decoupled_ppo, row buckets, one core
# per device; one device, then data-parallel over 2), and the RL sim runs
# with those costs on 2 devices (the real runs' shape: 16 prompts x 4, STEPS
# steps) and then on 1,024 and 16,384 devices (32 completions per device, as
# on 2). With REAL (an OUT_DIR of bench/rl_async.sh) it sets the sim's step
# times against the real runs': sync_dp against the sim's synchronous loop,
# eta1 / eta2 against its decoupled eta = 1 / 2 (one generator, one trainer).
# Writes OUT/costs.toml, OUT/sim_*.toml and their runs, OUT/compare.json.
# usage: bench/rl_sim_calibrated.sh BUILD_DIR OUT_DIR [INIT] [REAL] [STEPS] [REPEAT] [ROW_BUCKETS]
set -euo pipefail
build=$1
out=$2
init=${3:-runs/reasoning_sft/checkpoint}
real=${4:-}
steps=${5:-40}
repeat=${6:-12}
buckets=${7:-4}
here=$(cd "$(dirname "$0")/.." && pwd)
spec="$here/bench/results/reasoning_rl.toml"
[ -d "$init" ] || { echo "no SFT checkpoint at $init: run bench/results/reasoning_sft.toml first (bench/results/reasoning.md)"; exit 1; }
mkdir -p "$out"
"$build/troupe" calibrate "$spec" --repeat "$repeat" --out "$out/costs.toml" \
  --set rl.init="\"$init\"" --set rl.loss='"decoupled_ppo"' --set rl.row_buckets="$buckets" \
  --set topology.devices=2 --set topology.data_parallel=2 --set topology.threads_per_device=1 2>&1 |
  grep -v "calibrate rl:" || true
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
[ -n "$real" ] || exit 0
python3 - "$out/sim_2/metrics.jsonl" "$real/summary.json" "$out/compare.json" <<'PY'
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
