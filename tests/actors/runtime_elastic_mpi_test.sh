#!/usr/bin/env bash
# Elastic experts across processes, under mpirun (label `mpi`): placement
# changes on 2 processes, where new expert shards are spawned on the process
# their device belongs to and the other process switches to them before the
# next step.
# - [[elastic]] events scaling out and in (2 -> 4 -> 3 -> 2 shards with
#   1F1B; 4 -> 2 -> 8 -> 4 with DualPipe and 2 optimizer shards; 2 -> 4 -> 3
#   with 2 data-parallel replicas on 4 devices): the checkpoint (parameters,
#   AdamW moments) and every step's metrics are byte-identical to the same
#   spec with static placement and to the 1-process run with the events
#   (bitwise: every expert lives on one shard, so no sum changes order);
#   process 1 reports each change with the number of shards it holds; the
#   same on 3 processes, and resumed on 2 from a checkpoint between events;
# - the eplb policy (every step, migration cost off so that the moves do not
#   depend on timings): identical to the static run without copies, and with
#   redundant_experts to the 1-process eplb run (copies sum their weight
#   gradients in shard order, which differs from the static run's order;
#   tests/actors/runtime_elastic_replicas_test.cpp checks that within 1e-5), with
#   the same rebalance decisions;
# - process 1 killed as step 2 starts, right before the event that spawns
#   shards on it: the shards it would get are spawned on process 0 and the run
#   ends with the static run's checkpoint;
# - [experts] on_failure = "shrink" with process 1 killed: its expert shards'
#   slots are removed (1F1B, DualPipe: 4 -> 2 per layer), bitwise the static
#   run; with 2 replicas on 4 devices every slot was lost and the shards are
#   respawned instead.
# usage: runtime_elastic_mpi_test.sh TROUPE_BINARY MPIRUN SPEC_DIR
set -uo pipefail
troupe=$1
mpirun=$2
specs=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/../cli_test_lib.sh"  # failures, fail, expect_output
mpi=("$mpirun" --allow-run-as-root --oversubscribe)

tiny=(--set model.d_model=32 --set model.n_layers=2 --set model.n_heads=2 --set model.expert_hidden=32
      --set model.seq_len=32 --set data.batch_size=8 --set data.eval_problems=20 --set run.eval_batches=1
      --set log.progress=plain --set run.steps=4 --set topology.peer_timeout=2
      --set run.mode='"pretrain"' --set data.target_pairs='""' --set model.tie_embeddings=false
      --set optim.warmup_steps=20 --set 'optim.schedule="cosine"' --set topology.stages=2
      --set topology.threads_per_device="${TROUPE_TEST_THREADS:-2}")
one_f1b=(--set topology.devices=2 --set topology.schedule='"1f1b"' --set topology.microbatches=2
         --set topology.expert_shards=2 --set topology.optimizer_shards=1)
dualpipe=(--set topology.devices=2 --set topology.schedule='"dualpipe"' --set topology.microbatches=4
          --set topology.optimizer_shards=2 --set topology.expert_shards=4)
dp2=(--set topology.devices=4 --set topology.schedule='"1f1b"' --set topology.microbatches=2
     --set topology.data_parallel=2 --set topology.optimizer_shards=2 --set topology.expert_shards=2)

# events NAME "STEP:SHARDS ...": the default spec with those [[elastic]] events.
events() {
  cp "$specs/default.toml" "$work/$1.toml"
  for ev in $2; do printf '\n[[elastic]]\nat_step = %s\nexpert_shards = %s\n' "${ev%%:*}" "${ev##*:}" >> "$work/$1.toml"; done
}
one() { out=$("$troupe" run "$@" 2>&1) || fail "1-process run failed:\n$out"; }
two() { out=$(timeout 120 "${mpi[@]}" -np 2 "$troupe" run "$@" --set topology.processes=2 2>&1) || fail "2-process run failed:\n$out"; }
same_ckpt() {  # same_ckpt WHAT DIR_A DIR_B
  for f in params.f32.zst adam_m.f32.zst adam_v.f32.zst; do
    cmp -s "$2/checkpoint/$f" "$3/checkpoint/$f" || fail "$1: $f differs ($2 vs $3)"
  done
  local l1 l2
  l1=$(grep '"type":"step"' "$2/metrics.jsonl" | sed 's/"step_seconds".*//')
  l2=$(grep '"type":"step"' "$3/metrics.jsonl" | sed 's/"step_seconds".*//')
  [ -n "$l1" ] && [ "$l1" = "$l2" ] || fail "$1: step metrics differ:\n$l1\n---\n$l2"
}

