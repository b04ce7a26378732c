#!/usr/bin/env bash
# A process killed during a checkpoint save leaves <dir>.tmp-<pid>-<n>/
# behind. `troupe run` removes such leftovers of dead processes at start-up,
# beside the checkpoint it writes and the one it resumes from, and never a
# live process's. The kill is real: SIGKILL to the run's process group while
# a save's temporary directory exists (caught by polling the directory).
# usage: checkpoint_leftovers_test.sh TROUPE_BINARY
set -uo pipefail
troupe=$(realpath "$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/../cli_test_lib.sh"  # failures, fail, expect_exit, expect_output
py=/usr/bin/python3
[ -x "$py" ] || py=python3

tiny=(--set run.mode='"pretrain"' --set data.target_pairs='""' --set model.d_model=64 --set model.n_layers=2
      --set model.n_heads=2 --set model.expert_hidden=64 --set model.seq_len=32 --set data.batch_size=4
      --set topology.devices=1 --set topology.stages=1 --set topology.schedule='"sequential"'
      --set topology.microbatches=1 --set topology.expert_shards=1 --set topology.optimizer_shards=1
      --set run.eval_every=0 --set optim.warmup_steps=1 --set log.progress='"off"')

# Kill runs during a save until one leaves a temporary directory (a save takes
# milliseconds; each try kills at the first sight of one).
"$py" - "$troupe" "$work" "${tiny[@]}" <<'PY' || fail "no SIGKILL during a save left a temporary directory in 10 tries"
import os, signal, subprocess, sys, time
troupe, work, tiny = sys.argv[1], sys.argv[2], sys.argv[3:]
out = os.path.join(work, "run")
for attempt in range(10):
    p = subprocess.Popen([troupe, "run", *tiny, "--set", "run.steps=400", "--set", "checkpoint.every=1",
                          "--set", f'run.out_dir="{out}"'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    deadline = time.time() + 60
    left = []
    while p.poll() is None and time.time() < deadline:
        # After the first save (so there is a checkpoint to resume), at the first sight of the next one.
        names = os.listdir(out) if os.path.isdir(out) else []
        if "checkpoint" in names and any(n.startswith("checkpoint.tmp-") for n in names):
            os.killpg(p.pid, signal.SIGKILL)
            break
    p.wait()
    left = [n for n in os.listdir(out) if n.startswith("checkpoint.tmp-")] if os.path.isdir(out) else []
    if left and os.path.isdir(os.path.join(out, "checkpoint")):
        print(f"try {attempt + 1}: SIGKILL during a save left {left}")
        sys.exit(0)
sys.exit(1)
PY
left=$(ls -d "$work"/run/checkpoint.tmp-* 2>/dev/null)
# A live process's save in progress (this shell's pid) must survive.
mkdir "$work/run/checkpoint.tmp-$$-0"
# Resume for one more step: the leftovers of the killed process go at start-up
# (the line below is the start-up's; a save cleans quietly).
step=$("$troupe" eval "${tiny[@]}" --set run.out_dir="\"$work/run\"" | sed -n 's/.*(step \([0-9]*\)).*/\1/p')
[ -n "$step" ] || fail "eval of the killed run's checkpoint printed no step"
expect_exit 0 "$troupe" run "${tiny[@]}" --set run.steps=$((step + 1)) --set run.out_dir="\"$work/run\"" \
  --set checkpoint.resume="\"$work/run/checkpoint\""
expect_output "removed 1 leftover(s) of an interrupted checkpoint save beside $work/run/checkpoint"
for d in $left; do [ ! -e "$d" ] || fail "the resumed run left $d (its process is dead)"; done
[ -d "$work/run/checkpoint.tmp-$$-0" ] || fail "a live process's temporary checkpoint directory was removed"
finish checkpoint_leftovers_test
