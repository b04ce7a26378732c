// The page logic of `troupe dashboard` (live: polls /api) and `troupe report`
// (static: window.TROUPE_STATIC holds the runs). Line charts are dygraphs,
// the heatmap and the timeline are d3 (v3) SVG, both from Debian packages.
// window.troupe exposes the parsed runs and the charts; #troupe-state holds a
// JSON summary of what the charts hold (points, last values), for tests.
(function () {
  'use strict';
  const STATIC = window.TROUPE_STATIC || null;
  const COLORS = ['#1f77b4', '#d62728', '#2ca02c', '#9467bd', '#ff7f0e', '#8c564b', '#e377c2', '#17becf'];
  const state = { runs: [], charts: {}, xaxis: 'step', focus: 0, polls: 0, summary: null };
  window.troupe = state;
  // ?x=wall starts with wall time on the x axis (the select switches it).
  if (new URLSearchParams(window.location.search).get('x') === 'wall') state.xaxis = 'wall';
  document.getElementById('xaxis').value = state.xaxis;

  // ---- parsing metrics.jsonl --------------------------------------------
  function newRun(meta) {
    return { id: meta.id, name: meta.name, dir: meta.dir, status: 'loading', offset: 0, start: null, plan: null,
             end: null, steps: [], evals: [], rl: [], rlEvals: [], restarts: [], checkpoints: [], badLines: 0,
             log: '', trace: null, traceKey: '', wall: 0 };
  }
  function clearRun(run) { Object.assign(run, newRun(run), { status: run.status }); }

  // Appends complete JSON lines (the server never sends a partial last line).
  function ingest(run, text) {
    for (const line of text.split('\n')) {
      if (!line.trim()) continue;
      let o;
      try { o = JSON.parse(line); } catch (e) { run.badLines++; continue; }
      switch (o.type) {
        case 'start': run.start = o; break;
        case 'plan': run.plan = o; break;
        case 'step':
          // Wall time: the line's own clock, else the sum of step times.
          run.wall = o.wall_seconds != null ? o.wall_seconds : run.wall + (o.step_seconds || 0);
          o._wall = run.wall; run.steps.push(o); break;
        case 'eval': o._wall = o.wall_seconds != null ? o.wall_seconds : run.wall; run.evals.push(o); break;
        case 'rl_step':
          run.wall = o.wall_seconds != null ? o.wall_seconds : run.wall + (o.step_seconds || 0);
          o._wall = run.wall; run.rl.push(o); break;
        case 'rl_eval': o._wall = o.wall_seconds != null ? o.wall_seconds : run.wall; run.rlEvals.push(o); break;
        case 'restart': run.restarts.push(o); break;
        case 'checkpoint': run.checkpoints.push(o); break;
        case 'end': run.end = o; break;
      }
    }
  }

  // ---- line charts (dygraphs), runs overlaid ----------------------------
  const num = (v) => (typeof v === 'number' && isFinite(v) ? v : null);
  // Each chart draws one line per run and series (`series`: a label suffix
  // and the run's points); most charts have one series per run.
  const one = (pts) => [{ suffix: '', pts }];
  const LINE_CHARTS = [
    { id: 'loss', panel: 'p-loss', always: true, series: one((r) => r.steps.map((s) => [s, num(s.loss)])) },
    { id: 'val_loss', panel: 'p-val', always: true, series: one((r) => r.evals.map((e) => [e, num(e.val_loss)])) },
    // Pretraining (SFT) evaluations; an RL run's are on the next chart, on
    // its own step axis, one line per split. With a target split the
    // pretraining evaluator scores the RL target (problems SFT never shows),
    // so the dashed point is the RL evaluator's score of the SFT checkpoint
    // on the SFT task (phase 2's first evaluation), at the SFT phase's end.
    { id: 'exact_match', panel: 'p-em',
      series: [{ suffix: '', pts: (r) => r.evals.filter((e) => num(e.accuracy) != null).map((e) => [e, 100 * e.accuracy]) },
               { suffix: ': SFT task (RL evaluator)', pts: sftTaskAfterSft }] },
    { id: 'rl_exact_match', panel: 'p-rl-em',
      series: [{ suffix: ': RL target', pts: (r) => r.rlEvals.map((e) => [e, num(e.exact_match) == null ? null : 100 * e.exact_match]) },
               { suffix: ': SFT task', pts: (r) => r.rlEvals.filter((e) => num(e.sft_exact_match) != null)
                 .map((e) => [e, 100 * e.sft_exact_match]) }] },
    { id: 'reward', panel: 'p-reward', series: one((r) => r.rl.map((s) => [s, num(s.reward_mean)])) },
    // k3 (solid) has a heavy tail: one rarely sampled token can carry a
    // step's mean; k1 (dashed) is the light-tailed estimate beside it.
    { id: 'kl', panel: 'p-kl',
      series: [{ suffix: '', pts: (r) => r.rl.map((s) => [s, num(s.kl_ref)]) },
               { suffix: ': k1', pts: (r) => r.rl.filter((s) => num(s.kl_ref_k1) != null).map((s) => [s, s.kl_ref_k1]) }] },
    { id: 'entropy', panel: 'p-entropy', series: one((r) => r.rl.map((s) => [s, num(s.entropy)])) },
    { id: 'shard_imbalance', panel: 'p-imbalance',
      series: one((r) => r.steps.filter((s) => Array.isArray(s.shard_load) && s.shard_load.some((l) => l.length > 1))
        .map((s) => [s, num(s.shard_imbalance)])) },
  ];

  // The RL evaluator's SFT-task score of the SFT checkpoint (the first
  // rl_eval of a two-phase run, RL step 0), placed at the SFT phase's last
  // evaluation; none without both phases' evaluations.
  function sftTaskAfterSft(r) {
    const first = r.rlEvals.length ? r.rlEvals[0] : null;
    const sft = r.evals.filter((e) => num(e.accuracy) != null);
    if (!first || first.step !== 0 || num(first.sft_exact_match) == null || !sft.length) return [];
    const last = sft[sft.length - 1];
    return [[{ step: last.step, _wall: last._wall }, 100 * first.sft_exact_match]];
  }
  // What the pretraining evaluator scores, from the start line (eval_scores).
  function drawEvalNote() {
    const notes = state.runs.filter((r) => r.start && r.start.eval_scores && r.evals.some((e) => num(e.accuracy) != null))
      .map((r) => (state.runs.length > 1 ? r.name + ': ' : '') + r.start.eval_scores);
    const both = state.runs.some((r) => sftTaskAfterSft(r).length);
    let text = notes.join(' ');
    if (both) text += ' The dashed point is the SFT task scored by the RL evaluator after SFT: read it (or the RL chart\'s ' +
                      'SFT task line) for "did SFT work".';
    document.getElementById('em-note').textContent = text;
    state.emNote = text;
  }

  // One table for all runs: x, then one column per run (null where a run has no point).
  function mergedTable(perRun) {
    const rows = new Map();
    perRun.forEach((pts, i) => pts.forEach(([x, v]) => {
      if (x == null || v == null) return;
      let row = rows.get(x);
      if (!row) { row = new Array(perRun.length + 1).fill(null); row[0] = x; rows.set(x, row); }
      row[i + 1] = v;
    }));
    return Array.from(rows.values()).sort((a, b) => a[0] - b[0]);
  }

  function drawLineCharts() {
    const xkey = state.xaxis;
    for (const def of LINE_CHARTS) {
      // Lines: run-major, then series; a series no run has is left out.
      const lines = [];
      state.runs.forEach((r, i) => def.series.forEach((sr, k) => {
        const pts = sr.pts(r).map(([rec, v]) => [xkey === 'step' ? rec.step : rec._wall, v]);
        if (pts.some(([, v]) => v != null) || (k === 0 && def.series.length === 1))
          lines.push({ label: r.name + sr.suffix, color: COLORS[i % COLORS.length], dashed: k > 0, pts });
      }));
      const perRun = lines.map((l) => l.pts);
      const table = mergedTable(perRun);
      const panel = document.getElementById(def.panel);
      const has = table.length > 0;
      panel.hidden = !has && !def.always;
      const div = document.getElementById('c-' + def.id);
      const labels = [xkey === 'step' ? 'step' : 'wall time (s)'].concat(lines.map((l) => l.label));
      const series = {};
      lines.forEach((l) => { if (l.dashed) series[l.label] = { strokePattern: [7, 3] }; });
      const opts = { labels, file: table, colors: lines.map((l) => l.color), series,
                     xlabel: labels[0], connectSeparatedPoints: true, drawPoints: table.length < 60,
                     legend: 'always', labelsSeparateLines: false, strokeWidth: 1.5 };
      let g = state.charts[def.id];
      if (!has) {
        if (g) { g.destroy(); delete state.charts[def.id]; }
        div.innerHTML = '<p class="note">no data yet</p>';
        continue;
      }
      if (!g) {
        div.innerHTML = '';
        state.charts[def.id] = new Dygraph(div, table, opts);
      } else {
        g.updateOptions(opts);
      }
    }
  }

  // ---- expert-load heatmap (d3) -----------------------------------------
  function drawHeatmap(run) {
    const rows = run ? run.steps.filter((s) => Array.isArray(s.expert_load) && s.expert_load.length) : [];
    const panel = document.getElementById('p-heat');
    panel.hidden = rows.length === 0;
    const root = d3.select('#heat');
    root.selectAll('*').remove();
    state.heatmap = { run: run ? run.name : null, layers: 0, steps: rows.length, cells: 0 };
    if (!rows.length) return;
    document.getElementById('heat-run').textContent = run.name;
    const layers = rows[rows.length - 1].expert_load.length;
    const maxCols = 300;  // long runs: average adjacent steps into one column
    const per = Math.ceil(rows.length / maxCols);
    const ncol = Math.ceil(rows.length / per);
    for (let l = 0; l < layers; l++) {
      const experts = Math.max(...rows.map((s) => (s.expert_load[l] || []).length));
      const share = [];  // [col][expert]
      for (let c = 0; c < ncol; c++) {
        const acc = new Array(experts).fill(0);
        for (const s of rows.slice(c * per, (c + 1) * per)) {
          const load = s.expert_load[l] || [];
          const total = load.reduce((a, b) => a + b, 0) || 1;
          load.forEach((v, e) => { acc[e] += v / total; });
        }
        share.push(acc.map((v) => v / per));
      }
      const max = Math.max(1e-9, ...share.map((col) => Math.max(...col)));
      const color = d3.scale.linear().domain([0, 1 / experts, max]).range(['#ffffff', '#fdae61', '#b2182b']);
      const cw = Math.max(2, Math.min(24, Math.floor(520 / ncol))), ch = Math.max(6, Math.min(14, Math.floor(140 / experts)));
      const box = root.append('div').attr('class', 'heat-layer');
      box.append('div').attr('class', 'note').text('layer ' + l + ' (' + experts + ' experts, even share ' + (100 / experts).toFixed(1) + '%)');
      const svg = box.append('svg').attr('width', ncol * cw + 40).attr('height', experts * ch + 4);
      share.forEach((col, c) => col.forEach((v, e) => {
        svg.append('rect').attr('class', 'cell').attr('x', 30 + c * cw).attr('y', e * ch).attr('width', cw).attr('height', ch)
          .attr('fill', color(v))
          .append('title').text('step ' + rows[c * per].step + ', expert ' + e + ': ' + (100 * v).toFixed(1) + '%');
        state.heatmap.cells++;
      }));
      for (let e = 0; e < experts; e++) svg.append('text').attr('x', 0).attr('y', e * ch + ch - 2).text('e' + e);
    }
    state.heatmap.layers = layers;
  }

  // ---- pipeline timeline of the latest traced step (d3) -----------------
  // The trace covers many steps without step marks: a step starts at the
  // first forward after an optimizer update.
  function latestStep(trace) {
    const names = {};
    const evs = [];
    for (const e of trace.traceEvents || []) {
      if (e.ph === 'M' && e.name === 'thread_name') names[e.tid] = e.args && e.args.name;
      else if (e.ph === 'X') evs.push(e);
    }
    evs.sort((a, b) => a.ts - b.ts);
    let step = 0, sawUpdate = false;
    for (const e of evs) {
      const n = e.name || '';
      if (n.startsWith('update')) sawUpdate = true;
      else if (n.startsWith('F') && sawUpdate) { step++; sawUpdate = false; }
      e._step = step;
    }
    return { names, steps: step + 1, events: evs.filter((e) => e._step === step) };
  }
  // Colours by the trace's category (actors/device/trace.cpp); "other" is expert work.
  const CATEGORY_COLORS = { forward: '#1f77b4', backward: '#ff7f0e', exchange: '#7f7f7f', optimizer: '#9467bd',
                            init: '#c7c7c7', other: '#2ca02c' };
  const eventColor = (e) => CATEGORY_COLORS[e.cat] || CATEGORY_COLORS.other;
  function drawTimeline(run) {
    const panel = document.getElementById('p-timeline');
    const root = d3.select('#timeline');
    root.selectAll('*').remove();
    state.timeline = { run: run ? run.name : null, events: 0, tracks: 0 };
    panel.hidden = !(run && run.trace);
    if (!run || !run.trace) return;
    const { names, steps, events } = latestStep(run.trace);
    const tids = Array.from(new Set(events.map((e) => e.tid))).sort((a, b) => a - b);
    if (!events.length) { root.append('p').attr('class', 'note').text('the trace holds no events'); return; }
    const t0 = Math.min(...events.map((e) => e.ts)), t1 = Math.max(...events.map((e) => e.ts + (e.dur || 0)));
    document.getElementById('timeline-note').textContent = run.name + ': step ' + steps + ' of the trace, ' +
      ((t1 - t0) / 1000).toFixed(2) + ' ms, ' + events.length + ' events';
    const W = 1100, L = 80, H = 22;
    const x = d3.scale.linear().domain([0, (t1 - t0) / 1000]).range([L, W - 10]);
    const svg = root.append('svg').attr('width', W).attr('height', tids.length * H + 30);
    tids.forEach((tid, i) => svg.append('text').attr('x', 0).attr('y', i * H + 15).text(names[tid] || 'track ' + tid));
    for (const e of events) {
      const i = tids.indexOf(e.tid);
      const r = svg.append('rect').attr('class', 'ev').attr('x', x((e.ts - t0) / 1000)).attr('y', i * H + 2)
        .attr('width', Math.max(1, x((e.ts - t0 + (e.dur || 0)) / 1000) - x((e.ts - t0) / 1000))).attr('height', H - 4)
        .attr('fill', eventColor(e));
      r.append('title').text(e.name + ' (' + ((e.dur || 0) / 1000).toFixed(3) + ' ms)');
    }
    const legend = root.append('div').attr('class', 'note');
    Object.entries(CATEGORY_COLORS).forEach(([cat, color]) => {
      legend.append('span').style({ display: 'inline-block', width: '10px', height: '10px', background: color, margin: '0 4px 0 10px' });
      legend.append('span').text(cat === 'other' ? 'experts / other' : cat);
    });
    const axis = d3.svg.axis().scale(x).orient('bottom').ticks(10).tickFormat((d) => d + ' ms');
    svg.append('g').attr('transform', 'translate(0,' + (tids.length * H + 2) + ')').call(axis)
      .selectAll('path,line').style({ fill: 'none', stroke: '#555' });
    state.timeline.events = events.length;
    state.timeline.tracks = tids.length;
  }

  // ---- actor tree ---------------------------------------------------------
  function drawActors(run) {
    const div = document.getElementById('actors');
    state.actors = { run: run ? run.name : null, rows: 0, restarts: 0 };
    if (!run || !run.plan) { div.innerHTML = '<p class="note">no plan line in metrics.jsonl (runs from older troupe versions, or sim runs)</p>'; return; }
    const lastStep = Math.max(0, ...run.steps.map((s) => s.step), ...run.rl.map((s) => s.step));
    const restarts = {};
    for (const r of run.restarts) restarts[r.actor] = (restarts[r.actor] || 0) + 1;
    const faults = {};
    for (const f of run.plan.faults || []) (faults[f.target] = faults[f.target] || []).push(f);
    const esc = (s) => String(s).replace(/[&<>]/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;' }[c]));
    let html = '<table class="actors"><tr><th>actor</th><th>role</th><th>device</th><th>process</th><th>owns</th><th>restarts</th><th>faults injected</th></tr>';
    const actors = run.plan.actors || [];
    const procs = Array.from(new Set(actors.map((a) => a.process))).sort((a, b) => a - b);
    for (const p of procs) {
      const devs = Array.from(new Set(actors.filter((a) => a.process === p).map((a) => a.device))).sort((a, b) => a - b);
      for (const d of devs) {
        html += '<tr class="group"><td colspan="7">process ' + p + ' / ' + (d < 0 ? 'control (no device)' : 'device ' + d) + '</td></tr>';
        for (const a of actors.filter((x) => x.process === p && x.device === d)) {
          const fs = (faults[a.name] || []).map((f) => f.kind + ' @ step ' + f.at_step + (lastStep >= f.at_step ? ' (injected)' : ' (pending)'));
          const n = restarts[a.name] || 0;
          html += '<tr data-actor="' + esc(a.name) + '"><td>' + esc(a.name) + '</td><td>' + esc(a.role) + '</td><td>' +
            (d < 0 ? '-' : d) + '</td><td>' + p + '</td><td>' + esc(a.detail || '') + '</td><td class="' + (n ? 'bad' : '') +
            '">' + n + '</td><td>' + esc(fs.join(', ')) + '</td></tr>';
          state.actors.rows++;
          state.actors.restarts += n;
        }
      }
    }
    div.innerHTML = html + '</table>';
    document.getElementById('actors-note').textContent = run.name + ': ' + actors.length + ' actors, ' +
      run.restarts.length + ' restart(s)';
  }

  // ---- runs strip, staleness, log, summary -------------------------------
  function drawRuns() {
    const div = document.getElementById('runs');
    div.innerHTML = '';
    state.runs.forEach((r, i) => {
      const last = r.steps.length ? r.steps[r.steps.length - 1] : (r.rl.length ? r.rl[r.rl.length - 1] : null);
      const total = r.start ? r.start.steps : '?';
      const span = document.createElement('span');
      span.className = 'run ' + r.status;
      span.innerHTML = '<span class="swatch" style="background:' + COLORS[i % COLORS.length] + '"></span>';
      span.appendChild(document.createTextNode(r.name + ': ' + r.status + (last ? ', step ' + last.step + '/' + total +
        ', loss ' + (num(last.loss) == null ? '-' : last.loss.toFixed(4)) : '') + (r.end ? ', finished' : '')));
      span.title = r.dir;
      div.appendChild(span);
    });
    const sel = document.getElementById('focus');
    if (sel.options.length !== state.runs.length) {
      sel.innerHTML = '';
      state.runs.forEach((r, i) => sel.add(new Option(r.name, String(i))));
      sel.value = String(state.focus);
    }
  }
  function drawStaleness(run) {
    const rows = run ? run.rl.filter((s) => Array.isArray(s.staleness_histogram)) : [];
    document.getElementById('p-staleness').hidden = rows.length === 0;
    const root = d3.select('#staleness');
    root.selectAll('*').remove();
    if (!rows.length) return;
    const h = rows[rows.length - 1].staleness_histogram;
    const max = Math.max(1, ...h);
    const svg = root.append('svg').attr('width', 40 + h.length * 30).attr('height', 150);
    h.forEach((v, i) => {
      svg.append('rect').attr('x', 30 + i * 30).attr('y', 130 - 120 * v / max).attr('width', 24).attr('height', 120 * v / max).attr('fill', '#1f77b4');
      svg.append('text').attr('x', 36 + i * 30).attr('y', 145).text(i);
    });
  }
  // rollouts.jsonl's latest logged step (log.rollouts): a histogram of its
  // completion lengths (tokens) and its first groups as text.
  function drawRollouts(run) {
    const lines = run && run.rollouts ? run.rollouts : [];
    document.getElementById('p-rollouts').hidden = lines.length === 0;
    const hist = d3.select('#rollout-lengths');
    hist.selectAll('*').remove();
    const list = document.getElementById('rollouts');
    list.textContent = '';
    state.rollouts = null;
    if (!lines.length) return;
    const step = lines[lines.length - 1].step;
    const groups = lines.filter((g) => g.step === step);
    const lengths = [];
    groups.forEach((g) => g.completions.forEach((c) => lengths.push(c.tokens)));
    const maxLen = Math.max(1, ...lengths);
    const counts = new Array(maxLen + 1).fill(0);
    lengths.forEach((n) => counts[n]++);
    const top = Math.max(1, ...counts);
    const w = Math.max(6, Math.min(30, Math.floor(600 / counts.length)));
    const svg = hist.append('svg').attr('width', 40 + counts.length * w).attr('height', 150);
    counts.forEach((v, i) => {
      svg.append('rect').attr('x', 30 + i * w).attr('y', 130 - 120 * v / top).attr('width', w - 2).attr('height', 120 * v / top).attr('fill', '#2ca02c');
      if (counts.length <= 40 || i % 5 === 0) svg.append('text').attr('x', 30 + i * w).attr('y', 145).text(i);
    });
    document.getElementById('rollouts-note').textContent = 'step ' + step + ', sampled by version ' + groups[0].version +
      ', ' + groups.length + ' group(s), ' + lengths.length + ' completion(s)';
    groups.slice(0, 4).forEach((g) => {
      const pre = document.createElement('pre');
      let text = 'prompt ' + JSON.stringify(g.prompt) + '  answer ' + JSON.stringify(g.answer) + (g.kept ? '' : '  (dropped: equal rewards)') + '\n';
      g.completions.forEach((c) => {
        text += '  ' + JSON.stringify(c.text) + '  reward ' + c.reward + '  advantage ' + Number(c.advantage).toFixed(3) + '\n';
      });
      pre.textContent = text;
      list.appendChild(pre);
    });
    state.rollouts = { step, groups: groups.length, completions: lengths.length, length_counts: counts };
  }
  function summarize() {
    const charts = {};
    for (const [id, g] of Object.entries(state.charts)) {
      const series = [];
      for (let c = 1; c < g.numColumns(); c++) {
        let points = 0, last = null;
        for (let r = 0; r < g.numRows(); r++) {
          const v = g.getValue(r, c);
          if (v != null && !isNaN(v)) { points++; last = v; }
        }
        series.push({ label: g.getLabels()[c], points, last });
      }
      charts[id] = { rows: g.numRows(), x_last: g.numRows() ? g.getValue(g.numRows() - 1, 0) : null, series };
    }
    state.summary = {
      polls: state.polls, xaxis: state.xaxis,
      runs: state.runs.map((r) => ({ name: r.name, status: r.status, steps: r.steps.length, rl_steps: r.rl.length,
                                     evals: r.evals.length + r.rlEvals.length, finished: !!r.end, bad_lines: r.badLines })),
      charts, em_note: state.emNote || '', heatmap: state.heatmap, timeline: state.timeline, actors: state.actors, rollouts: state.rollouts,
    };
    document.getElementById('troupe-state').textContent = JSON.stringify(state.summary);
  }
  function render() {
    const run = state.runs[state.focus];
    drawRuns();
    drawLineCharts();
    drawEvalNote();
    drawHeatmap(run);
    drawTimeline(run);
    drawActors(run);
    drawStaleness(run);
    drawRollouts(run);
    const log = document.getElementById('log');
    log.textContent = run ? run.log : '';
    log.scrollTop = log.scrollHeight;
    summarize();
  }

  // ---- data sources --------------------------------------------------------
  async function fetchText(url) {
    const res = await fetch(url, { cache: 'no-store' });
    return { status: res.status, headers: res.headers, text: res.status === 200 ? await res.text() : '' };
  }
  async function poll() {
    for (const run of state.runs) {
      try {
        const m = await fetchText('/api/metrics?run=' + run.id + '&from=' + run.offset);
        if (m.status === 410) { run.status = 'deleted'; continue; }
        if (m.status !== 200) { run.status = 'error'; continue; }
        if (m.headers.get('X-Reset') === '1') clearRun(run);  // the file was replaced or truncated
        ingest(run, m.text);
        run.offset = Number(m.headers.get('X-Next-Offset'));
        run.status = run.end ? 'finished' : 'live';
        const l = await fetchText('/api/log?run=' + run.id);
        if (l.status === 200) run.log = l.text;
        const ro = await fetchText('/api/rollouts?run=' + run.id);
        if (ro.status === 200) {
          run.rollouts = [];
          for (const line of ro.text.split('\n')) {
            if (!line) continue;
            try { run.rollouts.push(JSON.parse(line)); } catch (e) { /* skip a damaged line */ }
          }
        }
        const t = await fetchText('/api/trace?run=' + run.id + '&key=' + encodeURIComponent(run.traceKey));
        if (t.status === 200) {
          try { run.trace = JSON.parse(t.text); run.traceKey = t.headers.get('X-Trace-Key') || ''; } catch (e) { /* being rewritten */ }
        }
      } catch (e) {
        run.status = 'unreachable';
      }
    }
    state.polls++;
    render();
    document.getElementById('updated').textContent = 'updated ' + new Date().toLocaleTimeString();
    document.body.setAttribute('data-polls', String(state.polls));
  }
  async function startLive() {
    document.getElementById('mode').textContent = 'live (read-only)';
    const res = await fetch('/api/runs', { cache: 'no-store' });
    for (const meta of await res.json()) state.runs.push(newRun(meta));
    await poll();
    document.body.setAttribute('data-ready', '1');
    (async function loop() {
      await new Promise((ok) => setTimeout(ok, 1000));
      await poll();
      loop();
    })();
  }
  function startStatic() {
    document.getElementById('mode').textContent = 'report, generated ' + STATIC.generated;
    STATIC.runs.forEach((meta, i) => {
      const run = newRun({ id: i, name: meta.name, dir: meta.dir });
      ingest(run, meta.metrics || '');
      run.log = meta.log || '';
      if (meta.trace) { try { run.trace = JSON.parse(meta.trace); } catch (e) { /* ignore */ } }
      run.status = run.end ? 'finished' : 'partial';
      state.runs.push(run);
    });
    state.polls = 1;
    render();
    document.body.setAttribute('data-ready', '1');
  }

  document.getElementById('xaxis').addEventListener('change', (ev) => { state.xaxis = ev.target.value; render(); });
  document.getElementById('focus').addEventListener('change', (ev) => { state.focus = Number(ev.target.value); render(); });
  if (STATIC) startStatic(); else startLive();
})();
