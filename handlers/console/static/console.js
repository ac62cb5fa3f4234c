// The console's page: one env at a time (the switcher), its live events, jobs and each
// job's page (timeline, world size and throughput charts), its experiments and each
// experiment's page (learning curves, rungs, best trial, decisions), the A/B results, the
// dead letters, the config documents, the envs and tokens; actions where the env's token
// allows them (the server lists them in whoami: a read-only token gets none).
// Tokens are kept per env in sessionStorage; a token given as #token=... goes to the env
// written in it. Nothing here is fetched from outside this console.
"use strict";

const MAX_ROWS = 500;
const REFRESH_MS = 2000;
const home = document.body.dataset.home;
const state = {
  env: home, view: "overview", job: null, tokens: {}, me: null, controller: null,
  received: 0, skipped: 0, charts: {}, jobName: null, envs: [],
  experiment: null, curves: null, curvesKey: "",
};

const $ = (id) => document.getElementById(id);
function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = text;
  if (cls) e.className = cls;
  return e;
}
function cell(tr, text, cls, title) {
  const td = el("td", text, cls);
  if (title) td.title = title;
  tr.append(td);
  return td;
}
const enc = encodeURIComponent;
// Times in UTC, as `tail` prints them.
const clock = (iso, ms) => {
  const t = iso ? new Date(iso) : null;
  return t && !isNaN(t) ? t.toISOString().slice(11, ms ? 23 : 19) : "";
};
const hhmmss = (iso) => clock(iso, false);
const num = (v, digits = 3) =>
  (v === null || v === undefined || !isFinite(v) ? "-" : String(parseFloat((+v).toPrecision(digits))));
const tokenEnv = (t) => { const m = /^dle\.([a-z][a-z0-9-]{0,30})\./.exec(t || ""); return m ? m[1] : null; };

