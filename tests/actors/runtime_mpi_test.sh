#!/usr/bin/env bash
# The actor runtime across processes under mpirun (label `mpi`):
# - 2-stage 1F1B (also with an explicit device -> process placement) and
#   DualPipe (with 2 optimizer shards; also with envelopes on the
#   shared-memory bulk path), and 2 data-parallel
#   replicas over 4 devices, and expert shards (2 with 1F1B, 4 with DualPipe)
#   spread over both processes, on 2 processes: the checkpoint (parameters, AdamW
#   moments, manifest) is byte-identical to the single-process run of the same
#   spec, and so are every step's loss, aux loss, grad norm and the validation loss;
# - a DualPipe expert run resumed from its step-2 checkpoint on 2 processes
#   ends with the one-process run's checkpoint, byte for byte;
# - a process that SIGKILLs itself at step 3 (test hook TROUPE_TEST_FAULT, read by
#   tests/launch/troupe_with_hooks.cpp only),
#   and one that hangs (SIGSTOP): process 0 names the lost process and its
#   actors and the run ends non-zero, well before the backstop timeout;
# - process 0 lost (killed or hung): the other process says so and exits non-zero;
# - world size != [topology] processes, and processes > 1 without mpirun,
#   are rejected with a clear message, so is an interface that cannot be
#   bound; validate lists actors per process;
# - authentication: the runs above use the default, mutual TLS with a key
#   process 0 makes; auth = "none" and a key from `troupe keygen` give the
#   same checkpoint; a rogue knocking on both processes' ports during a run
#   (TLS with a key of its own, then CAF's plain protocol) is refused and the
#   run ends with the same checkpoint as without the knocks.
# usage: runtime_mpi_test.sh TROUPE_BINARY MPIRUN ROGUE_CLIENT TROUPE_WITH_HOOKS
set -uo pipefail
troupe=$1
mpirun=$2
rogue=$3
hooked=$4  # troupe with the test hooks of TROUPE_TEST_FAULT (tests/launch/troupe_with_hooks.cpp)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
mpi=("$mpirun" --allow-run-as-root --oversubscribe)
expect_output() { grep -qF -- "$1" <<<"$out" || fail "expected '$1' in the output; got:\n$out"; }

tiny=(--set model.d_model=32 --set model.n_layers=2 --set model.n_heads=2 --set model.expert_hidden=32
      --set model.seq_len=32 --set data.batch_size=8 --set data.eval_problems=20 --set run.eval_batches=1
      --set log.progress=plain --set run.steps=4 --set topology.peer_timeout=2
      # The built-in default is a two-phase job (run.mode = "sft_rl"): these checks
      # run its phase 1 alone (run.mode = "pretrain") without the RL split.
      --set run.mode='"pretrain"' --set data.target_pairs='""'
      # Phase 1 is expert-parallel DualPipe on 2 devices, untied, with
      # 100 warmup steps and a constant LR (the addition recipe); these checks start
      # from the single-device topology, tied embeddings, 20 warmup steps and cosine
      # (so a few steps move the parameters) and set what they test.
      --set model.tie_embeddings=true --set optim.warmup_steps=20 --set 'optim.schedule="cosine"'
      --set topology.devices=1 --set topology.stages=1 --set 'topology.schedule="sequential"'
      --set topology.microbatches=1 --set topology.expert_shards=1 --set topology.optimizer_shards=1
      --set topology.threads_per_device="${TROUPE_TEST_THREADS:-2}")
val_of() { grep '"type":"end"' "$1/metrics.jsonl" | grep -o '"final_val_loss":[^,}]*'; }

