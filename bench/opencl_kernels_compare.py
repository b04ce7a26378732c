#!/usr/bin/env python3
"""Old vs new OpenCL kernels: runs two builds of bench_opencl_kernels (e.g. one
at the merge base, one on the branch) case by case, alternating which goes
first each round, so both see the same machine load; prints per case the
median wall and CPU ms of each and the median over rounds of the per-round
speedup old/new, and writes the rows as JSON.

  bench/opencl_kernels_compare.py OLD_BIN NEW_BIN [--rounds 3] [--json PATH] [--only TEXT]
                                  [--hd N]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CASES = ([f"attention B1 S{s} " for s in (64, 128, 256, 512)] + ["attention B16 S128 "] +
         [f"embedding T{t} V{v}" for t in (512, 2048, 8192) for v in (256, 32000)])


def run(binary, case, path, hd):
    subprocess.run([binary, "--only", case, "--json", path, "--hd", str(hd)], check=True,
                   stdout=subprocess.DEVNULL)
    with open(path) as f:
        return json.load(f)["rows"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default="bench_opencl_kernels_compare.json")
    ap.add_argument("--only", default="")
    ap.add_argument("--hd", type=int, default=32)
    a = ap.parse_args()
    cases = [c for c in CASES if a.only in c]
    samples = {}  # (op, shape) -> {"old": [(ms, cpu)], "new": [...]}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rows.json")
        for r in range(a.rounds):
            for case in cases:
                order = [("old", a.old), ("new", a.new)]
                if r % 2:
                    order.reverse()
                for label, binary in order:
                    for row in run(binary, case, path, a.hd):
                        key = (row["op"], row["shape"])
                        samples.setdefault(key, {"old": [], "new": []})[label].append(
                            (row["ms"], row["cpu_ms"]))
    out = []
    print(f"{'op':16} {'shape':22} {'old ms':>9} {'new ms':>9} {'x wall':>7} "
          f"{'old cpu':>9} {'new cpu':>9} {'x cpu':>7}")
    for (op, shape), s in samples.items():
        n = min(len(s["old"]), len(s["new"]))
        med = lambda xs: statistics.median(xs)
        row = {
            "op": op, "shape": shape, "rounds": n,
            "old_ms": med([x[0] for x in s["old"]]), "new_ms": med([x[0] for x in s["new"]]),
            "old_cpu_ms": med([x[1] for x in s["old"]]),
            "new_cpu_ms": med([x[1] for x in s["new"]]),
            "speedup_wall": med([s["old"][i][0] / s["new"][i][0] for i in range(n)]),
            "speedup_cpu": med([s["old"][i][1] / s["new"][i][1] for i in range(n)]),
        }
        out.append(row)
        print(f"{op:16} {shape:22} {row['old_ms']:9.3f} {row['new_ms']:9.3f} "
              f"{row['speedup_wall']:7.2f} {row['old_cpu_ms']:9.3f} {row['new_cpu_ms']:9.3f} "
              f"{row['speedup_cpu']:7.2f}")
    with open(a.json, "w") as f:
        json.dump({"benchmark": "bench_opencl_kernels_compare", "old": a.old, "new": a.new,
                   "rounds": a.rounds, "hd": a.hd, "rows": out}, f, indent=2)
    print(f"\nwrote {a.json}")


if __name__ == "__main__":
    sys.exit(main())
