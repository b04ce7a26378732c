#!/usr/bin/env bash
# Weight sync to a generator on another process (issue 12, "Across
# processes"): decoupled RL (fixed_lag, max_staleness 1) on the RL task's
# model (launch/specs/rl_addition.toml, 3.48 M parameters = 13.9 MB per
# version), trainer on device 0 / process 0, one generator on device 1:
#   one_process   the generator in process 0 (weights by reference)
#   shm           the generator on process 1 (mpirun -np 2); versions cross
#                 as RlWeights envelopes through the shared-memory bulk path
#   tcp           the same with topology.bulk_shm_bytes = 0: through CAF's
#                 TCP stream (what two hosts would use)
# Per version sent across: the round trip (encode, transfer, decode, the
# generator's confirmation) against a plain memcpy of the same bytes
# measured in the same run, and each run's seconds per RL step. Accuracy is
# not the point here, so the policy starts fresh (rl.init = "").
# usage: bench/rl_remote_sync.sh BUILD_DIR OUT_DIR [STEPS] [MPIRUN]
# Prints a table and writes OUT_DIR/rl_remote_sync.json.
set -euo pipefail
build=$1
out=$2
steps=${3:-12}
mpirun=${4:-mpirun}
here=$(cd "$(dirname "$0")/.." && pwd)
spec="$here/launch/specs/rl_addition.toml"
mkdir -p "$out"
common=(--set run.steps="$steps" --set run.eval_every=0 --set data.eval_problems=20 --set log.progress='"off"'
        --set rl.init='""' --set rl.sync='"fixed_lag"' --set rl.max_staleness=1 --set topology.devices=2
        --set topology.threads_per_device=1 --set topology.auth='"none"')
run() {  # NAME LAUNCHER... -- ARGS...
  local name=$1; shift
  local launch=()
  while [ "$1" != "--" ]; do launch+=("$1"); shift; done
  shift
  echo "== $name" >&2
  "${launch[@]}" "$build/troupe" run "$spec" "${common[@]}" --set run.out_dir="\"$out/$name\"" "$@" \
    > "$out/$name.log" 2>&1 || { tail -20 "$out/$name.log" >&2; exit 1; }
}
mpi=("$mpirun" --allow-run-as-root --oversubscribe -np 2)
run one_process env --
run shm "${mpi[@]}" -- --set topology.processes=2
run tcp "${mpi[@]}" -- --set topology.processes=2 --set topology.bulk_shm_bytes=0
python3 - "$out" "$steps" <<'PY'
import json, sys
out, steps = sys.argv[1], int(sys.argv[2])
rows = []
for name in ["one_process", "shm", "tcp"]:
    end = step = None
    steps_s = []
    for line in open(f"{out}/{name}/metrics.jsonl"):
        d = json.loads(line)
        if d.get("type") == "rl_actors_end": end = d
        if d.get("type") == "rl_step": steps_s.append(d["step_seconds"])
    n = end.get("remote_syncs", 0)
    row = {"run": name, "wall_seconds": end["wall_seconds"], "seconds_per_step": end["wall_seconds"] / steps,
           "generator_idle": end["generator_idle"], "trainer_idle": end["trainer_idle"], "remote_syncs": n}
    if n:
        b = end["remote_sync_bytes"] / n
        rt = end["remote_sync_seconds"] / n
        row.update({"bytes_per_version": b, "round_trip_ms": 1e3 * rt, "round_trip_gb_s": b / rt / 1e9,
                    "encode_ms": 1e3 * end["remote_encode_seconds"] / n, "decode_ms": 1e3 * end["remote_decode_seconds"] / n,
                    "memcpy_ms": 1e3 * end["memcpy_seconds"], "memcpy_gb_s": b / end["memcpy_seconds"] / 1e9,
                    "vs_memcpy": rt / end["memcpy_seconds"]})
    rows.append(row)
print(f"{'run':<12} {'s/step':>7} {'gen idle':>8} {'trn idle':>8} {'syncs':>5} {'MB/ver':>6} {'round trip ms':>13} {'GB/s':>5} {'enc ms':>6} {'dec ms':>6} {'memcpy ms':>9} {'x memcpy':>8}")
for r in rows:
    if r["remote_syncs"]:
        print(f"{r['run']:<12} {r['seconds_per_step']:7.3f} {100*r['generator_idle']:7.1f}% {100*r['trainer_idle']:7.1f}% {r['remote_syncs']:5d} "
              f"{r['bytes_per_version']/1e6:6.1f} {r['round_trip_ms']:13.2f} {r['round_trip_gb_s']:5.2f} {r['encode_ms']:6.2f} "
              f"{r['decode_ms']:6.2f} {r['memcpy_ms']:9.2f} {r['vs_memcpy']:8.1f}")
    else:
        print(f"{r['run']:<12} {r['seconds_per_step']:7.3f} {100*r['generator_idle']:7.1f}% {100*r['trainer_idle']:7.1f}%     -      -             -     -      -      -         -        -")
json.dump(rows, open(f"{out}/rl_remote_sync.json", "w"), indent=1)
PY
