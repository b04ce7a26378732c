#!/usr/bin/env bash
# `troupe launch`: a 2-process run through mpirun whose exit status is
# process 0's own: 0 when it finished, 130 when SIGINT or SIGHUP to the
# launcher stopped it (forwarded to process 0, which saves a checkpoint),
# 1 when process 0 was killed (where mpirun --enable-recovery says 0), 3 for
# a bad spec (before mpirun), 2 for an -np that contradicts the spec.
# usage: launch_test.sh TROUPE_BINARY   (exit 77: no mpirun)
set -uo pipefail
troupe=$(realpath "$1")
command -v mpirun >/dev/null || { echo "mpirun not installed: skipped"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/../cli_test_lib.sh"  # failures, fail, expect_exit, expect_output

tiny=(--set run.mode='"pretrain"' --set data.target_pairs='""' --set model.d_model=32 --set model.n_layers=2
      --set model.n_heads=2 --set model.expert_hidden=32 --set model.seq_len=32 --set data.batch_size=4
      --set topology.devices=2 --set topology.stages=2 --set topology.schedule='"1f1b"' --set topology.microbatches=2
      --set topology.expert_shards=1 --set topology.optimizer_shards=1 --set model.tie_embeddings=false
      --set topology.processes=2 --set optim.warmup_steps=1 --set run.eval_every=0 --set log.progress='"off"')

expect_exit 0 timeout 120 "$troupe" launch "${tiny[@]}" --set run.steps=4 --set run.out_dir="\"$work/ok\""
expect_output "troupe launch: mpirun -np 2"
expect_output "--mca btl self,vader"
expect_output "troupe launch: process 0 exited 0"
[ -s "$work/ok/checkpoint/params.f32.zst" ] || fail "the launched run saved no checkpoint"
expect_exit 3 "$troupe" launch "${tiny[@]}" --set run.steps=-4
expect_output "[run] steps = -4 is out of range"
expect_exit 2 "$troupe" launch -np 3 "${tiny[@]}"
expect_output "the spec has [topology] processes = 2"

# start_long NAME: a long launched run in the background; waits for its second step.
start_long() {
  "$troupe" launch "${tiny[@]}" --set run.steps=2000 --set run.out_dir="\"$work/$1\"" > "$work/$1.out" 2>&1 &
  pid=$!
  for _ in $(seq 600); do grep -qs '"type":"step","step":2,' "$work/$1/metrics.jsonl" && break; sleep 0.1; done
}
for sig in INT HUP; do
  start_long "sig$sig"
  kill -"$sig" "$pid"
  wait "$pid"; rc=$?
  [ "$rc" -eq 130 ] || fail "SIG$sig to the launcher: exit $rc, expected 130:\n$(tail -5 "$work/sig$sig.out")"
  grep -q "SIG$sig -> process 0" "$work/sig$sig.out" || fail "SIG$sig was not forwarded to process 0"
  grep -q '"type":"end",.*"interrupted":true' "$work/sig$sig/metrics.jsonl" || fail "SIG$sig: no interrupted end line"
  [ -s "$work/sig$sig/checkpoint/params.f32.zst" ] || fail "SIG$sig: no checkpoint"
done
# Process 0 killed outright: mpirun (with recovery) exits 0; the launcher does not.
start_long killed
pid0=""  # rank 0 of this run: its environment says so
for p in $(pgrep -f "$work/killed"); do
  tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=0" && { pid0=$p; break; }
done
[ -n "$pid0" ] || fail "could not find process 0 of the launched run"
[ -n "$pid0" ] && kill -9 "$pid0"
wait "$pid"; rc=$?
[ "$rc" -eq 1 ] || fail "process 0 killed: launcher exit $rc, expected 1:\n$(tail -5 "$work/killed.out")"
grep -q "process 0 ended without reporting its status" "$work/killed.out" || fail "the launcher did not say process 0 vanished"

finish launch_test