// --- tokens and the URL -------------------------------------------------------------
function loadTokens() {
  try { state.tokens = JSON.parse(sessionStorage.getItem("dle-tokens") || "{}"); }
  catch (e) { state.tokens = {}; }
}
function saveTokens() { sessionStorage.setItem("dle-tokens", JSON.stringify(state.tokens)); }
function readHash() {
  const q = new URLSearchParams(location.hash.slice(1));
  const token = q.get("token");
  if (token) {
    const env = tokenEnv(token) || q.get("env") || state.env;
    state.tokens[env] = token; saveTokens();
    if (!q.get("env")) q.set("env", env);
    q.delete("token");
  }
  state.env = q.get("env") || state.env;
  state.view = q.get("view") || "overview";
  state.job = q.get("job");
  state.experiment = q.get("experiment");
  if (token) history.replaceState(null, "", "#" + q);
  return !!token;
}
function writeHash() {
  const q = new URLSearchParams({env: state.env, view: state.view});
  if (state.job) q.set("job", state.job);
  if (state.experiment) q.set("experiment", state.experiment);
  history.replaceState(null, "", "#" + q);
}
function auth(env) { return {Authorization: "Bearer " + (state.tokens[env || state.env] || "")}; }

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}
async function call(method, path, body, env) {
  const opts = {method, headers: auth(env)};
  if (body !== undefined) {
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  const r = await fetch(path, opts);
  let data = null;
  try { data = await r.json(); } catch (e) { data = null; }
  if (!r.ok) {
    const msg = data && data.error ? (data.error.message || data.error) : "HTTP " + r.status;
    throw new ApiError(r.status, msg);
  }
  return data;
}
const envPath = (path, env) => "v1/envs/" + enc(env || state.env) + path;
const get = (path) => call("GET", envPath(path));

// --- opening an env -----------------------------------------------------------------
function setStatus(text, live) {
  const s = $("status"); s.textContent = text; s.classList.toggle("live", !!live);
}
function showCounts() {
  $("counts").textContent = state.received + " events" +
    (state.skipped ? ", " + state.skipped + " skipped (slow page)" : "");
}
function showLogin(env, why) {
  if (state.controller) state.controller.abort();
  $("main").hidden = true; $("tabs").hidden = true; $("login").hidden = false;
  $("login-env").textContent = env; $("login-why").textContent = why || "";
  $("mode").textContent = ""; $("scope").textContent = "";
  setStatus("token needed", false);
}
async function openEnv() {
  writeHash();
  setStatus("opening", false); $("scope").textContent = "";
  document.querySelectorAll(".env-name").forEach((e) => { e.textContent = state.env; });
  if (!state.tokens[state.env]) { showLogin(state.env); return; }
  try {
    state.me = await get("/whoami");
  } catch (e) {
    if (e.status === 401 || e.status === 403) {
      delete state.tokens[state.env]; saveTokens();
      showLogin(state.env, e.message); return;
    }
    setStatus("cannot open: " + e.message, false); return;
  }
  $("login").hidden = true; $("main").hidden = false; $("tabs").hidden = false;
  const mode = $("mode"); mode.textContent = state.me.mode; mode.className = "badge " + state.me.mode;
  const scope = $("scope"); scope.textContent = state.me.admin ? "admin" : "read only";
  scope.className = "badge" + (state.me.admin ? " admin" : "");
  refreshEnvList();
  tail();
  showView(state.view);
}
async function refreshEnvList() {
  try {
    const body = await call("GET", "v1/envs");
    state.envs = body.envs;
    const sw = body.last_switch;
    $("last-switch").textContent = sw
      ? "Last switch: " + sw.at.slice(0, 19).replace("T", " ") + ", " + sw.to + " became the real env" +
        (sw.from ? " (was " + sw.from + ")" : "") + ": " + (sw.reason || "no reason given")
      : "Last switch: none yet";
    const sel = $("env-select");
    const names = body.envs.map((e) => e.name);
    if (!names.includes(state.env)) names.push(state.env);
    sel.replaceChildren(...names.map((n) => {
      const o = el("option", n + (state.tokens[n] ? "" : " (token needed)")); o.value = n; return o;
    }));
    sel.value = state.env;
  } catch (e) { /* the next open tries again */ }
}
function switchEnv(env) {
  if (env === state.env) return;
  state.env = env; state.job = null; state.experiment = null; dropCurves();
  if (state.view === "job") state.view = "overview";
  if (state.view === "experiment") state.view = "experiments";
  state.received = 0; state.skipped = 0; showCounts();
  for (const c of Object.values(state.charts)) c.destroy();
  state.charts = {};
  $("events").replaceChildren(); $("jobs").replaceChildren();
  openEnv();
}

// --- views --------------------------------------------------------------------------
const REFRESH = {
  overview: () => refreshJobs(), job: () => refreshJob(), ab: () => refreshAB(),
  dlq: () => refreshDLQ(), configs: () => refreshConfigs(), envs: () => refreshEnvs(),
  experiments: () => refreshExperiments(), experiment: () => refreshExperiment(),
};
function showView(view) {
  if (!REFRESH[view] || (view === "job" && !state.job)) view = "overview";
  if (view === "experiment" && !state.experiment) view = "experiments";
  state.view = view; writeHash();
  for (const name of Object.keys(REFRESH)) $("view-" + name).hidden = name !== view;
  for (const a of document.querySelectorAll("#tabs a")) a.classList.toggle("on", a.dataset.view === view);
  $("tab-job").hidden = !state.job;
  $("tab-experiment").hidden = !state.experiment;
  REFRESH[view]();
}
let ticks = 0;
setInterval(() => {
  if ($("main").hidden) return;
  if (["overview", "job", "dlq", "experiments", "experiment"].includes(state.view)) REFRESH[state.view]();
  if (++ticks % 5 === 0) refreshEnvList();  // envs come and go
}, REFRESH_MS);

// --- live events --------------------------------------------------------------------
function addEvent(d) {
  const tr = el("tr"); tr.className = "event";
  tr.dataset.job = d.job || ""; tr.dataset.type = d.type || ""; tr.dataset.id = d.id || "";
  cell(tr, clock(d.at, true), "muted", d.at);
  cell(tr, d.topic, "", d.topic);
  cell(tr, d.type || "unreadable", (d.type || "").endsWith("oom") ? "oom" : "", d.type);
  cell(tr, d.job || "-", "", d.job);
  const what = cell(tr, d.summary || d.error || "", "summary");
  if (d.type === "eval.report") what.append(el("span", "", "repeat"));
  const body = $("events");
  body.prepend(tr);
  while (body.rows.length > MAX_ROWS) body.deleteRow(body.rows.length - 1);
  state.received++; showCounts(); soonJobs();
}
function repeated(d) {
  const sel = `#events tr.event[data-type="eval.report"][data-job="${CSS.escape(d.evaluator)}"]`;
  const row = document.querySelector(sel);
  if (row) row.querySelector(".repeat").textContent =
    "same values " + d.repeats + "\u00d7 more, last " + hhmmss(d.at);
}
let jobsTimer = null;
function soonJobs() {
  // A new event may change the jobs table: refresh it shortly, once per burst.
  if (jobsTimer === null) jobsTimer = setTimeout(() => {
    jobsTimer = null; if (state.view === "overview") refreshJobs();
  }, 300);
}
function handle(block) {
  let name = "message", data = "";
  for (const line of block.split("\n")) {
    if (line.startsWith("event:")) name = line.slice(6).trim();
    else if (line.startsWith("data:")) data += line.slice(5).trim();
  }
  if (!data) return;
  const d = JSON.parse(data);
  if (name === "ready") setStatus("live", true);
  else if (name === "dropped") { state.skipped = d.dropped; showCounts(); }
  else if (name === "line") addEvent(d);
  else if (name === "repeat") repeated(d);
}
async function tail() {
  if (state.controller) state.controller.abort();
  const mine = state.controller = new AbortController();
  const env = state.env;
  const q = new URLSearchParams();
  const job = $("job").value.trim(), type = $("type").value.trim();
  if (job) q.set("job", job);
  if (type) q.set("type", type);
  for (const o of $("topics").selectedOptions) q.append("topic", o.value);
  q.set("backlog", "50");
  $("events").replaceChildren();
  state.received = 0; state.skipped = 0; showCounts();
  while (!mine.signal.aborted) {
    setStatus("connecting", false);
    try {
      const r = await fetch(envPath("/events?" + q, env), {headers: auth(env), signal: mine.signal});
      if (r.status === 401 || r.status === 403) {
        delete state.tokens[env]; saveTokens(); showLogin(env, (await r.json()).error.message); return;
      }
      if (!r.ok) throw new Error("HTTP " + r.status);
      const reader = r.body.getReader(), dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const {value, done} = await reader.read();
        if (done) break;
        buf += dec.decode(value, {stream: true});
        let i;
        while ((i = buf.indexOf("\n\n")) >= 0) { handle(buf.slice(0, i)); buf = buf.slice(i + 2); }
      }
    } catch (e) {
      if (mine.signal.aborted) return;
    }
    setStatus("reconnecting", false);
    await new Promise((res) => setTimeout(res, 1000));
  }
}

