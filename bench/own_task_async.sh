#!/usr/bin/env bash
# A user's task with a reward program (launch/specs/own_task/, docs/own_task.md):
# 1. The program's overhead on the main job's shape (d_model 128, 4 layers,
#    8 experts, 32 prompts x 8 completions; fresh init): the built-in
#    "exact" reward against the trivial reward.py through the command
#    protocol, the same prompts; the share of a step the reward takes.
# 2. When asynchrony pays: a reward that takes wall time (slow_reward.py: each
#    completion checked for DELAY_MS, 8 at a time, in a child process as
#    code-execution rewards do, or by only waiting, as a remote sandbox
#    service costs), from the example's SFT checkpoint:
#      sync   rl.sync = "synchronous", one device, both cores: generate, then
#             reward (waiting for the program), then train
#      eta1   rl.sync = "fixed_lag", max_staleness 1: the trainer on device 0,
#             a generator on device 1, a reward actor scoring while they run
#    steps/s, idle shares and held-out reward at equal steps
#    (bench/rl_async_summary.py).
# usage: bench/own_task_async.sh BUILD_DIR OUT_DIR [STEPS] [DELAY_MS] [INIT]
set -euo pipefail
build=$(cd "$1" && pwd)
out=$2
steps=${3:-30}
delay=${4:-10}
init=${5:-runs/own_task_sft/checkpoint}
here=$(cd "$(dirname "$0")/.." && pwd)
spec="$here/launch/specs/own_task/rl.toml"
[ -d "$init" ] || { echo "no SFT checkpoint at $init: run launch/specs/own_task/sft.toml first (README, \"Your own task\")"; exit 1; }
init=$(cd "$init" && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
run() {
  local name=$1; shift
  echo "== $name: $*"
  "$build/troupe" run "$spec" --set log.progress='"off"' --set run.out_dir="\"$out/$name\"" "$@" 2>&1 | grep -E "done:|error" || true
}

# 1. Overhead on the main job's shape.
shape=(--set rl.init='""' --set model.d_model=128 --set model.n_layers=4 --set model.n_experts=8 --set model.expert_hidden=256
       --set model.seq_len=64 --set rl.prompts_per_step=32 --set rl.group_size=8 --set run.steps=6 --set run.eval_every=0
       --set data.eval_problems=8 --set topology.threads_per_device=2)
run shape_exact "${shape[@]}" --set rl.reward='"exact"'
run shape_command "${shape[@]}"
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
def steps(name):
    return [json.loads(l) for l in open(f"{out}/{name}/metrics.jsonl") if '"type":"rl_step"' in l][1:]
rows = {}
for name in ("shape_exact", "shape_command"):
    s = steps(name)
    step = sum(r["step_seconds"] for r in s) / len(s)
    reward = sum(r["reward_seconds"] for r in s) / len(s)
    rows[name] = {"step_seconds": step, "reward_seconds": reward, "reward_share": reward / step}
over = (rows["shape_command"]["reward_seconds"] - rows["shape_exact"]["reward_seconds"]) / rows["shape_exact"]["step_seconds"]
print("\n| reward | step (s) | reward (s) | reward share of the step |\n|---|---|---|---|")
for name, r in rows.items():
    print(f"| {name} | {r['step_seconds']:.3f} | {r['reward_seconds']:.4f} | {100 * r['reward_share']:.2f}% |")
print(f"\nthe program's overhead over the built-in reward: {100 * over:.2f}% of a step")
json.dump({"rows": rows, "overhead_share": over}, open(f"{out}/overhead.json", "w"), indent=1)
PY

# 2. A reward that takes wall time: synchronous against fixed_lag, for a
#    reward whose checks run local child processes (CPU: fork and exec on the
#    same 2 cores) and one that only waits (a remote sandbox service).
slow=(--set rl.init="\"$init\"" --set rl.reward_command='["python3", "slow_reward.py"]' --set run.steps="$steps"
      --set run.eval_every="$steps")
export TROUPE_REWARD_DELAY_MS=$delay TROUPE_REWARD_WORKERS=8
for mode in subprocess wait; do
  export TROUPE_REWARD_MODE=$mode
  run "$mode-sync" "${slow[@]}" --set topology.threads_per_device=2
  run "$mode-eta1" "${slow[@]}" --set rl.sync='"fixed_lag"' --set rl.max_staleness=1 --set topology.devices=2 \
    --set topology.threads_per_device=1
done
python3 "$here/bench/rl_async_summary.py" "$out" subprocess-sync subprocess-eta1 wait-sync wait-eta1
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
for name in ("subprocess-sync", "subprocess-eta1", "wait-sync", "wait-eta1"):
    recs = [json.loads(l) for l in open(f"{out}/{name}/metrics.jsonl")]
    ev = [r for r in recs if r.get("type") == "rl_eval"]
    steps = [r for r in recs if r.get("type") == "rl_step"][1:]
    per = lambda k: sum(s[k] for s in steps) / len(steps)
    print(f"{name}: held-out mean reward {ev[0]['mean_reward']:.3f} -> {ev[-1]['mean_reward']:.3f}, exact match "
          f"{ev[0]['exact_match']:.3f} -> {ev[-1]['exact_match']:.3f} at step {ev[-1]['step']}; per step: generation "
          f"{per('gen_seconds'):.3f} s, reward {per('reward_seconds'):.3f} s, training {per('train_seconds'):.3f} s")
PY
