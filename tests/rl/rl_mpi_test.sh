#!/usr/bin/env bash
# Decoupled RL with generators on another process, under mpirun (label
# `mpi`). The coordinator, buffer, reward actor and trainer stay on process
# 0; weights and rollouts cross as Cap'n Proto envelopes. Checks:
# - validate lists the generators under process 1 and refuses placements
#   where a process would hold no generator or the trainer would leave
#   process 0 (file:line:col errors, exit 3), and a process fault of the
#   wrong kind;
# - fixed_lag (eta 1) with both generators on process 1 ends with the
#   1-process run's checkpoint bytes and the same rl_step metrics;
# - a remote generator killed mid-job (after computing, before sending):
#   still bitwise, the ledger trained every group exactly once;
# - process 1 SIGKILLed at its first job of step 3 ([[faults]] target =
#   "process:1", mpirun --enable-recovery): its generators restart on
#   process 0, the run ends bitwise equal, nothing lost or trained twice;
#   and a process none of whose generators gets a job of at_step is lost
#   at its first job after it; a lost process holding more generators than
#   max_restarts recovers all of them;
# - rl.trainer = "actors" on process 0 with the generator on process 1:
#   bitwise the 1-process run;
# - with process_loss = "fail" the same loss (TROUPE_TEST_FAULT) ends the
#   run naming the process; mpirun with the wrong process count is refused.
# usage: rl_mpi_test.sh TROUPE_BINARY MPIRUN TROUPE_WITH_HOOKS
set -uo pipefail
troupe=$1
mpirun=$2
hooked=$3  # troupe with the test hooks of TROUPE_TEST_FAULT (tests/launch/troupe_with_hooks.cpp)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/../cli_test_lib.sh"  # failures, fail, expect_exit, expect_output
# Every mpirun is bounded: a hang fails the check in 2 minutes (exit 124)
# instead of the whole test at ctest's limit.
mpi=(timeout 120 "$mpirun" --allow-run-as-root --oversubscribe)

tiny_model_toml "$work/model.toml" $'[log]\nprogress = "off"'
cp "$work/model.toml" "$work/pre.toml"
printf '[run]\nsteps = 3\neval_every = 0\nout_dir = "%s/pre"\n' "$work" >> "$work/pre.toml"
expect_exit 0 "$troupe" run "$work/pre.toml"

cp "$work/model.toml" "$work/rl.toml"
cat >> "$work/rl.toml" <<TOML
[run]
mode = "rl"
steps = 4
eval_every = 2
out_dir = "$work/one"
[optim]
lr = 1e-3
warmup_steps = 0
schedule = "constant"
[rl]
init = "$work/pre/checkpoint"
prompts_per_step = 2
group_size = 4
max_new_tokens = 4
kl_coef = 0.01
sync = "fixed_lag"
max_staleness = 1
generators = 2
[topology]
devices = 2
peer_timeout = 2
TOML
strip_times() {
  sed -E 's/"(gen_seconds|reward_seconds|train_seconds|step_seconds|wall_seconds|seconds|gen_tokens_per_s|train_tokens_per_s|train_serial_seconds)":[^,}]*,?//g; s/"(device_idle|gen_idle_seconds|train_idle_seconds)":\[[^]]*\],?//g' "$1"
}
same_checkpoint() {  # DIR WHAT
  for f in params.f32.zst adam_m.f32.zst adam_v.f32.zst; do
    cmp -s "$work/one/checkpoint/$f" "$1/checkpoint/$f" || fail "$2 differs from the 1-process run in $f"
  done
  diff <(strip_times "$work/one/metrics.jsonl" | grep -E '"type":"rl_(step|eval)"') \
       <(strip_times "$1/metrics.jsonl" | grep -E '"type":"rl_(step|eval)"') >/dev/null ||
    fail "$2 wrote other rl_step / rl_eval metrics than the 1-process run"
  grep -q '"type":"rl_actors_end".*"groups_admitted":8,"groups_trained":8,.*"discarded":0,"double_trained":0' "$1/metrics.jsonl" ||
    fail "$2: the ledger is not 8 groups admitted and trained once, none discarded"
}