// --- jobs ---------------------------------------------------------------------------
function jobLink(j) {
  const a = el("a", j.name && j.name !== j.job ? j.name : j.job, "job-link");
  a.href = "#" + new URLSearchParams({env: state.env, view: "job", job: j.job});
  a.title = j.job;
  a.addEventListener("click", (ev) => { ev.preventDefault(); openJob(j.job); });
  return a;
}
function progress(j) {
  if (j.global_step === null) return "";
  return "step " + j.global_step + ", " + num(j.speed) + " steps/s, " + num(j.samples_per_s, 4) +
    " samples/s" + (j.world_size ? ", world " + j.world_size : "");
}
async function refreshJobs() {
  let body;
  try { body = await get("/jobs"); } catch (e) { return; }
  $("jobs").replaceChildren(...body.jobs.map((j) => {
    const tr = el("tr"); tr.dataset.job = j.job; tr.dataset.name = j.name || "";
    const td = cell(tr, ""); td.append(jobLink(j));
    cell(tr, j.status + (j.ooms ? " \u00b7 " + j.ooms + " OOM" : ""), j.ooms ? "oom" : "");
    cell(tr, j.resources_text, "summary");
    cell(tr, [progress(j), j.usage_text].filter(Boolean).join("; "), "summary");
    cell(tr, j.last_plan ? "[" + j.last_plan.optimizer + "] " + j.last_plan.reason : "", "summary");
    cell(tr, j.last_scale ? j.last_scale.status : "", j.last_scale ? j.last_scale.status : "",
      j.last_scale ? j.last_scale.plan_id : "");
    return tr;
  }));
  $("reports").replaceChildren(...body.reports.map((rep) => {
    const tr = el("tr"); tr.dataset.evaluator = rep.evaluator;
    cell(tr, rep.evaluator); cell(tr, hhmmss(rep.occurred_at)); cell(tr, String(rep.jobs));
    cell(tr, Object.entries(rep.metrics).map(([k, v]) => k + "=" + num(v, 4)).join(" "), "summary");
    cell(tr, rep.repeats ? rep.repeats + "\u00d7 unchanged, last " + hhmmss(rep.last_at) : "", "muted");
    return tr;
  }));
}
function openJob(job) {
  if (state.job !== job) {
    for (const c of Object.values(state.charts)) c.destroy();
    state.charts = {};
    $("timeline").replaceChildren(); $("action-result").textContent = "";
    $("action-form").hidden = true;
  }
  state.job = job; showView("job");
}
function chart(key, holder, opts, data) {
  if (typeof uPlot === "undefined") { holder.textContent = "charts unavailable"; return; }
  const width = Math.max(holder.clientWidth, 300);
  if (!data[0].length) { holder.textContent = "no runtime samples yet"; return; }
  if (!state.charts[key]) {
    holder.replaceChildren();
    // times in UTC, as everywhere on the page
    const tzDate = (ts) => uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC");
    state.charts[key] = new uPlot({width, height: 200, tzDate, ...opts}, data, holder);
  } else {
    state.charts[key].setData(data);
  }
}
async function refreshJob() {
  if (!state.job) return;
  let j;
  try { j = await get("/jobs/" + enc(state.job)); }
  catch (e) { $("job-facts").textContent = e.message; return; }
  state.jobName = j.name || j.job;
  $("job-title").textContent = state.jobName + (j.name && j.name !== j.job ? " (" + j.job + ")" : "");
  $("job-facts").textContent = [j.status, j.resources_text, progress(j), j.usage_text]
    .filter(Boolean).join(" \u00b7 ");
  renderJobActions();
  const s = j.series;
  chart("world", $("chart-world"), {
    scales: {x: {time: true}},
    series: [{}, {label: "world size", stroke: "#2563eb", width: 2,
                  paths: typeof uPlot !== "undefined" ? uPlot.paths.stepped({align: 1}) : undefined}],
    axes: [{}, {label: "processes"}],
  }, [s.t, s.world_size]);
  chart("speed", $("chart-speed"), {
    scales: {x: {time: true}},
    series: [{}, {label: "steps/s", stroke: "#1b7f3b", width: 2, scale: "steps"},
             {label: "samples/s", stroke: "#b45309", width: 2, scale: "samples"}],
    axes: [{}, {scale: "steps", label: "steps/s"},
           {scale: "samples", label: "samples/s", side: 1, grid: {show: false}}],
  }, [s.t, s.speed, s.samples_per_s]);
  $("timeline").replaceChildren(...j.timeline.slice().reverse().map((e) => {
    const tr = el("tr"); tr.className = "entry";
    tr.dataset.type = e.type; tr.dataset.plan = e.plan_id || ""; tr.dataset.source = e.source || "";
    tr.dataset.status = e.status || "";
    cell(tr, hhmmss(e.at), "muted", e.at);
    cell(tr, e.type + (e.status ? " " + e.status : ""), e.status || "", e.type);
    cell(tr, e.source || "", "", e.source);
    const what = cell(tr, e.text, "summary", e.plan_id || "");
    if (e.again) {
      tr.dataset.again = e.again;
      what.append(el("span", "the same plan " + e.again + "\u00d7 more, last " + hhmmss(e.last_at), "repeat"));
    }
    return tr;
  }));
}
function jobActions() { return (state.me && state.me.actions || []).filter((a) => a.kind === "job"); }
function renderJobActions() {
  const box = $("job-actions");
  const actions = jobActions();
  if (box.dataset.for === state.job + "/" + actions.length) return;
  box.dataset.for = state.job + "/" + actions.length;
  box.replaceChildren(...actions.map((a) => {
    const b = el("button", a.label, "action" + (a.method === "DELETE" ? " danger" : ""));
    b.type = "button"; b.dataset.action = a.name;
    b.addEventListener("click", () => startAction(a));
    return b;
  }));
}
function startAction(a) {
  if (!a.fields.length) { runAction(a, {}); return; }
  $("action-fields").replaceChildren(...a.fields.map((f) => {
    const label = el("label", f.name + " ");
    const input = el("input"); input.name = f.name; input.type = f.type;
    if (f.default !== undefined) input.value = f.default;
    if (f.min !== undefined) input.min = f.min;
    input.required = true; input.size = 8;
    label.append(input);
    return label;
  }));
  const form = $("action-form");
  form.dataset.action = a.name; form.hidden = false;
  form.querySelector("input").focus();
}
async function runAction(a, values) {
  const name = state.jobName || state.job;
  if (a.confirm && !confirm(a.confirm.replace("{job}", name))) return;
  const out = $("action-result");
  out.className = "muted"; out.textContent = a.label + "\u2026";
  try {
    const body = a.method === "DELETE" ? undefined : values;
    const done = await call(a.method, envPath("/jobs/" + enc(name) + a.path), body);
    out.className = "applied";
    // an action that publishes a plan (scale, suspend, resume) says which
    out.textContent = done.plan_id
      ? "plan " + done.plan_id + " published" +
        (done.replicas ? ": " + done.role + " \u2192 " + done.replicas + " replicas" : "") +
        "; the operator's answer shows in the timeline"
      : a.label + " done";
    $("action-form").hidden = true;
    refreshJob();
  } catch (e) {
    out.className = "error"; out.textContent = a.label + " refused: " + e.message;
  }
}
$("action-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const a = jobActions().find((x) => x.name === ev.target.dataset.action);
  if (!a) return;
  const values = {};
  for (const f of a.fields) {
    const v = ev.target.querySelector(`input[name="${f.name}"]`).value;
    values[f.name] = f.type === "number" ? Number(v) : v;
  }
  runAction(a, values);
});
$("action-cancel").addEventListener("click", () => { $("action-form").hidden = true; });

