#!/usr/bin/env bash
# End-to-end tests of the `troupe` executable: help, exit codes, spec errors,
# validate's topology listing, and a short real training run with its outputs.
# usage: cli_test.sh TROUPE_BINARY SOURCE_DIR
set -uo pipefail
troupe=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/../cli_test_lib.sh"  # failures, fail, expect_exit, expect_output
unset OPENBLAS_THREAD_TIMEOUT  # the check of troupe's own setting below wants it unset

expect_exit 0 "$troupe" --help
expect_output "exit codes:"
expect_exit 0 "$troupe" --version
expect_output "troupe "
expect_exit 2 "$troupe"
expect_exit 2 "$troupe" frobnicate
expect_output "unknown command 'frobnicate'"
expect_exit 2 "$troupe" run --bogus
expect_output "unknown option --bogus"
expect_exit 2 "$troupe" validate

# A bad spec: exit 3, every problem with file:line:col.
printf '[model]\nd_model = 12\nn_heads = 4\n[optim]\nlerning_rate = 1\n' > "$work/bad.toml"
expect_exit 3 "$troupe" validate "$work/bad.toml"
expect_output "$work/bad.toml:3:1: error: [model] head size d_model/n_heads"
expect_output "$work/bad.toml:5:1: error: unknown key 'lerning_rate' in [optim]; did you mean 'lr'?"
expect_exit 3 "$troupe" validate "$work/missing.toml"
expect_output "cannot open spec file"
# A spec path that is a directory, a FIFO or a huge file: a clear error, no hang, no run on defaults.
mkdir "$work/specdir"
expect_exit 3 "$troupe" run "$work/specdir"
expect_output "$work/specdir: error: is a directory, not a spec file"
mkfifo "$work/fifo.toml"
expect_exit 3 timeout 20 "$troupe" validate "$work/fifo.toml"
expect_output "is not a regular file (a FIFO, device or socket)"
head -c 1100000 /dev/zero | tr '\0' '#' > "$work/huge.toml"
expect_exit 3 "$troupe" validate "$work/huge.toml"
expect_output "is 1100000 bytes; a spec file is at most 1048576 bytes"
# The same for a text data file: a FIFO is refused (no hang), a 30 GiB sparse
# file by its size (not read into memory).
expect_exit 3 timeout 20 "$troupe" validate --set run.mode='"pretrain"' --set data.target_pairs='""' --set data.source='"text"' --set data.path="\"$work/fifo.toml\"" --set model.vocab_size=256
expect_output "is not a regular file (a FIFO, device or socket)"
truncate -s 30G "$work/huge.txt"
expect_exit 3 timeout 20 "$troupe" validate --set run.mode='"pretrain"' --set data.target_pairs='""' --set data.source='"text"' --set data.path="\"$work/huge.txt\"" --set model.vocab_size=256
expect_output "has 32212254720 bytes, more than the 4294967296 a text source reads into memory"
rm -f "$work/huge.txt"
# Import and eval inputs: a FIFO is refused without blocking, a huge file by its size.
expect_exit 4 timeout 20 "$troupe" import --checkpoint "$work/imp" --input "$work/fifo.toml"
expect_output "not a regular file (a directory, FIFO, device or socket)"
truncate -s 30G "$work/huge.safetensors"
expect_exit 4 timeout 20 "$troupe" import --checkpoint "$work/imp" --input "$work/huge.safetensors"
expect_output "32212254720 bytes, more than a file of this model's"
rm -f "$work/huge.safetensors"
mkdir -p "$work/fifock" && mkfifo "$work/fifock/manifest.bin"
expect_exit 4 timeout 20 "$troupe" eval --checkpoint "$work/fifock"
expect_output "manifest.bin: not a regular file"
# A checkpoint directory that cannot take the final save is an error before the run.
printf 'x' > "$work/ckfile"
expect_exit 3 "$troupe" validate --set checkpoint.dir="\"$work/ckfile\""
expect_output "checkpoint directory $work/ckfile exists and is not a directory"
mkdir -p "$work/notack" && printf 'keep me' > "$work/notack/notes.txt"
expect_exit 3 "$troupe" run --set checkpoint.dir="\"$work/notack\""
expect_output "is a non-empty directory that holds no checkpoint"
[ "$(cat "$work/notack/notes.txt")" = "keep me" ] || fail "a non-checkpoint directory was touched"
# Sampling settings must be finite numbers in range (stod reads nan and inf).
expect_exit 2 "$troupe" sample --checkpoint "$work/none" --prompt 1 --temperature nan
expect_output "--temperature nan: must be a finite number >= 0"
expect_exit 2 "$troupe" sample --checkpoint "$work/none" --prompt 1 --temperature inf
expect_exit 2 "$troupe" sample --checkpoint "$work/none" --prompt 1 --top-p 0
expect_output "--top-p 0: must be in (0, 1]"
# Expert shards as actors: validate lists them and says who computes the experts.
expect_exit 0 "$troupe" validate --set topology.expert_shards=4
expect_output "expert:3/3 "  # one naming scheme: validate lists the runtime's names (was experts:L3:S3)
expect_output "the experts run in the expert-shard actors"
# Multi-device topologies: the runtime's rules, checked at validation on the right key.
expect_exit 3 "$troupe" validate --set topology.devices=2 --set topology.stages=2 --set topology.schedule='"dualpipe"' \
  --set topology.microbatches=2
