#!/usr/bin/env bash
# Surviving the loss of a process (label `mpi`): a 2-process 1F1B run whose
# process 1 is hit from the spec ([[faults]] target = "process:1") —
#   kind = "kill": SIGKILLed as step 3 starts;
#   kind = "stop": SIGSTOPped as step 3 starts, found by its missing
#                  heartbeats (the adaptive deadline, not CAF's peer_timeout
#                  backstop), then SIGKILLed by process 0 —
# and a DualPipe run with 2 expert shards per layer, killed, recover:
# process 1's actors restart on process 0 from the coordinator's committed
# snapshot, step 3 is replayed, the run finishes on one process and
# its checkpoint is byte-identical (cmp) to the fault-free single-process
# run's, and so is every step's loss line. Also: validate lists the process
# faults and rejects process:0, a process that does not exist, and a process
# fault in a 1-process run, with file:line:col; run refuses process faults
# when mpirun was started without --enable-recovery.
# usage: runtime_procloss_test.sh TROUPE_BINARY MPIRUN
set -uo pipefail
troupe=$1
mpirun=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
expect_output() { grep -qF -- "$1" <<<"$out" || fail "expected '$1' in the output; got:\n$out"; }
# --enable-recovery: mpirun lets process 0 go on after process 1 dies (it
# then exits 0 itself, so each rank's exit code is printed and checked).
mpi=("$mpirun" --allow-run-as-root --oversubscribe --mca btl self,vader --enable-recovery)

tiny=(--set model.d_model=32 --set model.n_layers=2 --set model.n_heads=2 --set model.expert_hidden=32
      --set model.seq_len=32 --set data.batch_size=8 --set data.eval_problems=20 --set run.eval_batches=1
      --set log.progress=plain --set run.steps=5
      --set model.tie_embeddings=false --set optim.warmup_steps=20 --set 'optim.schedule="cosine"'
      --set topology.devices=2 --set topology.stages=2 --set 'topology.schedule="1f1b"'
      --set topology.microbatches=2 --set topology.expert_shards=1 --set topology.optimizer_shards=2
      --set topology.threads_per_device=1)
val_of() { grep '"type":"end"' "$1/metrics.jsonl" | grep -o '"final_val_loss":[^,}]*'; }


# spec KIND: a 2-process run with process 1 hit by KIND at step 3.
spec() {
  cat > "$work/$1.toml" <<TOML
[topology]
processes = 2
[[faults]]
at_step = 3
target = "process:1"
kind = "$1"
TOML
}
# The fault-free reference: the same spec file in one process, no faults.
printf '[topology]\nprocesses = 1\n' > "$work/ref.toml"
out=$("$troupe" run "$work/ref.toml" "${tiny[@]}" --set run.out_dir="$work/ref" 2>&1) || fail "fault-free 1-process run failed:\n$out"