// --- experiments --------------------------------------------------------------------
function experimentLink(name) {
  const a = el("a", name, "job-link");
  a.href = "#" + new URLSearchParams({env: state.env, view: "experiment", experiment: name});
  a.addEventListener("click", (ev) => { ev.preventDefault(); openExperiment(name); });
  return a;
}
async function refreshExperiments() {
  let body;
  try { body = await get("/experiments"); }
  catch (e) { $("experiments-count").textContent = e.message; return; }
  $("experiments-count").textContent = "(" + body.experiments.length + ")";
  $("experiments").replaceChildren(...body.experiments.map((x) => {
    const tr = el("tr"); tr.dataset.experiment = x.name; tr.dataset.status = x.status;
    cell(tr, "").append(experimentLink(x.name));
    cell(tr, x.status, statusClass(x.status), x.status_reason);
    cell(tr, x.searcher || "");
    cell(tr, x.metric ? x.metric + (x.smaller_is_better ? " \u2193" : " \u2191") : "");
    cell(tr, String(x.trials) + (x.max_trials ? " / " + x.max_trials : ""));
    cell(tr, x.best_trial === null ? "" : "trial " + x.best_trial);
    cell(tr, num(x.best_value, 5));
    cell(tr, (x.submitted_at || "").slice(0, 19).replace("T", " "), "muted");
    return tr;
  }));
}
function statusClass(status) {
  return {completed: "applied", killed: "failed", refused: "failed", paused: "partial"}[status] || "";
}
function dropCurves() {
  if (state.curves) state.curves.destroy();
  state.curves = null; state.curvesKey = "";
}
function openExperiment(name) {
  if (state.experiment !== name) {
    dropCurves();
    $("experiment-result").textContent = ""; $("experiment-actions").dataset.for = "";
    for (const id of ["trials", "decisions", "rungs", "best-trial"]) $(id).replaceChildren();
  }
  state.experiment = name; showView("experiment");
}
const PALETTE = ["#2563eb", "#b45309", "#1b7f3b", "#6d28d9", "#b42318", "#0e7490", "#a16207",
                 "#be185d", "#4d7c0f", "#475569"];
const hparamText = (h) => Object.entries(h || {}).map(([k, v]) => k + "=" +
  (typeof v === "number" ? num(v, 4) : String(v))).join(" ");
