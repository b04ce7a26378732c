#!/usr/bin/env bash
# `troupe validate` says what `troupe run` will say (issue 27, section 1):
# for each spec that a run would reject, validate and run exit with the same
# status and the same message, and run rejects it before training (no step
# line). Spec warnings (a warmup longer than the run, an empty spec file)
# are printed by both.
# usage: validate_run_test.sh TROUPE_BINARY
set -uo pipefail
troupe=$(realpath "$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/../cli_test_lib.sh"  # failures, fail, expect_exit, expect_output
cd "$work" || exit 1

tiny=(--set run.mode='"pretrain"' --set data.target_pairs='""' --set model.d_model=32 --set model.n_layers=2
      --set model.n_heads=2 --set model.expert_hidden=32 --set model.seq_len=32 --set data.batch_size=4
      --set topology.devices=1 --set topology.stages=1 --set topology.schedule='"sequential"'
      --set topology.microbatches=1 --set topology.expert_shards=1 --set topology.optimizer_shards=1
      --set run.steps=3 --set run.eval_every=0 --set optim.warmup_steps=1 --set log.progress='"off"')

# agree RC MESSAGE [--set ...]: validate and run both exit RC saying MESSAGE;
# the run trained nothing.
n=0
agree() {
  local rc=$1 msg=$2; shift 2
  n=$((n + 1))
  local dir="$work/run$n"
  expect_exit "$rc" "$troupe" validate "${tiny[@]}" --set run.out_dir="\"$dir\"" "$@"
  expect_output "$msg"
  expect_exit "$rc" "$troupe" run "${tiny[@]}" --set run.out_dir="\"$dir\"" "$@"
  expect_output "$msg"
  if grep -qs '"type":"step"' "$dir/metrics.jsonl"; then fail "case $n ($*): run trained before refusing"; fi
}

# A checkpoint directory that cannot be created: found before training, not at the first save.
touch "$work/A_FILE"
agree 3 "checkpoint directory /proc/ck cannot be created" --set checkpoint.dir='"/proc/ck"'
agree 3 "cannot be created: $work/A_FILE is not a directory" --set checkpoint.dir="\"$work/A_FILE/ck\""

# Resuming a checkpoint of another model: a spec error from both, naming the difference.
expect_exit 0 "$troupe" run "${tiny[@]}" --set run.out_dir="\"$work/small\""
agree 3 "the checkpoint's model differs from [model] (d_model: 64 vs 32" --set model.d_model=64 \
  --set checkpoint.resume="\"$work/small/checkpoint\""

# An interface this host does not have, or an empty one (which would bind every interface).
agree 3 "'no-such-interface' is neither an address nor a name this host resolves" \
  --set topology.interface='"no-such-interface"'
agree 3 "'8.8.8.8' is not an address of this host" --set topology.interface='"8.8.8.8"'
agree 3 "an empty interface would bind every interface" --set topology.interface='""'
expect_exit 0 "$troupe" validate "${tiny[@]}" --set topology.interface='"localhost"'

# More memory than the machine (or run.memory_limit) has: refused with the
# estimate, by both; validate prints the estimate of a spec that fits.
agree 3 "the run needs about" --set run.memory_limit=0.001
agree 3 "RL rollouts, KV cache and policy update" --set run.mode='"rl"' --set rl.group_size=1000000 --set rl.sft_fraction=0
# The message names the key whose term dominates, at that key, with its size,
# and the settings that alone would bring the estimate under the limit.
agree 3 "--set rl.slots=1000000: error: the run needs about" --set run.mode='"rl"' --set rl.slots=1000000 \
  --set rl.group_size=4 --set rl.sft_fraction=0
expect_output "the largest part is the generation KV cache (rl.slots = 1000000)"
expect_output "Any one of these would fit: rl.slots <= "
grep -q -- "--set rl.group_size=4: error" <<<"$out" && fail "the memory error blamed rl.group_size for rl.slots"
agree 3 "the largest part is the policy update's activations and logits (rl.prompts_per_step x rl.group_size = " \
  --set run.mode='"rl"' --set rl.group_size=1000000 --set rl.slots=4 --set rl.sft_fraction=0
expect_output "rl.prompts_per_step x rl.group_size <= "
agree 3 "the largest part is a training step's activations (data.batch_size = 4)" --set run.memory_limit=0.01 \
  --set model.seq_len=512
expect_output "data.batch_size <= "
expect_output "or run.memory_limit >= "
expect_exit 0 "$troupe" validate "${tiny[@]}"
expect_output "memory: about "

# Warnings: both commands print them, and the spec still runs.
expect_exit 0 "$troupe" validate "${tiny[@]}" --set optim.warmup_steps=500
expect_output "warning: optim.warmup_steps = 500 is longer than the run (run.steps = 3)"
expect_exit 0 "$troupe" run "${tiny[@]}" --set optim.warmup_steps=500 --set run.out_dir="\"$work/warm\""
expect_output "warning: optim.warmup_steps = 500 is longer than the run (run.steps = 3)"
: > "$work/empty.toml"
expect_exit 0 "$troupe" validate "$work/empty.toml"
expect_output "empty.toml: warning: the spec file sets no key: every value is its default"
expect_exit 0 "$troupe" validate "${tiny[@]}"
grep -q "warning" <<<"$out" && fail "a spec with nothing to warn about printed a warning:\n$out"

finish validate_run_test