expect_output "error: [topology] microbatches = 2 does not fit schedule = \"dualpipe\" with stages = 2"
expect_exit 3 "$troupe" validate --set topology.devices=4 --set topology.stages=4 --set topology.schedule='"dualpipev"' \
  --set topology.microbatches=8
expect_output "cuts the model into 8 stages, more than [model] n_layers = 4"
expect_exit 0 "$troupe" validate --set topology.devices=2 --set model.balance='"bias"'
expect_exit 0 "$troupe" validate --set topology.devices=2 --set topology.stages=2 --set topology.schedule='"1f1b"'
# log.trace needs the runtime: a single-device sequential spec says so on the key.
expect_exit 3 "$troupe" validate --set topology.devices=1 --set topology.stages=1 --set 'topology.schedule="sequential"' --set topology.microbatches=1 --set topology.expert_shards=1 --set topology.optimizer_shards=1 --set log.trace="$work/t.json"
expect_output "[log] trace = \"$work/t.json\": needs the actor runtime"

# validate prints the resolved topology.
expect_exit 0 "$troupe" validate "$src/launch/specs/default.toml"
expect_output "stage:0"
expect_output "optimizer:0"
expect_output "device 0 (host)"

# keys prints the table docs/spec.md carries.
expect_exit 0 "$troupe" keys
expect_output '| `model.d_model` | integer | `128` |'