// Every trial's curve (validation metric against budget) on one budget axis, the rungs'
// budgets as dashed lines, the best trial drawn thicker.
function drawCurves(x) {
  const holder = $("chart-curves");
  const trials = Object.keys(x.curves).map(Number).sort((a, b) => a - b);
  const rungs = x.rungs.filter((r) => r.budget !== null);
  const best = x.best_trial ? x.best_trial.trial : null;
  let points = 0;
  for (const t of trials) points += x.curves[t].length;
  holder.dataset.trials = trials.join(",");
  holder.dataset.points = String(points);
  holder.dataset.rungs = rungs.map((r) => r.budget).join(",");
  holder.dataset.best = best === null ? "" : String(best);
  $("curves-what").textContent = x.metric
    ? "(" + x.metric + " at each validation, against the budget used" +
      (x.curves_of < x.trials.length ? "; the first " + x.curves_of + " trials" : "") + ")"
    : "";
  if (typeof uPlot === "undefined") { holder.textContent = "charts unavailable"; return; }
  if (!points) { dropCurves(); holder.textContent = "no validation reported yet"; return; }
  const xs = [...new Set(trials.flatMap((t) => x.curves[t].map((p) => p[0])))].sort((a, b) => a - b);
  const at = new Map(xs.map((v, i) => [v, i]));
  const data = [xs, ...trials.map((t) => {
    const ys = new Array(xs.length).fill(null);
    for (const [b, v] of x.curves[t]) ys[at.get(b)] = v;
    return ys;
  })];
  const key = trials.join(",") + "|" + holder.dataset.rungs + "|" + best;
  if (state.curves && state.curvesKey === key) { state.curves.setData(data); return; }
  dropCurves();
  holder.replaceChildren();
  const rungLines = (u) => {
    const ctx = u.ctx; ctx.save();
    ctx.strokeStyle = "#9ca3af"; ctx.fillStyle = "#6b7280"; ctx.setLineDash([6, 4]); ctx.lineWidth = 1;
    ctx.font = 11 * devicePixelRatio + "px system-ui";
    for (const r of rungs) {
      const px = u.valToPos(r.budget, "x", true);
      if (px < u.bbox.left || px > u.bbox.left + u.bbox.width) continue;
      ctx.beginPath(); ctx.moveTo(px, u.bbox.top); ctx.lineTo(px, u.bbox.top + u.bbox.height); ctx.stroke();
      ctx.fillText("rung " + r.rung, px + 3 * devicePixelRatio, u.bbox.top + 12 * devicePixelRatio);
    }
    ctx.restore();
  };
  const top = Math.max(...xs, ...rungs.map((r) => r.budget));
  state.curves = new uPlot({
    width: Math.max(holder.clientWidth, 300), height: 300,
    scales: {x: {time: false, range: [0, top * 1.05 || 1]}},
    series: [{label: "budget"}, ...trials.map((t, i) => ({
      label: "trial " + t, stroke: PALETTE[i % PALETTE.length], spanGaps: true,
      width: t === best ? 3 : 1.5, points: {show: true, size: t === best ? 6 : 4},
    }))],
    axes: [{label: "budget (" + budgetUnit(x) + ")"}, {label: x.metric || ""}],
    hooks: {draw: [rungLines]},
  }, data, holder);
  state.curvesKey = key;
}
const budgetUnit = (x) => ((x.spec || {}).searcher || {}).budget?.unit || "steps";
function experimentActions() { return envActions("experiment"); }
function renderExperimentActions(x) {
  const box = $("experiment-actions");
  const fits = {pause: x.status === "active", activate: x.status === "paused",
                kill: x.status === "active" || x.status === "paused"};
  const actions = experimentActions().filter((a) => fits[a.name]);
  const key = x.name + "/" + actions.map((a) => a.name).join(",");
  if (box.dataset.for === key) return;
  box.dataset.for = key;
  box.replaceChildren(...actions.map((a) => {
    const b = el("button", a.label, "action" + (a.name === "kill" ? " danger" : ""));
    b.type = "button"; b.dataset.action = a.name;
    b.addEventListener("click", () => runExperimentAction(a));
    return b;
  }));
}
async function runExperimentAction(a) {
  const name = state.experiment;
  if (a.confirm && !confirm(a.confirm.replace("{experiment}", name))) return;
  const out = $("experiment-result");
  out.className = "muted"; out.textContent = a.label + "\u2026";
  try {
    const done = await call("POST", envPath("/experiments/" + enc(name) + "/" + a.name),
                            {reason: a.name + " from the console"});
    out.className = "applied";
    out.textContent = a.name + " published (" + done.event_id + "); the searcher acts on it";
  } catch (e) {
    out.className = "error"; out.textContent = a.label + " refused: " + e.message;
  }
  refreshExperiment();
}
async function refreshExperiment() {
  if (!state.experiment) return;
  let x;
  try { x = await get("/experiments/" + enc(state.experiment)); }
  catch (e) { $("experiment-facts").textContent = e.message; return; }
  if (x.name !== state.experiment) return;  // another was opened meanwhile
  $("experiment-title").textContent = x.name;
  const facts = $("experiment-facts");
  facts.dataset.status = x.status;
  facts.textContent = [x.status + (x.status_reason ? " (" + x.status_reason + ")" : ""),
    "searcher " + (x.searcher || "?"),
    x.metric ? x.metric + (x.smaller_is_better ? ", smaller is better" : ", larger is better") : "",
    x.trials.length + " trials"].filter(Boolean).join(" \u00b7 ");
  renderExperimentActions(x);
  drawCurves(x);
  const best = x.best_trial;
  $("best-trial").replaceChildren(...(best ? [
    ["trial", String(best.trial)], ["value", num(best.value, 6)],
    ...Object.entries(best.hparams).map(([k, v]) => [k, typeof v === "number" ? num(v, 6) : String(v)]),
  ] : [["", "no validation reported yet"]]).map(([k, v]) => {
    const tr = el("tr"); tr.dataset.key = k; cell(tr, k, "muted"); cell(tr, v); return tr;
  }));
  $("rungs").replaceChildren(...x.rungs.map((r) => {
    const tr = el("tr"); tr.dataset.rung = r.rung;
    cell(tr, String(r.rung)); cell(tr, num(r.budget, 6)); cell(tr, r.trials.join(", "), "summary");
    return tr;
  }));
  $("trials").replaceChildren(...x.trials.map((t) => {
    const tr = el("tr"); tr.dataset.trial = t.trial; tr.dataset.status = t.status;
    if (best && best.trial === t.trial) tr.className = "best";
    cell(tr, String(t.trial)); cell(tr, t.status, statusClass(t.status));
    cell(tr, hparamText(t.hparams), "summary");
    cell(tr, num(t.budget, 6)); cell(tr, t.rung === null ? "" : String(t.rung));
    cell(tr, num(t.budget_used, 6)); cell(tr, num(t.best_value, 5)); cell(tr, num(t.last_value, 5));
    return tr;
  }));
  const told = x.trials.flatMap((t) => t.decisions.map((d) => ({...d, trial: t.trial})))
    .concat(x.decisions).sort((a, b) => b.seq - a.seq);
  $("decisions").replaceChildren(...told.map((d) => {
    const tr = el("tr"); tr.className = "decision";
    tr.dataset.seq = d.seq; tr.dataset.decision = d.decision; tr.dataset.trial = d.trial ?? "";
    cell(tr, String(d.seq), "muted"); cell(tr, hhmmss(d.occurred_at), "muted", d.occurred_at);
    cell(tr, d.trial === null ? "-" : String(d.trial)); cell(tr, d.decision);
    cell(tr, num(d.budget, 6)); cell(tr, d.rung === null ? "" : String(d.rung));
    cell(tr, d.reason, "summary", d.reason);
    return tr;
  }));
}

