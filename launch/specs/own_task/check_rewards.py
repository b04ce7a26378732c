#!/usr/bin/env python3
"""Self-check for reward.py and slow_reward.py: pipes requests through each program
and checks the replies (and slow_reward.py's concurrency and timeout). Exit 0 = pass."""
import json
import os
import queue
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
P = "sort: pear apple fig lemon ="
# (completion, answer or None for "absent", expected reward, expected correct)
CASES = [
    (" apple fig lemon pear", "apple fig lemon pear", 1.0, True),
    ("apple fig lemon pear\n", "apple fig lemon pear", 1.0, True),
    (" apple fig pear lemon", "apple fig lemon pear", 0.25, False),
    (" apple  fig lemon pear", "apple fig lemon pear", 0.5, False),  # right words, odd spacing
    (" apple fig lemon", "apple fig lemon pear", 0.0, False),
    ("", "apple fig lemon pear", 0.0, False),
    (" äpple fïg lemon pear \ufffd", "apple fig lemon pear", 0.0, False),
    (" äpple fig lemon pear", "apple fig lemon pear", 0.375, False),
    (None, "apple fig lemon pear", 0.0, False),
    (" apple fig lemon pear", None, 1.0, True),  # answer rebuilt from the prompt
]
REQS = [{"id": f"r{i}", "prompt": P, "completion": c, "meta": {"words": 4},
         **({} if a is None else {"answer": a})} for i, (c, a, _, _) in enumerate(CASES)]
WANT = {f"r{i}": (r, ok) for i, (_, _, r, ok) in enumerate(CASES)}
failures = []


def expect(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def start(script, env=None):
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, script)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            encoding="utf-8", env={**os.environ, **(env or {})})
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(l) for l in proc.stdout] + [lines.put(None)],
                     daemon=True).start()
    return proc, lines


def send(proc, obj):
    proc.stdin.write((obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)) + "\n")
    proc.stdin.flush()


def read(lines, n, name):
    got = {}
    for _ in range(n):
        try:
            line = lines.get(timeout=20)
        except queue.Empty:
            line = None
        if line is None:
            expect(False, f"{name}: missing replies ({len(got)}/{n})")
            break
        try:
            rep = json.loads(line)
            got[rep["id"]] = (rep["reward"], rep["correct"])
        except (ValueError, KeyError) as e:
            expect(False, f"{name}: bad reply line {line!r} ({e})")
    return got


def check_program(script, env=None):
    proc, lines = start(script, env)
    send(proc, REQS[0])  # one request -> its reply arrives before stdin closes (flushed)
    expect(read(lines, 1, script).get("r0") == WANT["r0"], f"{script}: interactive reply")
    send(proc, "this is not json")  # logged, no reply
    send(proc, "")
    for r in REQS[1:]:
        send(proc, r)
    got = read(lines, len(REQS) - 1, script)
    for rid, want in list(WANT.items())[1:]:
        expect(got.get(rid) == want, f"{script}: {rid} got {got.get(rid)} want {want}")
    proc.stdin.close()
    rc, err = proc.wait(timeout=20), proc.stderr.read()
    expect(rc == 0, f"{script}: exit code {rc} at EOF")
    expect(lines.get(timeout=5) is None, f"{script}: extra stdout after the replies")
    expect("not JSON" in err, f"{script}: bad line not logged to stderr")


def check_slow_timing():
    n, delay = 8, 500
    proc, lines = start("slow_reward.py", {"TROUPE_REWARD_DELAY_MS": str(delay),
                                           "TROUPE_REWARD_WORKERS": "4"})
    t = time.monotonic()
    for i in range(n):
        send(proc, {**REQS[0], "id": f"t{i}"})
    got = read(lines, n, "slow timing")
    took = time.monotonic() - t
    expect(len(got) == n, "slow timing: all replies")
    expect(took < 0.6 * n * delay / 1000, f"slow timing: {took:.2f}s, not concurrent")
    proc.stdin.close()
    proc.wait(timeout=20)
    print(f"slow_reward.py: {n} requests x {delay} ms on 4 workers took {took:.2f}s")
    proc, lines = start("slow_reward.py", {"TROUPE_REWARD_DELAY_MS": "2000",
                                           "TROUPE_REWARD_TIMEOUT_S": "0.3"})
    send(proc, REQS[0])
    expect(read(lines, 1, "slow timeout") == {"r0": (0.0, False)}, "slow timeout scores 0")
    proc.stdin.close()
    expect(proc.wait(timeout=20) == 0, "slow timeout: exit code")
    expect("TimeoutExpired" in proc.stderr.read(), "slow timeout: logged")


if __name__ == "__main__":
    check_program("reward.py")
    check_program("slow_reward.py")
    check_slow_timing()
    print("check_rewards:", "FAIL" if failures else "PASS", f"({len(failures)} failures)")
    sys.exit(1 if failures else 0)