# A real (tiny) training run through the CLI, then eval, sample, export, import.
tiny=(--set model.d_model=32 --set model.n_layers=2 --set model.n_heads=2 --set model.expert_hidden=32
      --set model.seq_len=32 --set data.batch_size=4 --set data.eval_problems=20 --set run.eval_batches=1
      --set log.progress=plain
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
expect_exit 0 "$troupe" run "${tiny[@]}" --set run.steps=6 --set run.out_dir="$work/a"
expect_output "step 6/6"
expect_output "exact-match"
[ "$(grep -c '"type":"step"' "$work/a/metrics.jsonl")" -eq 6 ] || fail "metrics.jsonl should hold 6 step lines"
grep -q '"type":"end"' "$work/a/metrics.jsonl" || fail "metrics.jsonl has no end line"
# troupe sets OPENBLAS_THREAD_TIMEOUT for itself (its idle BLAS threads would
# spin on the cores its own threads use), and leaves a user's value alone.
grep -q '"openblas_thread_timeout":"4"' "$work/a/metrics.jsonl" || fail "start line: OPENBLAS_THREAD_TIMEOUT is not 4"
expect_exit 0 env OPENBLAS_THREAD_TIMEOUT=9 "$troupe" run "${tiny[@]}" --set run.steps=1 --set run.out_dir="$work/timeout9"
grep -q '"openblas_thread_timeout":"9"' "$work/timeout9/metrics.jsonl" || fail "a user's OPENBLAS_THREAD_TIMEOUT was not kept"
[ -f "$work/a/troupe.log" ] || fail "no troupe.log"
expect_exit 0 "$troupe" eval "${tiny[@]}" --set run.out_dir="$work/a"
expect_output "(step 6)"
expect_output "val_loss"
expect_exit 0 "$troupe" sample "${tiny[@]}" --set run.out_dir="$work/a" --prompt "12+34=" --max-new-tokens 4
expect_output "12+34="
expect_exit 0 "$troupe" export "${tiny[@]}" --set run.out_dir="$work/a" --format safetensors --output "$work/a.safetensors"
expect_exit 0 "$troupe" import "${tiny[@]}" --set run.out_dir="$work/imp" --input "$work/a.safetensors"
expect_exit 0 "$troupe" export "${tiny[@]}" --set run.out_dir="$work/imp" --format safetensors --output "$work/imp.safetensors"
# Same parameters after the round trip (metadata differs only in troupe_step).
expect_exit 0 "$troupe" eval "${tiny[@]}" --set run.out_dir="$work/imp"
expect_output "(step 0)"

# eval and sample use the checkpoint's model: a --set model.* that disagrees
# with it is an error naming both values (one that agrees is fine).
expect_exit 3 "$troupe" sample "${tiny[@]}" --set run.out_dir="$work/a" --set model.n_layers=3 --prompt "1+2="
expect_output "--set model.n_layers=3 disagrees"
expect_exit 0 "$troupe" eval "${tiny[@]}" --set run.out_dir="$work/a" --set model.n_experts=8
expect_exit 3 "$troupe" eval "${tiny[@]}" --set run.out_dir="$work/a" --set model.d_model=64
expect_output "--set model.d_model=64 disagrees with the checkpoint"
expect_output "(model.d_model = 32)"
# tiny sets model.d_model=32 and the line above sets it again: the key takes
# its last value, and only a final value that differs is reported (not the
# earlier 32, which is the checkpoint's).
grep -q "model.d_model=32 disagrees" <<<"$out" && fail "eval reported the overridden --set model.d_model=32 as disagreeing"
expect_exit 0 "$troupe" eval "${tiny[@]}" --set run.out_dir="$work/a" --set model.d_model=64 --set model.d_model=+32
# A safetensors file holding NaN is refused by import, naming the tensor (exit 4).
cp "$work/a.safetensors" "$work/nan.safetensors"
hdr=$(od -An -t u8 -N8 "$work/nan.safetensors" | tr -d ' ')  # header length; the data area follows it
printf '\x00\x00\xc0\x7f' | dd of="$work/nan.safetensors" bs=1 seek=$((8 + hdr)) conv=notrunc 2>/dev/null
expect_exit 4 "$troupe" import "${tiny[@]}" --set run.out_dir="$work/impnan" --input "$work/nan.safetensors"
expect_output "holds a non-finite value (nan) at element 0"
[ ! -e "$work/impnan/checkpoint" ] || fail "a refused import left a checkpoint"

# Resume is bitwise: 3 steps, then resume to 6, equals 6 straight.
expect_exit 0 "$troupe" run "${tiny[@]}" --set run.steps=6 --set run.out_dir="$work/b" --set checkpoint.every=3 \
  --set checkpoint.dir="$work/b/ck3"
expect_exit 0 "$troupe" run "${tiny[@]}" --set run.steps=3 --set run.out_dir="$work/c"
expect_exit 0 "$troupe" run "${tiny[@]}" --set run.steps=6 --set run.out_dir="$work/d" --set checkpoint.resume="$work/c/checkpoint"
expect_exit 0 "$troupe" export "${tiny[@]}" --set run.out_dir="$work/d" --format safetensors --output "$work/d.safetensors"
cmp -s "$work/a.safetensors" "$work/d.safetensors" || fail "6 steps straight differs from 3 + resume 3"
last_a=$(grep '"type":"step","step":6,' "$work/a/metrics.jsonl" | sed 's/"step_seconds".*//')
last_d=$(grep '"type":"step","step":6,' "$work/d/metrics.jsonl" | sed 's/"step_seconds".*//')
[ -n "$last_a" ] && [ "$last_a" = "$last_d" ] || fail "step 6 metrics differ after resume:\n$last_a\n$last_d"
# Resume runs on the runtime too. validate reads the checkpoint as run does
# (validate says what run would say): a missing one exits 4 naming it, one
# already at or past run.steps exits 3 (nothing left to train) from both.
expect_exit 0 "$troupe" validate "${tiny[@]}" --set run.steps=6 --set topology.optimizer_shards=2 \
  --set checkpoint.resume="$work/c/checkpoint"
expect_exit 4 "$troupe" validate --set topology.optimizer_shards=2 --set checkpoint.resume='"x"'
expect_output "x: checkpoint directory does not exist"
expect_exit 3 "$troupe" validate "${tiny[@]}" --set run.steps=3 --set checkpoint.resume="$work/c/checkpoint"
expect_output "is at step 3, but [run] steps = 3: nothing is left to train"
expect_exit 3 "$troupe" run "${tiny[@]}" --set run.steps=2 --set run.out_dir="$work/past" \
  --set checkpoint.resume="$work/c/checkpoint"
expect_output "nothing is left to train"
[ ! -e "$work/past/metrics.jsonl" ] || fail "a run with nothing to train wrote metrics"

# SIGINT / SIGTERM: the run stops after the running step, saves a checkpoint
# there, writes the end line and exits 130; resuming it ends bitwise equal to
# the straight run. $1: signal, $2: extra options (a topology).
signal_run() {
  local sig=$1; shift
  local dir="$work/sig_$sig"
  "$troupe" run "${tiny[@]}" "$@" --set run.steps=400 --set run.eval_every=0 --set run.out_dir="$dir" \
    > "$dir.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 600); do  # wait for the second step line (up to 60 s)
    grep -q '"type":"step","step":2,' "$dir/metrics.jsonl" 2>/dev/null && break
    sleep 0.1
  done
  kill -"$sig" "$pid"
  wait "$pid"; local rc=$?
  [ "$rc" -eq 130 ] || fail "run stopped by SIG$sig exited $rc, expected 130:\n$(tail -n 5 "$dir.log")"
  grep -q '"type":"end",.*"interrupted":true' "$dir/metrics.jsonl" || fail "SIG$sig: no interrupted end line"
  grep -q "stopped by SIG$sig" "$dir.log" || fail "SIG$sig: the log does not say so"
  local stopped
  stopped=$(grep -o '"type":"end","steps":[0-9]*' "$dir/metrics.jsonl" | grep -o '[0-9]*$')
  [ -n "$stopped" ] && [ "$stopped" -lt 400 ] || fail "SIG$sig: the run did not stop early (steps: $stopped)"
  ls "$dir"/checkpoint.tmp* >/dev/null 2>&1 && fail "SIG$sig: a temporary checkpoint directory was left behind"
  expect_exit 0 "$troupe" run "${tiny[@]}" "$@" --set run.steps=400 --set run.eval_every=0 --set run.out_dir="$dir" \
    --set checkpoint.resume="$dir/checkpoint" --set checkpoint.dir="$dir/resumed"
  "$troupe" run "${tiny[@]}" "$@" --set run.steps=400 --set run.eval_every=0 --set run.out_dir="$dir.straight" \
    > /dev/null 2>&1 || fail "SIG$sig: the straight run failed"
  for f in params.f32.zst adam_m.f32.zst adam_v.f32.zst; do
    cmp -s "$dir/resumed/$f" "$dir.straight/checkpoint/$f" || fail "SIG$sig: $f after stop + resume differs from the straight run"
  done
}
signal_run INT
signal_run TERM --set topology.devices=2 --set topology.stages=2 --set 'topology.schedule="1f1b"' \
  --set model.tie_embeddings=false
# A closed terminal or ssh session (SIGHUP) and SIGQUIT stop a run the same way.
signal_run HUP
signal_run QUIT

# A second SIGINT soon after the first ends the process, but never inside a
# checkpoint being written: no temporary directory is left, and what the
# checkpoint directory holds loads.
for delay in 0.005 0.01 0.02 0.03 0.05 0.08; do
  dir="$work/twice_$delay"
  "$troupe" run "${tiny[@]}" --set run.steps=400 --set run.eval_every=0 --set run.out_dir="$dir" > "$dir.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do grep -q '"type":"step","step":2,' "$dir/metrics.jsonl" 2>/dev/null && break; sleep 0.1; done
  kill -INT "$pid"; sleep "$delay"; kill -INT "$pid" 2>/dev/null
  wait "$pid"
  ls -d "$dir"/checkpoint.tmp* "$dir"/checkpoint.old* >/dev/null 2>&1 && fail "second SIGINT after ${delay} s: a temporary checkpoint directory was left behind"
  if [ -e "$dir/checkpoint" ]; then
    expect_exit 0 "$troupe" eval "${tiny[@]}" --set run.out_dir="$dir"
  fi
done

# A corrupt checkpoint is rejected with exit 4, naming the file.
printf 'xx' | dd of="$work/a/checkpoint/params.f32.zst" bs=1 seek=40 conv=notrunc 2>/dev/null
expect_exit 4 "$troupe" eval "${tiny[@]}" --set run.out_dir="$work/a"
expect_output "params.f32.zst"
expect_exit 4 "$troupe" run "${tiny[@]}" --set run.steps=8 --set run.out_dir="$work/e" --set checkpoint.resume="$work/nowhere"

# A 2-stage 1F1B run on the actor runtime (2 devices, one optimizer shard,
# untied embeddings: the runtime's bitwise case) saves the same checkpoint as
# the single-device run with the same microbatches: parameters (through
# export) and AdamW moments bit for bit, and the same validation loss.
untied=("${tiny[@]}" --set model.tie_embeddings=false --set topology.microbatches=2 --set run.steps=4)
expect_exit 0 "$troupe" run "${untied[@]}" --set run.out_dir="$work/single"
expect_exit 0 "$troupe" run "${untied[@]}" --set run.out_dir="$work/pipe" --set topology.devices=2 \
  --set topology.stages=2 --set topology.schedule='"1f1b"'
expect_output "actor runtime: schedule 1f1b"
expect_output "step 4/4"
expect_output "exact-match"
for run in single pipe; do
  expect_exit 0 "$troupe" export "${untied[@]}" --set run.out_dir="$work/$run" --format safetensors \
    --output "$work/$run.safetensors"
done
cmp -s "$work/single.safetensors" "$work/pipe.safetensors" || fail "2-stage 1f1b parameters differ from the single-device run"
for f in adam_m.f32.zst adam_v.f32.zst; do
  cmp -s "$work/single/checkpoint/$f" "$work/pipe/checkpoint/$f" || fail "2-stage 1f1b $f differs from the single-device run"
done
val_of() { grep '"type":"end"' "$1/metrics.jsonl" | grep -o '"final_val_loss":[^,}]*'; }
[ -n "$(val_of "$work/pipe")" ] && [ "$(val_of "$work/single")" = "$(val_of "$work/pipe")" ] ||
  fail "validation loss differs: $(val_of "$work/single") vs $(val_of "$work/pipe")"
expect_exit 0 "$troupe" eval "${untied[@]}" --set run.out_dir="$work/pipe"
expect_output "(step 4)"
expect_exit 0 "$troupe" sample "${untied[@]}" --set run.out_dir="$work/pipe" --prompt "12+34=" --max-new-tokens 4
expect_output "12+34="
# [log] trace on a pipeline run writes a Chrome trace with device tracks.
expect_exit 0 "$troupe" run "${untied[@]}" --set run.steps=1 --set run.out_dir="$work/tr" --set topology.devices=2 \
  --set topology.stages=2 --set topology.schedule='"1f1b"' --set log.trace="$work/tr/trace.json"
[ -s "$work/tr/trace.json" ] && grep -q '"traceEvents"' "$work/tr/trace.json" || fail "no trace written by log.trace"
grep -q '"name":"F mb1 s1"' "$work/tr/trace.json" || fail "trace lacks the forward of microbatch 1 on stage 1"
grep -q '"name":"device 1"' "$work/tr/trace.json" || fail "trace lacks the track of device 1"
# checkpoint.every is honoured on the runtime too, and DualPipe with 2 shards and
# 2 replicas (data_parallel) trains through the CLI.
expect_exit 0 "$troupe" run "${tiny[@]}" --set run.steps=4 --set run.out_dir="$work/dp" --set topology.devices=4 \
  --set topology.stages=2 --set topology.schedule='"dualpipe"' --set topology.microbatches=4 \
  --set topology.data_parallel=2 --set data.batch_size=8 --set topology.optimizer_shards=2 \
  --set checkpoint.every=2 --set checkpoint.dir="$work/dp/ck"
expect_output "step 4/4"
[ "$(grep -c '"type":"checkpoint"' "$work/dp/metrics.jsonl")" -eq 2 ] || fail "dualpipe run should log 2 checkpoints"
expect_exit 0 "$troupe" eval "${tiny[@]}" --set run.out_dir="$work/dp" --set data.batch_size=8 --checkpoint "$work/dp/ck"
expect_output "(step 4)"

# Sim devices: no math, timings on a virtual clock. validate lists the
# simulated devices; run prints the summary, writes metrics.jsonl and a trace
# that parses as JSON with one track per device (8 = 4 ranks x 2 replicas).
sim_small="$src/launch/specs/sim_small.toml"
expect_exit 0 "$troupe" validate "$sim_small"
expect_output "sim devices: 8 (2 replica(s) x 4 pipeline rank(s))"
expect_output "rank 3: s3"
expect_exit 0 "$troupe" run "$sim_small" --set run.out_dir="$work/sim" --set log.trace="\"$work/sim/trace.json\""
expect_output "No math runs: timings only"
expect_output "sim step 5/5"
expect_output "sim summary (virtual time; no math ran): 8 device(s)"
expect_output "step time 33.9249 ms = pipeline 33.4249 ms + optimizer 0.5000 ms"
[ "$(grep -c '"type":"sim_step"' "$work/sim/metrics.jsonl")" -eq 5 ] || fail "sim run should log 5 sim_step lines"
grep -q '"type":"end".*"sim":"timings only"' "$work/sim/metrics.jsonl" || fail "sim run lacks its end line"
[ -s "$work/sim/trace.json" ] || fail "sim run wrote no trace"
# Its tracks name the pipeline ranks the plan places on each device (as validate lists them).
grep -qF '"name":"device 7 (replica 1, rank 3)","actors":"stage:3/replica:1"' "$work/sim/trace.json" \
  || fail "sim trace: device 7's track does not name stage:3/replica:1"
if command -v python3 >/dev/null; then
  python3 - "$work/sim/trace.json" <<'PY' || fail "sim trace is not valid JSON with one track per device"
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
names = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
assert sorted(names) == list(range(8)), names
assert names[5] == "device 5 (replica 1, rank 1)", names[5]
spans = [e for e in events if e.get("ph") == "X"]
assert {e["tid"] for e in spans} == set(range(8))
for tid in range(8):
    mine = sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in spans if e["tid"] == tid)
    assert sum(n.startswith("F mb") for _, _, n in mine) == 8 * 5, tid  # 8 micro-batches x 5 steps
    assert sum(n.startswith("BW mb") for _, _, n in mine) == 8 * 5, tid
    assert sum(n == "optimizer" for _, _, n in mine) == 5, tid
    for (a0, a1, _), (b0, b1, _) in zip(mine, mine[1:]):
        assert a1 <= b0 + 1e-6, (tid, a1, b0)  # one span at a time on a device