// --- A/B results --------------------------------------------------------------------
function abChart(holder, arms) {
  if (typeof uPlot === "undefined") { holder.textContent = "charts unavailable"; return; }
  const shown = arms.filter((a) => a.mean_jct_s !== null);
  if (!shown.length) return;
  const xs = shown.map((_, i) => i);
  const whiskers = (u) => {
    const ctx = u.ctx; ctx.save(); ctx.strokeStyle = "#1d2330"; ctx.lineWidth = 2;
    shown.forEach((a, i) => {
      const [lo, hi] = a.jct_ci95_s || [];
      if (lo === null || hi === null || lo === undefined) return;
      const x = u.valToPos(i, "x", true);
      const y0 = u.valToPos(lo, "y", true), y1 = u.valToPos(hi, "y", true);
      ctx.beginPath(); ctx.moveTo(x, y0); ctx.lineTo(x, y1);
      ctx.moveTo(x - 6, y0); ctx.lineTo(x + 6, y0); ctx.moveTo(x - 6, y1); ctx.lineTo(x + 6, y1);
      ctx.stroke();
    });
    ctx.restore();
  };
  const top = Math.max(...shown.map((a) => Math.max(a.mean_jct_s, (a.jct_ci95_s || [])[1] || 0)));
  new uPlot({
    width: Math.max(holder.clientWidth, 300), height: 220,
    scales: {x: {time: false, range: [-0.5, shown.length - 0.5]}, y: {range: [0, top * 1.1]}},
    series: [{}, {label: "mean JCT (s), 95% CI", fill: "#93c5fd", stroke: "#2563eb",
                  paths: uPlot.paths.bars({size: [0.6, 120]}), points: {show: false}}],
    axes: [{splits: () => xs, values: (u, vals) => vals.map((v) => (shown[v] ? shown[v].name : "")),
            grid: {show: false}},
           {label: "mean JCT (s)"}],
    hooks: {draw: [whiskers]},
  }, [xs, shown.map((a) => a.mean_jct_s)], holder);
}
async function refreshAB() {
  let body;
  try { body = await get("/ab"); } catch (e) { $("ab-where").textContent = e.message; return; }
  $("ab-where").textContent = "summary.json files of `ab run` under: " + body.folders.join(", ") +
    (body.runs.length ? "" : " (none found)");
  $("ab-runs").replaceChildren(...body.runs.map((run) => {
    const box = el("div", undefined, "ab-run"); box.dataset.run = run.run_id || run.path;
    if (run.error) { box.append(el("p", run.path + ": " + run.error, "error")); return box; }
    box.append(el("h3", "run " + run.run_id + ": " + (run.trace || run.source || "") +
      " \u00b7 baseline " + run.baseline + " \u00b7 speed " + run.speed +
      (run.cluster ? " \u00b7 " + run.cluster.nodes + "\u00d7" + run.cluster.gpus_per_node + " GPUs" : "")));
    const ul = el("ul", undefined, "verdicts");
    for (const v of run.verdicts) ul.append(el("li", v));
    box.append(ul);
    const table = el("table", undefined, "arms");
    const head = el("tr");
    for (const h of ["arm", "env", "mean JCT (s)", "95% CI", "vs baseline (s)", "95% CI", "verdict",
                     "GPU hours", "finished", "unfinished", "failed"]) head.append(el("th", h));
    table.append(el("thead")); table.tHead.append(head);
    const tb = el("tbody");
    for (const a of run.arms) {
      const tr = el("tr"); tr.dataset.arm = a.name;
      if (a.env === state.env) tr.className = "applied";
      cell(tr, a.name); cell(tr, a.env + (a.env === state.env ? " (this env)" : ""));
      cell(tr, num(a.mean_jct_s, 5)); cell(tr, (a.jct_ci95_s || []).map((v) => num(v, 5)).join(" .. "));
      cell(tr, num(a.paired_diff_s, 4)); cell(tr, (a.paired_diff_ci95_s || []).map((v) => num(v, 4)).join(" .. "));
      cell(tr, a.verdict, a.verdict === "worse" ? "failed" : a.verdict === "better" ? "applied" : "");
      cell(tr, num(a.gpu_hours, 4)); cell(tr, String(a.jobs_finished));
      cell(tr, String(a.jobs_unfinished)); cell(tr, String(a.jobs_failed));
      tb.append(tr);
    }
    table.append(tb); box.append(table);
    const holder = el("div", undefined, "chart ab-chart"); box.append(holder);
    requestAnimationFrame(() => abChart(holder, run.arms));
    return box;
  }));
}

