#!/usr/bin/env bash
# bench/mpi_step.sh: step time of a real training run across processes
# (all traffic through CAF's TCP stream; large envelopes through the
# shared-memory bulk path; step messages through the shared-memory rings, the
# default), next to the same spec in one process, all in the same run
# (variants interleaved over rounds).
# Spec: launch/specs/mpi_pipeline.toml (the quickstart MoE model, 2-stage 1F1B,
# 4 microbatches, 2 optimizer shards: per step each shard sends its 6.9 MB
# parameter slice to each stage and receives gradient slices back).
# Also checks that every variant saved the same checkpoint (cmp).
# usage: bench/mpi_step.sh TROUPE_BINARY [STEPS=12] [ROUNDS=2] [JSON=bench_mpi_step.json] [SCHEDULE=1f1b]
set -euo pipefail
troupe=$1
steps=${2:-12}
rounds=${3:-2}
json=${4:-bench_mpi_step.json}
schedule=${5:-1f1b}
src=$(cd "$(dirname "$0")/.." && pwd)
spec=$src/launch/specs/mpi_pipeline.toml
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mpi=(mpirun --allow-run-as-root --oversubscribe)
common=(--set run.steps="$steps" --set run.eval_every=0 --set run.eval_batches=1 --set data.eval_problems=20
        --set log.progress=off --set topology.schedule="\"$schedule\"")

# median of the step_seconds of steps 3.. (the first two warm up) in a metrics file
median_step() {
  grep '"type":"step"' "$1" | sed 's/.*"step":\([0-9]*\),.*"step_seconds":\([0-9.e+-]*\).*/\1 \2/' |
    awk '$1 > 2 {print $2}' | sort -g | awk '{a[NR]=$1} END {if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'
}

declare -A sum n
run_variant() {  # name, then how to run
  local name=$1; shift
  local out=$work/$name-$round
  "$@" --set run.out_dir="$out" >"$out.log" 2>&1 || { cat "$out.log"; exit 1; }
  local m; m=$(median_step "$out/metrics.jsonl")
  sum[$name]=$(awk -v a="${sum[$name]:-0}" -v b="$m" 'BEGIN {print a + b}')
  n[$name]=$(( ${n[$name]:-0} + 1 ))
  echo "round $round $name: median step $m s"
}
for round in $(seq 1 "$rounds"); do
  run_variant one_process "$troupe" run "$spec" "${common[@]}" --set topology.processes=1
  run_variant two_caf "${mpi[@]}" -np 2 "$troupe" run "$spec" "${common[@]}" --set topology.bulk_shm_bytes=0 \
    --set topology.ring_bytes=0
  run_variant two_shm "${mpi[@]}" -np 2 "$troupe" run "$spec" "${common[@]}" --set topology.ring_bytes=0
  run_variant two_ring "${mpi[@]}" -np 2 "$troupe" run "$spec" "${common[@]}"
done
for v in two_caf two_shm two_ring; do
  for f in params.f32.zst adam_m.f32.zst adam_v.f32.zst; do
    cmp -s "$work/one_process-1/checkpoint/$f" "$work/$v-1/checkpoint/$f" || { echo "checkpoint $f of $v differs"; exit 1; }
  done
done
mean() { awk -v a="${sum[$1]}" -v b="${n[$1]}" 'BEGIN {printf "%.4f", a / b}'; }
one=$(mean one_process); caf=$(mean two_caf); shm=$(mean two_shm); ring=$(mean two_ring)
echo
echo "Step time, $schedule, $steps steps x $rounds rounds (mean over rounds of the median step, steps 3..$steps), same run"
printf "%-44s %10s %12s\n" "variant" "step (s)" "vs 1 process"
printf "%-44s %10s %12s\n" "1 process (2 devices)" "$one" "1.00"
printf "%-44s %10s %12s\n" "2 processes, all traffic through CAF TCP" "$caf" "$(awk -v a="$caf" -v b="$one" 'BEGIN {printf "%.2f", a / b}')"
printf "%-44s %10s %12s\n" "2 processes, bulk envelopes via shared memory" "$shm" "$(awk -v a="$shm" -v b="$one" 'BEGIN {printf "%.2f", a / b}')"
printf "%-44s %10s %12s\n" "2 processes, + step messages via the rings" "$ring" "$(awk -v a="$ring" -v b="$one" 'BEGIN {printf "%.3f", a / b}')"
echo "shared-memory gain (CAF TCP step / shm step): $(awk -v a="$caf" -v b="$shm" 'BEGIN {printf "%.2f", a / b}')"
echo "checkpoints of all variants are byte-identical"
cat >"$json" <<JSON
{"bench": "mpi_step", "spec": "launch/specs/mpi_pipeline.toml", "schedule": "$schedule", "steps": $steps, "rounds": $rounds,
 "step_seconds": {"one_process": $one, "two_processes_caf": $caf, "two_processes_shm": $shm, "two_processes_ring": $ring}}
JSON
echo "wrote $json"