PY
else
  grep -q '"name":"device 7 (replica 1, rank 3)"' "$work/sim/trace.json" || fail "sim trace lacks device 7's track"
fi
expect_exit 3 "$troupe" run "$sim_small" --set sim.weight_ms=5
expect_output "[sim] weight_ms = 5 must be <= backward_ms = 2"
expect_exit 3 "$troupe" validate --set sim.forward_ms=2
expect_output "[sim] keys apply only to [topology] device_kind = \"sim\""
# Sim device failures: validate names the model, run prints the goodput
# study and writes a sim_faults line per policy; only on the pipeline sim.
expect_exit 0 "$troupe" validate "$sim_small" --set sim.mtbf_hours=100
expect_output "device failures: MTBF 100 h per device, so one every 12.5 h for the job"
expect_exit 0 "$troupe" run "$sim_small" --set sim.mtbf_hours=100 --set sim.fault_horizon_hours=1000 \
  --set run.out_dir="$work/simfaults"
expect_output "sim faults: "
expect_output "troupe replay"
expect_output "checkpoint-restart, Young/Daly"
[ "$(grep -c '"type":"sim_faults"' "$work/simfaults/metrics.jsonl")" -eq 3 ] || fail "sim faults: expected 3 sim_faults lines"
expect_exit 3 "$troupe" validate --set sim.mtbf_hours=100
expect_output "[sim] keys apply only to [topology] device_kind = \"sim\""
# The 1,024-device DualPipe spec: one simulated step.
expect_exit 0 "$troupe" run "$src/launch/specs/sim_dualpipe_1024.toml" --set run.out_dir="$work/sim1024" --set run.steps=1
expect_output "sim summary (virtual time; no math ran): 1024 device(s), schedule dualpipe"
# [[faults]]: the 2-stage 1F1B run above, with stage 1 killed inside step 2 and
# the optimizer shard inside step 3, restarts both, replays those steps and
# saves the same checkpoint bit for bit; the log names the restarts. With
# max_restarts = 0 the first kill fails the run, naming the actor.
cp "$src/launch/specs/default.toml" "$work/faults.toml"
printf '\n[[faults]]\nat_step = 2\ntarget = "stage:1"\nkind = "kill"\n\n[[faults]]\nat_step = 3\ntarget = "optimizer:0"\n' >> "$work/faults.toml"
expect_exit 0 "$troupe" run "$work/faults.toml" "${untied[@]}" --set run.out_dir="$work/faults" --set topology.devices=2 \
  --set topology.stages=2 --set topology.schedule='"1f1b"'
