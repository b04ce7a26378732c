#!/usr/bin/env bash
# The two-phase job (run.mode = "sft_rl", the built-in default's mode) through
# the `troupe` executable, on a tiny model: validate lists both phases with
# their actors and devices; a run's phase 1 equals the standalone SFT run of
# the same spec (--set run.mode="pretrain") and its phase 2 the standalone RL
# run (run.mode = "rl") from phase 1's checkpoint, checkpoint bytes equal;
# the summary reports both tasks after each phase, consistent with the
# phases' own evaluations and with `troupe eval`; resume continues phase 1
# or skips it, and phase 2's own checkpoint resumes phase 2; phase-2 keys are refused
# outside sft_rl.
# usage: main_job_test.sh TROUPE_BINARY [SOURCE_DIR]
set -uo pipefail
troupe=$1
src=${2:-$(cd "$(dirname "$0")/../.." && pwd)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/../cli_test_lib.sh"  # failures, fail, expect_exit, expect_output
same_checkpoint() {  # DIR_A DIR_B WHAT: every file of A (sub-folders too, e.g. rl_versions/) equal in B, byte for byte
  [ -s "$1/params.f32.zst" ] || { fail "$3: no checkpoint in $1"; return; }
  local rel
  while IFS= read -r rel; do
    cmp -s "$1/$rel" "$2/$rel" || fail "$3: $rel differs ($1 vs $2)"
  done < <(cd "$1" && find . -type f | sed 's|^\./||' | sort)
}

# The tiny model and task shared by every run: 1-digit addition split at the
# units (pairs with both digits in 6..9 are RL's targets, never SFT's).
tiny_model_toml "$work/common.toml" $'target_pairs = "6-9+6-9"\ntarget_column = 0\n[log]\nprogress = "plain"\nprogress_every = 1'
# Phase 1 on the actor runtime as the default does it: DualPipe over 2
# devices with expert-shard and optimizer-shard actors; phase 2 decoupled.
cp "$work/common.toml" "$work/two.toml"
cat >> "$work/two.toml" <<TOML
[run]
mode = "sft_rl"
steps = 4
eval_every = 0
eval_batches = 1
out_dir = "$work/two"
[optim]
lr = 1e-3
warmup_steps = 1
schedule = "constant"
[topology]
devices = 2
stages = 2
schedule = "dualpipe"
microbatches = 4
expert_shards = 2
optimizer_shards = 2
[rl]
steps = 3
eval_every = 2
lr = 3e-3
warmup_steps = 0
sync = "fixed_lag"
max_staleness = 1
prompts_per_step = 2
group_size = 4
max_new_tokens = 4
loss = "dapo"
partial_credit = 0.5
TOML

expect_exit 0 "$troupe" validate "$work/two.toml"
expect_output "two-phase job (run.mode = \"sft_rl\"): phase 1 trains 4 SFT steps and saves $work/two/checkpoint_sft; phase 2 trains 3 RL steps"
expect_output "phase 1/2: SFT"
expect_output "expert:0/1"
expect_output "optimizer:1"
expect_output "phase 2/2: online RL, lr 0.003, warmup 0, evaluation every 2 steps: run.mode = \"rl\" with rl.init = \"$work/two/checkpoint_sft\""
expect_output "decoupled online RL (sync \"fixed_lag\", max_staleness 1): 2 host device(s), 5 actors"
expect_output "    trainer "
expect_output "    generator:0 "
expect_output "summary: held-out exact match (greedy) after SFT and after RL"

# Bad input names the key: phase 2 starts from phase 1, and phase-2 keys
# belong to sft_rl only; a sim topology is not a two-phase job.
expect_exit 3 "$troupe" validate "$work/two.toml" --set rl.init='"elsewhere"'
expect_output "error: [rl] init in run.mode = \"sft_rl\": phase 2 starts from phase 1's checkpoint"
cp "$work/common.toml" "$work/one.toml"
printf '[run]\nmode = "rl"\n[rl]\nsteps = 3\n' >> "$work/one.toml"
expect_exit 3 "$troupe" validate "$work/one.toml"
expect_output "$work/one.toml:22:1: error: [rl] steps is phase 2's value in run.mode = \"sft_rl\""
expect_exit 3 "$troupe" validate "$work/two.toml" --set rl.group_size=1
expect_output "[rl] group_size: group_size = 1"
expect_exit 3 "$troupe" validate "$work/two.toml" --set topology.microbatches=3
expect_output "[topology]"
# rl.sft_fraction (retention): validated with the file's line, needs a split.
expect_exit 0 "$troupe" validate "$work/two.toml" --set rl.sft_fraction=0.5
expect_output "prompts: 50% from the SFT side of the split (rl.sft_fraction = 0.5"
sed 's/^target_pairs = .*/target_pairs = ""/' "$work/two.toml" > "$work/nosplit.toml"
printf 'sft_fraction = 0.25\n' >> "$work/nosplit.toml"
line=$(grep -n '^sft_fraction' "$work/nosplit.toml" | cut -d: -f1)
expect_exit 3 "$troupe" validate "$work/nosplit.toml"
expect_output "$work/nosplit.toml:$line:1: error: [rl] sft_fraction = 0.25 draws RL prompts from the SFT side of a target split"
expect_exit 3 "$troupe" validate "$work/two.toml" --set rl.sft_fraction=1
expect_output "error: [rl] sft_fraction = 1 is out of range"

# The two-phase run.
expect_exit 0 "$troupe" run "$work/two.toml"
expect_output "phase 1/2: SFT, 4 steps"
expect_output "step 4/4"
expect_output "phase 2/2: RL, 3 steps from $work/two/checkpoint_sft"
expect_output "rl step 3/3"
expect_output "summary (seed 1): held-out exact match (greedy)"
grep -qE "^  SFT task: held-out, off the target split +20 +[0-9.]+% +[0-9.]+% +[-+][0-9.]+ pt  \(pass@4 " <<<"$out" || fail "no SFT task row in:\n$out"
grep -qE "^  RL target: held-out target problems +20 +[0-9.]+% +[0-9.]+% +[-+][0-9.]+ pt  \(pass@4 " <<<"$out" || fail "no RL target row in:\n$out"
m="$work/two/metrics.jsonl"
[ "$(grep -c '"type":"phase"' "$m")" -eq 2 ] || fail "metrics.jsonl should hold 2 phase lines"
[ "$(grep -c '"type":"step"' "$m")" -eq 4 ] || fail "metrics.jsonl should hold 4 SFT step lines"
[ "$(grep -c '"type":"rl_step"' "$m")" -eq 3 ] || fail "metrics.jsonl should hold 3 rl_step lines"
grep -q '"type":"summary","seed":1,"sft_steps":4,"rl_steps":3,"sft_task_problems":20,' "$m" || fail "no summary line for 4 + 3 steps"

# (a) Phase 1 is the standalone SFT run of the same spec, bit for bit.
expect_exit 0 "$troupe" run "$work/two.toml" --set run.mode='"pretrain"' --set run.out_dir="\"$work/sft_alone\""
same_checkpoint "$work/sft_alone/checkpoint" "$work/two/checkpoint_sft" "phase 1 against the standalone SFT run"

# (b) Phase 2 is the standalone RL run from phase 1's checkpoint, bit for bit:
# [run] steps / eval_every and [optim] lr / warmup_steps carry rl.steps,
# rl.eval_every, rl.lr, rl.warmup_steps; the topology is the RL one.
cp "$work/common.toml" "$work/rl_alone.toml"
cat >> "$work/rl_alone.toml" <<TOML
[run]
mode = "rl"
steps = 3
eval_every = 2
out_dir = "$work/rl_alone"
[optim]
lr = 3e-3
warmup_steps = 0
schedule = "constant"
[topology]
devices = 2
[rl]
init = "$work/two/checkpoint_sft"
sync = "fixed_lag"
max_staleness = 1
prompts_per_step = 2
group_size = 4
max_new_tokens = 4
loss = "dapo"
partial_credit = 0.5
TOML
expect_exit 0 "$troupe" run "$work/rl_alone.toml"
same_checkpoint "$work/rl_alone/checkpoint" "$work/two/checkpoint" "phase 2 against the standalone RL run"

# (c) The summary's figures are the phases' own: the RL target's before/after
# are phase 2's first and last evaluation; the SFT task's are what a
# standalone RL run scores before its first step on the SFT side of the split
# (every units pair with a digit in 0..5), from phase 1's and from the final
# checkpoint.
python3 - "$m" "$work/rl_alone/metrics.jsonl" <<'PY' || fail "summary figures disagree with the phases' evaluations"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
summ = [l for l in lines if l["type"] == "summary"][-1]
evals = [l for l in lines if l["type"] == "rl_eval"]
alone = [json.loads(l) for l in open(sys.argv[2]) if '"rl_eval"' in l]
assert len(evals) == 3, evals  # before step 1, at step 2, after step 3
assert summ["target_before"] == evals[0]["exact_match"] and summ["target_after"] == evals[-1]["exact_match"], summ
assert summ["target_pass_at_k_after"] == evals[-1]["pass_at_k"], summ
assert summ["target_mean_reward_before"] == evals[0]["mean_reward"], summ
assert summ["target_mean_reward_after"] == evals[-1]["mean_reward"], summ
# (the tiny model's exact match is 0 everywhere; the verifier's partial
# credit makes mean rewards that tell the checkpoints and the sides apart)
assert summ["sft_task_mean_reward_before"] != summ["target_mean_reward_before"], summ
assert summ["target_mean_reward_before"] != summ["target_mean_reward_after"], summ
assert [e["exact_match"] for e in evals] == [e["exact_match"] for e in alone], (evals, alone)
for k in ("sft_task_before", "sft_task_after", "target_before", "target_after"):
    assert 0.0 <= summ[k] <= 1.0, (k, summ)
assert summ["target_problems"] == 20 and summ["sft_task_problems"] == 20, summ
# Phase 2 scores the SFT side at every evaluation too (forgetting while it
# happens): its first and last are the summary's SFT-task figures.
assert all(e["sft_problems"] == 20 for e in evals), evals
assert summ["sft_task_before"] == evals[0]["sft_exact_match"], (summ, evals[0])
assert summ["sft_task_after"] == evals[-1]["sft_exact_match"], (summ, evals[-1])
assert summ["sft_task_mean_reward_after"] == evals[-1]["sft_mean_reward"], (summ, evals[-1])
PY
for which in before:checkpoint_sft after:checkpoint; do
  expect_exit 0 "$troupe" run "$work/rl_alone.toml" --set data.target_pairs='"0-5+0-9"' --set run.steps=1 \
    --set run.eval_every=0 --set rl.init="\"$work/two/${which#*:}\"" --set run.out_dir="\"$work/side_${which%%:*}\""
  python3 - "$m" "$work/side_${which%%:*}/metrics.jsonl" "${which%%:*}" <<'PY' || fail "summary sft_task_${which%%:*} differs from the standalone evaluation"
import json, sys
summ = [json.loads(l) for l in open(sys.argv[1]) if '"summary"' in l][-1]
first = [json.loads(l) for l in open(sys.argv[2]) if '"rl_eval"' in l][0]
assert first["step"] == 0 and first["problems"] == 20, first
w = sys.argv[3]
assert summ["sft_task_" + w] == first["exact_match"], (summ, first)
assert summ["sft_task_pass_at_k_" + w] == first["pass_at_k"], (summ, first)
assert summ["sft_task_mean_reward_" + w] == first["mean_reward"], (summ, first)
PY
done

# Resume: a phase-1 checkpoint mid-way continues phase 1 and then runs phase
# 2 (the same final bytes); one at phase 1's last step skips to phase 2 (the
# same bytes again).
expect_exit 0 "$troupe" run "$work/two.toml" --set run.mode='"pretrain"' --set run.steps=2 --set run.out_dir="\"$work/half\""
expect_exit 0 "$troupe" run "$work/two.toml" --set run.out_dir="\"$work/resumed\"" --set checkpoint.resume="\"$work/half/checkpoint\""
expect_output "step 4/4"
same_checkpoint "$work/two/checkpoint_sft" "$work/resumed/checkpoint_sft" "phase 1 resumed at step 2"
same_checkpoint "$work/two/checkpoint" "$work/resumed/checkpoint" "the job resumed in phase 1"
expect_exit 0 "$troupe" validate "$work/two.toml" --set checkpoint.resume="\"$work/two/checkpoint_sft\""
expect_output "phase 1/2: SFT (skipped: [checkpoint] resume"
expect_exit 0 "$troupe" run "$work/two.toml" --set run.out_dir="\"$work/skip\"" --set checkpoint.resume="\"$work/two/checkpoint_sft\""
expect_output "phase 1/2 (SFT) is done already"
same_checkpoint "$work/two/checkpoint" "$work/skip/checkpoint" "phase 2 after a resume at phase 1's end"
# Resume inside phase 2: a job whose phase 2 stopped after 1 of 3 RL steps
# (its checkpoint holds rl_versions/ for fixed_lag) continues from it, in
# the same out_dir, to the same final bytes and the same summary figures.
expect_exit 0 "$troupe" run "$work/two.toml" --set run.out_dir="\"$work/p2\"" --set rl.steps=1
[ -d "$work/p2/checkpoint/rl_versions" ] || fail "phase 2's checkpoint has no rl_versions/"
expect_exit 0 "$troupe" validate "$work/two.toml" --set run.out_dir="\"$work/p2\"" --set checkpoint.resume="\"$work/p2/checkpoint\""
expect_output "phase 2/2: online RL (resumed from its checkpoint \"$work/p2/checkpoint\" at RL step 1)"
expect_exit 0 "$troupe" run "$work/two.toml" --set run.out_dir="\"$work/p2\"" --set checkpoint.resume="\"$work/p2/checkpoint\""
expect_output "resuming phase 2 from"
expect_output "step 3/3"
same_checkpoint "$work/two/checkpoint" "$work/p2/checkpoint" "the job resumed inside phase 2"
python3 - "$m" "$work/p2/metrics.jsonl" <<'PY' || fail "the resumed job's summary differs from the uninterrupted job's"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1]) if '"summary"' in l][-1]
b = [json.loads(l) for l in open(sys.argv[2]) if '"summary"' in l][-1]
assert b["sft_steps"] == 0 and b["rl_steps"] == 2, b
for k, v in a.items():
    if k.endswith("_seconds") or k in ("sft_steps", "rl_steps", "type"):
        continue
    assert b[k] == v, (k, v, b[k])
