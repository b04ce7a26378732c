#!/usr/bin/env bash
# `troupe calibrate` end to end on a tiny model: the [sim] table it prints
# and writes is accepted by `troupe validate` in a sim spec and round-trips
# (validate reads back exactly the values calibrate wrote), a sim run uses
# it, and bad input gets a clear error. Also the measured cost model's spec
# rules. No timing is asserted: the values depend on the machine.
# usage: calibrate_test.sh TROUPE_BINARY
set -uo pipefail
troupe=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/../cli_test_lib.sh"
# value KEY FILE: the right-hand side of `KEY = ...` in FILE.
value() { sed -n "s/^$1 = //p" "$2"; }

cat > "$work/tiny.toml" <<'EOF'
[run]
name = "tiny"
mode = "pretrain"
steps = 20
[model]
vocab_size = 256
d_model = 32
n_layers = 2
n_heads = 2
seq_len = 32
ffn = "moe"
n_experts = 4
top_k = 2
expert_hidden = 32
[data]
source = "addition"
batch_size = 4
[topology]
devices = 2
device_kind = "host"
threads_per_device = 1
stages = 2
schedule = "1f1b"
microbatches = 2
optimizer_shards = 2
EOF
# sim_spec TABLE OUT: the tiny spec on sim devices with TABLE appended.
sim_spec() {
  sed -e 's/device_kind = "host"/device_kind = "sim"/' -e 's/^optimizer_shards = 2/optimizer_shards = 1/' \
    "$work/tiny.toml" > "$2"
  cat "$1" >> "$2"
}

# The default: measured per-stage times, unless the flops fit is within 5%.
expect_exit 0 "$troupe" calibrate "$work/tiny.toml" --repeat 3 --model measured --out "$work/t.toml"
expect_output "troupe calibrate: wrote $work/t.toml"
expect_output "F 2 busy"
[ -s "$work/t.toml" ] || fail "calibrate wrote no table"
ls "$work" | grep -q '\.tmp\.\|\.probe' && fail "calibrate left a temporary file: $(ls "$work")"
# What it printed is what it wrote (the table is the end of stdout).
grep -qF -- "$(cat "$work/t.toml")" <<<"$out" || fail "the printed table differs from the file"
grep -qx '\[sim\]' "$work/t.toml" || fail "no [sim] header in the table"
[ "$(value cost_model "$work/t.toml")" = '"measured"' ] || fail "cost_model is not \"measured\""
fwd=$(value stage_forward_ms "$work/t.toml")
bwd=$(value stage_backward_ms "$work/t.toml")
opt=$(value optimizer_ms "$work/t.toml")
lat=$(value link_latency_us "$work/t.toml")
python3 - "$fwd" "$bwd" "$opt" "$lat" <<'PY' || fail "table values are not two positive stage times each and non-negative scalars: $fwd $bwd $opt $lat"
import json, sys
f, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
opt, lat = float(sys.argv[3]), float(sys.argv[4])
assert len(f) == 2 and len(b) == 2 and all(x > 0 for x in f + b) and opt > 0 and lat >= 0
PY
sim_spec "$work/t.toml" "$work/sim.toml"
expect_exit 0 "$troupe" validate "$work/sim.toml"
# Round trip: validate reads back exactly the printed values.
expect_output "cost model measured: per stage F $fwd ms, B $bwd ms (full backward, W none of it)"
expect_output "link $lat us latency"
expect_output "optimizer step: $opt ms (fixed)"
expect_exit 0 "$troupe" run "$work/sim.toml" --set run.steps=1 --set run.out_dir="\"$work/simrun\"" --set 'log.progress="off"'
expect_output "sim summary (virtual time; no math ran): 2 device(s), schedule 1f1b"
# A sim spec cannot be calibrated.
expect_exit 3 "$troupe" calibrate "$work/sim.toml"
expect_output "device_kind = \"sim\": calibrate measures real devices"

# --model flops: the fitted rates, read back by validate.
expect_exit 0 "$troupe" calibrate "$work/tiny.toml" --repeat 3 --model flops --out "$work/f.toml"
[ "$(value cost_model "$work/f.toml")" = '"flops"' ] || fail "--model flops wrote no flops table"
sim_spec "$work/f.toml" "$work/simf.toml"
expect_exit 0 "$troupe" validate "$work/simf.toml"
expect_output "cost model flops: $(value gflops "$work/f.toml") GFLOP/s and $(value gbps "$work/f.toml") GB/s per device"

# Bad input: a clear error, nothing written, the old table kept.
cp "$work/t.toml" "$work/keep.toml"
expect_exit 2 "$troupe" calibrate
expect_output "calibrate needs a SPEC file"
expect_exit 3 "$troupe" calibrate "$work/missing.toml"
expect_output "cannot open spec file"
expect_exit 4 "$troupe" calibrate "$work/tiny.toml" --out "$work/no/such/dir/t.toml"
expect_output "--out $work/no/such/dir/t.toml: cannot write"
expect_exit 4 "$troupe" calibrate "$work/tiny.toml" --out "$work"
expect_output "is a directory"
expect_exit 2 "$troupe" calibrate "$work/tiny.toml" --repeat 0
expect_output "--repeat 0: expected 1..1000"
expect_exit 2 "$troupe" calibrate "$work/tiny.toml" --model roofline
expect_output "--model roofline: expected flops or measured"
expect_exit 2 "$troupe" validate "$work/tiny.toml" --out "$work/x.toml"
expect_output "--out, --repeat and --model are options of calibrate only"
expect_exit 3 "$troupe" calibrate "$work/tiny.toml" --set run.mode='"reward_model"' --set topology.devices=1 \
  --set topology.stages=1 --set 'topology.schedule="sequential"' --set topology.optimizer_shards=1 --set topology.microbatches=1
