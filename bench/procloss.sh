#!/usr/bin/env bash
# Detection time and MTTR of losing process 1 of a 2-process run (docs/faults.md
# "Losing a process"): for kind kill and stop, REPS runs each of a small
# 2-stage 1F1B spec with process 1 hit at step 3; prints, per run, the
# detection time (from the start of the step the loss hit to process 0
# noticing it: the fault fires as the step starts) and the MTTR (from the
# detection to the end of the replayed step), from metrics.jsonl's faults line,
# with the load. usage: bench/procloss.sh TROUPE [REPS] [PEER_TIMEOUT]
set -uo pipefail
troupe=$1
reps=${2:-3}
pt=${3:-3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
args=(--set model.d_model=64 --set model.n_layers=2 --set model.n_heads=2 --set model.expert_hidden=64
      --set model.seq_len=32 --set data.batch_size=8 --set data.eval_problems=20 --set run.eval_batches=1
      --set log.progress=plain --set run.steps=5 --set topology.devices=2 --set topology.stages=2
      --set 'topology.schedule="1f1b"' --set topology.microbatches=2 --set topology.expert_shards=1
      --set topology.optimizer_shards=2 --set topology.threads_per_device=1 --set topology.peer_timeout="$pt")
echo "peer_timeout = $pt s; $(uptime)"
printf '%-5s %-4s %12s %10s %12s\n' kind run detect_s mttr_ms step_wall_s
for kind in kill stop; do
  printf '[topology]\nprocesses = 2\n[[faults]]\nat_step = 3\ntarget = "process:1"\nkind = "%s"\n' "$kind" > "$work/$kind.toml"
  for r in $(seq 1 "$reps"); do
    mpirun --allow-run-as-root --oversubscribe --mca btl self,vader --enable-recovery -np 2 \
      "$troupe" run "$work/$kind.toml" "${args[@]}" --set run.out_dir="$work/$kind-$r" >/dev/null 2>&1
    line=$(grep '"type":"faults"' "$work/$kind-$r/metrics.jsonl")
    det=$(grep -o '"detect_s":[^,}]*' <<<"$line" | cut -d: -f2)
    mttr=$(grep -o '"process":{[^}]*}' <<<"$line" | grep -o '"mean_ms":[^,}]*' | cut -d: -f2)
    wall=$(grep -o '"wall_s":[^,}]*' <<<"$line" | cut -d: -f2)
    printf '%-5s %-4s %12.3f %10.1f %12.3f\n' "$kind" "$r" "$det" "$mttr" "$wall"
  done
done
echo "$(uptime)"
