#!/usr/bin/env bash
# A user's own task end to end through the CLI (docs/own_task.md): a
# SentencePiece tokenizer trained by `troupe tokenizer train`, SFT on JSONL
# records, RL on JSONL prompts rewarded by a Python program, the tokenizer
# stored in the checkpoint (sample, export, a different one refused naming
# both hashes), fixed_lag with the program bitwise reproducible and after a
# reward:0 kill, and bad input: JSONL, tokenizer and reward program errors.
# usage: own_task_test.sh TROUPE_BINARY SOURCE_DIR
set -uo pipefail
troupe=$(realpath "$1")
src=$(realpath "$2")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/../cli_test_lib.sh"  # failures, fail, expect_exit, expect_output
cd "$work" || exit 1
py=/usr/bin/python3
[ -x "$py" ] || py=python3

"$py" "$src/launch/specs/own_task/make_data.py" --out "$work" --train 1500 --eval 60 >/dev/null || fail "make_data.py failed"
cp "$src/launch/specs/own_task/reward.py" "$work/"

# Tokenizers: train (deterministic), show, and refuse bad requests leaving nothing behind.
expect_exit 0 "$troupe" tokenizer train --input "$work/corpus.txt" --vocab-size 512 --output "$work/words.model"
expect_output "wrote $work/words.model: sentencepiece model"
expect_exit 0 "$troupe" tokenizer train --input "$work/corpus.txt" --vocab-size 512 --output "$work/again.model"
cmp -s "$work/words.model" "$work/again.model" || fail "two trainings of the same text gave different models"
expect_exit 0 "$troupe" tokenizer train --input "$work/corpus.txt" --vocab-size 512 --max-sentences 300 --output "$work/other.model"
expect_exit 0 "$troupe" tokenizer show "$work/words.model"
expect_output "(bpe, vocab 512"
expect_exit 4 "$troupe" tokenizer train --input "$work/nope.txt" --vocab-size 512 --output "$work/x.model"
expect_output "nope.txt"
[ ! -e "$work/x.model" ] || fail "a failed training left $work/x.model"
expect_exit 2 "$troupe" tokenizer train --input "$work/corpus.txt" --output "$work/x.model"
expect_output "train needs --vocab-size N"

# The small model both specs share ([tokenizer] gives its vocab_size).
model_toml='[model]
d_model = 32
n_layers = 2
n_heads = 2
seq_len = 32
n_experts = 4
expert_hidden = 32
tie_embeddings = false'
with_model() { awk -v m="$model_toml" '{ if ($0 == "@MODEL@") print m; else print }' > "$1"; }
with_model "$work/sft.toml" <<'TOML'
spec_version = 1
[run]
name = "sft"
mode = "pretrain"
seed = 1
steps = 20
eval_every = 0
@MODEL@
[data]
source = "jsonl"
path = "sft.jsonl"
eval_fraction = 0.05
batch_size = 8
eval_problems = 10
[tokenizer]
kind = "sentencepiece"
model = "words.model"
[topology]
threads_per_device = 1
[log]
progress = "off"
TOML
expect_exit 0 "$troupe" validate "$work/sft.toml"
expect_output "tokenizer: sentencepiece model $work/words.model (bpe, vocab 512"
expect_output "data: jsonl '$work/sft.jsonl': "
# model.vocab_size follows from the tokenizer; one that disagrees names both numbers.
expect_exit 3 "$troupe" validate "$work/sft.toml" --set model.vocab_size=256
expect_output "[model] vocab_size = 256 disagrees with the tokenizer's 512"
# A missing or corrupt tokenizer model: the file is named.
expect_exit 3 "$troupe" validate "$work/sft.toml" --set tokenizer.model='"gone.model"'
expect_output "$work/gone.model"
head -c 3000 /dev/urandom > "$work/junk.model"
expect_exit 3 "$troupe" validate "$work/sft.toml" --set tokenizer.model='"junk.model"'
expect_output "$work/junk.model"
# Bad JSONL: file:line and what was expected.
{ head -n 5 "$work/sft.jsonl"; echo '{"prompt": "sort: a b =", "completion": 3}'; } > "$work/bad.jsonl"
expect_exit 3 "$troupe" validate "$work/sft.toml" --set data.path='"bad.jsonl"'
expect_output "$work/bad.jsonl:6: \"completion\" is a number; expected a string"
: > "$work/empty.jsonl"
expect_exit 3 "$troupe" validate "$work/sft.toml" --set data.path='"empty.jsonl"'
expect_output "$work/empty.jsonl: holds no record"

