#!/usr/bin/env bash
# End-to-end tests of run.mode = "rl" through the `troupe` executable: the
# [rl] section's errors (file:line:col, exit 3), a missing or damaged init
# checkpoint (exit 4, naming the file) for validate and run alike, and a short
# RL run from a pretraining checkpoint that is identical when repeated and
# when resumed halfway.
# usage: rl_cli_test.sh TROUPE_BINARY [SOURCE_DIR]
set -uo pipefail
troupe=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/../cli_test_lib.sh"  # failures, fail, expect_exit, expect_output

# A tiny model: pretrain 3 steps to get an init checkpoint.
tiny_model_toml "$work/model.toml" $'[log]\nprogress = "off"'
cp "$work/model.toml" "$work/pre.toml"
printf '[run]\nsteps = 3\neval_every = 0\nout_dir = "%s/pre"\n' "$work" >> "$work/pre.toml"
expect_exit 0 "$troupe" run "$work/pre.toml"
init="$work/pre/checkpoint"
[ -f "$init/manifest.bin" ] || fail "pretraining wrote no checkpoint"

cp "$work/model.toml" "$work/rl.toml"
cat >> "$work/rl.toml" <<TOML
[run]
mode = "rl"
steps = 4
eval_every = 2
out_dir = "$work/rl1"
[optim]
lr = 1e-3
warmup_steps = 0
schedule = "constant"  # so that a 2-step run and a 4-step run share their first 2 steps
[rl]
init = "$init"
prompts_per_step = 2
group_size = 4
max_new_tokens = 4
kl_coef = 0.01
TOML
expect_exit 0 "$troupe" validate "$work/rl.toml"
expect_output "online RL (synchronous, one process): each step samples 2 prompts x 4 completions"

# [rl] errors name the key's position; each is exit 3.
expect_exit 3 "$troupe" validate "$work/rl.toml" --set rl.group_size=1
expect_output "error: [rl] group_size: group_size = 1: loss \"grpo\" uses group-relative advantages"
expect_exit 3 "$troupe" validate "$work/rl.toml" --set rl.max_new_tokens=40
expect_output "error: [rl] max_new_tokens = 40 does not fit: the task's prompts are 5 tokens and [model] seq_len = 32"
expect_exit 3 "$troupe" validate "$work/rl.toml" --set rl.max_new_tokens=2
expect_output "is shorter than the task's answers"
expect_exit 3 "$troupe" validate "$work/rl.toml" --set model.d_model=64
expect_output "$work/rl.toml:26:1: error: [rl] init = \"$init\": the checkpoint's model differs from [model] (d_model: 64 vs 32"
expect_exit 3 "$troupe" validate "$work/rl.toml" --set rl.lss='"dapo"'
expect_output "unknown key 'lss' in [rl]; did you mean 'loss'?"
expect_exit 3 "$troupe" validate "$work/rl.toml" --set rl.loss='"ppo"'
expect_output "[rl] loss = \"ppo\" is not one of"
expect_exit 3 "$troupe" validate "$work/rl.toml" --set topology.devices=2 --set topology.stages=2 --set topology.schedule='"1f1b"'
expect_output "with sync = \"synchronous\" runs the RL loop in one process, data-parallel over data_parallel = devices devices"
# Synchronous RL data-parallel over 2 devices (devices = data_parallel): validate says so.
expect_exit 0 "$troupe" validate "$work/rl.toml" --set topology.devices=2 --set topology.data_parallel=2
expect_output "data-parallel over devices 0..1"
expect_output "runs in the single-process RL trainer on 2 devices (no actors)"
expect_exit 3 "$troupe" validate "$work/pre.toml" --set rl.group_size=4
expect_output "[rl] keys apply only to [run] mode = \"rl\""

# A missing or damaged init: exit 4 naming the file, from validate and run.
expect_exit 4 "$troupe" validate "$work/rl.toml" --set rl.init="\"$work/nope\""
expect_output "$work/nope"
cp -r "$init" "$work/damaged"
printf 'garbage' | dd of="$work/damaged/params.f32.zst" bs=1 seek=100 conv=notrunc status=none
expect_exit 4 "$troupe" validate "$work/rl.toml" --set rl.init="\"$work/damaged\""
expect_output "$work/damaged/params.f32.zst"
expect_exit 4 "$troupe" run "$work/rl.toml" --set rl.init="\"$work/damaged\"" --set run.out_dir="\"$work/rl_bad\""
expect_output "$work/damaged/params.f32.zst"

