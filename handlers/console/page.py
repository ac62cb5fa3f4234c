"""The console's one page. Static: it holds no data and no secret, so it is served without
a token; everything it shows comes from the API with the token the user gives it.

The token is read from the URL fragment (``#token=...``, which browsers never send to a
server) or typed in, and kept in sessionStorage. The live tail is read with fetch(), not
EventSource, because EventSource cannot send an Authorization header.
"""

from __future__ import annotations

PAGE = r"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>dlrover-events console: __ENV__</title>
<style>
 body { font: 13px/1.4 system-ui, sans-serif; margin: 0; color: #1d2330; background: #f6f7f9; }
 header { background: #1d2330; color: #fff; padding: 8px 16px; display: flex; gap: 16px;
          align-items: center; }
 header h1 { font-size: 16px; margin: 0; }
 #status { padding: 2px 8px; border-radius: 8px; background: #8a5a00; }
 #status.live { background: #1b7f3b; }
 main { display: grid; grid-template-columns: 1fr 1fr; gap: 12px; padding: 12px; }
 section { background: #fff; border: 1px solid #d8dce3; border-radius: 6px; padding: 8px;
           overflow: auto; max-height: 80vh; }
 h2 { font-size: 14px; margin: 0 0 6px; }
 table { border-collapse: collapse; width: 100%; }
 td, th { border-bottom: 1px solid #eceef2; padding: 2px 6px; text-align: left;
          vertical-align: top; white-space: nowrap; }
 td.summary { white-space: normal; }
 form { display: flex; gap: 6px; margin-bottom: 6px; flex-wrap: wrap; }
 .muted { color: #6b7280; }
 .oom { color: #b42318; font-weight: 600; }
 #login { padding: 24px; }
</style>
</head>
<body>
<header>
 <h1>dlrover-events &middot; env <span id="env">__ENV__</span></h1>
 <span id="status">connecting</span>
 <span id="counts" class="muted"></span>
</header>
<div id="login" hidden>
 <form id="login-form"><label>Bearer token (read scope)
  <input id="token-input" size="60" autocomplete="off"></label>
  <button>Open</button></form>
</div>
<main id="main" hidden>
 <section>
  <h2>Live events</h2>
  <form id="filters">
   <input id="job" placeholder="job id" size="18">
   <input id="type" placeholder="type glob, e.g. node.*" size="18">
   <select id="topics" multiple size="1" title="topics (none: all)">__TOPICS__</select>
   <button id="apply">Filter</button>
  </form>
  <table><thead><tr><th>time</th><th>topic</th><th>type</th><th>job</th><th>what</th></tr>
  </thead><tbody id="events"></tbody></table>
 </section>
 <section>
  <h2>Jobs</h2>
  <table><thead><tr><th>job</th><th>status</th><th>resources</th><th>usage</th>
   <th>last plan</th><th>last scale</th></tr></thead><tbody id="jobs"></tbody></table>
  <h2 style="margin-top:12px">Evaluation reports</h2>
  <table><thead><tr><th>time</th><th>evaluator</th><th>jobs</th><th>metrics</th></tr></thead>
   <tbody id="reports"></tbody></table>
 </section>
</main>
<script>
"use strict";
const MAX_ROWS = 500;
let token = null, controller = null, received = 0, skipped = 0;

function readToken() {
  const m = location.hash.match(/token=([^&]+)/);
  if (m) {
    sessionStorage.setItem("dle-token", decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }
  return sessionStorage.getItem("dle-token");
}
function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = text;
  if (cls) e.className = cls;
  return e;
}
function bytes(n) {
  if (n === null || n === undefined) return "";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"]; let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return n.toFixed(i ? 1 : 0) + " " + u[i];
}
function setStatus(text, live) {
  const s = document.getElementById("status");
  s.textContent = text; s.classList.toggle("live", !!live);
}
function showCounts() {
  document.getElementById("counts").textContent =
    received + " events" + (skipped ? ", " + skipped + " skipped (slow page)" : "");
}
function addEvent(d) {
  const tr = el("tr"); tr.className = "event";
  tr.dataset.job = d.job || ""; tr.dataset.type = d.type || "";
  const t = d.at ? d.at.slice(11, 23) : "";
  tr.append(el("td", t, "muted"), el("td", d.topic), el("td", d.type || "unreadable",
    (d.type || "").endsWith("oom") ? "oom" : ""), el("td", d.job || "-"),
    el("td", d.summary || d.error || "", "summary"));
  const body = document.getElementById("events");
  body.prepend(tr);
  while (body.rows.length > MAX_ROWS) body.deleteRow(body.rows.length - 1);
  received++; showCounts(); soonJobs();
}
let jobsTimer = null;
function soonJobs() {
  // A new event may change the jobs table: refresh it shortly, once per burst.
  if (jobsTimer === null) jobsTimer = setTimeout(() => { jobsTimer = null; refreshJobs(); }, 300);
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
  else if (name === "dropped") { skipped = d.dropped; showCounts(); }
  else if (name === "line") addEvent(d);
}
async function tail() {
  if (controller) controller.abort();
  const mine = controller = new AbortController();
  const q = new URLSearchParams();
  const job = document.getElementById("job").value.trim();
  const type = document.getElementById("type").value.trim();
  if (job) q.set("job", job);
  if (type) q.set("type", type);
  for (const o of document.getElementById("topics").selectedOptions) q.append("topic", o.value);
  q.set("backlog", "50");
  document.getElementById("events").replaceChildren();
  received = 0; skipped = 0; showCounts();
  while (!mine.signal.aborted) {
    setStatus("connecting", false);
    try {
      const r = await fetch("v1/events?" + q, {headers: {Authorization: "Bearer " + token},
                                               signal: mine.signal});
      if (r.status === 401 || r.status === 403) { logout((await r.json()).error.message); return; }
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
    await new Promise(res => setTimeout(res, 1000));
  }
}
function cell(tr, text, cls) { tr.append(el("td", text, cls)); }
async function refreshJobs() {
  if (!token) return;
  try {
    const r = await fetch("v1/jobs", {headers: {Authorization: "Bearer " + token}});
    if (!r.ok) return;
    const body = await r.json();
    const rows = body.jobs.map(j => {
      const tr = el("tr"); tr.dataset.job = j.job;
      cell(tr, j.job + (j.name && j.name !== j.job ? " (" + j.name + ")" : ""));
      cell(tr, j.status + (j.ooms ? " \u00b7 " + j.ooms + " OOM" : ""), j.ooms ? "oom" : "");
      cell(tr, Object.entries(j.resources).map(([role, r]) =>
        role + " " + (r.replicas ?? "?") + "\u00d7 " + (r.cpu ? r.cpu + " cpu " : "") +
        (r.memory ? bytes(r.memory) + " " : "") + (r.gpu_num ? r.gpu_num + " gpu" : "")).join("; "),
        "summary");
      cell(tr, (j.global_step !== null ? "step " + j.global_step + ", " +
        j.speed.toFixed(2) + " steps/s, " + j.samples_per_s.toFixed(0) + " samples/s; " : "") +
        Object.entries(j.usage).map(([n, u]) => n + " " + bytes(u.memory) +
          (u.gpu_memory ? " gpu " + bytes(u.gpu_memory) : "")).join("; "), "summary");
      cell(tr, j.last_plan ? "[" + j.last_plan.optimizer + "] " + j.last_plan.reason : "",
        "summary");
      cell(tr, j.last_scale ? j.last_scale.status + " " + j.last_scale.plan_id : "");
      return tr;
    });
    document.getElementById("jobs").replaceChildren(...rows);
    document.getElementById("reports").replaceChildren(...body.reports.map(rep => {
      const tr = el("tr");
      cell(tr, (rep.occurred_at || "").slice(0, 19)); cell(tr, rep.evaluator);
      cell(tr, String(rep.jobs));
      cell(tr, Object.entries(rep.metrics).map(([k, v]) => k + "=" + (+v).toFixed(3)).join(" "),
        "summary");
      return tr;
    }));
  } catch (e) { /* the next refresh tries again */ }
}
function logout(why) {
  sessionStorage.removeItem("dle-token"); token = null;
  if (controller) controller.abort();
  document.getElementById("main").hidden = true;
  document.getElementById("login").hidden = false;
  setStatus(why || "token needed", false);
}
function openConsole() {
  document.getElementById("login").hidden = true;
  document.getElementById("main").hidden = false;
  tail(); refreshJobs();
}
document.getElementById("filters").addEventListener("submit", ev => {
  ev.preventDefault(); tail();
});
document.getElementById("login-form").addEventListener("submit", ev => {
  ev.preventDefault();
  token = document.getElementById("token-input").value.trim();
  sessionStorage.setItem("dle-token", token); openConsole();
});
setInterval(refreshJobs, 2000);
token = readToken();
if (token) openConsole(); else logout();
</script>
</body>
</html>
"""