# same_run NAME ARGS...: one process, then 2 under mpirun (plus "${extra2[@]}");
# checkpoints must match byte for byte.
extra2=()
same_run() {
  local name=$1; shift
  out=$("$troupe" run "${tiny[@]}" "$@" --set run.out_dir="$work/$name-1" 2>&1) || fail "$name: single-process run failed:\n$out"
  out=$(timeout 120 "${mpi[@]}" -np 2 "$troupe" run "${tiny[@]}" "$@" "${extra2[@]}" --set topology.processes=2 \
        --set run.out_dir="$work/$name-2" 2>&1) || fail "$name: 2-process run failed:\n$out"
  expect_output "2 process(es)"
  expect_output "step 4/4"
  for f in params.f32.zst adam_m.f32.zst adam_v.f32.zst manifest.bin; do
    cmp -s "$work/$name-1/checkpoint/$f" "$work/$name-2/checkpoint/$f" || fail "$name: $f differs between 1 and 2 processes"
  done
  [ -n "$(val_of "$work/$name-1")" ] && [ "$(val_of "$work/$name-1")" = "$(val_of "$work/$name-2")" ] ||
    fail "$name: validation loss differs: $(val_of "$work/$name-1") vs $(val_of "$work/$name-2")"
  # Every step's loss, aux loss, lr and gradient norm (the line up to the timings).
  local l1 l2
  l1=$(grep '"type":"step"' "$work/$name-1/metrics.jsonl" | sed 's/"step_seconds".*//')
  l2=$(grep '"type":"step"' "$work/$name-2/metrics.jsonl" | sed 's/"step_seconds".*//')
  [ -n "$l1" ] && [ "$l1" = "$l2" ] || fail "$name: step metrics differ:\n$l1\n---\n$l2"
}
same_run 1f1b --set topology.devices=2 --set topology.stages=2 --set topology.schedule='"1f1b"' \
  --set topology.microbatches=2 --set model.tie_embeddings=false
same_run dualpipe --set topology.devices=2 --set topology.stages=2 --set topology.schedule='"dualpipe"' \
  --set topology.microbatches=4 --set topology.optimizer_shards=2
# Step messages took the shared-memory rings (actors/transport/ring_transport.hpp),
# whose names leave /dev/shm as soon as both processes have mapped them.
grep -Eq 'shared-memory rings: sent [1-9]' <<<"$out" || fail "the 2-process run sent no message through the rings:\n$out"
for f in /dev/shm/troupe-ring-*; do
  [ -e "$f" ] || continue
  pid=$(basename "$f" | cut -d- -f3)
  kill -0 "$pid" 2>/dev/null || fail "ring segment $f of the ended process $pid left in /dev/shm"
done
# The same bits with the rings off: every step message through CAF's TCP stream.
extra2=(--set topology.ring_bytes=0)
same_run dualpipe-tcp --set topology.devices=2 --set topology.stages=2 --set topology.schedule='"dualpipe"' \
  --set topology.microbatches=4 --set topology.optimizer_shards=2
extra2=()
grep -q 'shared-memory rings' <<<"$out" && fail "ring_bytes = 0 still used the rings:\n$out"
# DualPipe again with every envelope >= 1 KiB on the shared-memory bulk path.
same_run dualpipe-shm --set topology.devices=2 --set topology.stages=2 --set topology.schedule='"dualpipe"' \
  --set topology.microbatches=4 --set topology.optimizer_shards=2 --set topology.bulk_shm_bytes=1024
expect_output "shared-memory bulk path: sent"
# This run's segments are gone (each process names its own: other tests'
# runs may hold theirs in /dev/shm at the same time).
shm_pids=$(grep -o 'segments /troupe-bulk-[0-9]*-' <<<"$out" | grep -o '[0-9]*' | sort -u)
[ "$(wc -w <<<"$shm_pids")" -eq 2 ] || fail "the processes did not name their shared-memory segments:\n$out"
for pid in $shm_pids; do
  [ -z "$(ls /dev/shm | grep "^troupe-bulk-$pid-")" ] || fail "shared-memory segments of pid $pid left in /dev/shm: $(ls /dev/shm)"
done
# Explicit placement: device 0 (stage:0, optimizer:0) on process 1, device 1 on process 0.
extra2=(--set topology.device_processes='"1,0"')
same_run placed --set topology.devices=2 --set topology.stages=2 --set topology.schedule='"1f1b"' \
  --set topology.microbatches=2 --set topology.optimizer_shards=2
extra2=()
same_run dp --set topology.devices=4 --set topology.stages=2 --set topology.schedule='"1f1b"' \
  --set topology.microbatches=2 --set topology.data_parallel=2 --set topology.optimizer_shards=2
# Expert parallelism across processes: expert shards follow their device
# (shard k of a layer on the device after its stage's), so Dispatch and
# Combine cross the process boundary; 1F1B with 2 shards and DualPipe with 4.
same_run experts2 --set topology.devices=2 --set topology.stages=2 --set topology.schedule='"1f1b"' \
  --set topology.microbatches=2 --set topology.expert_shards=2 --set model.tie_embeddings=false
