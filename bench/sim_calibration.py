#!/usr/bin/env python3
# Sim calibration (issue 16): does a sim calibrated by `troupe calibrate`
# predict the real 2-device step time of 1F1B and DualPipe?
#
# For each config (the quickstart model of launch/specs/pipeline_1f1b.toml /
# pipeline_dualpipe.toml, the specs bench_pipeline_real runs, and "d256":
# d_model 256, 8 heads, expert hidden 512) and schedule, in rounds so that
# load drift on a shared machine hits every part alike:
#   1. troupe calibrate SPEC --out T          (the [sim] table, ops with 2 devices busy)
#   2. troupe run SIMSPEC --set run.steps=1   (SPEC with device_kind = "sim",
#      optimizer_shards = 1 and T; also once with the "alone" op times from
#      T's comment line, to show what the contention term is worth)
#   3. troupe run SPEC --set run.steps=N      (the real runtime, with a device
#      trace), median step_seconds after 2 warm-up steps
# and prints predicted vs measured with the relative error per round and the
# median over rounds, plus a breakdown from the real run's trace: per-op
# medians of F and B there vs the calibrated ones, the post-pipeline work and
# the idle time per device and step. Writes JSON.
#
#   bench/sim_calibration.py BUILD_DIR [--rounds N] [--steps N] [--configs quickstart,d256] [--json PATH]
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SPECS = {"1f1b": os.path.join(ROOT, "launch/specs/pipeline_1f1b.toml"),
         "dualpipe": os.path.join(ROOT, "launch/specs/pipeline_dualpipe.toml")}
CONFIGS = {"quickstart": [],
           "d256": ["model.d_model=256", "model.n_heads=8", "model.expert_hidden=512"]}


def sets(pairs):
    out = []
    for p in pairs:
        out += ["--set", p]
    return out


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return r.stdout


def metrics(out_dir):
    return [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))]


def sim_spec(spec_path, table, path):
    text = open(spec_path).read()
    text = re.sub(r'device_kind = "host"', 'device_kind = "sim"', text)
    text = re.sub(r"(?m)^optimizer_shards = \d+", "optimizer_shards = 1", text)
    with open(path, "w") as f:
        f.write(text + "\n" + table)


def predict(troupe, spec_path, table, overrides, work):
    path = os.path.join(work, "sim.toml")
    sim_spec(spec_path, table, path)
    out = os.path.join(work, "simrun")
    run([troupe, "run", path] + sets(overrides + ["run.steps=1", f'run.out_dir="{out}"', 'log.progress="off"']))
    end = [m for m in metrics(out) if m.get("type") == "end"][-1]
    return end["step_ms"]


def alone_table(table):
    # The commented "alone" line: "# alone (...): stage_forward_ms = [..], stage_backward_ms = [..], optimizer_ms = X"
    m = re.search(r"# alone[^:]*: stage_forward_ms = (\[[^]]*\]), stage_backward_ms = (\[[^]]*\]), optimizer_ms = (\S+)", table)
    t = re.sub(r"(?m)^stage_forward_ms = .*$", f"stage_forward_ms = {m.group(1)}", table)
    t = re.sub(r"(?m)^stage_backward_ms = .*$", f"stage_backward_ms = {m.group(2)}", t)
    return re.sub(r"(?m)^optimizer_ms = .*$", f"optimizer_ms = {m.group(3)}", t)


def flops_table(table):
    # The commented flops fit: "# flops fit (...): gflops = X, gbps = Y; ..."
    m = re.search(r"(?m)^# flops fit.*: gflops = (\S+), gbps = ([^;]+);", table)
    t = re.sub(r'(?m)^cost_model = .*$', f'cost_model = "flops"\ngflops = {m.group(1)}\ngbps = {m.group(2)}', table)
    return re.sub(r"(?m)^stage_(forward|backward)_ms = .*\n", "", t)