expect_output "calibrate measures pipeline training steps (mode = \"pretrain\") or RL steps (mode = \"rl\")"
cmp -s "$work/t.toml" "$work/keep.toml" || fail "a failed calibrate changed the earlier table"

# An RL spec: the synchronous loop on one device, then data-parallel over 2;
# the rl_* table validates in a sim RL spec, round-trips, and the sim runs.
tiny_model_toml "$work/rl.toml" $'[log]\nprogress = "off"'
cat >> "$work/rl.toml" <<'TOML'
[run]
mode = "rl"
steps = 10
[rl]
prompts_per_step = 2
group_size = 4
max_new_tokens = 4
TOML
mkdir -p "$work/tmp"
TMPDIR="$work/tmp" expect_exit 0 "$troupe" calibrate "$work/rl.toml" --repeat 2 --set topology.devices=2 \
  --set topology.data_parallel=2 --out "$work/rlt.toml"
expect_output "data-parallel over 2 devices: step"
expect_output "rl_train_ms_per_token and rl_train_step_ms: the trainer of a fixed_lag 1 run (2 timed steps"
[ -z "$(ls -A "$work/tmp")" ] || fail "calibrate left its decoupled run's directory: $(ls "$work/tmp")"
expect_output "Completion lengths (16, one-device steps)"
grep -qF -- "$(cat "$work/rlt.toml")" <<<"$out" || fail "the printed RL table differs from the file"
for key in rl_mean_tokens rl_sigma rl_decode_ms_per_token rl_train_ms_per_token rl_train_step_ms \
    rl_parallel_decode_ms_per_token rl_parallel_train_ms_per_token rl_sync_ms; do
  v=$(value $key "$work/rlt.toml")
  python3 -c "import sys; x = float(sys.argv[1]); assert x > 0 or (sys.argv[2] == 'rl_sigma' and x >= 0)" "$v" "$key" ||
    fail "$key = '$v' in the RL table is not a positive number"
done
[ "$(value rl_max_tokens "$work/rlt.toml")" = 4 ] || fail "rl_max_tokens is not the spec's max_new_tokens"
[ "$(value rl_slots "$work/rlt.toml")" = 1 ] || fail "rl_slots is not 1"
{ cat "$work/rl.toml"; printf '[topology]\ndevice_kind = "sim"\ndevices = 2\n'; cat "$work/rlt.toml"; } > "$work/rlsim.toml"
expect_exit 0 "$troupe" validate "$work/rlsim.toml"
expect_output "train $(value rl_train_ms_per_token "$work/rlt.toml") ms per token per device + $(value rl_train_step_ms "$work/rlt.toml") ms a step"
expect_output "with several devices in a phase at once: decode $(value rl_parallel_decode_ms_per_token "$work/rlt.toml") ms, train $(value rl_parallel_train_ms_per_token "$work/rlt.toml") ms per token"
expect_exit 0 "$troupe" run "$work/rlsim.toml" --set run.out_dir="\"$work/rlsimrun\""
expect_output "sim RL summary (virtual time; no math ran): 2 devices"
expect_exit 2 "$troupe" calibrate "$work/rl.toml" --model flops
expect_output "--model applies to pipeline specs"

# SIGINT stops it after the running round: exit 130, nothing written.
"$troupe" calibrate "$work/tiny.toml" --repeat 1000 --out "$work/int.toml" > "$work/int.log" 2>&1 &
pid=$!
sleep 2
kill -INT "$pid"
wait "$pid"; rc=$?
[ "$rc" -eq 130 ] || fail "calibrate after SIGINT exited $rc, expected 130: $(tail -3 "$work/int.log")"
grep -qF "interrupted (SIGINT); nothing was written" "$work/int.log" || fail "no interruption message: $(tail -3 "$work/int.log")"
[ -e "$work/int.toml" ] && fail "an interrupted calibrate wrote its table"

# The measured cost model's rules (file:line:col).
n=$(grep -n '^stage_forward_ms' "$work/sim.toml" | cut -d: -f1)
expect_exit 3 "$troupe" validate "$work/sim.toml" --set 'sim.stage_forward_ms=[1, 2, 3]'
expect_output "[sim] stage_forward_ms has 3 value(s); with cost_model = \"measured\" it must have one value per pipeline stage: 2"
expect_exit 3 "$troupe" validate "$work/sim.toml" --set 'sim.stage_weight_ms=[0, 1e5]'
expect_output "[sim] stage_weight_ms[1] = 100000 must be <= stage_backward_ms[1]"
expect_exit 3 "$troupe" validate "$work/sim.toml" --set 'sim.stage_forward_ms="1, 2"'
expect_output "[sim] stage_forward_ms: expected an array of floats, got string"
expect_exit 3 "$troupe" validate "$work/sim.toml" --set 'sim.stage_forward_ms=[1, -2]'
expect_output "[sim] stage_forward_ms: -2 is out of range (allowed 0 .. 1000000)"
expect_exit 3 "$troupe" validate "$work/sim.toml" --set 'sim.stage_forward_ms=[1, "a"]'
expect_output "[sim] stage_forward_ms: expected an array of numbers"
expect_exit 3 "$troupe" validate "$work/sim.toml" --set sim.gflops=10
expect_output "[sim] gflops applies only to cost_model = \"flops\" (this spec has cost_model = \"measured\")"
sed 's/^cost_model = "measured"/cost_model = "fixed"/' "$work/sim.toml" > "$work/fixed.toml"
expect_exit 3 "$troupe" validate "$work/fixed.toml"
expect_output "$work/fixed.toml:$n:1: error: [sim] stage_forward_ms applies only to cost_model = \"measured\""

finish calibrate_test