same_run experts4 --set topology.devices=2 --set topology.stages=2 --set topology.schedule='"dualpipe"' \
  --set topology.microbatches=4 --set topology.optimizer_shards=2 --set topology.expert_shards=4
# Resume across processes: 2 processes run 2 steps of the DualPipe expert
# run, then 2 processes (each reading the checkpoint itself) resume it to 4:
# the checkpoint equals the uninterrupted one-process run's byte for byte.
x4=(--set topology.devices=2 --set topology.stages=2 --set topology.schedule='"dualpipe"' --set topology.microbatches=4
    --set topology.optimizer_shards=2 --set topology.expert_shards=4 --set topology.processes=2)
out=$(timeout 120 "${mpi[@]}" -np 2 "$troupe" run "${tiny[@]}" "${x4[@]}" --set run.steps=2 \
      --set run.out_dir="$work/xr-half" 2>&1) || fail "resume: 2-process half run failed:\n$out"
out=$(timeout 120 "${mpi[@]}" -np 2 "$troupe" run "${tiny[@]}" "${x4[@]}" --set checkpoint.resume="$work/xr-half/checkpoint" \
      --set run.out_dir="$work/xr-rest" 2>&1) || fail "resume: 2-process resumed run failed:\n$out"
expect_output "step 4/4"
for f in params.f32.zst adam_m.f32.zst adam_v.f32.zst manifest.bin; do
  cmp -s "$work/experts4-1/checkpoint/$f" "$work/xr-rest/checkpoint/$f" || fail "resume across processes: $f differs"
done

# process_loss = "fail": these check the report of a lost process (surviving
# one, the default "recover", is tests/actors/runtime_procloss_test.sh's).
pipe=(--set topology.devices=2 --set topology.stages=2 --set topology.schedule='"1f1b"' --set topology.microbatches=2
      --set topology.processes=2 --set run.steps=6 --set topology.process_loss='"fail"')
# Process 1 dies at step 3. --enable-recovery keeps mpirun from killing process 0
# before it reports (Open MPI then exits 0 itself, so each rank's code is recorded).
start=$(date +%s)
out=$(TROUPE_TEST_FAULT=kill:1:3 timeout 120 "${mpi[@]}" --enable-recovery -np 2 bash -c \
      '"$@"; rc=$?; echo "rank $OMPI_COMM_WORLD_RANK exit $rc"; exit $rc' _ \
      "$hooked" run "${tiny[@]}" "${pipe[@]}" --set run.out_dir="$work/kill" 2>&1)
elapsed=$(( $(date +%s) - start ))
expect_output "test fault: kill at step 3"
expect_output "process 1 lost"
expect_output "its actors are gone: stage:1"
expect_output "run failed"
expect_output "rank 0 exit 1"
# Bounded: the report must not come from the backstop (2 * peer_timeout + 10 s).
grep -q "exiting now" <<<"$out" && fail "kill: process 0 needed the backstop to exit:\n$out"
[ "$elapsed" -lt 60 ] || fail "kill: took ${elapsed}s"

# Process 1 hangs at step 3 (SIGSTOP): found by the connection timeout.
out=$(TROUPE_TEST_FAULT=hang:1:3 timeout 120 "${mpi[@]}" -np 2 "$hooked" run "${tiny[@]}" "${pipe[@]}" \
      --set run.out_dir="$work/hang" 2>&1); rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "hang: mpirun exited $rc, expected a non-zero code other than the timeout's"
expect_output "process 1 lost"
expect_output "its actors are gone: stage:1"
expect_output "run failed"
grep -q "exiting now" <<<"$out" && fail "hang: process 0 needed the backstop to exit:\n$out"

# Process 0 dies: process 1 notices and exits non-zero on its own.
out=$(TROUPE_TEST_FAULT=kill:0:3 timeout 120 "${mpi[@]}" --enable-recovery -np 2 bash -c \
      '"$@"; rc=$?; echo "rank $OMPI_COMM_WORLD_RANK exit $rc"; exit $rc' _ \
      "$hooked" run "${tiny[@]}" "${pipe[@]}" --set run.out_dir="$work/kill0" 2>&1)
