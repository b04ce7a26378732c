#!/usr/bin/env bash
# `troupe dashboard`, `report` and `plot` against real short runs, checked in
# a real browser: headless Chromium loads the live page and the report, and
# what their charts hold (#troupe-state, computed from the dygraphs/d3
# objects) is compared with metrics.jsonl. Also: bad run directories, a port
# in use, a run still writing (partial last line), a deleted run, SIGTERM.
# Skipped (exit 77) only when Chromium is absent; ./setup.sh test installs it.
# usage: dashboard_test.sh TROUPE_BINARY SOURCE_DIR
# TROUPE_DASHBOARD_SCREENSHOT=PATH also copies the screenshot there (docs/dashboard.png).
set -uo pipefail
troupe=$1
src=$2
work=$(mktemp -d)
dash_pid=""
cleanup() {
  [ -n "$dash_pid" ] && kill "$dash_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
source "$(dirname "$0")/../cli_test_lib.sh"  # failures, fail, expect_exit, expect_output

chromium_bin=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$chromium_bin" ]; then
  echo "SKIP: chromium is not installed (./setup.sh test installs Debian's chromium); the browser test did not run"
  exit 77
fi
py=/usr/bin/python3
[ -x "$py" ] || py=python3
browse() {  # browse MODE(dump|shot) URL [PNG]: headless Chromium, virtual time so polls complete
  local args=(--headless --no-sandbox --disable-gpu --disable-dev-shm-usage --hide-scrollbars
              --user-data-dir="$work/chrome-profile" --virtual-time-budget=6000 --window-size=1400,1500)
  if [ "$1" = dump ]; then
    timeout 120 "$chromium_bin" "${args[@]}" --dump-dom "$2" 2>"$work/chromium.err"
  else
    timeout 120 "$chromium_bin" "${args[@]}" --screenshot="$3" "$2" >/dev/null 2>"$work/chromium.err"
  fi
}

# Help names the commands; command-line errors: no run, a missing directory, a file, a directory that is no run.
expect_exit 0 "$troupe" --help
expect_output "troupe dashboard RUN_DIR... [--port N]"
expect_output "troupe plot RUN_DIR... --output FILE.png|FILE.svg"
expect_exit 2 "$troupe" validate --port 8080
expect_output "--port is an option of dashboard only"
expect_exit 2 "$troupe" dashboard
expect_output "dashboard needs at least one RUN_DIR"
expect_exit 4 "$troupe" dashboard "$work/nowhere"
expect_output "$work/nowhere: no such directory"
: > "$work/afile"
expect_exit 4 "$troupe" dashboard "$work/afile"
expect_output "is not a directory"
mkdir "$work/empty"
expect_exit 4 "$troupe" report "$work/empty" --output "$work/r.html"
expect_output "not a run directory (it holds neither metrics.jsonl nor troupe.log)"
expect_exit 2 "$troupe" dashboard "$work/empty" --port 70000
expect_output "--port 70000: expected 1..65535"
expect_exit 2 "$troupe" plot "$work/empty"
expect_output "plot needs --output FILE"

# Two real short runs. A: 2-stage 1F1B on the actor runtime with 2 expert
# shards per MoE layer, a trace, and stage 1 killed in step 3 (restarted).
# B: the single-device trainer at a higher learning rate, for the overlay.
tiny=(--set model.d_model=32 --set model.n_layers=2 --set model.n_heads=2 --set model.expert_hidden=32
      --set model.seq_len=32 --set data.batch_size=4 --set data.eval_problems=20 --set run.eval_batches=1
      --set log.progress=plain --set optim.warmup_steps=2 --set run.eval_every=2 --set run.steps=10
      --set model.tie_embeddings=false --set topology.microbatches=2 --set topology.optimizer_shards=1
      --set run.mode='"pretrain"' --set data.target_pairs='""')  # phase 1 of the default alone, without the RL split
cp "$src/launch/specs/default.toml" "$work/a.toml"
printf '\n[[faults]]\nat_step = 3\ntarget = "stage:1"\nkind = "kill"\n' >> "$work/a.toml"
expect_exit 0 "$troupe" run "$work/a.toml" "${tiny[@]}" --set run.name=runA --set run.out_dir="$work/a" \
  --set topology.devices=2 --set topology.stages=2 --set 'topology.schedule="1f1b"' --set topology.expert_shards=2 \
  --set log.trace="$work/a/trace.json"
expect_output "restarted stage:1 (killed"
expect_exit 0 "$troupe" run "${tiny[@]}" --set run.name=runB --set run.out_dir="$work/b" --set optim.lr=0.003 --set topology.devices=1 \
  --set topology.stages=1 --set 'topology.schedule="sequential"' --set topology.microbatches=1 --set topology.expert_shards=1
# C: a run "still writing": A's lines without its last four, and a partial line.
mkdir "$work/c"
head -n -4 "$work/a/metrics.jsonl" > "$work/c/metrics.jsonl"
tail -n 4 "$work/a/metrics.jsonl" | head -n 1 | head -c 40 >> "$work/c/metrics.jsonl"
sed -i 's/"name":"runA"/"name":"runC"/' "$work/c/metrics.jsonl"
# Rollouts (log.rollouts) beside run A's metrics: step 2's group, step 4's two
# groups (completions of 3, 5, 5 and 1 tokens), and a line still being written.
co() { printf '{"text":"%s","tokens":%d,"reward":%s,"correct":false,"finished":true,"advantage":%s,"logp":[],"version":[]}' "$@"; }
{
  printf '{"type":"rollouts","step":2,"version":1,"group":0,"prompt_index":0,"prompt":"1+2=","answer":"3","kept":true,"completions":[%s,%s]}\n' \
    "$(co 12 2 1 0.5)" "$(co 3 1 0 -0.5)"
  printf '{"type":"rollouts","step":4,"version":3,"group":0,"prompt_index":5,"prompt":"4+4=","answer":"8","kept":true,"completions":[%s,%s]}\n' \
    "$(co 812 3 1 0.7)" "$(co 81234 5 0 -0.7)"
  printf '{"type":"rollouts","step":4,"version":3,"group":1,"prompt_index":6,"prompt":"5+5=","answer":"01","kept":true,"completions":[%s,%s]}\n' \
    "$(co 01abc 5 1 0.7)" "$(co 0 1 0 -0.7)"
  printf '{"type":"rollouts","step":6,"ver'
} > "$work/a/rollouts.jsonl"

# What the page should show, from the files.
"$py" - "$work/a" "$work/b" "$work/c" > "$work/expected.json" <<'PY'
import json, sys
out = []
for d in sys.argv[1:]:
    steps, evals, restarts, plan = [], [], 0, None
    for line in open(d + "/metrics.jsonl"):
        if not line.endswith("\n"):
            break  # the partial last line
        o = json.loads(line)
        if o["type"] == "step": steps.append(o)
        elif o["type"] == "eval": evals.append(o)
        elif o["type"] == "restart": restarts += 1
        elif o["type"] == "plan": plan = o
    out.append({"steps": len(steps), "last_loss": steps[-1]["loss"], "evals": len(evals),
                "last_val": evals[-1]["val_loss"] if evals else None, "restarts": restarts,
                "actors": len(plan["actors"]) if plan else 0,
                "layers": len(steps[-1]["expert_load"])})
print(json.dumps(out))
PY

# check_state DUMP N_RUNS LABEL: the page's #troupe-state against expected.json.
check_state() {
  "$py" - "$1" "$work/expected.json" "$2" "$3" <<'PY'
import html, json, re, sys
dom = open(sys.argv[1]).read()
m = re.search(r'<pre id="troupe-state"[^>]*>(.*?)</pre>', dom, re.S)
if not m or not m.group(1).strip():
    sys.exit("the page has no chart state (did the page script run?)")
state = json.loads(html.unescape(m.group(1)))
exp = json.load(open(sys.argv[2]))[: int(sys.argv[3])]
label, bad = sys.argv[4], []
def close(a, b): return a is not None and b is not None and abs(a - b) <= 1e-9 * max(1.0, abs(b))
for name in ("loss", "val_loss"):
    if name not in state["charts"]:
        bad.append(f"no {name} chart")
for i, e in enumerate(exp):
    s = state["charts"]["loss"]["series"][i]
    if s["points"] != e["steps"]: bad.append(f"run {i}: loss chart has {s['points']} points, metrics.jsonl {e['steps']} steps")
    if not close(s["last"], e["last_loss"]): bad.append(f"run {i}: last loss {s['last']} != {e['last_loss']}")
    v = state["charts"]["val_loss"]["series"][i]
    if v["points"] != e["evals"] or not close(v["last"], e["last_val"]):
        bad.append(f"run {i}: val_loss chart {v} vs {e['evals']} evals, last {e['last_val']}")
    if state["runs"][i]["steps"] != e["steps"]: bad.append(f"run {i}: {state['runs'][i]}")
a = exp[0]
if state["actors"]["rows"] != a["actors"] or state["actors"]["restarts"] != a["restarts"] or a["restarts"] < 1:
    bad.append(f"actor tree {state['actors']} vs {a['actors']} actors, {a['restarts']} restarts")
if state["heatmap"]["layers"] != a["layers"] or state["heatmap"]["cells"] < a["steps"]:
    bad.append(f"heatmap {state['heatmap']} vs {a['layers']} layers")
if state["timeline"]["tracks"] != 2 or state["timeline"]["events"] < 4:
    bad.append(f"timeline {state['timeline']}: expected 2 device tracks")
if "shard_imbalance" not in state["charts"]:
    bad.append("no shard imbalance chart for the expert-shard run")
if bad:
    sys.exit(label + ": " + "; ".join(bad))
print(label + ": page state matches metrics.jsonl:", json.dumps(state["charts"]["loss"]))
PY
}

# D: a real run that is still writing while the dashboard follows it.
mkdir "$work/d"
"$troupe" run "${tiny[@]}" --set run.steps=400 --set run.eval_every=0 --set run.name=runD --set run.out_dir="$work/d" \
  --set log.progress=off --set topology.devices=1 --set topology.stages=1 --set 'topology.schedule="sequential"' \
  --set topology.microbatches=1 --set topology.expert_shards=1 > "$work/d.out" 2>&1 &
run_pid=$!
for _ in $(seq 200); do [ -e "$work/d/troupe.log" ] && break; sleep 0.05; done
# Its own dashboard (two can run side by side), stopped with SIGINT afterwards.
"$troupe" dashboard "$work/d" > "$work/dash_d.out" 2>&1 &
dash_pid=$!
for _ in $(seq 100); do grep -q 'http://127.0.0.1:' "$work/dash_d.out" && break; sleep 0.1; done
port_d=$(grep -o 'http://127.0.0.1:[0-9]*' "$work/dash_d.out" | head -1 | sed 's/.*://')
[ -n "$port_d" ] || fail "dashboard for the live run printed no address: $(cat "$work/dash_d.out")"
# Follow D while it writes: every answer is whole lines, and together they are the file.
"$py" - "http://127.0.0.1:$port_d/api/metrics?run=0" "$work/d/metrics.jsonl" "$run_pid" <<'PY' || fail "following a run that is writing (see above)"
import os, sys, time, urllib.request
url, path, pid = sys.argv[1], sys.argv[2], int(sys.argv[3])
got, offset, polls = b"", 0, 0
def running():
  try:
      os.kill(pid, 0)
      return open(f"/proc/{pid}/stat").read().split()[2] != "Z"
  except OSError:
      return False
deadline = time.time() + 300
while time.time() < deadline:
  alive = running()
  with urllib.request.urlopen(f"{url}&from={offset}") as r:
      body, nxt = r.read(), int(r.headers["X-Next-Offset"])
  polls += 1
  if body and not body.endswith(b"\n"): sys.exit(f"poll {polls}: a partial line was served")
  if nxt != offset + len(body): sys.exit(f"poll {polls}: next offset {nxt} != {offset} + {len(body)}")
  got, offset = got + body, nxt
  if not alive: break
  time.sleep(0.02)
final = open(path, "rb").read()
if got != final: sys.exit(f"after {polls} polls the served lines ({len(got)} bytes) differ from metrics.jsonl ({len(final)} bytes)")
steps = got.count(b'"type":"step"')
if steps != 400: sys.exit(f"expected 400 step lines, got {steps}")
print(f"followed a live run: {polls} polls, {steps} step lines, all whole")
PY
wait "$run_pid" || fail "run D failed: $(tail -5 "$work/d.out")"
kill -INT "$dash_pid"
wait "$dash_pid"; rc=$?
[ "$rc" -eq 0 ] && grep -q "stopped (SIGINT)" "$work/dash_d.out" || fail "SIGINT: exit $rc, $(cat "$work/dash_d.out")"
dash_pid=""

# The live dashboard: port from its first line.
"$troupe" dashboard "$work/a" "$work/b" "$work/c" > "$work/dash.out" 2>&1 &
dash_pid=$!
for _ in $(seq 100); do grep -q 'http://127.0.0.1:' "$work/dash.out" && break; sleep 0.1; done
port=$(grep -o 'http://127.0.0.1:[0-9]*' "$work/dash.out" | head -1 | sed 's/.*://')
if [ -z "$port" ]; then
  fail "dashboard printed no address: $(cat "$work/dash.out")"
else
  url="http://127.0.0.1:$port/"
  # Listens on loopback only.
  ss -ltn 2>/dev/null | grep -q ":$port " && { ss -ltn | grep ":$port " | grep -q "127.0.0.1:$port" || fail "not bound to loopback only"; }
  # A port in use is a clear error.
  expect_exit 1 "$troupe" dashboard "$work/a" --port "$port"
  expect_output "cannot listen on 127.0.0.1:$port (port in use?)"
  # The still-writing run: only complete lines, then the rest once written.
  size_c=$(stat -c %s "$work/c/metrics.jsonl")
  complete_c=$(( size_c - 40 ))
  hdr=$(curl -s -D - -o "$work/c.part" "${url}api/metrics?run=2&from=0")
  grep -qi "X-Next-Offset: $complete_c" <<<"$hdr" || fail "partial last line: expected next offset $complete_c, got: $hdr"
  [ "$(tail -c 1 "$work/c.part" | od -An -c | tr -d ' ')" = '\n' ] || fail "the server sent a partial line"
  # The browser loads the page: charts hold the runs' data.
  browse dump "$url" > "$work/live.html" || fail "chromium failed: $(tail -5 "$work/chromium.err")"
  check_state "$work/live.html" 3 live || fail "live page state (see above)"
  # Rollouts: complete lines only, and the page shows step 4's two groups
  # with their length histogram (1, 3, 5, 5 tokens).
  [ "$(curl -s "${url}api/rollouts?run=0" | grep -c '"type":"rollouts"')" = 3 ] || fail "/api/rollouts: expected 3 complete lines"
  code=$(curl -s -o /dev/null -w '%{http_code}' "${url}api/rollouts?run=1")
  [ "$code" = 404 ] || fail "/api/rollouts of a run without rollouts.jsonl: $code, expected 404"
  "$py" - "$work/live.html" <<'PY' || fail "the rollouts panel (see above)"
import html, json, re, sys
dom = open(sys.argv[1]).read()
state = json.loads(html.unescape(re.search(r'<pre id="troupe-state"[^>]*>(.*?)</pre>', dom, re.S).group(1)))
r = state.get("rollouts")
want = {"step": 4, "groups": 2, "completions": 4, "length_counts": [0, 1, 0, 1, 0, 2]}
if r != want:
    sys.exit(f"rollouts panel state {r}, expected {want}")
if "81234" not in dom or "prompt &quot;5+5=&quot;" not in dom.replace('"', "&quot;"):
    sys.exit("the rollouts panel does not show step 4's groups as text")
PY
  browse shot "$url" "$work/dashboard.png" || fail "chromium screenshot failed"
  [ "$(head -c 4 "$work/dashboard.png" | od -An -c | tr -d ' ')" = '211PNG' ] || fail "no PNG screenshot"
  [ "$(stat -c %s "$work/dashboard.png")" -gt 20000 ] || fail "screenshot is suspiciously small"
  if [ -n "${TROUPE_DASHBOARD_SCREENSHOT:-}" ]; then cp "$work/dashboard.png" "$TROUPE_DASHBOARD_SCREENSHOT"; fi
  # The run goes on writing: the next poll from the offset returns the rest.
  tail -n 4 "$work/a/metrics.jsonl" | tail -c +41 > "$work/rest" && cat "$work/rest" >> "$work/c/metrics.jsonl"
  more=$(curl -s "${url}api/metrics?run=2&from=$complete_c" | grep -c '"type"')
  [ "$more" -eq 4 ] || fail "after the run wrote on, expected its 4 remaining lines, got $more"
  # A deleted run: 410, and the server lives on.
  rm -rf "$work/c"
  code=$(curl -s -o /dev/null -w '%{http_code}' "${url}api/metrics?run=2&from=0")
  [ "$code" = 410 ] || fail "a deleted run should answer 410, got $code"
  code=$(curl -s -o /dev/null -w '%{http_code}' "${url}api/metrics?run=0&from=0")
  [ "$code" = 200 ] || fail "the server should serve the other runs after one was deleted, got $code"
  code=$(curl -s -o /dev/null -w '%{http_code}' "${url}api/metrics?run=9")
  [ "$code" = 404 ] || fail "an unknown run should answer 404, got $code"
  code=$(curl -s -o /dev/null -w '%{http_code}' -X POST "${url}api/metrics?run=0")
  [ "$code" -ge 400 ] || fail "the dashboard is read-only; POST answered $code"
  # DNS rebinding: a Host that is not a loopback name of this port is refused.
  code=$(curl -s -o /dev/null -w '%{http_code}' -H "Host: evil.example:$port" "${url}api/runs")
  [ "$code" = 403 ] || fail "a foreign Host header should answer 403, got $code"
  code=$(curl -s -o /dev/null -w '%{http_code}' -H "Host: localhost:$port" "${url}api/runs")
  [ "$code" = 200 ] || fail "Host localhost:$port should be served, got $code"
  code=$(curl -s -o /dev/null -w '%{http_code}' -H "Host: 127.0.0.1:1" "${url}js/d3/d3.min.js")
  [ "$code" = 403 ] || fail "another port in Host should answer 403 (static files too), got $code"
  # A trace named outside the run directory (an edited plan line, or a
  # symlink out of it) is not served.
  printf 'secret\n' > "$work/outside.json"
  set_trace() {  # set_trace FILE: run B's plan line names FILE as its trace
    "$py" - "$work/b/metrics.jsonl" "$1" <<'PY'
import json, sys
lines = open(sys.argv[1]).read().splitlines()
for i, l in enumerate(lines):
    j = json.loads(l)
    if j.get("type") == "plan":
        j["trace"] = sys.argv[2]
        lines[i] = json.dumps(j)
        break
else:
    sys.exit("run B has no plan line")
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
PY
  }
  set_trace "$work/outside.json" || fail "test setup: run B has no plan line to edit"
  code=$(curl -s -o "$work/leak" -w '%{http_code}' "${url}api/trace?run=1")
  [ "$code" != 200 ] && ! grep -q secret "$work/leak" || fail "a trace outside the run directory was served ($code)"
  ln -sf "$work/outside.json" "$work/b/trace_link.json"
  set_trace "$work/b/trace_link.json"
  code=$(curl -s -o "$work/leak" -w '%{http_code}' "${url}api/trace?run=1")
  [ "$code" != 200 ] && ! grep -q secret "$work/leak" || fail "a symlink out of the run directory was served ($code)"
  # 50 half-open connections (connected, no request) do not starve the page:
  # it is answered while every one of them is still waiting (before the
  # server's read timeout closes any), not after they time out. (No
  # wall-clock bound is asserted; the time is printed.)
  "$py" - "$port" <<'PY' || fail "50 half-open connections starved the dashboard (see above)"
import errno, socket, sys, time, urllib.request
port = int(sys.argv[1])
held = [socket.create_connection(("127.0.0.1", port)) for _ in range(50)]
t0 = time.time()
body = urllib.request.urlopen(f"http://127.0.0.1:{port}/api/runs", timeout=30).read()
took = time.time() - t0
def still_open(s):
    s.setblocking(False)
    try:
        return s.recv(1, socket.MSG_PEEK) != b""  # b"": the server closed it
    except BlockingIOError:
        return True
closed = sum(not still_open(s) for s in held)
for s in held: s.close()
if b'"id":0' not in body: sys.exit(f"unexpected answer {body[:80]!r}")
if closed: sys.exit(f"the request was answered only after the server dropped {closed} of the 50 half-open connections ({took:.2f} s)")
print(f"answered in {took * 1000:.0f} ms with 50 half-open connections held")
PY
  # SIGTERM stops it cleanly.
  kill -TERM "$dash_pid"
  for _ in $(seq 50); do kill -0 "$dash_pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$dash_pid" 2>/dev/null; then fail "dashboard still running 5 s after SIGTERM"; else
    wait "$dash_pid"; rc=$?
    [ "$rc" -eq 0 ] || fail "dashboard exited $rc after SIGTERM"
    grep -q "stopped (SIGTERM)" "$work/dash.out" || fail "dashboard did not say it stopped"
  fi
  dash_pid=""
fi

# A FIFO as a run's metrics.jsonl is refused at once, not opened (which would block).
mkdir "$work/fifo" && mkfifo "$work/fifo/metrics.jsonl"
for cmd in "dashboard $work/fifo" "report $work/fifo --output $work/fifo.html" "plot $work/fifo --output $work/fifo.png"; do
  # shellcheck disable=SC2086
  expect_exit 4 timeout 20 "$troupe" $cmd
  expect_output "metrics.jsonl: is not a regular file"
done

# The report: one self-contained file (no external scripts), the same charts.
expect_exit 0 "$troupe" report "$work/a" "$work/b" --output "$work/report.html"
grep -q '<script src=' "$work/report.html" && fail "the report loads external scripts"
grep -q 'href="/' "$work/report.html" && fail "the report links external stylesheets"
browse dump "file://$work/report.html" > "$work/report.dom" || fail "chromium failed on the report"
check_state "$work/report.dom" 2 report || fail "report page state (see above)"
# Wall time on the x axis: the loss chart's last x is the latest wall_seconds of the two runs.
browse dump "file://$work/report.html?x=wall" > "$work/wall.dom" || fail "chromium failed on the report (wall time)"
"$py" - "$work/wall.dom" "$work/a/metrics.jsonl" "$work/b/metrics.jsonl" <<'PY' || fail "wall-time axis (see above)"
import html, json, re, sys
state = json.loads(html.unescape(re.search(r'<pre id="troupe-state"[^>]*>(.*?)</pre>', open(sys.argv[1]).read(), re.S).group(1)))
walls = [json.loads(l)["wall_seconds"] for f in sys.argv[2:] for l in open(f) if '"type":"step"' in l]
loss = state["charts"]["loss"]
if state["xaxis"] != "wall" or abs(loss["x_last"] - max(walls)) > 1e-9 or loss["rows"] != len(set(walls)):
    sys.exit(f"wall axis: x_last {loss['x_last']} rows {loss['rows']} vs max wall_seconds {max(walls)}, {len(set(walls))} distinct")
print("wall axis: last x", loss["x_last"], "s")
PY

# An RL run (fresh init, one device): the reward, KL and entropy panels hold its rl_step lines.
expect_exit 0 "$troupe" run --set 'run.mode="rl"' --set data.target_pairs='"6-9+6-9"' --set data.target_column=0 --set rl.sync='"synchronous"' --set rl.trainer='"single"' --set rl.max_staleness=0 --set run.name=rl --set run.out_dir="$work/rl" --set run.steps=3 \
  --set run.eval_every=0 --set model.d_model=32 --set model.n_layers=2 --set model.n_heads=2 --set model.seq_len=32 \
  --set model.n_experts=4 --set model.expert_hidden=32 --set data.digits=1 --set data.batch_size=4 \
  --set data.eval_problems=20 --set rl.prompts_per_step=2 --set rl.group_size=2 --set rl.max_new_tokens=4 \
  --set log.progress=off --set topology.devices=1 --set topology.stages=1 --set 'topology.schedule="sequential"' \
  --set topology.microbatches=1 --set topology.expert_shards=1 --set topology.optimizer_shards=1
expect_exit 0 "$troupe" report "$work/rl" --output "$work/rl.html"
browse dump "file://$work/rl.html" > "$work/rl.dom" || fail "chromium failed on the RL report"
"$py" - "$work/rl.dom" "$work/rl/metrics.jsonl" <<'PY' || fail "RL panels (see above)"
import html, json, re, sys
state = json.loads(html.unescape(re.search(r'<pre id="troupe-state"[^>]*>(.*?)</pre>', open(sys.argv[1]).read(), re.S).group(1)))
rl = [json.loads(l) for l in open(sys.argv[2]) if '"type":"rl_step"' in l]
bad = []
for chart, key in (("reward", "reward_mean"), ("kl", "kl_ref"), ("entropy", "entropy")):
    s = state["charts"].get(chart, {"series": [{}]})["series"][0]
    if s.get("points") != len(rl) or abs(s.get("last", 1e99) - rl[-1][key]) > 1e-9 * max(1, abs(rl[-1][key])):
        bad.append(f"{chart}: {s} vs {len(rl)} rl_step lines, last {rl[-1][key]}")
if len(rl) != 3: bad.append(f"expected 3 rl_step lines, got {len(rl)}")
# The RL evaluations: one line per split (the target, the SFT side), on the RL step axis.
ev = [json.loads(l) for l in open(sys.argv[2]) if '"type":"rl_eval"' in l]
em = state["charts"].get("rl_exact_match", {"series": []})["series"]
want = [("rl: RL target", "exact_match"), ("rl: SFT task", "sft_exact_match")]
if [s["label"] for s in em] != [w[0] for w in want]: bad.append(f"rl_exact_match series {em}")
for s, (label, key) in zip(em, want):
    if s["points"] != len(ev) or abs(s["last"] - 100 * ev[-1][key]) > 1e-9: bad.append(f"{label}: {s} vs {len(ev)} rl_eval lines, last {ev[-1][key]}")
if len(ev) != 2 or "exact_match" in state["charts"]: bad.append(f"{len(ev)} rl_eval lines; pretraining chart {state['charts'].get('exact_match')}")
if bad: sys.exit("; ".join(bad))
print("rl: page state matches metrics.jsonl:", json.dumps(state["charts"]["reward"]))
PY

# A two-phase job (SFT, then RL on a target split): the SFT chart says what it
# scores (the target split, by the pretraining evaluator) and carries the RL
# evaluator's SFT-task score of the SFT checkpoint as its own series.
expect_exit 0 "$troupe" run --set 'run.mode="sft_rl"' --set data.target_pairs='"6-9+6-9"' --set data.target_column=0 \
  --set rl.sync='"synchronous"' --set rl.trainer='"single"' --set rl.max_staleness=0 --set run.name=two \
  --set run.out_dir="$work/two" --set run.steps=4 --set run.eval_every=2 --set rl.steps=2 --set rl.eval_every=2 \
  --set model.d_model=32 --set model.n_layers=2 --set model.n_heads=2 --set model.seq_len=32 \
  --set model.n_experts=4 --set model.expert_hidden=32 --set data.digits=1 --set data.batch_size=4 \
  --set data.eval_problems=20 --set rl.prompts_per_step=2 --set rl.group_size=2 --set rl.max_new_tokens=4 \
  --set log.progress=off --set topology.devices=1 --set topology.stages=1 --set 'topology.schedule="sequential"' \
  --set topology.microbatches=1 --set topology.expert_shards=1 --set topology.optimizer_shards=1
expect_exit 0 "$troupe" report "$work/two" --output "$work/two.html"
browse dump "file://$work/two.html" > "$work/two.dom" || fail "chromium failed on the two-phase report"
"$py" - "$work/two.dom" "$work/two/metrics.jsonl" <<'PY' || fail "the SFT chart of a two-phase run (see above)"
import html, json, re, sys
dom = open(sys.argv[1]).read()
state = json.loads(html.unescape(re.search(r'<pre id="troupe-state"[^>]*>(.*?)</pre>', dom, re.S).group(1)))
lines = [json.loads(l) for l in open(sys.argv[2])]
evals = [l for l in lines if l["type"] == "eval"]
rl_evals = [l for l in lines if l["type"] == "rl_eval"]
bad = []
series = {s["label"]: s for s in state["charts"].get("exact_match", {"series": []})["series"]}
if series.get("two", {}).get("points") != len(evals) or abs(series["two"]["last"] - 100 * evals[-1]["accuracy"]) > 1e-9:
    bad.append(f"pretraining evaluator series {series.get('two')} vs {len(evals)} eval lines")
sft = series.get("two: SFT task (RL evaluator)")
if not sft or sft["points"] != 1 or abs(sft["last"] - 100 * rl_evals[0]["sft_exact_match"]) > 1e-9:
    bad.append(f"SFT task series {sft} vs the first rl_eval's sft_exact_match {rl_evals[0].get('sft_exact_match')}")
note = state.get("em_note", "")
for want in ("held-out TARGET problems", "which SFT rows never show", "did SFT work"):
    if want not in note: bad.append(f"the chart's note lacks '{want}': {note!r}")
if "pretraining evaluator" not in dom: bad.append("the SFT chart's title does not name its evaluator")
if bad: sys.exit("; ".join(bad))
print("two-phase: the SFT chart says what it scores:", note)
PY

# Plots: PNG and SVG through gnuplot.
expect_exit 0 "$troupe" plot "$work/a" "$work/b" --output "$work/plot.png"
[ "$(head -c 4 "$work/plot.png" | od -An -c | tr -d ' ')" = '211PNG' ] || fail "plot.png is not a PNG"
expect_exit 0 "$troupe" plot "$work/a" "$work/b" --output "$work/plot.svg"
for want in '<svg' 'Training loss' 'Validation loss' 'runA' 'runB' 'Expert load, layer 1' 'Shard imbalance'; do
  grep -qF "$want" "$work/plot.svg" || fail "plot.svg lacks '$want'"
done
expect_exit 0 "$troupe" plot "$work/rl" --output "$work/rl.svg"
for want in 'RL reward (mean)' 'RL held-out exact match: target (solid), SFT task (dashed)' 'rl: RL target' 'rl: SFT task'; do
  grep -qF "$want" "$work/rl.svg" || fail "the RL plot lacks '$want'"
done
expect_exit 2 "$troupe" plot "$work/a" --output "$work/plot.txt"
expect_output "expected a .png or .svg file"

if [ "$failures" -gt 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "dashboard_test: all checks passed"