# elastic NAME "EVENTS" TOPOLOGY... ; then the process-1 lines expected.
elastic() {
  local name=$1 evs=$2; shift 2
  events "$name" "$evs"
  one "${tiny[@]}" "$@" --set run.out_dir="$work/$name-static"
  one "$work/$name.toml" "${tiny[@]}" "$@" --set run.out_dir="$work/$name-1"
  two "$work/$name.toml" "${tiny[@]}" "$@" --set run.out_dir="$work/$name-2"
  expect_output "step 4/4"
  [ "$(grep -c '"type":"rescale"' "$work/$name-2/metrics.jsonl")" -eq "$(wc -w <<<"$evs")" ] ||
    fail "$name: metrics.jsonl should hold one rescale line per event"
  same_ckpt "$name: 1 vs 2 processes" "$work/$name-1" "$work/$name-2"
  same_ckpt "$name: static vs elastic on 2 processes" "$work/$name-static" "$work/$name-2"
}
# 1F1B, 2 devices: shard k of a layer on the device after its stage's, so
# half of every layer's shards live on process 1.
elastic 1f1b "2:4 3:3 4:2" "${one_f1b[@]}"
expect_output "troupe[process 1]: expert placement: 4 shard(s) per MoE layer, 4 of 8 expert shard(s) here"
expect_output "troupe[process 1]: expert placement: 3 shard(s) per MoE layer, 3 of 6 expert shard(s) here"
expect_output "rescale: step 3: expert shards 4 -> 3"
elastic dualpipe "2:2 3:8 4:4" "${dualpipe[@]}"
expect_output "troupe[process 1]: expert placement: 8 shard(s) per MoE layer, 8 of 16 expert shard(s) here"
# 2 replicas on 4 devices: replica 1's ranks and expert shards on process 1.
elastic dp2 "2:4 4:3" "${dp2[@]}"
expect_output "troupe[process 1]: expert placement: 4 shard(s) per MoE layer, 8 of 16 expert shard(s) here"
# 3 processes on 3 devices: every process gets some of the new shards.
one "$work/1f1b.toml" "${tiny[@]}" "${one_f1b[@]}" --set topology.devices=3 --set run.out_dir="$work/three-1"
out=$(timeout 120 "${mpi[@]}" -np 3 "$troupe" run "$work/1f1b.toml" "${tiny[@]}" "${one_f1b[@]}" --set topology.devices=3 \
      --set topology.processes=3 --set run.out_dir="$work/three-3" 2>&1) || fail "3-process run failed:\n$out"
expect_output "troupe[process 1]: expert placement: 4 shard(s) per MoE layer, 3 of 8 expert shard(s) here"
expect_output "troupe[process 2]: expert placement: 4 shard(s) per MoE layer, 2 of 8 expert shard(s) here"
same_ckpt "3 processes" "$work/three-1" "$work/three-3"
# Resumed on 2 processes from step 2 to 4: it starts on the [topology]
# count (2) and goes to the count in force at step 3 (3) before its first
# step, then 3 -> 2 at step 4.
events half "2:4"
two "$work/half.toml" "${tiny[@]}" "${one_f1b[@]}" --set run.steps=2 --set run.out_dir="$work/half"
two "$work/1f1b.toml" "${tiny[@]}" "${one_f1b[@]}" --set checkpoint.resume="$work/half/checkpoint" \
    --set run.out_dir="$work/resumed"
expect_output "rescale: step 3: expert shards 2 -> 3"
expect_output "rescale: step 4: expert shards 3 -> 2"
for f in params.f32.zst adam_m.f32.zst adam_v.f32.zst; do
  cmp -s "$work/1f1b-static/checkpoint/$f" "$work/resumed/checkpoint/$f" || fail "resumed: $f differs from the static run's"
done
# validate shows each shard's process after an event.
out=$("$troupe" validate "$work/1f1b.toml" "${tiny[@]}" "${one_f1b[@]}" --set topology.processes=2 2>&1) ||
  fail "validate failed:\n$out"
expect_output "expert:0/3   experts 6..7 on device 1, process 1"

# eplb across processes (skewed loads: balance = "none").
eplb=(--set model.balance='"none"' --set run.steps=6 --set topology.devices=2 --set topology.schedule='"1f1b"'
      --set topology.microbatches=2 --set topology.expert_shards=4 --set topology.optimizer_shards=1)