# validate: generators listed under process 1; placements that cannot work.
two=(--set topology.processes=2)
expect_exit 0 "$troupe" validate "$work/rl.toml" "${two[@]}"
expect_output "6 actors on 2 processes"
expect_output "process 1"
expect_output "    generator:1"
expect_exit 3 "$troupe" validate "$work/rl.toml" --set topology.processes=2 --set topology.device_processes='"1,0"'
expect_output "--set topology.processes=2: error: [topology] processes = 2: the RL trainer's device 0 would be on process 1"
expect_exit 3 "$troupe" validate "$work/rl.toml" --set topology.processes=3 --set topology.devices=3 --set rl.generators=1
expect_output "process 2 would hold no generator"
cp "$work/rl.toml" "$work/rl_pstop.toml"
printf '\n[[faults]]\nat_step = 2\ntarget = "process:1"\nkind = "stop"\n' >> "$work/rl_pstop.toml"
expect_exit 3 "$troupe" validate "$work/rl_pstop.toml" "${two[@]}"
expect_output "[[faults]] kind = \"stop\" on process:1: in an RL run a process takes \"kill\""

# The 1-process reference, then the same spec with generators on process 1.
expect_exit 0 "$troupe" run "$work/rl.toml"
expect_exit 0 "${mpi[@]}" -np 2 "$troupe" run "$work/rl.toml" "${two[@]}" --set run.out_dir="\"$work/two\""
expect_output "generator host listening on"
expect_output "weight sync across processes: 4 version(s)"
same_checkpoint "$work/two" "generators on process 1"
grep -q '"type":"rl_actors_end".*"processes":2,"processes_lost":0,"remote_syncs":4,' "$work/two/metrics.jsonl" ||
  fail "rl_actors_end does not report 2 processes, none lost, 4 remote syncs"

# A remote generator killed after computing its rollout (the work is lost
# with it): re-dealt, bitwise the same, exactly once.
cp "$work/rl.toml" "$work/rl_kill.toml"
printf '\n[[faults]]\nat_step = 2\ntarget = "generator:1"\nkind = "kill"\nat_message = 2\n' >> "$work/rl_kill.toml"
expect_exit 0 "${mpi[@]}" -np 2 "$troupe" run "$work/rl_kill.toml" "${two[@]}" --set run.out_dir="\"$work/kill\""
expect_output "restarted generator:1 (killed"
same_checkpoint "$work/kill" "a run with a remote generator killed"

# Process 1 lost at step 3: its generators go on on process 0.
cp "$work/rl.toml" "$work/rl_lost.toml"
printf '\n[[faults]]\nat_step = 3\ntarget = "process:1"\nkind = "kill"\n' >> "$work/rl_lost.toml"
expect_exit 0 "${mpi[@]}" --enable-recovery -np 2 "$troupe" run "$work/rl_lost.toml" "${two[@]}" --set run.out_dir="\"$work/lost\""
expect_output "process 1 lost; restarted on process 0"
expect_output "1 generator process(es) lost"
same_checkpoint "$work/lost" "a run that lost process 1"
grep -q '"processes_lost":1' "$work/lost/metrics.jsonl" || fail "rl_actors_end does not count the lost process"

# A process whose generators get no job of at_step (3 devices: generator:0
# on device 1 of process 0 takes step 3, generator:1 on process 1 steps 2
# and 4): it is lost at its first job after it, not never.
cp "$work/rl_lost.toml" "$work/rl_lost_later.toml"
expect_exit 0 "${mpi[@]}" --enable-recovery -np 2 "$troupe" run "$work/rl_lost_later.toml" "${two[@]}" --set topology.devices=3 \
  --set run.out_dir="\"$work/lost_later\""
expect_output "process 1 lost; restarted on process 0"
grep -q '"processes_lost":1' "$work/lost_later/metrics.jsonl" || fail "process 1 was not lost after at_step: its fault never fired"
same_checkpoint "$work/lost_later" "a run that lost process 1 after at_step"

