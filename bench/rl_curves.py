#!/usr/bin/env python3
"""Held-out exact match against wall time for one or more RL runs.

Reads each run's metrics.jsonl (run.mode = "rl": rl_eval lines carry
exact_match, pass_at_k and wall_seconds) and prints a Markdown table per run
plus a summary (start, best, final, time to a target), and writes the same
numbers as JSON.

usage: rl_curves.py [--target 0.9] [--json out.json] LABEL=RUN_DIR ...
"""
import argparse
import json
import sys


def load(run_dir):
    evals, steps = [], []
    with open(f"{run_dir}/metrics.jsonl") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a run still writing its last line
            if rec.get("type") == "rl_eval":
                evals.append(rec)
            elif rec.get("type") == "rl_step":
                steps.append(rec)
    return evals, steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", type=float, default=0.9)
    ap.add_argument("--json")
    ap.add_argument("runs", nargs="+", metavar="LABEL=RUN_DIR")
    args = ap.parse_args()
    out = {}
    for spec in args.runs:
        label, _, run_dir = spec.partition("=")
        if not run_dir:
            sys.exit(f"rl_curves.py: expected LABEL=RUN_DIR, got {spec!r}")
        evals, steps = load(run_dir)
        if not evals:
            sys.exit(f"rl_curves.py: {run_dir}/metrics.jsonl has no rl_eval lines")
        print(f"\n### {label} ({run_dir})\n")
        print("| step | wall s | exact match | pass@k | mean reward |")
        print("|---|---|---|---|---|")
        for e in evals:
            print(f"| {e['step']} | {e.get('wall_seconds', 0):.0f} | {100 * e['exact_match']:.1f}% | "
                  f"{100 * e['pass_at_k']:.1f}% | {e['mean_reward']:.3f} |")
        hit = next((e for e in evals if e["exact_match"] >= args.target), None)
        gen = [s["gen_tokens_per_s"] for s in steps if s.get("gen_tokens_per_s")]
        out[label] = {
            "run_dir": run_dir,
            "curve": [[e["step"], e.get("wall_seconds", 0), e["exact_match"], e["pass_at_k"]] for e in evals],
            "start": evals[0]["exact_match"],
            "best": max(e["exact_match"] for e in evals),
            "final": evals[-1]["exact_match"],
            "seconds_to_target": hit.get("wall_seconds") if hit else None,
            "steps": len(steps),
            "mean_step_seconds": sum(s["step_seconds"] for s in steps) / len(steps) if steps else None,
            "mean_gen_tokens_per_s": sum(gen) / len(gen) if gen else None,
        }
    print(f"\n| run | start | best | final | wall s to {100 * args.target:.0f}% | steps | s/step |")
    print("|---|---|---|---|---|---|---|")
    for label, r in out.items():
        t = f"{r['seconds_to_target']:.0f}" if r["seconds_to_target"] is not None else "not reached"
        sps = f"{r['mean_step_seconds']:.3f}" if r["mean_step_seconds"] else "-"
        print(f"| {label} | {100 * r['start']:.1f}% | {100 * r['best']:.1f}% | {100 * r['final']:.1f}% | {t} | "
              f"{r['steps']} | {sps} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