# Two runs of one spec: the same metrics (timings aside) and checkpoint bytes.
strip_times() {
  sed -E 's/"(gen_seconds|reward_seconds|train_seconds|step_seconds|wall_seconds|seconds|gen_tokens_per_s|train_tokens_per_s|train_serial_seconds)":[^,}]*,?//g; s/"(device_idle|gen_idle_seconds|train_idle_seconds)":\[[^]]*\],?//g' "$1"
}
expect_exit 0 "$troupe" run "$work/rl.toml"
expect_output "done: 4 RL steps; held-out exact match"
expect_exit 0 "$troupe" run "$work/rl.toml" --set run.out_dir="\"$work/rl2\""
grep -q '"type":"rl_step"' "$work/rl1/metrics.jsonl" || fail "metrics.jsonl has no rl_step lines"
grep -q '"type":"rl_eval"' "$work/rl1/metrics.jsonl" || fail "metrics.jsonl has no rl_eval lines"
for key in reward_mean reward_std zero_variance_share kl_ref entropy clip_low clip_high importance_weight_max response_length gen_tokens_per_s; do
  grep -q "\"$key\":" "$work/rl1/metrics.jsonl" || fail "metrics.jsonl lacks $key"
done
[ "$(grep -c '"type":"rl_step"' "$work/rl1/metrics.jsonl")" -eq 4 ] || fail "expected 4 rl_step lines"
diff <(strip_times "$work/rl1/metrics.jsonl" | grep -v '"type":"start"' | sed 's#/rl1/#/rlX/#g') \
     <(strip_times "$work/rl2/metrics.jsonl" | grep -v '"type":"start"' | sed 's#/rl2/#/rlX/#g') >/dev/null ||
  fail "two runs of the same RL spec wrote different metrics"
