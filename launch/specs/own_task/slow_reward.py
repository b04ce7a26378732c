#!/usr/bin/env python3
"""Slow word-sorting reward (for benches): reward.py's scoring after a per-request
child process that takes wall time (a sleep) under a timeout, the way
code-execution rewards run each completion in a sandbox.

Env: TROUPE_REWARD_DELAY_MS (default 20): how long each check's child process runs;
     TROUPE_REWARD_WORKERS (default 4): requests checked concurrently (thread pool);
     TROUPE_REWARD_TIMEOUT_S (default 5): per-check timeout (a timeout scores 0, logged);
     TROUPE_REWARD_MODE (default subprocess): "subprocess" runs a child per check,
     "wait" only waits (a remote sandbox: wall time and no local CPU).
Same protocol and scores as reward.py, but replies come in completion order, not request
order (troupe matches them by id). Each reply is flushed as soon as it is ready.
"""
import concurrent.futures
import json
import os
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ in the example folder
sys.path.insert(0, HERE)
import reward  # noqa: E402  (score, parse, reply)

def env_num(name, default, kind):
    try:
        return max(kind(os.environ.get(name, default)), 0)
    except ValueError:
        print(f"slow_reward.py: bad {name}, using {default}", file=sys.stderr)
        return default


DELAY_MS = env_num("TROUPE_REWARD_DELAY_MS", 20, float)
WORKERS = max(env_num("TROUPE_REWARD_WORKERS", 4, int), 1)
TIMEOUT_S = env_num("TROUPE_REWARD_TIMEOUT_S", 5, float)
MODE = os.environ.get("TROUPE_REWARD_MODE", "subprocess")
out_lock = threading.Lock()


def check(req):
    # The "sandbox": a child process that takes wall time (here it only
    # sleeps), killed past the timeout, as a code-execution reward's run of a
    # completion would be; or (TROUPE_REWARD_MODE=wait) a wait with no local
    # work at all, as a call to a remote sandbox service is. The score itself
    # is reward.py's.
    try:
        if MODE == "wait":
            time.sleep(DELAY_MS / 1000.0)
        else:
            subprocess.run(["sleep", f"{DELAY_MS / 1000.0:.3f}"], check=True, timeout=TIMEOUT_S,
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        r, correct = reward.score(req)
        return reward.reply(req, r, correct)
    except Exception as e:  # timeout, crash: score 0
        print(f"slow_reward.py: check of id {req['id']!r} failed: {e!r}", file=sys.stderr)
        return reward.reply(req, 0.0, False)


def emit(fut):
    with out_lock:
        try:
            print(fut.result(), flush=True)
        except BrokenPipeError:
            os._exit(0)


def main():
    sys.stdin.reconfigure(encoding="utf-8", errors="replace")
    with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
        for line in sys.stdin:
            req = reward.parse(line) if line.strip() else None
            if req is not None:
                pool.submit(check, req).add_done_callback(emit)
    return 0  # leaving the with-block waits for the pending checks


if __name__ == "__main__":
    sys.exit(main())