policy=(--set experts.policy='"eplb"' --set experts.rebalance_every=1 --set experts.migration_cost_scale=0)
one "${tiny[@]}" "${eplb[@]}" --set run.out_dir="$work/eplb-static"
two "${tiny[@]}" "${eplb[@]}" "${policy[@]}" --set run.out_dir="$work/eplb-2"
expect_output "eplb: 2 expert(s) moved"
grep -q '"type":"rebalance"' "$work/eplb-2/metrics.jsonl" || fail "eplb: no rebalance line in metrics.jsonl"
same_ckpt "eplb: static vs eplb on 2 processes" "$work/eplb-static" "$work/eplb-2"
one "${tiny[@]}" "${eplb[@]}" "${policy[@]}" --set experts.redundant_experts=2 --set run.out_dir="$work/copies-1"
two "${tiny[@]}" "${eplb[@]}" "${policy[@]}" --set experts.redundant_experts=2 --set run.out_dir="$work/copies-2"
expect_output "expert(s) with copies"
same_ckpt "eplb with copies: 1 vs 2 processes" "$work/copies-1" "$work/copies-2"
decisions() { grep '"type":"rebalance"' "$1/metrics.jsonl" | sed 's/"bytes".*//'; }
[ -n "$(decisions "$work/copies-2")" ] && [ "$(decisions "$work/copies-1")" = "$(decisions "$work/copies-2")" ] ||
  fail "eplb with copies: rebalance decisions differ between 1 and 2 processes"

# Process 1 lost as step 2 starts (the event at step 2 would spawn half the
# new shards on it): process 0 spawns them itself and the run ends as the
# static run did. --enable-recovery and the rank wrapper as in
# tests/runtime_procloss_test.sh.
cp "$work/1f1b.toml" "$work/lost.toml"
printf '\n[[faults]]\nat_step = 2\ntarget = "process:1"\nkind = "kill"\n' >> "$work/lost.toml"
out=$(timeout 120 "${mpi[@]}" --mca btl self,vader --enable-recovery -np 2 bash -c '"$@"; rc=$?
      echo "rank $OMPI_COMM_WORLD_RANK exit $rc"; [ "$OMPI_COMM_WORLD_RANK" = 0 ] && exit $rc; exit 0' _ \
      "$troupe" run "$work/lost.toml" "${tiny[@]}" "${one_f1b[@]}" --set topology.processes=2 \
      --set run.out_dir="$work/lost" 2>&1)
expect_output "process 1 lost"
expect_output "rescale: step 2: expert shards 2 -> 4"
expect_output "step 4/4"
expect_output "rank 0 exit 0"
same_ckpt "process 1 lost before a scale event" "$work/1f1b-static" "$work/lost"

# [experts] on_failure = "shrink" with process 1 killed as step 3 starts:
# the slots of the expert shards it held go (their experts join the
# survivors on process 0, loaded from the committed snapshot), its other
# actors are respawned on process 0, the step is replayed, and the run ends
# with the static run's checkpoint (bitwise: every expert still lives on one
# shard). 1F1B with 4 shards: each layer loses 2 slots (4 -> 2); DualPipe
# likewise. With 2 replicas on 4 devices replica 1's shards all lived on
# process 1, so every slot of every layer was lost (the plan keeps one count
# for all replicas): nothing to shrink to, the shards are respawned instead.
shrink() {  # shrink NAME TOPOLOGY...
  local name=$1; shift
  cp "$specs/default.toml" "$work/$name.toml"
  printf '\n[experts]\non_failure = "shrink"\n\n[[faults]]\nat_step = 3\ntarget = "process:1"\nkind = "kill"\n' >> "$work/$name.toml"
  one "${tiny[@]}" "$@" --set run.out_dir="$work/$name-static"
  out=$(timeout 120 "${mpi[@]}" --mca btl self,vader --enable-recovery -np 2 bash -c '"$@"; rc=$?
        echo "rank $OMPI_COMM_WORLD_RANK exit $rc"; [ "$OMPI_COMM_WORLD_RANK" = 0 ] && exit $rc; exit 0' _ \
        "$troupe" run "$work/$name.toml" "${tiny[@]}" "$@" --set topology.processes=2 --set run.out_dir="$work/$name" 2>&1)
  expect_output "process 1 lost"
  expect_output "step 4/4"
  expect_output "rank 0 exit 0"
  same_ckpt "$name" "$work/$name-static" "$work/$name"
}
shrink shrink-1f1b "${one_f1b[@]}" --set topology.expert_shards=4
expect_output "troupe[process 0]: shrinking around the lost process: expert shards per layer 4 -> 2"
expect_output "restarting stage:1 on process 0"
expect_output "removed the expert shards of process 1 (process 1 lost"
expect_output "their process was lost, expert shards per layer 4 -> 2, step replayed"
grep -q '"shrink":1,"shards_before":4,"shards_after":2' "$work/shrink-1f1b/metrics.jsonl" ||
  fail "shrink-1f1b: no shrink line in metrics.jsonl"
shrink shrink-dualpipe "${dualpipe[@]}"
expect_output "shrinking around the lost process: expert shards per layer 4 -> 2"
shrink shrink-dp2 "${dp2[@]}"
expect_output "cannot shrink around the lost process (MoE layer 0 lost 2 of 2 expert shard slot(s), none left"
expect_output "restarting stage:0/replica:1, stage:1/replica:1, expert:1/1/replica:0, expert:0/0/replica:1"

[ "$failures" -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
echo "all elastic-across-processes checks passed"