expect_output "process 0 lost"
expect_output "its actors are gone: coordinator, optimizer:0, stage:0"
expect_output "rank 1 exit 1"

# Process 0 hangs: process 1 finds it by the connection timeout and ends the job.
out=$(TROUPE_TEST_FAULT=hang:0:3 timeout 120 "${mpi[@]}" -np 2 "$hooked" run "${tiny[@]}" "${pipe[@]}" \
      --set run.out_dir="$work/hang0" 2>&1); rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "hang of process 0: mpirun exited $rc"
expect_output "process 0 lost"
grep -q "exiting now" <<<"$out" && fail "hang of process 0: process 1 needed the backstop to exit:\n$out"

# An interface no process can bind: every process stops with the spec error
# validate gives (before any actor starts), no hang.
out=$(timeout 60 "${mpi[@]}" -np 2 "$troupe" run "${tiny[@]}" "${pipe[@]}" --set topology.interface='"10.255.255.1"' \
      --set run.out_dir="$work/if" 2>&1); rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "unbindable interface: mpirun exited $rc"
expect_output "'10.255.255.1' is not an address of this host"

# World size must equal [topology] processes.
out=$(timeout 60 "${mpi[@]}" -np 2 "$troupe" run "${tiny[@]}" --set topology.devices=2 --set topology.stages=2 \
      --set topology.schedule='"1f1b"' --set topology.microbatches=2 --set run.out_dir="$work/np" 2>&1); rc=$?
[ "$rc" -ne 0 ] || fail "mpirun -np 2 with processes = 1 should fail"
expect_output "[topology] processes = 1, but 2 process(es) were started"
out=$("$troupe" run "${tiny[@]}" "${pipe[@]}" --set run.out_dir="$work/nompi" 2>&1); rc=$?
[ "$rc" -eq 3 ] || fail "processes = 2 without mpirun exited $rc, expected 3"
expect_output "mpirun -np 2 troupe run"
# Placement in validate: device blocks per process, actors follow their device.
out=$("$troupe" validate "${tiny[@]}" "${pipe[@]}" --set topology.optimizer_shards=2 2>&1) || fail "validate failed:\n$out"
grep -A4 '^process 1' <<<"$out" | grep -q "stage:1" || fail "validate should place stage:1 on process 1:\n$out"
grep -A4 '^process 1' <<<"$out" | grep -q "optimizer:1" || fail "validate should place optimizer:1 on process 1:\n$out"
out=$("$troupe" validate "${tiny[@]}" "${pipe[@]}" --set topology.device_processes='"1,0"' 2>&1) || fail "validate failed:\n$out"
grep -A4 '^process 1' <<<"$out" | grep -q "stage:0" || fail "device_processes = 1,0 should place stage:0 on process 1:\n$out"

# Expert shards in validate: shard 1 of layer 0 (stage:0 on device 0) sits on device 1, process 1.
out=$("$troupe" validate "${tiny[@]}" "${pipe[@]}" --set topology.expert_shards=2 2>&1) || fail "validate failed:\n$out"
grep -A8 '^process 1' <<<"$out" | grep -q " expert:0/1 " || fail "validate should place expert:0/1 on process 1:\n$out"
grep -q "the experts run in the expert-shard actors" <<<"$out" || fail "validate should say the experts run in their actors:\n$out"

# Authentication. The 1f1b runs above used TLS with a per-run key.
expect_checkpoint() {  # DIR_A DIR_B WHAT
  for f in params.f32.zst adam_m.f32.zst adam_v.f32.zst manifest.bin; do
    cmp -s "$1/checkpoint/$f" "$2/checkpoint/$f" || fail "$3: $f differs"
  done
}
p1f1b=(--set topology.devices=2 --set topology.stages=2 --set topology.schedule='"1f1b"' --set topology.microbatches=2
       --set model.tie_embeddings=false --set topology.processes=2)
out=$(timeout 120 "${mpi[@]}" -np 2 "$troupe" run "${tiny[@]}" "${p1f1b[@]}" --set topology.auth='"none"' \
      --set run.out_dir="$work/auth-none" 2>&1) || fail "auth none: run failed:\n$out"