// --- dead letters, config documents -------------------------------------------------
async function refreshDLQ() {
  let body;
  try { body = await get("/dlq"); } catch (e) { $("dlq-count").textContent = e.message; return; }
  $("dlq-count").textContent = "(" + body.seen + " since the console started; newest first)";
  $("dlq").replaceChildren(...body.letters.map((l) => {
    const tr = el("tr"); tr.className = "letter"; tr.dataset.kind = l.kind;
    cell(tr, hhmmss(l.at), "muted", l.at);
    const from = l.original_topic + "[" + l.partition + "]@" + l.offset;
    cell(tr, from, "", from + (l.consumer_group ? " read by " + l.consumer_group : ""));
    cell(tr, l.kind, "failed");
    cell(tr, l.error + (l.consumer_group ? " (" + l.consumer_group + ")" : ""), "summary");
    cell(tr, l.preview + (l.truncated ? " \u2026" : ""), "", l.preview);
    return tr;
  }));
}
async function refreshConfigs() {
  let body;
  try { body = await get("/configs"); } catch (e) { $("configs-count").textContent = e.message; return; }
  $("configs-count").textContent = "(" + body.total + (body.total > body.documents.length
    ? ", the first " + body.documents.length + " shown" : "") + ")";
  $("configs").replaceChildren(...body.documents.map((d) => {
    const tr = el("tr"); tr.dataset.config = d.name;
    const a = el("a", d.name, "job-link"); a.href = "#";
    a.addEventListener("click", (ev) => { ev.preventDefault(); showConfig(d.name); });
    cell(tr, "").append(a);
    cell(tr, String(d.version)); cell(tr, String(d.priority));
    cell(tr, JSON.stringify(d.include), "summary"); cell(tr, JSON.stringify(d.exclude), "summary");
    cell(tr, d.configure_size); cell(tr, d.updated_at.slice(0, 19).replace("T", " "));
    return tr;
  }));
}
async function showConfig(name) {
  const pre = $("config-doc");
  try {
    const d = await get("/configs/" + enc(name));
    pre.textContent = name + " (version " + d.version + ")\n" + JSON.stringify(d.document, null, 2);
  } catch (e) { pre.textContent = e.message; }
  pre.hidden = false;
}

// --- envs and tokens ----------------------------------------------------------------
function envActions(kind) { return (state.me && state.me.actions || []).filter((a) => a.kind === kind); }
async function refreshEnvs() {
  await refreshEnvList();
  const promote = envActions("env").find((a) => a.name === "promote");
  $("envs").replaceChildren(...state.envs.map((e) => {
    const tr = el("tr"); tr.dataset.env = e.name;
    const a = el("a", e.name, "job-link"); a.href = "#";
    a.addEventListener("click", (ev) => { ev.preventDefault(); switchEnv(e.name); });
    cell(tr, "").append(a);
    cell(tr, e.role || e.mode, e.mode === "real" ? "failed" : ""); cell(tr, String(e.partitions));
    cell(tr, "v" + e.settings_version); cell(tr, e.updated_at.slice(0, 19).replace("T", " "));
    const td = cell(tr, "");
    if (promote && e.mode === "virtual") {
      const b = el("button", "Promote", "action danger"); b.type = "button";
      b.dataset.action = "promote"; b.dataset.env = e.name;
      b.addEventListener("click", () => doPromote(e.name));
      td.append(b);
    }
    return tr;
  }));
  const revoke = envActions("token").length > 0;
  $("tokens-note").textContent = revoke ? "" : "An admin token of this env lists and revokes its tokens.";
  if (!revoke) { $("tokens").replaceChildren(); return; }
  let body;
  try { body = await get("/tokens"); } catch (e) { $("tokens-note").textContent = e.message; return; }
  $("tokens").replaceChildren(...body.tokens.map((t) => {
    const tr = el("tr"); tr.dataset.token = t.token_id;
    cell(tr, t.token_id); cell(tr, t.name); cell(tr, t.scopes.join(", "));
    cell(tr, t.created_at.slice(0, 19).replace("T", " "));
    cell(tr, t.revoked_at ? "revoked" : "active", t.revoked_at ? "failed" : "applied");
    const td = cell(tr, "");
    if (!t.revoked_at) {
      const b = el("button", "Revoke", "action danger"); b.type = "button";
      b.dataset.action = "revoke"; b.dataset.token = t.token_id;
      b.addEventListener("click", () => doRevoke(t.token_id));
      td.append(b);
    }
    return tr;
  }));
}
async function doPromote(env) {
  const reason = prompt("Make " + env + " the real env (" + state.env + " becomes virtual). Why?");
  if (reason === null) return;
  try {
    await call("POST", "v1/promote", {env, reason});
    state.me = await get("/whoami");
    $("mode").textContent = state.me.mode; $("mode").className = "badge " + state.me.mode;
    $("tokens-note").textContent = env + " is now the real env";
  } catch (e) { $("tokens-note").textContent = "promote refused: " + e.message; }
  refreshEnvs();
}
async function doRevoke(tokenId) {
  if (!confirm("Revoke token " + tokenId + " of env " + state.env + "?")) return;
  try { await call("POST", envPath("/tokens/" + enc(tokenId) + "/revoke")); }
  catch (e) { $("tokens-note").textContent = "revoke refused: " + e.message; }
  refreshEnvs();
}