# A lost process holding more generators than run.max_restarts (4 > 1):
# process_loss = "recover" moves them all to process 0, the budget is for
# actors that fail.
expect_exit 0 "${mpi[@]}" --enable-recovery -np 2 "$troupe" run "$work/rl_lost.toml" "${two[@]}" --set rl.generators=4 \
  --set run.max_restarts=1 --set run.out_dir="\"$work/lost_many\""
grep -q '"processes_lost":1' "$work/lost_many/metrics.jsonl" || fail "a lost process with 4 generators did not recover"
same_checkpoint "$work/lost_many" "a run that lost process 1 with 4 generators"

# latest with the buffer killed after storing a step it never confirmed:
# the step is dealt again and, with long completions, sampled after the
# trainer trained it (versions newer than the step). The ledger drops it as
# a duplicate, as in one process; it is no bad rollout (before, the
# generator restarted on it until the run gave up, most runs).
cp "$work/rl.toml" "$work/rl_dup.toml"
printf '\n[[faults]]\nat_step = 6\ntarget = "rollout_buffer"\nkind = "kill"\nat_message = 2\n' >> "$work/rl_dup.toml"
expect_exit 0 "${mpi[@]}" -np 2 "$troupe" run "$work/rl_dup.toml" "${two[@]}" --set rl.sync='"latest"' --set rl.loss='"decoupled_ppo"' \
  --set rl.max_staleness=1 --set rl.max_new_tokens=24 --set rl.generators=1 --set run.steps=12 --set run.eval_every=0 \
  --set run.out_dir="\"$work/dup\""
grep -q 'sent a bad rollout' <<<"$out" && fail "a duplicate latest rollout was refused as a bad one"
grep -q '"type":"rl_actors_end".*"groups_admitted":24,"groups_trained":24,.*"double_trained":0' "$work/dup/metrics.jsonl" ||
  fail "latest with a killed buffer: the ledger is not 24 groups admitted and trained once"

# rl.trainer = "actors" (1F1B over devices 0-1 with 2 expert and 2
# optimizer shards, on process 0) with the generator on device 2, process 1:
# the same checkpoint as in one process.
act=(--set rl.trainer='"actors"' --set topology.devices=3 --set topology.stages=2 --set topology.schedule='"1f1b"'
     --set topology.microbatches=2 --set topology.expert_shards=2 --set topology.optimizer_shards=2 --set rl.generators=1)
expect_exit 0 "$troupe" run "$work/rl.toml" "${act[@]}" --set run.out_dir="\"$work/act1\""
expect_exit 0 "${mpi[@]}" -np 2 "$troupe" run "$work/rl.toml" "${act[@]}" "${two[@]}" --set run.out_dir="\"$work/act2\""
expect_output "generator:0 (device 2, process 1)"
for f in params.f32.zst adam_m.f32.zst adam_v.f32.zst; do
  cmp -s "$work/act1/checkpoint/$f" "$work/act2/checkpoint/$f" || fail "trainer on actors: the generator on process 1 changed $f"
done

# process_loss = "fail": the same loss (the test hook's, as a spec with a
# process fault and "fail" is refused) stops the run, naming the process.
TROUPE_TEST_FAULT=kill:1:3 "${mpi[@]}" --enable-recovery -x TROUPE_TEST_FAULT -np 2 "$hooked" run "$work/rl.toml" "${two[@]}" \
  --set topology.process_loss='"fail"' --set run.out_dir="\"$work/lost_fail\"" > "$work/out.txt" 2>&1
grep -q 'run failed: generator process 1 was lost' "$work/out.txt" ||
  fail "process_loss = fail did not name the lost process; the run printed:\n$(tail -n 25 "$work/out.txt")"
[ -f "$work/lost_fail/checkpoint/manifest.bin" ] && fail "a failed run wrote a final checkpoint"

# The wrong number of processes for the spec: a clear error, nothing run.
expect_exit 3 "${mpi[@]}" -np 2 "$troupe" run "$work/rl.toml" --set run.out_dir="\"$work/wrong\""
expect_output "[topology] processes = 1, but 2 process(es) were started"

finish "rl across processes"