expect_output "restarted stage:1 (killed"
expect_output "in step 2, attempt 2: step replayed"
expect_output "restarted optimizer:0 (killed"
expect_output "step 4/4"
grep -q "restarted stage:1 (killed" "$work/faults/troupe.log" || fail "troupe.log does not name the restart"
[ "$(grep -c '"type":"restart"' "$work/faults/metrics.jsonl")" -eq 2 ] || fail "metrics.jsonl should hold 2 restart lines"
expect_exit 0 "$troupe" export "$work/faults.toml" "${untied[@]}" --set run.out_dir="$work/faults" --set topology.devices=2 \
  --set topology.stages=2 --set topology.schedule='"1f1b"' --format safetensors --output "$work/faults.safetensors"
cmp -s "$work/pipe.safetensors" "$work/faults.safetensors" || fail "parameters after kill-and-replay differ from the run without faults"
for f in adam_m.f32.zst adam_v.f32.zst; do
  cmp -s "$work/pipe/checkpoint/$f" "$work/faults/checkpoint/$f" || fail "$f after kill-and-replay differs from the run without faults"
done
expect_exit 1 "$troupe" run "$work/faults.toml" "${untied[@]}" --set run.out_dir="$work/faults0" --set topology.devices=2 \
  --set topology.stages=2 --set topology.schedule='"1f1b"' --set run.max_restarts=0
