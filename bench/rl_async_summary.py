#!/usr/bin/env python3
"""Steps/s, tokens/s, idle shares and staleness of RL runs (bench/rl_async.sh).

For each run directory OUT/LABEL it reads metrics.jsonl: rl_step lines
(wall_seconds, gen_tokens), rl_eval lines (seconds, wall_seconds) and, for
decoupled runs, the rl_actors_end line (trainer_idle, generator_idle,
staleness). Throughput is over the steps after the first, with the
evaluations' seconds taken out (every run evaluates at the same steps).
Prints a Markdown table and writes OUT/summary.json.

usage: rl_async_summary.py OUT LABEL ...
"""
import json
import sys


def read(path):
    recs = []
    with open(path) as f:
        for line in f:
            try:
                recs.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # a partial last line
    return recs


def summarize(run_dir):
    recs = read(f"{run_dir}/metrics.jsonl")
    steps = [r for r in recs if r.get("type") == "rl_step"]
    evals = [r for r in recs if r.get("type") == "rl_eval"]
    end = next((r for r in reversed(recs) if r.get("type") == "rl_actors_end"), None)
    if len(steps) < 2:
        raise SystemExit(f"rl_async_summary.py: {run_dir} has {len(steps)} rl_step lines; need 2 or more")
    t0, t1 = steps[0]["wall_seconds"], steps[-1]["wall_seconds"]
    eval_s = sum(e.get("seconds", 0.0) for e in evals if t0 < e.get("wall_seconds", 0.0) <= t1)
    span = max(t1 - t0 - eval_s, 1e-9)
    tokens = sum(s.get("gen_tokens", 0) for s in steps[1:])
    out = {
        "steps": len(steps),
        "steps_per_s": (len(steps) - 1) / span,
        "gen_tokens_per_s": tokens / span,
        "eval_seconds_removed": eval_s,
        "final_exact_match": evals[-1]["exact_match"] if evals else None,
        "mean_response_length": sum(s.get("response_length", 0.0) for s in steps) / len(steps),
    }
    # The data-parallel synchronous loop: each device's idle share (waiting
    # at a join for the slowest device, or while device 0 runs the serial
    # parts), weighted by the steps' times.
    dp = [r for r in steps[1:] if r.get("device_idle")]
    if dp:
        walls = [r["gen_seconds"] + r.get("reward_seconds", 0.0) + r["train_seconds"] for r in dp]
        n = len(dp[0]["device_idle"])
        out["device_idle"] = [sum(r["device_idle"][d] * w for r, w in zip(dp, walls)) / sum(walls) for d in range(n)]
        out["gen_seconds_per_step"] = sum(r["gen_seconds"] for r in dp) / len(dp)
        out["train_seconds_per_step"] = sum(r["train_seconds"] for r in dp) / len(dp)
    if end:
        out.update(trainer_idle=end.get("trainer_idle"), generator_idle=end.get("generator_idle"),
                   staleness=end.get("staleness"))
        hist = {int(k): v for k, v in (end.get("staleness") or {}).items()}
        n = sum(hist.values())
        if n:
            # AReaL's comparison: how fresh the trained tokens are. fixed_lag
            # trains every token eta versions old (after the first steps);
            # latest's tokens taken mid-rollout are fresher.
            out["mean_lag"] = sum(k * v for k, v in hist.items()) / n
            out["lag0_share"] = hist.get(0, 0) / n
    return out


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    out_dir, labels = sys.argv[1], sys.argv[2:]
    rows = {label: summarize(f"{out_dir}/{label}") for label in labels}
    base = rows[labels[0]]["steps_per_s"]
    print(f"\n| run | steps/s | vs {labels[0]} | gen tokens/s | final exact match | mean length | "
          "trainer idle | generator idle | devices idle (data-parallel) | mean lag | lag-0 tokens | staleness (lag: tokens) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for label, r in rows.items():
        pct = lambda x: f"{100 * x:.1f}%" if x is not None else "-"
        print(f"| {label} | {r['steps_per_s']:.3f} | {r['steps_per_s'] / base:.2f}x | {r['gen_tokens_per_s']:.0f} | "
              f"{pct(r['final_exact_match'])} | {r['mean_response_length']:.1f} | {pct(r.get('trainer_idle'))} | "
              f"{pct(r.get('generator_idle'))} | {' / '.join(pct(x) for x in r.get('device_idle', [])) or '-'} | "
              f"{r.get('mean_lag', 0):.2f} | {pct(r.get('lag0_share'))} | "
              f"{r.get('staleness', '-')} |")
    with open(f"{out_dir}/summary.json", "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