expect_output 'troupe[process 1]: listening on 127.0.0.1:'
expect_output '(plain, auth = "none")'
expect_checkpoint "$work/1f1b-1" "$work/auth-none" "auth none"
out=$("$troupe" keygen "$work/key" 2>&1) || fail "keygen failed:\n$out"
out=$(timeout 120 "${mpi[@]}" -np 2 "$troupe" run "${tiny[@]}" "${p1f1b[@]}" --set topology.auth_dir="\"$work/key\"" \
      --set run.out_dir="$work/auth-dir" 2>&1) || fail "auth_dir: run failed:\n$out"
expect_output '(mutual TLS)'
expect_checkpoint "$work/1f1b-1" "$work/auth-dir" "auth_dir"
out=$("$troupe" validate "${tiny[@]}" "${p1f1b[@]}" --set topology.auth_dir="\"$work/nokey\"" 2>&1); rc=$?
[ "$rc" -eq 4 ] || fail "validate with a missing auth_dir exited $rc, expected 4:\n$out"
expect_output "auth_dir $work/nokey: not a directory"
# The knock: a longer run, both ports knocked on while it trains.
long=(--set run.steps=300 --set run.eval_every=0)
"$troupe" run "${tiny[@]}" "${p1f1b[@]}" "${long[@]}" --set topology.processes=1 --set run.out_dir="$work/knock-1" \
  >/dev/null 2>&1 || fail "knock: single-process run failed"
timeout 180 "${mpi[@]}" -np 2 "$troupe" run "${tiny[@]}" "${p1f1b[@]}" "${long[@]}" --set run.out_dir="$work/knock-2" \
  >"$work/knock.log" 2>&1 &
run_pid=$!
ports=""
for _ in $(seq 600); do
  ports=$(grep -o 'listening on 127.0.0.1:[0-9]*' "$work/knock.log" | sed 's/.*://' | tr '\n' ' ')
  [ "$(wc -w <<<"$ports")" -eq 2 ] && break
  sleep 0.1
done
[ "$(wc -w <<<"$ports")" -eq 2 ] || fail "knock: the processes never said where they listen:\n$(cat "$work/knock.log")"
for port in $ports; do
  for try in 1 2 3; do  # exit 3 (no verdict: a connect that failed) is retried while the run lives
    out=$("$rogue" "$port" 2>&1); rc=$?
    [ "$rc" -eq 3 ] && kill -0 "$run_pid" 2>/dev/null || break
  done
  [ "$rc" -eq 0 ] || fail "knock on port $port: rogue exit $rc (1: got through, 3: the run had ended) after $try knock(s):\n$out"
  grep -q "refused" <<<"$out" || fail "knock on port $port: no refusal reported:\n$out"
done
# A probe that knocks again and again: the log gets the first few refusals
# one by one, then a count per interval, not a line per knock.
first_port=${ports%% *}
for _ in $(seq 12); do kill -0 "$run_pid" 2>/dev/null && "$rogue" "$first_port" >/dev/null 2>&1; done
wait "$run_pid" || fail "knock: the 2-process run failed:\n$(cat "$work/knock.log")"
python3 - "$work/knock.log" <<'PY' || fail "knock: refusals were not rate-limited (see above)"
import collections, re, sys
one, summary = collections.Counter(), collections.Counter()
for line in open(sys.argv[1]):
    m = re.match(r"troupe\[pid (\d+)\]: refused (a connection|(\d+) more connection)", line)
    if m: (one if m.group(2) == "a connection" else summary)[m.group(1)] += 1
for pid, n in one.items():
    if n > 5: sys.exit(f"pid {pid}: {n} refusals logged one by one (at most 5)")
    if n == 5 and summary[pid] == 0: sys.exit(f"pid {pid}: refusals beyond the first 5 were not counted")
print("refusal lines per process:", dict(one), "count lines:", dict(summary))
PY
grep -q "refused a connection from 127.0.0.1:[0-9]*: TLS handshake failed" "$work/knock.log" ||
  fail "knock: the refusals were not logged:\n$(cat "$work/knock.log")"
grep -qF "step 300/300" "$work/knock.log" || fail "knock: the run did not reach step 300:\n$(cat "$work/knock.log")"
expect_checkpoint "$work/knock-1" "$work/knock-2" "knocked run"

if [ $failures -ne 0 ]; then echo "$failures failure(s)"; exit 1; fi
echo "all mpi runtime checks passed"