// --- models -------------------------------------------------------------------------
// The env's model registry: every model, one model's versions, and the lineage of the
// version chosen (its checkpoint, the job, trial and experiment it came from, the
// hyperparameters, the plans it trained under). `#view=models&model=NAME` opens one.
REFRESH.models = () => refreshModels();
state.model = new URLSearchParams(location.hash.slice(1)).get("model");
state.modelVersion = null;
const modelTime = (iso) => (iso || "").slice(0, 19).replace("T", " ");
const modelKv = (o) => Object.entries(o || {}).map(([k, v]) => k + "=" +
  (typeof v === "number" ? num(v, 5) : String(v))).join(" ");
function openModel(name, version) {
  state.model = name; state.modelVersion = version || null;
  const q = new URLSearchParams({env: state.env, view: "models", model: name});
  history.replaceState(null, "", "#" + q);
  refreshModel();
}
async function refreshModels() {
  let body;
  try { body = await get("/models"); }
  catch (e) { $("models-count").textContent = e.message; return; }
  $("models-count").textContent = "(" + body.models.length + ")";
  $("models").replaceChildren(...body.models.map((m) => {
    const tr = el("tr"); tr.dataset.model = m.name;
    const a = el("a", m.name, "model-link");
    a.href = "#" + new URLSearchParams({env: state.env, view: "models", model: m.name});
    a.addEventListener("click", (ev) => { ev.preventDefault(); openModel(m.name); });
    cell(tr, "").append(a);
    cell(tr, String(m.versions)); cell(tr, m.latest === null ? "-" : String(m.latest));
    cell(tr, modelTime(m.updated_at), "muted"); cell(tr, m.description || "");
    return tr;
  }));
  await refreshModel();
}
function factRow(name, value) {
  const tr = el("tr"); tr.dataset.fact = name;
  cell(tr, name, "muted"); cell(tr, value === null || value === undefined || value === "" ? "-" : String(value));
  return tr;
}
async function refreshModel() {
  const box = $("model-detail");
  if (!state.model) { box.hidden = true; return; }
  const path = "/models/" + enc(state.model) + (state.modelVersion ? "?version=" + state.modelVersion : "");
  let x;
  try { x = await get(path); }
  catch (e) { box.hidden = false; $("model-title").textContent = state.model + ": " + e.message; return; }
  box.hidden = false; box.dataset.model = x.name; box.dataset.version = x.version.version;
  $("model-title").textContent = x.name + " version " + x.version.version + " of " + x.versions;
  $("model-versions").replaceChildren(...x.all_versions.map((v) => {
    const tr = el("tr"); tr.dataset.version = v.version;
    if (v.version === x.version.version) tr.className = "on";
    const a = el("a", String(v.version), "version-link"); a.href = "#";
    a.addEventListener("click", (ev) => { ev.preventDefault(); openModel(x.name, v.version); });
    cell(tr, "").append(a);
    cell(tr, v.checkpoint_id);
    cell(tr, v.job_name + (v.experiment ? " (" + v.experiment + " #" + v.trial + ")" : ""));
    cell(tr, String(v.step)); cell(tr, modelKv(v.metrics)); cell(tr, (v.labels || []).join(", "));
    cell(tr, v.state, v.state === "kept" ? "" : "failed");
    cell(tr, modelTime(v.created_at), "muted");
    return tr;
  }));
  const v = x.version, c = v.checkpoint, l = v.lineage;
  const searcher = l.searcher ? l.searcher.name + " on " + l.searcher.metric +
    (l.searcher.smaller_is_better ? " \u2193" : " \u2191") : null;
  $("model-lineage").replaceChildren(
    factRow("notes", v.notes), factRow("labels", (v.labels || []).join(", ")),
    factRow("registered", modelTime(v.created_at) + " by " + (v.registered_by || "-")),
    factRow("checkpoint", c.checkpoint_id + " (" + c.state + ")"), factRow("url", c.url),
    factRow("step", c.step), factRow("world size", c.world_size),
    factRow("job", (l.job.name || "-") + " (" + l.job.uuid + ")"),
    factRow("experiment", l.experiment), factRow("trial", l.trial),
    factRow("searcher", searcher), factRow("hyperparameters", modelKv(l.hyperparameters)),
    factRow("metrics", modelKv(l.metrics)), factRow("plan in force", l.plan_in_force),
  );
  $("model-plans").replaceChildren(...l.plans.map((p) => {
    const tr = el("tr"); tr.dataset.plan = p.plan_id;
    cell(tr, p.plan_id); cell(tr, p.first_step + "\u2013" + p.last_step);
    cell(tr, p.world_sizes.join("/")); cell(tr, p.status || "-"); cell(tr, p.optimizer || "-");
    cell(tr, p.reason || "");
    return tr;
  }));
}

// --- wiring -------------------------------------------------------------------------
for (const a of document.querySelectorAll("#tabs a")) {
  a.addEventListener("click", (ev) => { ev.preventDefault(); showView(a.dataset.view); });
}
$("filters").addEventListener("submit", (ev) => { ev.preventDefault(); tail(); });
$("env-select").addEventListener("change", (ev) => switchEnv(ev.target.value));
$("login-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const token = $("token-input").value.trim();
  $("token-input").value = "";
  state.tokens[state.env] = token; saveTokens(); openEnv();
});
window.addEventListener("hashchange", () => {
  const before = state.env;
  const newToken = readHash();
  if (state.env !== before) { const env = state.env; state.env = before; switchEnv(env); }
  else if (newToken || $("main").hidden) openEnv();  // another token: what may it do?
  else showView(state.view);
});
loadTokens();
readHash();
openEnv();
