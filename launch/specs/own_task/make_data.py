#!/usr/bin/env python3
"""Generate the word-sorting example data for troupe (standard library only).

Task: sort 3 to 5 distinct lowercase words alphabetically.
  prompt     "sort: pear apple fig ="     (words in random order, then " =")
  completion " apple fig pear"            (leading space, words sorted, space-separated)
  answer     "apple fig pear"             (RL files: the sorted words, no leading space)

Files written into --out (default: this script's folder), one JSON object per line:
  sft.jsonl   {"prompt": ..., "completion": ...}
  rl.jsonl    {"prompt": ..., "answer": ..., "meta": {"words": N}}
  eval.jsonl  same format as rl.jsonl; held out: no word SET of an eval problem
              occurs (in any order) in sft.jsonl or rl.jsonl, and eval has no duplicates
  corpus.txt  prompt + completion of every sft problem, one per line (tokenizer input)
Output is deterministic for a given --seed (each file has its own seeded stream).
"""
import argparse
import json
import os
import random
import tempfile

WORDS = """apple bird blue bread cake cat chair cloud cold dog door duck earth egg fig
fish frog game gold grass green hat home horse ice iron jam juice kite king lamp leaf
lemon milk moon nest night nut ocean owl pear pen pink queen rain red river road salt
ship snow star sun table tea tiger tree water wind zebra""".split()
assert len(set(WORDS)) == len(WORDS) and all(3 <= len(w) <= 6 and w.isalpha() for w in WORDS)


def problem(rng):
    """Return (prompt, answer, word count) for one random problem."""
    words = rng.sample(WORDS, rng.randint(3, 5))
    return "sort: " + " ".join(words) + " =", " ".join(sorted(words)), len(words)


def write_atomic(path, lines):
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".tmp_")
    try:
        with open(fd, "w", encoding="utf-8", newline="\n") as f:
            f.writelines(line + "\n" for line in lines)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return os.path.getsize(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--train", type=int, default=8000, help="lines in sft.jsonl and rl.jsonl each")
    ap.add_argument("--eval", type=int, default=300, help="lines in eval.jsonl")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)

    # Held-out eval first: distinct word sets; train problems using one are redrawn.
    rng, held, evals = random.Random(f"{a.seed}/eval"), set(), []
    while len(evals) < a.eval:
        p, ans, n = problem(rng)
        if ans not in held:  # the sorted answer identifies the word set
            held.add(ans)
            evals.append((p, ans, n))

    def train(stream):
        rng, out = random.Random(f"{a.seed}/{stream}"), []
        while len(out) < a.train:
            p = problem(rng)
            if p[1] not in held:
                out.append(p)
        return out

    sft, rl = train("sft"), train("rl")
    dump = lambda o: json.dumps(o, ensure_ascii=False)
    rl_line = lambda p, ans, n: dump({"prompt": p, "answer": ans, "meta": {"words": n}})
    path = lambda name: os.path.join(a.out, name)
    sizes = {
        "sft.jsonl": write_atomic(path("sft.jsonl"), [dump({"prompt": p, "completion": " " + ans}) for p, ans, _ in sft]),
        "rl.jsonl": write_atomic(path("rl.jsonl"), [rl_line(*x) for x in rl]),
        "eval.jsonl": write_atomic(path("eval.jsonl"), [rl_line(*x) for x in evals]),
        "corpus.txt": write_atomic(path("corpus.txt"), [p + " " + ans for p, ans, _ in sft]),
    }
    print(f"wrote {a.out}: {len(WORDS)} words, seed {a.seed}, " +
          ", ".join(f"{k} {v / 1e6:.2f} MB" for k, v in sizes.items()) +
          f" (sft/rl {a.train} lines each, eval {a.eval}; total {sum(sizes.values()) / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
