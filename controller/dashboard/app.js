// jetrl dashboard: polls the controller's JSON endpoints and draws uPlot charts (vendored, no CDN).
"use strict";

const POLL_MS = 2000;
const COLORS = ["#1a73e8", "#e8711a", "#1f8a4c", "#b3261e", "#7b1fa2", "#00838f", "#6d4c41", "#c2185b", "#827717"];
const state = { run: new URLSearchParams(location.search).get("run"), charts: {}, queueHistory: [],
                statsRun: null, statsAt: 0, diagRun: null, diagAt: 0 };
const STATS_MS = 10000;
const DIAG_MS = 5000;  // the diagnosis asks the weight store and NATS too: every few polls  // the prompt-memory view reads every observation of the run: not every poll

// The controller's token comes in the URL fragment (/#token=...), which browsers never send to a server
// nor write to its logs; it is kept for this tab only (sessionStorage) and sent as a bearer token.
function controllerToken() {
  const m = /(?:^|[#&])token=([^&]+)/.exec(location.hash);
  if (m) {
    sessionStorage.setItem("jetrl-token", decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }
  return sessionStorage.getItem("jetrl-token") || "";
}
const TOKEN = controllerToken();

async function getJSON(path) {
  const headers = TOKEN ? { Authorization: "Bearer " + TOKEN } : {};
  const r = await fetch(path, { cache: "no-store", headers });
  if (r.status === 401) throw new Error("the controller needs its token: open this page as /#token=<controller.token>");
  if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
  return r.json();
}

function el(tag, attrs = {}, text = "") {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== "") e.textContent = text;
  return e;
}

function badge(id, label, cls) {
  const b = document.getElementById(id);
  b.textContent = label;
  b.className = "badge " + cls;
}

// Draw (or redraw) one chart. `xs` is shared by all series; `series` = [{label, values}].
function chart(id, xs, series, opts = {}) {
  const box = document.getElementById(id);
  const points = xs.length;
  box.dataset.points = String(points);
  box.dataset.series = series.map((s) => s.label).join(",");
  const key = id + "|" + box.dataset.series + "|" + (opts.bars ? "b" : opts.stacked ? "s" : "l");
  const data = [xs, ...series.map((s) => s.values)];
  const old = state.charts[id];
  if (old && old.key === key) {
    old.plot.setData(data);
    return;
  }
  if (old) old.plot.destroy();
  box.textContent = "";
  if (!points) {
    box.appendChild(el("div", { class: "empty" }, opts.empty || "no data yet"));
    delete state.charts[id];
    return;
  }
  const width = Math.max(320, box.clientWidth || 520);
  const plot = new uPlot({
    width, height: 220,
    scales: opts.bars
      ? { x: { time: false, range: (u, lo, hi) => [lo - 0.5, hi + 0.5] },
          y: { range: (u, lo, hi) => [0, hi > 0 ? hi * 1.1 : 1] } }
      : { x: { time: !!opts.time } },
    axes: [opts.bars ? { label: opts.xlabel || "", incrs: [1, 2, 5, 10, 20, 50] } : { label: opts.xlabel || "" }, {}],
    series: [{ label: opts.xlabel || "x" }, ...series.map((s, i) => ({
      label: s.label, stroke: COLORS[i % COLORS.length], width: 2,
      fill: opts.bars || opts.stacked ? COLORS[i % COLORS.length] + (opts.stacked ? "cc" : "88") : undefined,
      paths: opts.bars ? uPlot.paths.bars({ size: [0.6, 60] }) : undefined,
      points: { show: points < 60 },
    }))],
  }, data, box);
  state.charts[id] = { key, plot };
}

// Merge {name: [[x, y], ...]} series onto one sorted x axis.
function merge(seriesMap, names) {
  const xsSet = new Set();
  for (const n of names) for (const [x] of seriesMap[n]) xsSet.add(x);
  const xs = [...xsSet].sort((a, b) => a - b);
  const index = new Map(xs.map((x, i) => [x, i]));
  const series = names.map((n) => {
    const values = new Array(xs.length).fill(null);
    for (const [x, y] of seriesMap[n]) values[index.get(x)] = y;
    return { label: n, values };
  });
  return { xs, series };
}

function renderRuns(runs) {
  const tbody = document.querySelector("#runs tbody");
  tbody.textContent = "";
  if (!runs.length) {
    tbody.appendChild(el("tr")).appendChild(el("td", { colspan: 10, class: "empty" }, "no runs yet: POST /v1/runs"));
    return;
  }
  if (!state.run || !runs.some((r) => r.id === state.run)) state.run = runs[runs.length - 1].id;
  for (const r of runs) {
    const l = r.ledger;
    const tr = el("tr", { class: "run" + (r.id === state.run ? " selected" : ""), "data-run": r.id });
    for (const v of [r.id, r.status, r.current_version < 0 ? "none yet" : r.current_version, l.released, l.in_flight, l.trained, l.dropped_stale,
                     l.filtered, l.dead_lettered, r.admission_bound]) tr.appendChild(el("td", {}, String(v)));
    tr.onclick = () => { state.run = r.id; state.queueHistory = []; refresh(); };
    tbody.appendChild(tr);
  }
  document.getElementById("run-name").textContent = "(" + state.run + ")";
}

function renderHealth(h) {
  badge("nats-badge", "nats " + h.nats, h.nats === "connected" ? "ok" : "warn");
  badge("db-badge", "db " + (h.database === "ok" ? "ok" : "error"), h.database === "ok" ? "ok" : "bad");
  const tbody = document.querySelector("#health tbody");
  tbody.textContent = "";
  if (!h.services.length) {
    tbody.appendChild(el("tr")).appendChild(el("td", { colspan: 5, class: "empty" }, "no service has reported yet"));
    return;
  }
  for (const s of h.services) {
    const tr = el("tr");
    tr.appendChild(el("td", {}, s.run));
    tr.appendChild(el("td", {}, s.service));
    tr.appendChild(el("td", {}, s.instance));
    const st = el("td");
    st.appendChild(el("span", { class: "badge " + (s.alive ? "ok" : "bad") }, s.alive ? s.status : "silent"));
    tr.appendChild(st);
    tr.appendChild(el("td", {}, s.age_s.toFixed(1) + " s ago"));
    tbody.appendChild(tr);
  }
}

function renderMetrics(m) {
  const rewardNames = Object.keys(m).filter((n) => /\.(reward_mean|accuracy|reward|acc)$|^trainer\.reward_(criterion|pairwise)\//.test(n)).sort();
  const r = merge(m, rewardNames);
  chart("chart-reward", r.xs, r.series, { xlabel: "version", empty: "no trainer steps yet" });
  const tpNames = Object.keys(m).filter((n) => /tokens_per_s$/.test(n)).sort();
  const t = merge(m, tpNames.filter((n) => n.startsWith("trainer.")));
  chart("chart-throughput", t.xs, t.series, { xlabel: "version", empty: "no throughput reported yet" });
  const sigNames = Object.keys(m).filter((n) => /^trainer\.(groups_with_signal|samples_drawn|samples_trained)$/.test(n)).sort();
  const g = merge(m, sigNames);
  chart("chart-signal", g.xs, g.series, { xlabel: "version", empty: "no signal counts reported yet" });
}

// The trainer's "no_signal" report of the selected run (GET /v1/runs: run.signal), as a banner.
function renderSignal(runs) {
  const banner = document.getElementById("signal-banner");
  const r = runs.find((x) => x.id === state.run);
  const sig = r && r.signal;
  if (sig && sig.no_signal) {
    banner.textContent = `No learning signal in run ${r.id} since step ${sig.since_step}` +
                         (sig.message ? ": " + sig.message : "");
    banner.dataset.run = r.id;
    banner.hidden = false;
  } else {
    banner.textContent = "";
    banner.hidden = true;
  }
}

// GET /v1/runs/{run}/diagnosis (`jetrl why`): the run's state and summary, then each finding with what to do.
// Text only (textContent): the findings quote the services' error messages.
function renderDiagnosis(d) {
  const box = document.getElementById("diagnosis");
  box.replaceChildren();
  box.dataset.state = d.state;
  const head = document.createElement("div");
  head.className = "summary";
  head.textContent = `Run ${d.run}: ${d.summary}`;
  box.appendChild(head);
  for (const f of d.findings) {
    const row = document.createElement("div");
    row.className = "finding";
    row.dataset.cause = f.cause;
    row.dataset.severity = f.severity;
    row.textContent = `[${f.cause}] ${f.summary}`;
    const act = document.createElement("div");
    act.className = "action";
    act.textContent = "what to do: " + f.action;
    row.appendChild(act);
    box.appendChild(row);
  }
  box.hidden = false;
}

// GET /v1/runs/{run}/prompts/stats: per version bucket, the share of prompts at each solve rate (exactly 0,
// the ten bins between, exactly 1), one line per bucket (the last six); the classes; the most sampled prompts.
function renderPromptStats(st) {
  const h = st.histogram;
  const bins = h.counts.map((_, i) => (h.edges[i] + h.edges[i + 1]) / 2);
  const buckets = st.by_version.filter((b) => b.prompts > 0).slice(-6);
  const xs = buckets.length ? [0, ...bins, 1] : [];
  const series = buckets.map((b) => ({
    label: b.versions[0] === b.versions[1] ? "v" + b.versions[0] : "v" + b.versions[0] + "-" + b.versions[1],
    values: [b.histogram.zero, ...b.histogram.counts, b.histogram.one].map((n) => n / b.prompts),
  }));
  chart("chart-solve", xs, series, { xlabel: "solve rate", empty: "no prompts observed yet" });
  const kv = document.getElementById("prompt-classes");
  kv.textContent = "";
  const rows = [["prompts observed", st.prompts_observed], ["samples drawn", st.samples_drawn],
                ["groups with signal", st.groups_with_signal + " of " + st.groups_observed],
                ["filtered for no signal", st.filtered.no_signal]];
  for (const [k, v] of Object.entries(st.classes)) rows.push([k.replace("_", " "), v]);
  for (const [k, v] of rows) {
    kv.appendChild(el("span", {}, k));
    kv.appendChild(el("span", { "data-stat": k }, String(v)));
  }
  const tbody = document.querySelector("#prompt-top tbody");
  tbody.textContent = "";
  for (const p of st.top.slice(0, 8)) {
    const tr = el("tr", { "data-prompt": p.prompt_id });
    for (const v of [p.prompt_id, p.sampled, p.solve_rate.toFixed(2), p.class]) tr.appendChild(el("td", {}, String(v)));
    tbody.appendChild(tr);
  }
}

function renderStaleness(hist) {
  const xs = Object.keys(hist).map(Number).sort((a, b) => a - b);
  chart("chart-staleness", xs, [{ label: "samples", values: xs.map((x) => hist[String(x)]) }],
        { bars: true, xlabel: "staleness (versions)", empty: "no trained samples yet" });
}

// Stacked: each series is the running sum of the stages up to it, drawn biggest first so each band shows.
function renderTimings(t) {
  const stages = Object.keys(t.trainer || {}).filter((k) => t.trainer[k].some((v) => v > 0));
  const box = document.getElementById("chart-timings");
  box.dataset.stages = stages.join(",");
  box.dataset.totals = JSON.stringify(t.totals ? t.totals.trainer : {});
  let run = t.versions.map(() => 0);
  const cum = stages.map((k) => {
    run = run.map((acc, i) => acc + (t.trainer[k][i] || 0));
    return { label: k, values: run.slice() };
  });
  chart("chart-timings", t.versions, cum.reverse(), { xlabel: "version", stacked: true, empty: "no trainer steps yet" });
  const kv = document.getElementById("timings-rollout");
  kv.textContent = "";
  const tot = t.totals || {};
  for (const [side, vals] of [["rollout", tot.rollout || {}], ["weights", tot.weights || {}]]) {
    for (const [k, v] of Object.entries(vals)) {
      kv.appendChild(el("span", {}, side + " " + k + " (mean s)"));
      kv.appendChild(el("span", { "data-stage": side + "." + k }, v == null ? "-" : v.toFixed(3)));
    }
  }
}

function renderQueues(q) {
  const box = document.getElementById("queues");
  box.textContent = "";
  const pick = (o, k) => (o && typeof o === "object" && o[k] != null ? o[k] : null);
  const row = { t: Date.now() / 1000, prompts: pick(q.prompts, "pending") ?? q.prompts_in_stream,
                generating: pick(q.prompts, "ack_pending"), trajectories: pick(q.trajectories, "pending") };
  for (const [k, v] of [["prompts waiting", row.prompts], ["prompts being generated", row.generating],
                        ["trajectories waiting", row.trajectories], ["dead letters", q.dead_letters_in_stream]]) {
    box.appendChild(el("span", {}, k));
    box.appendChild(el("span", {}, v == null ? "-" : String(v)));
  }
  state.queueHistory.push(row);
  if (state.queueHistory.length > 300) state.queueHistory.shift();
  const h = state.queueHistory;
  chart("chart-queues", h.map((r) => r.t), [
    { label: "prompts waiting", values: h.map((r) => r.prompts) },
    { label: "trajectories waiting", values: h.map((r) => r.trajectories) },
  ], { time: true, xlabel: "time" });
}

// Rollout viewer: GET /v1/runs/{run}/rollouts pages the TRAJECTORIES stream newest first (cursor = before).
const viewer = { run: null, before: null };

function viewerParams(before) {
  const p = new URLSearchParams({ limit: "10" });
  for (const [id, key] of [["viewer-version", "version"], ["viewer-prompt", "prompt"], ["viewer-min", "min_reward"],
                           ["viewer-max", "max_reward"]]) {
    const v = document.getElementById(id).value.trim();
    if (v !== "") p.set(key, v);
  }
  if (before) p.set("before", String(before));
  return p;
}

function renderGroup(g) {
  const box = el("div", { class: "group", "data-group": g.group_id, "data-seq": String(g.seq) });
  box.appendChild(el("div", { class: "group-head" },
    `${g.group_id} · version ${g.version} · worker ${g.worker || "-"} · stream seq ${g.seq}`));
  for (const s of g.samples) {
    const line = el("div", { class: "sample", "data-reward": String(s.reward) });
    line.appendChild(el("span", { class: "reward" }, s.reward.toFixed(2)));
    line.appendChild(el("span", { class: "seg-prompt" }, s.prompt == null ? `[${s.prompt_len} prompt tokens]` : s.prompt));
    for (const seg of s.segments) {
      const text = seg.text != null ? seg.text : "[" + (seg.ids || []).join(" ") + "]";
      const attrs = { class: "seg-" + seg.kind, "data-kind": seg.kind, "data-version": String(seg.version) };
      if (seg.kind === "policy") attrs.title = "sampled by version " + seg.version;
      else attrs.title = "environment / tool tokens (loss mask 0)";
      line.appendChild(el("span", attrs, text));
    }
    line.appendChild(el("span", { class: "group-head" }, "  (" + s.finish_reason + ")"));
    box.appendChild(line);
  }
  return box;
}

async function loadRollouts(more) {
  if (!state.run) return;
  const box = document.getElementById("viewer");
  const status = document.getElementById("viewer-status");
  const page = await getJSON("/v1/runs/" + encodeURIComponent(state.run) + "/rollouts?" +
                             viewerParams(more ? viewer.before : null));
  if (!more) box.textContent = "";
  for (const g of page.items) box.appendChild(renderGroup(g));
  if (!box.children.length) box.appendChild(el("div", { class: "empty" }, "no trajectories match"));
  viewer.run = state.run;
  viewer.before = page.next_before;
  document.getElementById("viewer-older").disabled = !page.next_before;
  box.dataset.groups = String(box.querySelectorAll(".group").length);
  status.textContent = `${page.items.length} groups from ${page.scanned} messages read` +
                       (page.exhausted ? " (start of the stream)" : "");
}

document.getElementById("viewer-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  loadRollouts(false).catch((e) => { document.getElementById("viewer-status").textContent = e.message; });
});
document.getElementById("viewer-older").addEventListener("click", () => {
  loadRollouts(true).catch((e) => { document.getElementById("viewer-status").textContent = e.message; });
});

async function refresh() {
  try {
    const [health, runs] = await Promise.all([getJSON("/v1/health"), getJSON("/v1/runs")]);
    renderHealth(health);
    renderRuns(runs);
    renderSignal(runs);
    if (state.run) {
      const base = "/v1/runs/" + encodeURIComponent(state.run);
      const [m, hist, q, tm] = await Promise.all([getJSON(base + "/metrics"), getJSON(base + "/staleness"),
                                                  getJSON(base + "/queues"), getJSON(base + "/timings?last=500")]);
      renderMetrics(m);
      renderStaleness(hist);
      renderQueues(q);
      renderTimings(tm);
      if (state.statsRun !== state.run || Date.now() - state.statsAt > STATS_MS) {
        renderPromptStats(await getJSON(base + "/prompts/stats?limit=8"));
        state.statsRun = state.run;
        state.statsAt = Date.now();
      }
      if (state.diagRun !== state.run || Date.now() - state.diagAt > DIAG_MS) {
        renderDiagnosis(await getJSON(base + "/diagnosis"));
        state.diagRun = state.run;
        state.diagAt = Date.now();
      }
      if (viewer.run !== state.run) await loadRollouts(false);  // once per run; then on search / older
    }
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
    document.body.dataset.loaded = "1";
  } catch (err) {
    document.getElementById("updated").textContent = "error: " + err.message;
  }
}

refresh();
setInterval(refresh, POLL_MS);