expect_output "stage:1 went down (killed) in step 2"
expect_output "more than max_restarts = 0"
# [chaos]: validate lists the seeded schedule (the same for the same seed,
# another for another seed); a run with it (kinds that need no deadline here)
# prints the fault summary, writes it to metrics.jsonl and saves the same
# parameters as the run without faults.
chaos_=(--set topology.devices=2 --set topology.stages=2 --set topology.schedule='"1f1b"' --set run.max_restarts=20
        --set chaos.mean_steps_between_faults=0.7 --set chaos.kinds='"kill,duplicate,delay,pause,slow"')
expect_exit 0 "$troupe" validate "${untied[@]}" "${chaos_[@]}" --set chaos.seed=5
expect_output "from [chaos] (seed 5"
chaos_list=$(grep -F "[chaos]" <<<"$out" | grep "^  step")
[ -n "$chaos_list" ] || fail "validate lists no [chaos] faults:\n$out"
expect_exit 0 "$troupe" validate "${untied[@]}" "${chaos_[@]}" --set chaos.seed=5
[ "$(grep -F "[chaos]" <<<"$out" | grep "^  step")" == "$chaos_list" ] || fail "the same seed gave another schedule"
expect_exit 0 "$troupe" validate "${untied[@]}" "${chaos_[@]}" --set chaos.seed=6
[ "$(grep -F "[chaos]" <<<"$out" | grep "^  step")" != "$chaos_list" ] || fail "another seed gave the same schedule"
expect_exit 3 "$troupe" validate "${untied[@]}" "${chaos_[@]}" --set chaos.kinds='"kill,explode"'
expect_output "[chaos] kinds: \"explode\" is not a fault kind"
expect_exit 0 "$troupe" run "${untied[@]}" "${chaos_[@]}" --set chaos.seed=5 --set run.out_dir="$work/chaos"
expect_output "faults: $(grep -c . <<<"$chaos_list") injected"
expect_output "goodput"
expect_output "MTTR:"
grep -q '"type":"faults"' "$work/chaos/metrics.jsonl" || fail "metrics.jsonl has no faults line"
expect_exit 0 "$troupe" export "${untied[@]}" "${chaos_[@]}" --set chaos.seed=5 --set run.out_dir="$work/chaos" \
  --format safetensors --output "$work/chaos.safetensors"
