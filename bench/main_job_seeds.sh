#!/usr/bin/env bash
# The main job (the built-in default spec: SFT, then decoupled RL) on several
# seeds, each from scratch, and the table issue 26 asks for: per seed the
# SFT task and the RL target after SFT and after RL with the change in
# points, then the median and the worst of each; wall time per run. Writes
# OUT_DIR/main_job_seeds.json; the runs stay in OUT_DIR/s<seed>/.
# Results: bench/results/main_job.md.
#
# usage: bench/main_job_seeds.sh BUILD_DIR OUT_DIR [SEEDS] [--set KEY=VALUE ...]
#   SEEDS: comma-separated (default 1,2,3); the --set options go to every run
#   (an ablation: e.g. --set rl.sft_fraction=0).
# With SFT_FROM=DIR (holding s<seed>/checkpoint_sft from an earlier call)
# phase 1 is skipped and phase 2 starts from those checkpoints (RL-only
# ablations; the wall time is then phase 2's alone).
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,16p' "$0"; exit 2; }
build=$1
out=$2
shift 2
seeds=1,2,3
if [ $# -gt 0 ] && [[ $1 != --* ]]; then seeds=$1; shift; fi
[ -x "$build/troupe" ] || { echo "no troupe in $build (build it first)"; exit 1; }
mkdir -p "$out"
trap 'echo "interrupted"; exit 130' INT TERM HUP
IFS=, read -ra list <<<"$seeds"
for s in "${list[@]}"; do
  d="$out/s$s"
  mkdir -p "$d"
  extra=()
  if [ -n "${SFT_FROM:-}" ]; then
    [ -d "$SFT_FROM/s$s/checkpoint_sft" ] || { echo "no $SFT_FROM/s$s/checkpoint_sft"; exit 1; }
    extra=(--set checkpoint.resume="\"$SFT_FROM/s$s/checkpoint_sft\"")
  fi
  echo "== seed $s -> $d $*"
  start=$(date +%s.%N)
  "$build/troupe" run --set run.seed="$s" --set run.name="\"s$s\"" --set run.out_dir="\"$d\"" \
    --set checkpoint.dir="\"$d/checkpoint\"" --set log.progress='"off"' "${extra[@]}" "$@" > "$d/out.txt" 2>&1 ||
    { echo "seed $s failed:"; tail -5 "$d/out.txt"; exit 1; }
  end=$(date +%s.%N)
  echo "$start $end" > "$d/wall.txt"
  grep -A3 '^summary' "$d/out.txt"
done

python3 - "$out" "$seeds" "$*" <<'PY'
import json, os, statistics, sys
out, seeds, args = sys.argv[1], sys.argv[2].split(","), sys.argv[3]
rows = []
for s in seeds:
    d = os.path.join(out, "s" + s)
    summ = [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl")) if '"type":"summary"' in l][-1]
    a, b = map(float, open(os.path.join(d, "wall.txt")).read().split())
    rows.append({"seed": int(s), "wall_seconds": round(b - a, 1),
                 **{k: summ[k] for k in ("sft_task_before", "sft_task_after", "target_before", "target_after",
                                         "sft_task_pass_at_k_after", "target_pass_at_k_after", "sft_seconds",
                                         "rl_seconds")}})
pt = lambda x: f"{100 * x:5.1f}%"
print(f"\nmain job, {len(rows)} seed(s){': ' + args if args else ''}")
print("seed   SFT task: after SFT  after RL  change   RL target: after SFT  after RL  change   wall")
for r in rows:
    print(f"{r['seed']:4d}   {pt(r['sft_task_before']):>19} {pt(r['sft_task_after']):>9} "
          f"{100 * (r['sft_task_after'] - r['sft_task_before']):+6.1f}   {pt(r['target_before']):>20} "
          f"{pt(r['target_after']):>9} {100 * (r['target_after'] - r['target_before']):+6.1f}   {r['wall_seconds']:5.0f} s")
agg = {}
for name, pick in (("median", statistics.median), ("worst", min)):
    sft_change = pick([r["sft_task_after"] - r["sft_task_before"] for r in rows])
    target = pick([r["target_after"] for r in rows])
    agg[name] = {"sft_task_change_points": round(100 * sft_change, 1), "target_after": target,
                 "wall_seconds": (statistics.median if name == "median" else max)([r["wall_seconds"] for r in rows])}
    print(f"{name:>6}: SFT task change {100 * sft_change:+.1f} pt, RL target after RL {pt(target)}, "
          f"wall {agg[name]['wall_seconds']:.0f} s")
goal = agg["worst"]["target_after"] >= 0.9 and agg["worst"]["sft_task_change_points"] >= -1.0
print("goal (every seed: target >= 90%, SFT task within 1 point):", "met" if goal else "not met")
json.dump({"args": args, "seeds": rows, **agg, "goal_met": goal},
          open(os.path.join(out, "main_job_seeds.json"), "w"), indent=1)
PY