for f in "$work/rl1/checkpoint"/*; do
  cmp -s "$f" "$work/rl2/checkpoint/$(basename "$f")" || fail "two RL runs differ in $(basename "$f")"
done

# Data-parallel over 2 devices: the same step-1 rollouts (reward) as one device;
# and two such runs write the same checkpoint bytes.
expect_exit 0 "$troupe" run "$work/rl.toml" --set topology.devices=2 --set topology.data_parallel=2 \
  --set run.out_dir="\"$work/dp1\""
expect_output "data-parallel over 2 devices"
expect_exit 0 "$troupe" run "$work/rl.toml" --set topology.devices=2 --set topology.data_parallel=2 \
  --set run.out_dir="\"$work/dp2\""
first_reward() { grep '"type":"rl_step"' "$1/metrics.jsonl" | head -1 | grep -o '"reward_mean":[^,]*'; }
[ -n "$(first_reward "$work/rl1")" ] && [ "$(first_reward "$work/dp1")" = "$(first_reward "$work/rl1")" ] ||
  fail "2 devices sampled other step-1 rollouts: $(first_reward "$work/dp1") vs $(first_reward "$work/rl1")"
for f in "$work/dp1/checkpoint"/*; do
  cmp -s "$f" "$work/dp2/checkpoint/$(basename "$f")" || fail "two data-parallel RL runs differ in $(basename "$f")"
done
# Each rl_step line says each device's idle share of the step (2 shares in
# [0, 1]) and where it idled (generation, training); one device's lines do not.
python3 - "$work/dp1/metrics.jsonl" "$work/rl1/metrics.jsonl" <<'PY' || fail "the data-parallel run's rl_step lines lack device idle shares"
import json, sys
dp = [json.loads(l) for l in open(sys.argv[1]) if '"rl_step"' in l]
one = [json.loads(l) for l in open(sys.argv[2]) if '"rl_step"' in l]
assert dp and all(len(r["device_idle"]) == 2 and all(0 <= x <= 1 for x in r["device_idle"]) for r in dp)
assert all(len(r["gen_idle_seconds"]) == 2 and len(r["train_idle_seconds"]) == 2 for r in dp)
assert all(r["train_serial_seconds"] >= 0 for r in dp + one)
assert one and not any("device_idle" in r for r in one)
PY

# Resume halfway: 2 steps, then continue to 4 from that checkpoint.
expect_exit 0 "$troupe" run "$work/rl.toml" --set run.steps=2 --set run.out_dir="\"$work/half\""
expect_exit 0 "$troupe" run "$work/rl.toml" --set run.out_dir="\"$work/resumed\"" \
  --set checkpoint.resume="\"$work/half/checkpoint\""
for f in "$work/rl1/checkpoint"/*; do
  cmp -s "$f" "$work/resumed/checkpoint/$(basename "$f")" || fail "resumed RL run differs from the straight run in $(basename "$f")"
done

# Decoupled actors (rl.sync = "fixed_lag"): validate lists them by device;
# with max_staleness 0, two generators on device 1 and generator:1 killed
# mid-job, the run ends with the synchronous run's checkpoint bytes and
# rl_step metrics, and the ledger trained every group once.
decoupled=(--set rl.sync='"fixed_lag"' --set rl.generators=2 --set topology.devices=2)
expect_exit 0 "$troupe" validate "$work/rl.toml" "${decoupled[@]}"
expect_output "decoupled online RL (sync \"fixed_lag\", max_staleness 0): 2 host device(s), 6 actors"
expect_output "  device 1 (host)"
expect_output "    generator:1"
cp "$work/rl.toml" "$work/rl_kill.toml"
printf '\n[[faults]]\nat_step = 2\ntarget = "generator:1"\nkind = "kill"\nat_message = 2\n' >> "$work/rl_kill.toml"
expect_exit 0 "$troupe" run "$work/rl_kill.toml" "${decoupled[@]}" --set run.out_dir="\"$work/dec\""
expect_output "restarted generator:1 (killed"
for f in "$work/rl1/checkpoint"/*; do
  cmp -s "$f" "$work/dec/checkpoint/$(basename "$f")" || fail "decoupled eta 0 run with a kill differs from the synchronous run in $(basename "$f")"
done
diff <(strip_times "$work/rl1/metrics.jsonl" | grep -E '"type":"rl_(step|eval)"') \
     <(strip_times "$work/dec/metrics.jsonl" | grep -E '"type":"rl_(step|eval)"') >/dev/null ||
  fail "decoupled eta 0 run wrote other rl_step / rl_eval metrics than the synchronous run"
grep -q '"type":"restart".*"actor":"generator:1"' "$work/dec/metrics.jsonl" || fail "no restart line for generator:1"
[ "$(grep -c '"type":"rl_actors"' "$work/dec/metrics.jsonl")" -eq 4 ] || fail "expected 4 rl_actors lines"
grep -q '"type":"rl_actors_end".*"groups_admitted":8,"groups_trained":8,.*"discarded":0,"double_trained":0,"restarts":1' \
  "$work/dec/metrics.jsonl" || fail "the ledger summary is not 8 admitted, 8 trained, 0 discarded, 0 twice, 1 restart"

# fixed_lag with max_staleness 1, stopped after 2 steps and resumed: the
# checkpoint carries the version steps 2.. are sampled by (rl_versions/v1),
# and the resumed run ends with the uninterrupted run's checkpoint bytes.
lag1=(--set rl.sync='"fixed_lag"' --set rl.max_staleness=1 --set rl.generators=2 --set topology.devices=2
      --set checkpoint.every=2)
expect_exit 0 "$troupe" run "$work/rl.toml" "${lag1[@]}" --set run.out_dir="\"$work/lag1\"" --set log.rollouts=2
# log.rollouts = 2: steps 2 and 4's groups (2 prompts each) as text in
# rollouts.jsonl, each sampled by a policy version at most 1 behind (eta 1),
# every token of a completion by that version (fixed_lag never changes it
# mid-completion).
rl_lines=$(grep -c '"type":"rollouts"' "$work/lag1/rollouts.jsonl" 2>/dev/null)
[ "$rl_lines" = 4 ] || fail "rollouts.jsonl has ${rl_lines:-no} group lines, expected 4 (2 steps x 2 prompts)"
[ "$(grep -c '"step":2,"version":0,' "$work/lag1/rollouts.jsonl")" = 2 ] || fail "step 2's groups were not sampled by version 0"
[ "$(grep -c '"step":4,"version":2,' "$work/lag1/rollouts.jsonl")" = 2 ] || fail "step 4's groups were not sampled by version 2"
grep -q '"prompt":"[^"]*="' "$work/lag1/rollouts.jsonl" || fail "no prompt as text (a+b=) in rollouts.jsonl"
grep '"step":4,' "$work/lag1/rollouts.jsonl" | grep -o '"version":\[[^]]*\]' | grep -vqE '^"version":\[2(,2)*\]$' &&
  fail "a completion of step 4 has a token of another version than 2"
expect_exit 0 "$troupe" run "$work/rl.toml" "${lag1[@]}" --set run.steps=2 --set run.out_dir="\"$work/lag1_half\""
[ -f "$work/lag1_half/checkpoint/rl_versions/v1/manifest.bin" ] || fail "the fixed_lag checkpoint lacks policy version 1"
expect_exit 0 "$troupe" run "$work/rl.toml" "${lag1[@]}" --set run.out_dir="\"$work/lag1_resumed\"" \
  --set checkpoint.resume="\"$work/lag1_half/checkpoint\""
for f in params.f32.zst adam_m.f32.zst adam_v.f32.zst; do
  cmp -s "$work/lag1/checkpoint/$f" "$work/lag1_resumed/checkpoint/$f" ||
    fail "resumed fixed_lag run differs from the uninterrupted one in $f"
done
diff <(strip_times "$work/lag1/metrics.jsonl" | grep -E '"type":"rl_step","step":[34],') \
     <(strip_times "$work/lag1_resumed/metrics.jsonl" | grep -E '"type":"rl_step"') >/dev/null ||
  fail "resumed fixed_lag run wrote other rl_step metrics for steps 3-4"
# rl.trainer = "actors": the trainer is the runtime's 2 stage ranks, 2
# expert shards per MoE layer and 2 optimizer shards on devices 0-1, the
# generator on device 2. validate lists both; a run with a killed stage rank
# and a killed expert shard (RL steps 2 and 3) ends with the fault-free run's
# checkpoint bytes; bad trainer settings are spec errors with a position.
act=(--set rl.sync='"fixed_lag"' --set rl.max_staleness=1 --set rl.trainer='"actors"' --set topology.devices=3
     --set topology.stages=2 --set topology.schedule='"1f1b"' --set topology.microbatches=2
     --set topology.expert_shards=2 --set topology.optimizer_shards=2)
expect_exit 0 "$troupe" validate "$work/rl.toml" "${act[@]}"
expect_output "on the actor runtime's pipeline ranks, expert and optimizer shards, devices 0..1"
expect_output "the trainer's actors (rl.trainer = \"actors\""
expect_output "    expert:1/1"
expect_exit 0 "$troupe" run "$work/rl.toml" "${act[@]}" --set run.out_dir="\"$work/act\""
cp "$work/rl.toml" "$work/rl_act_kill.toml"
printf '\n[[faults]]\nat_step = 2\ntarget = "stage:1"\nkind = "kill"\n' >> "$work/rl_act_kill.toml"
printf '\n[[faults]]\nat_step = 3\ntarget = "expert:1/0"\nkind = "kill"\n' >> "$work/rl_act_kill.toml"
expect_exit 0 "$troupe" validate "$work/rl_act_kill.toml" "${act[@]}"
expect_output "faults: 2 from [[faults]]"
expect_exit 0 "$troupe" run "$work/rl_act_kill.toml" "${act[@]}" --set run.out_dir="\"$work/act_kill\""
expect_output "trainer: stage:1 went down"
expect_output "trainer: expert:1/0 went down"
for f in params.f32.zst adam_m.f32.zst adam_v.f32.zst; do
  cmp -s "$work/act/checkpoint/$f" "$work/act_kill/checkpoint/$f" ||
    fail "the actors trainer with killed stage and expert shard differs from the fault-free run in $f"
done
# Stopped after 2 steps and resumed, the actors trainer ends with the
# uninterrupted run's bytes (its AdamW moments come back from the optimizer
# shards for the checkpoint and go back in as the runtime's start state).
expect_exit 0 "$troupe" run "$work/rl.toml" "${act[@]}" --set checkpoint.every=2 --set run.out_dir="\"$work/act_full\""
expect_exit 0 "$troupe" run "$work/rl.toml" "${act[@]}" --set checkpoint.every=2 --set run.steps=2 --set run.out_dir="\"$work/act_half\""
expect_exit 0 "$troupe" run "$work/rl.toml" "${act[@]}" --set checkpoint.every=2 --set run.out_dir="\"$work/act_resumed\"" \
  --set checkpoint.resume="\"$work/act_half/checkpoint\""
for f in params.f32.zst adam_m.f32.zst adam_v.f32.zst; do
  cmp -s "$work/act_full/checkpoint/$f" "$work/act_resumed/checkpoint/$f" ||
    fail "the resumed actors-trainer run differs from the uninterrupted one in $f"
done
expect_exit 3 "$troupe" validate "$work/rl_act_kill.toml" "${act[@]}" --set rl.trainer='"single"'
expect_output "is an actor of the trainer's runtime"
expect_exit 3 "$troupe" validate "$work/rl.toml" "${act[@]}" --set topology.microbatches=3
expect_output "rl.toml:"
expect_output "the RL batch of 8 rows (prompts_per_step x group_size) must split"
cp "$work/rl.toml" "$work/rl_act_bad.toml"
printf '\n[[faults]]\nat_step = 2\ntarget = "stage:2"\nkind = "kill"\n' >> "$work/rl_act_bad.toml"
expect_exit 3 "$troupe" validate "$work/rl_act_bad.toml" "${act[@]}"
expect_output "is not an actor of the trainer's runtime (stage:0..1"
expect_exit 3 "$troupe" validate "$work/rl.toml" "${act[@]}" --set rl.trainer_devices=4
expect_output "puts the trainer on 4 device(s)"
expect_exit 3 "$troupe" validate "$work/rl.toml" "${act[@]}" --set rl.sync='"synchronous"'
expect_output "needs sync = \"fixed_lag\" or \"latest\""

# [chaos] on the RL actors: validate lists the seeded schedule (kills and
# lost weight syncs of the generator or reward actor that handles each
# step), and the run ends with the fault-free lag1 run's checkpoint bytes,
# its faults line counting what was injected and the ledger clean.
chaos_rl=(--set chaos.mean_steps_between_faults=0.5 --set chaos.seed=4 --set rl.sync_deadline_ms=300
          --set run.max_restarts=100)
expect_exit 0 "$troupe" validate "$work/rl.toml" "${lag1[@]}" "${chaos_rl[@]}"
expect_output "from [chaos] (seed 4"
expect_output "[chaos]"
n_chaos=$(grep -c ' \[chaos\]$' <<<"$out")
[ "$n_chaos" -ge 3 ] || fail "expected at least 3 [chaos] faults listed, got $n_chaos"
expect_exit 0 "$troupe" run "$work/rl.toml" "${lag1[@]}" "${chaos_rl[@]}" --set run.out_dir="\"$work/lag1_chaos\""
for f in params.f32.zst adam_m.f32.zst adam_v.f32.zst; do
  cmp -s "$work/lag1/checkpoint/$f" "$work/lag1_chaos/checkpoint/$f" ||
    fail "fixed_lag run under [chaos] differs from the fault-free one in $f"
done
grep -q "\"type\":\"faults\",.*\"total\":$n_chaos,.*\"double_trained\":0" "$work/lag1_chaos/metrics.jsonl" ||
  fail "the RL faults line does not count the $n_chaos [chaos] faults with a clean ledger"
expect_exit 3 "$troupe" validate "$work/rl.toml" "${lag1[@]}" "${chaos_rl[@]}" --set chaos.kinds='"kill,corrupt"'
expect_output "which RL actors do not take yet"
rm -rf "$work/lag1_half/checkpoint/rl_versions"
expect_exit 4 "$troupe" run "$work/rl.toml" "${lag1[@]}" --set run.out_dir="\"$work/lag1_bad\"" \
  --set checkpoint.resume="\"$work/lag1_half/checkpoint\""
expect_output "rl_versions/v1"

# rl.sync = "latest": validate lists the actors; it needs decoupled_ppo (exit
# 3, with the position); a run with generator:0 losing two weight syncs ends
# its 4 steps, retries, restarts the generator and trains every group once.
# (It loses every sync until the restart: in latest a newer confirmed version
# stands in for a lost older one, so fewer losses may end in a retry alone.)
latest=(--set rl.sync='"latest"' --set rl.loss='"decoupled_ppo"' --set rl.max_staleness=1 --set topology.devices=2
        --set rl.sync_deadline_ms=300)
expect_exit 0 "$troupe" validate "$work/rl.toml" "${latest[@]}"
expect_output "decoupled online RL (sync \"latest\", max_staleness 1)"
expect_output "takes new versions between decode steps"
expect_exit 3 "$troupe" validate "$work/rl.toml" --set rl.sync='"latest"' --set topology.devices=2
expect_output "needs loss = \"decoupled_ppo\""
# latest resumes: with max_staleness 0 it is bitwise (latest eta 0 equals
# fixed_lag eta 0), so a run stopped after 2 steps and resumed ends with the
# uninterrupted run's bytes; with eta 1 the resumed steps train every group
# once and no token is older than the bound.
lat0=(--set rl.sync='"latest"' --set rl.loss='"decoupled_ppo"' --set rl.max_staleness=0 --set topology.devices=2
      --set checkpoint.every=2)
expect_exit 0 "$troupe" run "$work/rl.toml" "${lat0[@]}" --set run.out_dir="\"$work/lat0\""
expect_exit 0 "$troupe" run "$work/rl.toml" "${lat0[@]}" --set run.steps=2 --set run.out_dir="\"$work/lat0_half\""
expect_exit 0 "$troupe" run "$work/rl.toml" "${lat0[@]}" --set run.out_dir="\"$work/lat0_resumed\"" \
  --set checkpoint.resume="\"$work/lat0_half/checkpoint\""
for f in params.f32.zst adam_m.f32.zst adam_v.f32.zst; do
  cmp -s "$work/lat0/checkpoint/$f" "$work/lat0_resumed/checkpoint/$f" ||
    fail "resumed latest (eta 0) run differs from the uninterrupted one in $f"
done
expect_exit 0 "$troupe" run "$work/rl.toml" "${latest[@]}" --set checkpoint.every=2 --set run.steps=2 \
  --set run.out_dir="\"$work/lat1_half\""
expect_exit 0 "$troupe" run "$work/rl.toml" "${latest[@]}" --set run.out_dir="\"$work/lat1_resumed\"" \
  --set checkpoint.resume="\"$work/lat1_half/checkpoint\""
grep -q '"type":"rl_actors_end","sync":"latest",.*"groups_admitted":4,"groups_trained":4,.*"discarded":0,"double_trained":0' \
  "$work/lat1_resumed/metrics.jsonl" || fail "resumed latest run: the ledger is not 4 admitted, 4 trained once, 0 discarded"
grep '"type":"rl_actors"' "$work/lat1_resumed/metrics.jsonl" | grep -qE '"staleness":\{[^}]*"[2-9]"' &&
  fail "resumed latest run trained a token more than max_staleness = 1 versions old"
[ "$(grep -c '"type":"rl_step"' "$work/lat1_resumed/metrics.jsonl")" -eq 2 ] || fail "resumed latest run did not run steps 3-4"
cp "$work/rl.toml" "$work/rl_drop.toml"
printf '\n[[faults]]\nat_step = 2\ntarget = "generator:0"\nkind = "drop"\ncount = 100\n' >> "$work/rl_drop.toml"
expect_exit 0 "$troupe" run "$work/rl_drop.toml" "${latest[@]}" --set run.out_dir="\"$work/latest\""
grep -q '"type":"rl_actors_end","sync":"latest",.*"groups_admitted":8,"groups_trained":8,.*"discarded":0,"double_trained":0' \
  "$work/latest/metrics.jsonl" || fail "latest: the ledger summary is not 8 admitted, 8 trained, 0 discarded"
grep -q '"sync_retries":[1-9]' "$work/latest/metrics.jsonl" || fail "latest: no weight-sync retry counted"
grep -q '"sync_restarts":[1-9]' "$work/latest/metrics.jsonl" || fail "latest: no generator restart after two lost syncs"
grep -q '"type":"restart".*"actor":"generator:0"' "$work/latest/metrics.jsonl" || fail "latest: no restart line for generator:0"
cp "$work/rl.toml" "$work/rl_drop_reward.toml"
printf '\n[[faults]]\nat_step = 2\ntarget = "reward:0"\nkind = "drop"\n' >> "$work/rl_drop_reward.toml"
expect_exit 3 "$troupe" validate "$work/rl_drop_reward.toml" "${latest[@]}"
expect_output "drops act on weight syncs"

# run.mode = "reward_model": validate says what it would do, errors are exit 3,
# a short run reports held-out accuracy before and after and saves a
# checkpoint of the same model, and a repeated run writes the same metrics.
rm=(--set run.mode='"reward_model"' --set rl.rm_prompts=6 --set rl.rm_batch=8 --set rl.kl_coef=0
    --set run.eval_every=0)
expect_exit 0 "$troupe" validate "$work/rl.toml" "${rm[@]}"
expect_output "reward model (one process): $init samples 6 training prompts and 20 held-out prompts x 4 completions"
expect_exit 3 "$troupe" validate "$work/rl.toml" "${rm[@]}" --set rl.rm_batch=0
expect_output "[rl] rm_batch = 0 is out of range"
expect_exit 3 "$troupe" validate "$work/rl.toml" "${rm[@]}" --set 'rl.sync="fixed_lag"'
expect_output "run.mode = \"reward_model\" trains in one process without actors"
expect_exit 3 "$troupe" validate "$work/rl.toml" "${rm[@]}" --set model.vocab_size=16
expect_output "use vocab_size >= 17"
for d in rm1 rm2; do
  expect_exit 0 "$troupe" run "$work/rl.toml" "${rm[@]}" --set run.out_dir="\"$work/$d\""
done
grep -q '"type":"rm_eval","step":0,"heldout_examples":80,' "$work/rm1/metrics.jsonl" || fail "no rm_eval line before training"
grep -q '"type":"rm_eval","step":4,' "$work/rm1/metrics.jsonl" || fail "no rm_eval line after training"
grep -q '"type":"end","steps":4,"heldout_accuracy_before"' "$work/rm1/metrics.jsonl" || fail "no end line"
[ -f "$work/rm1/checkpoint/manifest.bin" ] || fail "the reward-model run wrote no checkpoint"
diff <(strip_times "$work/rm1/metrics.jsonl" | grep -E '"type":"rm_') <(strip_times "$work/rm2/metrics.jsonl" | grep -E '"type":"rm_') \
  >/dev/null || fail "two reward-model runs of one spec wrote different metrics"
cmp -s "$work/rm1/checkpoint/params.f32.zst" "$work/rm2/checkpoint/params.f32.zst" || fail "two reward-model runs saved different parameters"
grep -q '"type":"rm_eval","step":4,.*"heldout_pairs":[0-9]*,"heldout_pair_accuracy":' "$work/rm1/metrics.jsonl" ||
  fail "rm_eval has no pairwise accuracy"
# A reward-model run resumes: 2 steps, then resumed to 4 (constant LR), ends
# with the uninterrupted run's bytes and step metrics; a checkpoint of another
# run (another seed) or of pretraining is refused as a bad input (exit 4).
expect_exit 0 "$troupe" run "$work/rl.toml" "${rm[@]}" --set run.steps=2 --set run.out_dir="\"$work/rm_half\""
expect_exit 0 "$troupe" run "$work/rl.toml" "${rm[@]}" --set run.out_dir="\"$work/rm_resumed\"" \
  --set checkpoint.resume="\"$work/rm_half/checkpoint\""
for f in params.f32.zst adam_m.f32.zst adam_v.f32.zst; do
  cmp -s "$work/rm1/checkpoint/$f" "$work/rm_resumed/checkpoint/$f" || fail "resumed reward-model run differs in $f"
done
diff <(strip_times "$work/rm1/metrics.jsonl" | grep -E '"type":"rm_(step","step":[34]|eval","step":4),') \
     <(strip_times "$work/rm_resumed/metrics.jsonl" | grep -E '"type":"rm_(step|eval)"') >/dev/null ||
  fail "resumed reward-model run wrote other metrics for steps 3-4"
grep -q '"type":"end","steps":2,"resumed_from_step":2,' "$work/rm_resumed/metrics.jsonl" || fail "resumed RM run: no end line"
expect_exit 4 "$troupe" run "$work/rl.toml" "${rm[@]}" --set run.seed=7 \
  --set run.out_dir="\"$work/rm_bad\"" --set checkpoint.resume="\"$work/rm_half/checkpoint\""
expect_output "the checkpoint was trained as \"reward model: seed 1, rm_loss bce, rm_batch 8, data "
expect_exit 4 "$troupe" run "$work/rl.toml" "${rm[@]}" --set run.out_dir="\"$work/rm_bad\"" \
  --set checkpoint.resume="\"$init\""
expect_output "not a checkpoint of a reward-model run"
# rl.rm_loss = "bradley_terry": pairs of one prompt's completions; validate
# says so, an odd rm_batch is exit 3, data without a right-and-wrong group is
# refused (the 3-step model gets nothing right), and a run from a model that
# gets some right reports pairs and pair accuracy.
expect_exit 0 "$troupe" validate "$work/rl.toml" "${rm[@]}" --set 'rl.rm_loss="bradley_terry"'
expect_output "the Bradley-Terry loss on 4 pairs each"
expect_exit 3 "$troupe" validate "$work/rl.toml" "${rm[@]}" --set 'rl.rm_loss="bradley_terry"' --set rl.rm_batch=7
expect_output "rm_batch must be even"
expect_exit 1 "$troupe" run "$work/rl.toml" "${rm[@]}" --set 'rl.rm_loss="bradley_terry"' --set run.out_dir="\"$work/rm_bt0\""
expect_output "needs pairs, but none of the 6 training prompts has both an accepted and a rejected completion (0 all right, 6 all wrong)"
expect_exit 0 "$troupe" run "$work/pre.toml" --set run.steps=200 --set run.out_dir="\"$work/pre200\""
expect_exit 0 "$troupe" run "$work/rl.toml" "${rm[@]}" --set 'rl.rm_loss="bradley_terry"' --set run.out_dir="\"$work/rm_bt\"" \
  --set rl.init="\"$work/pre200/checkpoint\""
grep -q '"type":"rm_data","rm_loss":"bradley_terry",.*"train_groups":6,' "$work/rm_bt/metrics.jsonl" ||
  fail "Bradley-Terry run: no rm_data line with the group counts"
grep -q '"type":"end","steps":4,.*"heldout_pair_accuracy_after"' "$work/rm_bt/metrics.jsonl" || fail "Bradley-Terry run: no end line"
grep -q '"type":"rm_data","rm_loss":"bradley_terry",.*"train_pairs":[1-9]' "$work/rm_bt/metrics.jsonl" ||
  fail "Bradley-Terry run: no training pairs"
# rl.reward = "model": RL rewarded by that RM (frozen); bad combinations are exit 3, a missing RM exit 4.
expect_exit 3 "$troupe" validate "$work/rl.toml" --set 'rl.reward="model"'
expect_output "reward = \"model\" needs reward_model"
expect_exit 0 "$troupe" validate "$work/rl.toml" --set 'rl.reward="model"' --set rl.reward_model="\"$work/rm1/checkpoint\"" \
  --set 'rl.sync="fixed_lag"' --set topology.devices=2
expect_output "    reward_model:0  the learned reward model $work/rm1/checkpoint"
cp "$work/rl.toml" "$work/rl_rm_kill.toml"
printf '\n[[faults]]\nat_step = 2\ntarget = "reward:0"\nkind = "kill"\n' >> "$work/rl_rm_kill.toml"
expect_exit 3 "$troupe" validate "$work/rl_rm_kill.toml" --set 'rl.reward="model"' --set rl.reward_model="\"$work/rm1/checkpoint\"" \
  --set 'rl.sync="fixed_lag"' --set topology.devices=2
expect_output "the reward actors of this run are reward_model:K"
expect_exit 4 "$troupe" validate "$work/rl.toml" --set 'rl.reward="model"' --set rl.reward_model="\"$work/nope\""
expect_output "[rl] reward_model: "
expect_exit 0 "$troupe" validate "$work/rl.toml" --set 'rl.reward="model"' --set rl.reward_model="\"$work/rm1/checkpoint\""
expect_output "scores them with the frozen learned reward model $work/rm1/checkpoint"
expect_exit 0 "$troupe" run "$work/rl.toml" --set 'rl.reward="model"' --set rl.reward_model="\"$work/rm1/checkpoint\"" \
  --set run.steps=2 --set run.out_dir="\"$work/rl_rm\""
grep -q '"type":"end","steps":2,' "$work/rl_rm/metrics.jsonl" || fail "RL rewarded by the RM did not finish its 2 steps"

# The shipped RL spec: without its init (the checkpoint its header says how to
# make) validate stops with exit 4 naming it; with one made as the header says
# (1 step here, on one device) it validates.
if [ -n "${2:-}" ]; then
  expect_exit 4 "$troupe" validate "$2/launch/specs/rl_addition.toml"
  expect_output "runs/sft_addition_split/checkpoint"
  single=(--set topology.devices=1 --set topology.stages=1 --set 'topology.schedule="sequential"'
          --set topology.microbatches=1 --set topology.expert_shards=1 --set topology.optimizer_shards=1)
  expect_exit 0 "$troupe" run "$2/launch/specs/sft_addition.toml" "${single[@]}" --set data.target_pairs='"6-9+6-9"' \
    --set run.steps=1 --set data.eval_problems=4 --set log.progress='"off"' --set run.out_dir="\"$work/w4\"" \
    --set checkpoint.dir="\"$work/w4/checkpoint\""
  expect_exit 0 "$troupe" validate "$2/launch/specs/rl_addition.toml" --set rl.init="\"$work/w4/checkpoint\""
  expect_output "online RL (synchronous, one process): each step samples 32 prompts x 8 completions"
  expect_exit 4 "$troupe" validate "$2/launch/specs/rm_addition.toml"
  expect_output "runs/sft_addition_split/checkpoint"
  expect_exit 0 "$troupe" validate "$2/launch/specs/rm_addition.toml" --set rl.init="\"$work/w4/checkpoint\""
  expect_output "reward model (one process): $work/w4/checkpoint samples 512 training prompts and 200 held-out prompts x 8 completions"
fi

if [ "$failures" -gt 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "rl cli tests passed"