# SFT, then the checkpoint's stored tokenizer serves sample and export.
expect_exit 0 "$troupe" run "$work/sft.toml" --set run.out_dir='"sft"'
expect_exit 0 "$troupe" sample --checkpoint "$work/sft/checkpoint" --prompt "sort: pear apple fig =" --max-new-tokens 6
expect_output "sort: pear apple fig ="
mkdir -p "$work/out"
expect_exit 0 "$troupe" export "$work/sft.toml" --checkpoint "$work/sft/checkpoint" --format safetensors --output "$work/out/model.safetensors"
expect_output "wrote the checkpoint's tokenizer (sentencepiece, hash"
cmp -s "$work/out/tokenizer.model" "$work/words.model" || fail "export's tokenizer.model is not the training tokenizer"
if "$py" -c "import sentencepiece" 2>/dev/null; then
  got=$("$py" -c "import sentencepiece as s; p = s.SentencePieceProcessor(model_file='$work/out/tokenizer.model'); print(p.vocab_size(), p.decode(p.encode('sort: pear apple fig =')))")
  [ "$got" = "512 sort: pear apple fig =" ] || fail "python3-sentencepiece read the exported tokenizer as: $got"
else
  echo "SKIP (one check): python3-sentencepiece is not installed; the exported tokenizer.model was not read back in Python"
fi
# The same weights with another tokenizer: refused, naming both hashes.
expect_exit 3 "$troupe" run "$work/sft.toml" --set run.out_dir='"sft2"' --set tokenizer.model='"other.model"' \
  --set checkpoint.resume="\"$work/sft/checkpoint\"" --set run.steps=25
expect_output "tokenizer: sentencepiece "
expect_output " vs sentencepiece "
expect_exit 4 "$troupe" eval "$work/sft.toml" --checkpoint "$work/sft/checkpoint" --set tokenizer.model='"other.model"'
expect_output "is not the one the checkpoint $work/sft/checkpoint was trained with"

# RL on JSONL prompts rewarded by the Python program.
with_model "$work/rl.toml" <<'TOML'
spec_version = 1
[run]
name = "rl"
mode = "rl"
seed = 1
steps = 3
eval_every = 0
@MODEL@
[data]
eval_problems = 8
[tokenizer]
kind = "sentencepiece"
model = "words.model"
[topology]
threads_per_device = 1
[rl]
prompts = "rl.jsonl"
eval_prompts = "eval.jsonl"
reward = "command"
reward_command = ["python3", "reward.py"]
reward_timeout = 20
prompts_per_step = 4
group_size = 4
max_new_tokens = 8
loss = "dapo"
[log]
progress = "off"
TOML
init=(--set rl.init="\"$work/sft/checkpoint\"")
expect_exit 0 "$troupe" validate "$work/rl.toml" "${init[@]}"
expect_output "rl prompts: RL prompts from '$work/rl.jsonl'"
expect_output "reward: command [python3 reward.py] in $work"
expect_exit 0 "$troupe" run "$work/rl.toml" "${init[@]}" --set run.out_dir='"rl_sync"'
[ "$(grep -c '"type":"rl_step"' "$work/rl_sync/metrics.jsonl")" = 3 ] || fail "the synchronous RL run wrote no 3 rl_step lines"
# Reward program problems: named before anything runs, or stop the run naming the request.
# The program's stderr goes to the run's log, named for its actor.
cat > "$work/chatty.py" <<'PY'
import json, sys
for line in sys.stdin:
    q = json.loads(line)
    print("chatty checked", q["id"], file=sys.stderr, flush=True)
    print(json.dumps({"id": q["id"], "reward": float(q["completion"].strip() == q["answer"])}), flush=True)
PY
expect_exit 0 "$troupe" run "$work/rl.toml" "${init[@]}" --set rl.reward_command='["python3", "chatty.py"]' \
  --set run.steps=1 --set run.out_dir='"rl_chatty"'
grep -q "reward: chatty checked " "$work/rl_chatty/troupe.log" || fail "the reward program's stderr is not in troupe.log as 'reward: ...'"
expect_exit 0 "$troupe" run "$work/rl.toml" "${init[@]}" --set rl.reward_command='["python3", "chatty.py"]' \
  --set run.steps=2 --set rl.sync='"fixed_lag"' --set rl.max_staleness=1 --set run.out_dir='"rl_chatty_actors"'