for kind in kill stop; do
  spec "$kind"
  out=$("$troupe" validate "$work/$kind.toml" "${tiny[@]}" 2>&1) || fail "$kind: validate failed:\n$out"
  expect_output "$kind process:1"
  start=$(date +%s)
  # The wrapper prints each rank's code; rank 1's wrapper then exits 0: a rank
  # that *exits* non-zero (137 here, passed on by bash) makes mpirun abort the
  # job even with --enable-recovery (orte_abort_on_non_zero_status); a process
  # killed by a signal, as in a real run, does not. The timeout catches a
  # hang at the end (MPI_Finalize with a dead peer, which troupe now skips).
  out=$(timeout 120 "${mpi[@]}" -np 2 bash -c '"$@"; rc=$?; echo "rank $OMPI_COMM_WORLD_RANK exit $rc"
        [ "$OMPI_COMM_WORLD_RANK" = 0 ] && exit $rc; exit 0' _ \
        "$troupe" run "$work/$kind.toml" "${tiny[@]}" --set run.out_dir="$work/$kind" 2>&1)
  elapsed=$(( $(date +%s) - start ))
  [ "$elapsed" -lt 100 ] || fail "$kind: took ${elapsed}s (a hang at the end?)"
  expect_output "test fault: $([ "$kind" = kill ] && echo kill || echo hang) at step 3"
  expect_output "process 1 lost"
  expect_output "restarting optimizer:1, stage:1 on process 0"
  expect_output "step 5/5"
  expect_output "rank 0 exit 0"
  expect_output "processes lost: 1"
  [ "$kind" = stop ] && expect_output "SIGKILLed pid"
  [ "$kind" = stop ] && expect_output "no heartbeat for"
  grep -q "exiting now" <<<"$out" && fail "$kind: a backstop fired:\n$out"
  for f in params.f32.zst adam_m.f32.zst adam_v.f32.zst manifest.bin; do
    cmp -s "$work/ref/checkpoint/$f" "$work/$kind/checkpoint/$f" || fail "$kind: $f differs from the fault-free run's\n$out"
  done
  [ -n "$(val_of "$work/ref")" ] && [ "$(val_of "$work/ref")" = "$(val_of "$work/$kind")" ] ||
    fail "$kind: validation loss differs: $(val_of "$work/ref") vs $(val_of "$work/$kind")"
  l1=$(grep '"type":"step"' "$work/ref/metrics.jsonl" | sed 's/"step_seconds".*//')
  l2=$(grep '"type":"step"' "$work/$kind/metrics.jsonl" | sed 's/"step_seconds".*//')
  [ -n "$l1" ] && [ "$l1" = "$l2" ] || fail "$kind: step metrics differ:\n$l1\n---\n$l2"
  grep -q '"type":"faults".*"processes_lost":1' "$work/$kind/metrics.jsonl" || fail "$kind: no faults line with processes_lost"
  # No process left behind (a stopped one would linger forever).
  pgrep -f "$work/$kind.toml" >/dev/null && fail "$kind: a troupe process of the run is still there"
  echo "$kind: recovered in ${elapsed}s"
done

# DualPipe with 2 expert shards per MoE layer: process 1's expert shards
# (their Dispatch/Combine crossed processes) restart on process 0 too.
xp=(--set 'topology.schedule="dualpipe"' --set topology.microbatches=4 --set topology.expert_shards=2)
out=$("$troupe" run "$work/ref.toml" "${tiny[@]}" "${xp[@]}" --set run.out_dir="$work/xref" 2>&1) || fail "experts: 1-process run failed:\n$out"
out=$(timeout 180 "${mpi[@]}" -np 2 "$troupe" run "$work/kill.toml" "${tiny[@]}" "${xp[@]}" --set run.out_dir="$work/xkill" 2>&1) ||
  fail "experts: mpirun exited non-zero:\n$out"
expect_output "restarting optimizer:1, stage:1, expert:0/1, expert:1/0 on process 0"
expect_output "step 5/5"
for f in params.f32.zst adam_m.f32.zst adam_v.f32.zst manifest.bin; do
  cmp -s "$work/xref/checkpoint/$f" "$work/xkill/checkpoint/$f" || fail "experts: $f differs from the fault-free run's\n$out"
done

# Without --enable-recovery Open MPI would end the job when process 1 dies:
# run refuses a spec with process faults up front (exit 3), naming the flag.
out=$(timeout 120 "$mpirun" --allow-run-as-root --oversubscribe --mca btl self,vader -np 2 "$troupe" run "$work/kill.toml" \
      "${tiny[@]}" --set run.out_dir="$work/norec" 2>&1); rc=$?
[ "$rc" -eq 3 ] || fail "without --enable-recovery: mpirun exited $rc, expected 3:\n$out"
expect_output 'need `mpirun --enable-recovery`'

# validate rejects what cannot be recovered, at file:line:col.
bad() {  # NAME TOML EXPECTED
  printf '%s\n' "$2" > "$work/$1.toml"
  out=$("$troupe" validate "$work/$1.toml" "${tiny[@]}" 2>&1) && fail "$1: validate accepted it"
  expect_output "$3"
  expect_output "$work/$1.toml:"
}
bad p0 $'[topology]\nprocesses = 2\n[[faults]]\nat_step = 2\ntarget = "process:0"\nkind = "kill"' 'process 0 holds the coordinator'
bad p2 $'[topology]\nprocesses = 2\n[[faults]]\nat_step = 2\ntarget = "process:2"\nkind = "stop"' 'does not exist: [topology] processes = 2'
bad one $'[[faults]]\nat_step = 2\ntarget = "process:1"\nkind = "kill"' 'a process fault needs [topology] processes = 2'
bad drop $'[topology]\nprocesses = 2\n[[faults]]\nat_step = 2\ntarget = "process:1"\nkind = "drop"' 'does not apply to a process'
bad stopactor $'[[faults]]\nat_step = 2\ntarget = "stage:1"\nkind = "stop"' 'its target must be "process:P"'
bad failmode $'[topology]\nprocesses = 2\nprocess_loss = "fail"\n[[faults]]\nat_step = 2\ntarget = "process:1"\nkind = "kill"' 'process_loss = "fail"'

[ "$failures" -eq 0 ] && echo "runtime_procloss: all passed" || echo "runtime_procloss: $failures failure(s)"
[ "$failures" -eq 0 ]
