#!/usr/bin/env python3
# Summary of bench/elastic_eplb.sh's runs (OUT_DIR/r<round><static|eplb>):
# mean step time (steps 2..N), max/mean shard load (mean over layers, and
# the worst layer, over steps 2..N), every rebalance line of metrics.jsonl,
# and whether each round's static and eplb checkpoints are byte-identical.
import filecmp, glob, json, os, sys

out = sys.argv[1]
for d in sorted(glob.glob(os.path.join(out, 'r*'))):
    metrics = glob.glob(os.path.join(d, '**', 'metrics.jsonl'), recursive=True)
    if not os.path.isdir(d) or not metrics:
        continue
    rows = [json.loads(l) for l in open(metrics[0])]
    steps = [r for r in rows if r.get('type') == 'step' and r['step'] >= 2]
    def layer_mean(r):
        v = [max(l) * len(l) / sum(l) for l in r['shard_load'] if sum(l)]
        return sum(v) / len(v)
    n = len(steps)
    print(f"{os.path.basename(d):9s} mean step {sum(r['step_seconds'] for r in steps) / n:.3f} s, "
          f"max/mean shard load {sum(layer_mean(r) for r in steps) / n:.3f} (layer mean), "
          f"{sum(r['shard_imbalance'] for r in steps) / n:.3f} (worst layer)")
    for r in rows:
        if r.get('type') != 'rebalance':
            continue
        fmt = lambda v: ' '.join('%.2f' % x for x in v)
        print(f"  step {r['step']:3d} {r['decision']:7s} moved {r['moved_experts']} replaced {r['spawned']} "
              f"{r['bytes'] / 1e6:.1f} MB in {1e3 * r['migration_seconds']:.2f} ms; step {r['step_seconds']:.3f} s vs "
              f"{r['neighbour_step_seconds']:.3f} s (stall {r['step_seconds'] - r['neighbour_step_seconds']:+.3f}); "
              f"max/mean {fmt(r['max_mean_load_before'])} -> {fmt(r['max_mean_load_after'])}; "
              f"gain {1e3 * r['predicted_gain_seconds']:.1f} ms vs cost {1e3 * r['predicted_cost_seconds']:.2f} ms")
for s in sorted(glob.glob(os.path.join(out, 'r*static'))):
    e = s[:-len('static')] + 'eplb'
    same = all(filecmp.cmp(a, a.replace(s, e), shallow=False)
               for a in glob.glob(os.path.join(s, '**', 'checkpoint', '*.f32.zst'), recursive=True))
    print(f"{os.path.basename(s)} vs {os.path.basename(e)}: checkpoints {'byte-identical' if same else 'DIFFER'}")
