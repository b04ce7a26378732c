#!/usr/bin/env python3
"""Word-sorting reward for troupe's command reward (rl.reward = "command").

Protocol: one JSON request per stdin line
  {"id": "...", "prompt": "...", "completion": "...", "answer": "...", "meta": ...}
and one reply per line on stdout, flushed at once:  {"id": "...", "reward": R, "correct": B}
Scoring (score() below; slow_reward.py uses the same function):
  - completion.strip() == answer.strip()              -> reward 1.0, correct true
  - else, same number of words (whitespace-split)     -> 0.5 * share of positions whose word
                                                         equals the answer's word there
  - else (wrong word count, empty, not a string)      -> 0.0
  correct is true only for the exact match. If "answer" is missing, it is rebuilt from a
  "sort: w1 w2 ... =" prompt. Problems go to stderr; a line that is not a JSON object gets
  no reply (it has no id to answer). Exits 0 at EOF.
"""
import json
import os
import sys


def expected(req):
    """The answer to score against: req["answer"], else the prompt's words sorted."""
    ans = req.get("answer")
    if isinstance(ans, str):
        return ans
    prompt = req.get("prompt")
    if isinstance(prompt, str) and prompt.startswith("sort:"):
        return " ".join(sorted(prompt[5:].replace("=", " ").split()))
    return ""


def score(req):
    """Return (reward, correct) for one request dict; never raises on odd values."""
    comp, ans = req.get("completion"), expected(req)
    if not isinstance(comp, str) or not ans.strip():
        return 0.0, False
    if comp.strip() == ans.strip():
        return 1.0, True
    got, want = comp.split(), ans.split()
    if len(got) != len(want):
        return 0.0, False
    return 0.5 * sum(g == w for g, w in zip(got, want)) / len(want), False


def parse(line):
    """Request dict from one line, or None (logged) when it is not a JSON object."""
    try:
        req = json.loads(line)
    except ValueError as e:
        print(f"reward.py: skipping a line that is not JSON ({e}): {line[:200]!r}", file=sys.stderr)
        return None
    if not isinstance(req, dict) or "id" not in req:
        print(f"reward.py: skipping a line without an id: {line[:200]!r}", file=sys.stderr)
        return None
    return req


def reply(req, reward, correct):
    return json.dumps({"id": req["id"], "reward": float(reward), "correct": bool(correct)})


def main():
    sys.stdin.reconfigure(encoding="utf-8", errors="replace")
    for line in sys.stdin:
        if not line.strip():
            continue
        req = parse(line)
        if req is None:
            continue
        try:
            reward, correct = score(req)
        except Exception as e:  # defensive: score() should not raise
            print(f"reward.py: scoring id {req['id']!r} failed: {e!r}", file=sys.stderr)
            reward, correct = 0.0, False
        try:
            print(reply(req, reward, correct), flush=True)
        except BrokenPipeError:  # reader gone: stop quietly (no flush error at exit)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