cmp -s "$work/pipe.safetensors" "$work/chaos.safetensors" || fail "parameters after the [chaos] run differ from the run without faults"
# The same with 2 expert shards per MoE layer (expert-shard actors): expert
# shard 1 of layer 1 killed inside step 2 is restarted on its device, the step
# replayed, and the checkpoint equals the fault-free expert-parallel run's.
xargs_=(--set topology.devices=2 --set topology.stages=2 --set topology.schedule='"1f1b"' --set topology.expert_shards=2)
expect_exit 0 "$troupe" run "${untied[@]}" "${xargs_[@]}" --set run.out_dir="$work/xpipe"
cp "$src/launch/specs/default.toml" "$work/xfaults.toml"
printf '\n[[faults]]\nat_step = 2\ntarget = "expert:1/1"\n' >> "$work/xfaults.toml"
expect_exit 0 "$troupe" run "$work/xfaults.toml" "${untied[@]}" "${xargs_[@]}" --set run.out_dir="$work/xfaults"
expect_output "restarted expert:1/1 (killed"
expect_output "step 4/4"
for f in params.f32.zst adam_m.f32.zst adam_v.f32.zst; do
  [ -s "$work/xpipe/checkpoint/$f" ] || fail "no $f in the expert-parallel run's checkpoint"
  cmp -s "$work/xpipe/checkpoint/$f" "$work/xfaults/checkpoint/$f" || fail "$f after an expert-shard kill differs from the run without faults"
done
# Faults on messages in flight, from the spec: messages to expert:1/1 dropped
# in step 2 (a 1 s step deadline replays it), to stage:1 duplicated in step 3
# and to optimizer:0 paused in step 3: the checkpoint equals the fault-free run's.
cp "$src/launch/specs/default.toml" "$work/mfaults.toml"
printf '\n[[faults]]\nat_step = 2\ntarget = "expert:1/1"\nkind = "drop"\ncount = 2\n' >> "$work/mfaults.toml"
printf '\n[[faults]]\nat_step = 3\ntarget = "stage:1"\nkind = "duplicate"\ncount = 3\n' >> "$work/mfaults.toml"
printf '\n[[faults]]\nat_step = 3\ntarget = "optimizer:0"\nkind = "pause"\nduration_ms = 200\n' >> "$work/mfaults.toml"
expect_exit 0 "$troupe" run "$work/mfaults.toml" "${untied[@]}" "${xargs_[@]}" --set run.out_dir="$work/mfaults" \
  --set run.step_deadline=1.0
expect_output "step 2 missed its deadline (no progress within 1 s; waiting for"
expect_output "step 4/4"
for f in params.f32.zst adam_m.f32.zst adam_v.f32.zst; do
  cmp -s "$work/xpipe/checkpoint/$f" "$work/mfaults/checkpoint/$f" || fail "$f after message faults differs from the run without faults"
done
# The same at the default, adaptive deadlines (docs/faults.md "Adaptive
# deadlines"): the drop is found by a sequence gap or by the run falling
# silent, never by waiting out a step deadline, and nothing else changes.
expect_exit 0 "$troupe" run "$work/mfaults.toml" "${untied[@]}" "${xargs_[@]}" --set run.out_dir="$work/mfaults_adaptive"
grep -qE "adaptive message deadline|sequence gap" <<<"$out" || fail "the drop was not found by the adaptive deadlines:\n$out"
grep -qF "no progress within" <<<"$out" && fail "the drop waited for a step deadline:\n$out"
expect_output "on a deadline"
for f in params.f32.zst adam_m.f32.zst adam_v.f32.zst; do
  cmp -s "$work/xpipe/checkpoint/$f" "$work/mfaults_adaptive/checkpoint/$f" || fail "$f after message faults (adaptive deadlines) differs from the run without faults"
done
printf '\n[[faults]]\nat_step = 1\ntarget = "stage:0"\nkind = "delay"\n' >> "$work/mfaults.toml"
expect_exit 3 "$troupe" validate "$work/mfaults.toml" "${untied[@]}" "${xargs_[@]}"
expect_output "[[faults]] kind = \"delay\" needs delay_ms"
# [[elastic]]: the expert-parallel run above scaled from 2 to 4 expert shards
# per MoE layer before step 2 and to 1 before step 4: two rescale lines in
# metrics.jsonl and the same checkpoint, bit for bit, as the static run.
cp "$src/launch/specs/default.toml" "$work/elastic.toml"
printf '\n[[elastic]]\nat_step = 2\nexpert_shards = 4\n\n[[elastic]]\nat_step = 4\nexpert_shards = 1\n' >> "$work/elastic.toml"
expect_exit 0 "$troupe" validate "$work/elastic.toml" "${untied[@]}" "${xargs_[@]}"
expect_output "[[elastic]] at step 2: expert shards 2 -> 4 per MoE layer"
expect_exit 0 "$troupe" run "$work/elastic.toml" "${untied[@]}" "${xargs_[@]}" --set run.out_dir="$work/elastic"
expect_output "rescale: step 2: expert shards 2 -> 4"
expect_output "step 4/4"
[ "$(grep -c '"type":"rescale"' "$work/elastic/metrics.jsonl")" -eq 2 ] || fail "metrics.jsonl should hold 2 rescale lines"
grep -q '"type":"rescale","step":4,"old_shards":4,"new_shards":1' "$work/elastic/metrics.jsonl" || fail "no rescale line for step 4"
for f in params.f32.zst adam_m.f32.zst adam_v.f32.zst; do
  cmp -s "$work/xpipe/checkpoint/$f" "$work/elastic/checkpoint/$f" || fail "$f after scale events differs from the static placement"
