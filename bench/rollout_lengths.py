#!/usr/bin/env python3
"""rollout_lengths.py - the length distribution of real rollouts.

Usage:  python3 bench/rollout_lengths.py RUN_DIR/rollouts.jsonl [...] [--json FILE]

Reads the rollouts.jsonl a run writes with log.rollouts = N (one line per
group: its prompt and completions) and prints, over every completion: how
many, mean, p50, p90, p99 and max tokens, the share that ended with EOS and
the share exactly right. For "a+b=" prompts (the addition and scratchpad
tasks) it also breaks completions down by the operands' width: count, mean
tokens, share right. --json writes the same figures.
"""
import argparse
import json
import math
import sys


def quantile(sorted_values, q):
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * (len(sorted_values) - 1) + 0.5))]


def width_of(prompt):
    text = prompt.strip("\n")
    if "+" not in text or not text.endswith("="):
        return None
    return len(text.split("+")[0].split("\n")[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--json", dest="json_out")
    a = ap.parse_args()
    lengths, finished, correct = [], 0, 0
    by_width = {}
    for path in a.files:
        try:
            f = open(path)
        except OSError as e:
            sys.exit(f"rollout_lengths: {path}: {e.strerror}")
        with f:
            for n, line in enumerate(f, 1):
                try:
                    g = json.loads(line)
                except json.JSONDecodeError as e:
                    sys.exit(f"rollout_lengths: {path}:{n}: not JSON ({e.msg})")
                if g.get("type") != "rollouts":
                    continue
                w = width_of(g.get("prompt", ""))
                for c in g["completions"]:
                    lengths.append(c["tokens"])
                    finished += bool(c["finished"])
                    correct += bool(c["correct"])
                    if w is not None:
                        b = by_width.setdefault(w, [0, 0, 0])
                        b[0] += 1
                        b[1] += c["tokens"]
                        b[2] += bool(c["correct"])
    if not lengths:
        sys.exit("rollout_lengths: no completions found (was log.rollouts set?)")
    s = sorted(lengths)
    out = {
        "completions": len(s),
        "mean_tokens": sum(s) / len(s),
        "p50": quantile(s, 0.5),
        "p90": quantile(s, 0.9),
        "p99": quantile(s, 0.99),
        "max": s[-1],
        "finished_share": finished / len(s),
        "correct_share": correct / len(s),
        "by_width": {str(w): {"completions": b[0], "mean_tokens": b[1] / b[0], "correct_share": b[2] / b[0]}
                     for w, b in sorted(by_width.items())},
    }
    print(f"completions {out['completions']}: tokens mean {out['mean_tokens']:.1f}, p50 {out['p50']}, p90 {out['p90']}, "
          f"p99 {out['p99']}, max {out['max']}; ended with EOS {100 * out['finished_share']:.1f}%, "
          f"right {100 * out['correct_share']:.1f}%")
    if by_width:
        print("width  completions  mean tokens  right")
        for w, b in sorted(by_width.items()):
            print(f"{w:>5}  {b[0]:>11}  {b[1] / b[0]:>11.1f}  {100 * b[2] / b[0]:>5.1f}%")
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