def trace_breakdown(path, warmup):
    # Per-op medians (F, B by stage) and per device and step: post-pipeline
    # busy time (exchange, optimizer, snapshot) and idle ("wait" spans).
    events = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X" and e["cat"] != "init"]
    updates = sorted(e["ts"] for e in events if e["name"] == "update shard0")
    start = updates[warmup - 1] if warmup > 0 and len(updates) >= warmup else 0
    events = [e for e in events if e["ts"] > start]
    steps = max(1, sum(1 for e in events if e["name"] == "update shard0"))
    ops = {}
    per_dev = {}
    for e in events:
        ms = e["dur"] / 1e3
        if e["cat"] in ("forward", "backward"):
            stage = int(re.search(r" s(\d+)", e["name"]).group(1))
            ops.setdefault(f"{e['name'][0]}{stage}", []).append(ms)
        d = per_dev.setdefault(e["tid"], {"post": 0.0, "wait": 0.0, "compute": 0.0})
        if e["cat"] in ("exchange", "optimizer", "snapshot"):
            d["post"] += ms / steps
        elif e["cat"] == "wait":
            d["wait"] += ms / steps
        else:
            d["compute"] += ms / steps
    return {"ops_ms": {k: statistics.median(v) for k, v in sorted(ops.items())},
            "per_device_ms_per_step": per_dev}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=8, help="troupe calibrate --repeat")
    ap.add_argument("--configs", default="quickstart,d256")
    ap.add_argument("--json", default="bench_sim_calibration.json")
    a = ap.parse_args()
    troupe = os.path.join(a.build, "troupe")
    load_before = open("/proc/loadavg").read().split()[:3]
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for cfg in a.configs.split(","):
            for rnd in range(a.rounds):
                for sched, spec in SPECS.items():
                    ov = CONFIGS[cfg]
                    tab = os.path.join(work, "calib.toml")
                    t0 = time.time()
                    run([troupe, "calibrate", spec, "--out", tab, "--repeat", str(a.repeat)] + sets(ov))
                    table = open(tab).read()
                    pred = predict(troupe, spec, table, ov, work)
                    pred_alone = predict(troupe, spec, alone_table(table), ov, work)
                    pred_flops = predict(troupe, spec, flops_table(table), ov, work)
                    out = os.path.join(work, f"real_{cfg}_{sched}_{rnd}")
                    trace = os.path.join(out, "trace.json")
                    run([troupe, "run", spec] + sets(ov + [f"run.steps={a.steps}", "run.eval_every=0", "run.eval_batches=1",
                                                          f'run.out_dir="{out}"', 'log.progress="off"', f'log.trace="{trace}"']))
                    st = [m["step_seconds"] * 1e3 for m in metrics(out) if m.get("type") == "step"][2:]
                    real = statistics.median(st)
                    calib = {k: json.loads(re.search(rf"(?m)^{k} = (.*)$", table).group(1))
                             for k in ("stage_forward_ms", "stage_backward_ms", "optimizer_ms", "link_latency_us")}
                    row = {"config": cfg, "schedule": sched, "round": rnd, "predicted_ms": pred,
                           "predicted_alone_ms": pred_alone, "predicted_flops_ms": pred_flops, "measured_ms": real, "measured_steps_ms": st,
                           "error": pred / real - 1.0, "error_alone": pred_alone / real - 1.0,
                           "error_flops": pred_flops / real - 1.0, "calibrated": calib,
                           "real_trace": trace_breakdown(trace, 2), "seconds": time.time() - t0,
                           "load": open("/proc/loadavg").read().split()[:3]}
                    rows.append(row)
                    print(f"{cfg:10} {sched:8} round {rnd}: predicted {pred:7.1f} ms (alone {pred_alone:7.1f}), "
                          f"measured {real:7.1f} ms, error {100 * row['error']:+5.1f}% (alone {100 * row['error_alone']:+5.1f}%, "
                          f"flops {100 * row['error_flops']:+5.1f}%), "
                          f"load {' '.join(row['load'])}", flush=True)
    load_after = open("/proc/loadavg").read().split()[:3]

    print(f"\nsim calibration: predicted (troupe calibrate + sim) vs measured (troupe run) step time, 2 host devices, "
          f"medians over {a.rounds} round(s); load before {' '.join(load_before)}, after {' '.join(load_after)}")
    print(f"{'config':10} {'schedule':8} {'predicted ms':>12} {'measured ms':>11} {'error':>7} {'|error| max':>11} "
          f"{'alone pred':>10} {'alone err':>9} {'flops pred':>10} {'flops err':>9}")
    summary = []
    for cfg in a.configs.split(","):
        for sched in SPECS:
            rs = [r for r in rows if r["config"] == cfg and r["schedule"] == sched]
            p = statistics.median(r["predicted_ms"] for r in rs)
            m = statistics.median(r["measured_ms"] for r in rs)
            e = statistics.median(r["error"] for r in rs)
            ea = statistics.median(r["error_alone"] for r in rs)
            worst = max(abs(r["error"]) for r in rs)
            pa = statistics.median(r["predicted_alone_ms"] for r in rs)
            pf = statistics.median(r["predicted_flops_ms"] for r in rs)
            ef = statistics.median(r["error_flops"] for r in rs)
            summary.append({"config": cfg, "schedule": sched, "predicted_ms": p, "measured_ms": m, "median_error": e,
                            "max_abs_error": worst, "predicted_alone_ms": pa, "median_error_alone": ea,
                            "predicted_flops_ms": pf, "median_error_flops": ef})
            print(f"{cfg:10} {sched:8} {p:12.1f} {m:11.1f} {100 * e:+6.1f}% {100 * worst:10.1f}% {pa:10.1f} {100 * ea:+8.1f}% "
                  f"{pf:10.1f} {100 * ef:+8.1f}%")
    print("\nbreakdown (last round): calibrated op ms vs the same ops inside the real run's trace; per device and step:"
          " post-pipeline and idle ms")
    for r in rows:
        if r["round"] != a.rounds - 1:
            continue
        c, t = r["calibrated"], r["real_trace"]
        ops = " ".join(f"{k} {c['stage_forward_ms' if k[0] == 'F' else 'stage_backward_ms'][int(k[1:])]:.1f}/{v:.1f}"
                       for k, v in t["ops_ms"].items())
        devs = " ".join(f"dev{d}: post {v['post']:.1f} idle {v['wait']:.1f}" for d, v in sorted(t["per_device_ms_per_step"].items()))
        print(f"  {r['config']:10} {r['schedule']:8} ops (calibrated/real) {ops}; optimizer_ms {c['optimizer_ms']:.1f}; {devs}")
    with open(a.json, "w") as f:
        json.dump({"bench": "sim_calibration", "rounds": a.rounds, "steps": a.steps, "load_before": load_before,
                   "load_after": load_after, "summary": summary, "rows": rows}, f, indent=1)
    print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