PY
# ... and nothing is left at its end; phase 2 goes on from its checkpoint
# with more steps (here as a "latest" run); a phase-2 checkpoint without
# phase 1's finished one is refused.
expect_exit 3 "$troupe" validate "$work/two.toml" --set run.out_dir="\"$work/p2\"" --set checkpoint.resume="\"$work/p2/checkpoint\""
expect_output "nothing is left to train (raise rl.steps to continue phase 2)"
cp -r "$work/p2" "$work/p2_latest"
expect_exit 0 "$troupe" run "$work/two.toml" --set run.out_dir="\"$work/p2_latest\"" \
  --set checkpoint.resume="\"$work/p2_latest/checkpoint\"" --set rl.steps=5 --set rl.sync='"latest"' --set rl.loss='"decoupled_ppo"'
expect_output "step 5/5"
grep -q '"type":"rl_actors_end","sync":"latest",.*"groups_trained":4,.*"double_trained":0' "$work/p2_latest/metrics.jsonl" ||
  fail "phase 2 resumed as latest did not train RL steps 4-5 exactly once"
mv "$work/p2/checkpoint_sft" "$work/p2/gone"
expect_exit 4 "$troupe" run "$work/two.toml" --set run.out_dir="\"$work/p2\"" --set checkpoint.resume="\"$work/p2/checkpoint\"" --set rl.steps=5
expect_output "resuming phase 2 needs phase 1's checkpoint"

if [ "$failures" -gt 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all two-phase job checks passed"
