#!/usr/bin/env bash
# checkpoints_identical.sh OLD_TROUPE NEW_TROUPE OUT
#
# Whether two troupe builds write the same bytes: the rule of a refactoring
# ("behaviour stays"). Runs, with each build, in OUT/old and OUT/new:
#   main     the built-in main job, shortened (40 SFT steps, 6 RL steps): its
#            phase 1 is a DualPipe run on 2 devices with 4 expert shards and 2
#            optimizer shards, its phase 2 decoupled RL (fixed_lag, trainer on
#            the actor runtime), so checkpoint_sft/ and checkpoint/ (with
#            rl_versions/) cover the pipeline, expert, optimizer and RL actors;
#   elastic  launch/specs/elastic_experts.toml to step 45 (its three [[elastic]]
#            events at steps 21, 31 and 41, eplb in between);
# then compares every file of every checkpoint with cmp. Exit 0 when all are
# identical; prints each file that differs or is missing. Needs the source
# tree's launch/specs (run it from the repository root).
set -uo pipefail
if [ $# -ne 3 ]; then
  echo "usage: $0 OLD_TROUPE NEW_TROUPE OUT" >&2
  exit 2
fi
old=$1 new=$2 out=$3
for t in "$old" "$new"; do
  [ -x "$t" ] || { echo "$0: $t is not an executable" >&2; exit 2; }
done
[ -f launch/specs/elastic_experts.toml ] || { echo "$0: run it from the repository root" >&2; exit 2; }
mkdir -p "$out" || exit 2

run() {  # run WHO TROUPE
  local who=$1 t=$2
  rm -rf "$out/$who"
  echo "== $who: main job (shortened)"
  "$t" run --set run.steps=40 --set rl.steps=6 --set rl.eval_every=3 --set log.progress='"off"' \
    --set run.out_dir="\"$out/$who/main\"" > "$out/$who.main.log" 2>&1 || { echo "$who main job failed (see $out/$who.main.log)"; return 1; }
  echo "== $who: elastic experts to step 45"
  "$t" run launch/specs/elastic_experts.toml --set run.steps=45 --set log.progress='"off"' \
    --set run.out_dir="\"$out/$who/elastic\"" > "$out/$who.elastic.log" 2>&1 || { echo "$who elastic run failed (see $out/$who.elastic.log)"; return 1; }
}
run old "$old" || exit 1
run new "$new" || exit 1

differ=0 files=0
while IFS= read -r f; do
  rel=${f#"$out/old/"}
  files=$((files + 1))
  if [ ! -f "$out/new/$rel" ]; then
    echo "missing in new: $rel"
    differ=1
  elif ! cmp -s "$f" "$out/new/$rel"; then
    echo "differs: $rel"
    differ=1
  fi
done < <(find "$out/old" -path '*checkpoint*' -type f | sort)
echo "$files checkpoint file(s) compared"
[ "$files" -gt 0 ] || { echo "no checkpoint was written"; exit 1; }
[ $differ -eq 0 ] && echo "identical" && exit 0
exit 1