done
# [experts] redundant_experts: eplb every step with up to 2 copies per layer on
# skewed loads: each rebalance line reports the holders of every expert
# ("replicas", one list per MoE layer) and the max/mean shard loads.
expect_exit 0 "$troupe" run "${untied[@]}" "${xargs_[@]}" --set run.out_dir="$work/replicas" \
  --set 'experts.policy="eplb"' --set experts.rebalance_every=1 --set experts.migration_cost_scale=0 \
  --set experts.redundant_experts=2 --set 'model.balance="none"'
expect_output "step 4/4"
grep -q '"type":"rebalance".*"max_mean_load_after":\[[0-9.]*,[0-9.]*\].*"replicas":\[\[[12,]*\],\[[12,]*\]\]' \
  "$work/replicas/metrics.jsonl" || fail "no rebalance line with replicas per expert in metrics.jsonl"
# [experts] on_failure = "shrink": expert:1/1 killed in steps 2 and 3 with a
# budget of one expert restart: the second kill removes its slot (2 -> 1
# shards per layer) and replays step 3; a restart line with "shrink":1, and
# the same checkpoint, bit for bit, as the static run.
cp "$src/launch/specs/default.toml" "$work/shrink.toml"
printf '
[experts]
on_failure = "shrink"
' >> "$work/shrink.toml"
printf '
[[faults]]
at_step = 2
target = "expert:1/1"
kind = "kill"

[[faults]]
at_step = 3
target = "expert:1/1"
kind = "kill"
' >> "$work/shrink.toml"
expect_exit 0 "$troupe" run "$work/shrink.toml" "${untied[@]}" "${xargs_[@]}" --set run.out_dir="$work/shrink" \
  --set run.max_restarts_expert=1
expect_output "removed expert:1/1 (killed) in step 3: over its restart budget, expert shards per layer 2 -> 1"
grep -q '"type":"restart","step":3,.*"shrink":1,"shards_before":2,"shards_after":1' "$work/shrink/metrics.jsonl" ||
  fail "no shrink restart line for step 3"
for f in params.f32.zst adam_m.f32.zst adam_v.f32.zst; do
  cmp -s "$work/xpipe/checkpoint/$f" "$work/shrink/checkpoint/$f" || fail "$f after a shrink differs from the static placement"
done
# Resume on the runtime: the expert-parallel run above, stopped after 2 steps
# and continued to 4 by a new process from its checkpoint, saves the same
# parameters (exported safetensors) and AdamW moments bit for bit, and logs
# the same step-4 metrics. A missing checkpoint is exit 4, naming it.
expect_exit 0 "$troupe" run "${untied[@]}" "${xargs_[@]}" --set run.steps=2 --set run.out_dir="$work/xhalf"
expect_exit 0 "$troupe" run "${untied[@]}" "${xargs_[@]}" --set run.out_dir="$work/xrest" \
  --set checkpoint.resume="$work/xhalf/checkpoint"
expect_output "step 4/4"
for run in xpipe xrest; do
  expect_exit 0 "$troupe" export "${untied[@]}" "${xargs_[@]}" --set run.out_dir="$work/$run" --format safetensors \
    --output "$work/$run.safetensors"
done
cmp -s "$work/xpipe.safetensors" "$work/xrest.safetensors" || fail "runtime: 4 steps straight differ from 2 + resume 2"
for f in adam_m.f32.zst adam_v.f32.zst; do
  cmp -s "$work/xpipe/checkpoint/$f" "$work/xrest/checkpoint/$f" || fail "runtime: $f differs after resume"
done
last_x=$(grep '"type":"step","step":4,' "$work/xpipe/metrics.jsonl" | sed 's/"step_seconds".*//')
last_r=$(grep '"type":"step","step":4,' "$work/xrest/metrics.jsonl" | sed 's/"step_seconds".*//')
[ -n "$last_x" ] && [ "$last_x" = "$last_r" ] || fail "runtime: step 4 metrics differ after resume:\n$last_x\n$last_r"
expect_exit 4 "$troupe" run "${untied[@]}" "${xargs_[@]}" --set run.out_dir="$work/xnone" \
  --set checkpoint.resume="$work/nowhere"
expect_output "$work/nowhere"
printf '[[faults]]\nat_step = 1\ntarget = "stage:3"\n' > "$work/badfault.toml"
expect_exit 3 "$troupe" validate "$work/badfault.toml" --set topology.devices=2 --set topology.stages=2 --set topology.schedule='"1f1b"'
expect_output "$work/badfault.toml:3:1: error: [[faults]] target = \"stage:3\" does not exist"

if [ $failures -ne 0 ]; then echo "$failures failure(s)"; exit 1; fi
echo "all CLI checks passed"
