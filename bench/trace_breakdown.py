#!/usr/bin/env python3
# Where a runtime step goes, per device, from the Chrome traces that
# `bench_pipeline_real --trace-dir DIR` writes (actors/trace.cpp): busy
# milliseconds per step by category (forward, backward, exchange = gradient
# download + parameter load, optimizer = reduce + update, snapshot = the
# optimizer shards' m and v copies for kill-and-replay; weight = the W
# passes of split backwards) and the idle rest.
# Steps are counted as the "update shard0" events; init is left out. The
# bench steps its engines round-robin, so one engine's trace has long pauses:
# its steps are the runs of closures with no pause over 50 ms across all
# devices, and "step" is the mean length of those runs.
#   bench/trace_breakdown.py DIR/runtime_1f1b__2_dev.json [...]
import collections
import json
import sys


def breakdown(path):
    # "wait" events fill the gaps between closures (the device was idle): not work.
    events = [e for e in json.load(open(path))["traceEvents"]
              if e.get("ph") == "X" and e["cat"] not in ("init", "wait")]
    if not events:
        print(f"{path}: no events")
        return
    steps = sum(1 for e in events if e["name"] == "update shard0")
    events.sort(key=lambda e: e["ts"])
    total, start, end = 0.0, events[0]["ts"], events[0]["ts"] + events[0]["dur"]
    for e in events[1:]:
        if e["ts"] > end + 50e3:  # a pause: another engine's step
            total += end - start
            start = e["ts"]
        end = max(end, e["ts"] + e["dur"])
    total += end - start
    span = total / 1e3 / max(steps, 1)
    per_dev = collections.defaultdict(list)
    for e in events:
        per_dev[e["tid"]].append(e)
    print(f"{path}: {steps} steps, {span:.1f} ms per step (first to last closure)")
    cats = ["forward", "backward", "weight", "exchange", "optimizer", "snapshot"]
    print(f"  {'device':>6} " + " ".join(f"{c:>9}" for c in cats) + f" {'busy':>7} {'idle':>7}  (ms per step)")
    for dev, evs in sorted(per_dev.items()):
        by = collections.Counter()
        for e in evs:
            by[e["cat"]] += e["dur"] / 1e3 / max(steps, 1)
        busy = sum(by.values())
        print(f"  {dev:>6} " + " ".join(f"{by[c]:9.1f}" for c in cats) + f" {busy:7.1f} {span - busy:7.1f}")


for p in sys.argv[1:]:
    breakdown(p)