grep -q "reward:0: chatty checked " "$work/rl_chatty_actors/troupe.log" || fail "a reward actor's program's stderr is not in troupe.log as 'reward:0: ...'"
expect_exit 3 "$troupe" validate "$work/rl.toml" "${init[@]}" --set rl.reward_command='["./nope.py"]'
expect_output "nope.py"
printf 'print("hi")\n' > "$work/noexec.py"
expect_exit 3 "$troupe" validate "$work/rl.toml" "${init[@]}" --set rl.reward_command='["./noexec.py"]'
expect_output "not executable"
cat > "$work/nan.py" <<'PY'
import json, sys
for line in sys.stdin:
    print(json.dumps({"id": json.loads(line)["id"], "reward": float("nan")}), flush=True)
PY
expect_exit 1 "$troupe" run "$work/rl.toml" "${init[@]}" --set rl.reward_command='["python3", "nan.py"]' --set run.out_dir='"rl_nan"'
expect_output "NaN"
grep -v -E '^(prompts|eval_prompts|reward_command|kind|model) =|^\[tokenizer\]' "$work/rl.toml" > "$work/rl_builtin.toml"
expect_exit 3 "$troupe" validate "$work/rl_builtin.toml" --set rl.reward='"exact"'
expect_output "scores a user's task: set rl.prompts"

# fixed_lag with the program: bitwise reproducible, and after its reward actor is killed.
fixed=(--set rl.sync='"fixed_lag"' --set rl.max_staleness=1 --set rl.generators=1 --set rl.reward_actors=1 --set run.steps=4)
expect_exit 0 "$troupe" run "$work/rl.toml" "${init[@]}" "${fixed[@]}" --set run.out_dir='"fa"'
expect_exit 0 "$troupe" run "$work/rl.toml" "${init[@]}" "${fixed[@]}" --set run.out_dir='"fb"'
cp "$work/rl.toml" "$work/rl_kill.toml"
printf '\n[[faults]]\nat_step = 2\ntarget = "reward:0"\nkind = "kill"\n' >> "$work/rl_kill.toml"
expect_exit 0 "$troupe" run "$work/rl_kill.toml" "${init[@]}" "${fixed[@]}" --set run.out_dir='"fk"'
expect_output "reward:0"
# A program that crashes on its first training batch (the held-out prompts
# are tagged in their meta: the trainer's evaluation runs a program of its
# own): restarted, the batch sent again, the same bits, and the fault summary
# counts the restart.
"$py" - "$work/eval.jsonl" "$work/eval_tagged.jsonl" <<'PY'
import json, sys
with open(sys.argv[2], "w") as out:
    for line in open(sys.argv[1]):
        r = json.loads(line)
        r["meta"] = {"eval": True}
        out.write(json.dumps(r) + "\n")
PY
cat > "$work/crash_once.py" <<'PY'
import json, os, sys
for line in sys.stdin:
    q = json.loads(line)
    if not (q["meta"] or {}).get("eval") and not os.path.exists("crashed.flag"):
        open("crashed.flag", "w").close()
        sys.exit(3)
    print(json.dumps({"id": q["id"], "reward": float(q["completion"].strip() == q["answer"])}), flush=True)
PY
cat > "$work/same.py" <<'PY'
import json, sys
for line in sys.stdin:
    q = json.loads(line)
    print(json.dumps({"id": q["id"], "reward": float(q["completion"].strip() == q["answer"])}), flush=True)
PY
tagged=(--set rl.eval_prompts='"eval_tagged.jsonl"')
expect_exit 0 "$troupe" run "$work/rl.toml" "${init[@]}" "${fixed[@]}" "${tagged[@]}" --set rl.reward_command='["python3", "same.py"]' --set run.out_dir='"fs"'
rm -f "$work/crashed.flag"
expect_exit 0 "$troupe" run "$work/rl.toml" "${init[@]}" "${fixed[@]}" "${tagged[@]}" --set rl.reward_command='["python3", "crash_once.py"]' --set run.out_dir='"fc"'
expect_output "1 reward program restart(s)"
grep -q '"reward_program_restarts":1' "$work/fc/metrics.jsonl" || fail "the faults line does not count the reward program's restart"
for d in fs fc; do
  expect_exit 0 "$troupe" export "$work/rl.toml" --checkpoint "$work/$d/checkpoint" --format safetensors --output "$work/$d.safetensors"
done
cmp -s "$work/fs.safetensors" "$work/fc.safetensors" || fail "a reward program restarted mid-run changed the training"
for d in fa fb fk; do
  expect_exit 0 "$troupe" export "$work/rl.toml" --checkpoint "$work/$d/checkpoint" --format safetensors --output "$work/$d.safetensors"
done
cmp -s "$work/fa.safetensors" "$work/fb.safetensors" || fail "two fixed_lag runs with the reward program differ"
cmp -s "$work/fa.safetensors" "$work/fk.safetensors" || fail "a fixed_lag run with reward:0 killed differs from the fault-free one"

finish own_task_test
