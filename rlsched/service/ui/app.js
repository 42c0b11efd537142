// rlsched dashboard: polls the service's JSON API and draws the fleet, the queue, the policy and the audit.
// Every string that comes from the API is put on the page as text (textContent / text nodes), never as
// HTML: job names, arguments and reasons are hostile input. The token lives in this tab's sessionStorage
// and travels only in the Authorization header. Without a token the page reads anyway: a service started
// with --public-read answers the fleet and queue reads (redacted) and the page renders them read-only; one
// without it shows only the login. /healthz says which (public_read), so a service that refuses anonymous
// reads is not asked (each refusal would be a 401 in the console every poll); a 401 still means the login.
"use strict";

const POLL_MS = 2000;
const TOKEN_KEY = "rlsched.token";
const AUDIT_KEEP = 60;
const SVG_NS = "http://www.w3.org/2000/svg";

const ui = { auditCursor: null, audit: [], timer: null, jobLog: { id: null, next: 0, text: "" }, busy: false,
             cancelMsg: null };

// ------------------------------------------------------------------ helpers

function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }

/** An element with attributes and children; strings become text nodes (never parsed as HTML). */
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  setAttrs(node, attrs);
  append(node, children);
  return node;
}

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  setAttrs(node, attrs);
  append(node, children);
  return node;
}

function setAttrs(node, attrs) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    node.setAttribute(k, v === true ? "" : String(v));
  }
}

function append(node, children) {
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

class ApiError extends Error {
  constructor(status, detail) { super(detail); this.status = status; }
}

/** One API call with the token (if any) as a bearer header; JSON back, or the Response with raw. */
async function api(path, { method = "GET", raw = false } = {}) {
  const headers = {};
  const t = token();
  if (t) headers.Authorization = "Bearer " + t;
  const resp = await fetch(path, { method, headers, cache: "no-store", credentials: "omit" });
  if (!resp.ok) {
    let detail = resp.statusText;
    try { detail = (await resp.json()).detail || detail; } catch (e) { /* not JSON */ }
    throw new ApiError(resp.status, detail);
  }
  return raw ? resp : resp.json();
}

function ago(t) {
  if (!t) return "";
  return duration(Date.now() / 1000 - t);
}

function duration(s) {
  if (s === null || s === undefined || !isFinite(s)) return "";
  s = Math.max(0, s);
  if (s < 60) return s.toFixed(0) + "s";
  if (s < 3600) return Math.floor(s / 60) + "m" + String(Math.floor(s % 60)).padStart(2, "0") + "s";
  if (s < 86400) return Math.floor(s / 3600) + "h" + String(Math.floor((s % 3600) / 60)).padStart(2, "0") + "m";
  return (s / 86400).toFixed(1) + "d";
}

function clock(t) { return t ? new Date(t * 1000).toLocaleTimeString() : ""; }
function usd(x) { return "$" + Number(x || 0).toFixed(2); }
function badge(text, cls) { return el("span", { class: "badge s-" + (cls || text) }, text); }
function jobLink(id) { return el("a", { href: "#/jobs/" + encodeURIComponent(id), class: "job-link" }, id); }

function request(job) {
  const r = job.request || {};
  if (r.mig) return r.mig;
  const n = r.gpus || 1;
  return n + " GPU" + (n === 1 ? "" : "s");
}

function argvText(job) { return ((job.request || {}).argv || []).join(" "); }

function table(headers, rows, empty) {
  if (!rows.length) return el("p", { class: "empty" }, empty);
  return el("table", {}, el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows.map((cells) => el("tr", {}, cells.map((c) => el("td", {}, c))))));
}

function section(title, id, cls, ...body) {
  return el("section", { id, class: cls || null }, el("h2", {}, title), ...body);
}

function banner(text, error) {
  const b = document.getElementById("banner");
  b.hidden = !text;
  b.className = error ? "error" : "";
  b.textContent = text || "";
}

// ------------------------------------------------------------------ fleet drawing

/** A GPU as an SVG bar of its 8 memory slices: MIG instances as boxes with their job; a whole GPU as one box. */
function gpuLayout(gpu) {
  const W = 400, H = 34, cell = W / 8;
  const box = svg("svg", { class: "layout", viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none",
                           role: "img", "data-gpu": gpu.uuid });
  const closed = !gpu.healthy ? "sick" : gpu.problem ? "closed" : null;
  const parts = gpu.mig ? gpu.slices.map((s) => ({ x: s.start * cell, w: s.size * cell, label: s.profile, job: s.job }))
                        : [{ x: 0, w: W, label: gpu.model, job: gpu.jobs[0] || null, more: gpu.jobs.length - 1 }];
  if (gpu.mig && !parts.length) parts.push({ x: 0, w: W, label: "MIG on, no instances", job: null });
  for (const p of parts) {
    const cls = closed || (p.job ? "used" : "free");
    const g = svg("g", { class: "instance", "data-profile": gpu.mig ? p.label : null,
                         "data-job": p.job ? p.job.id : null });
    g.append(svg("rect", { x: p.x + 1, y: 1, width: Math.max(p.w - 2, 1), height: H - 2, rx: 3, class: cls }));
    g.append(svg("text", { x: p.x + 5, y: 13 }, p.label));
    if (p.job) {
      g.append(svg("text", { x: p.x + 5, y: 27, class: "job" },
        p.job.id + " " + (p.job.user || "") + (p.more > 0 ? ` +${p.more}` : "")));
    }
    g.append(svg("title", {}, (p.job ? `${p.label}: ${p.job.id} (${p.job.user})` : `${p.label}: free`) +
      (gpu.problem ? ` - ${gpu.problem}` : "")));
    box.append(g);
  }
  return box;
}

function fleetSection(fleet) {
  const nodes = fleet.nodes.map((n) => el("div", { class: "node", "data-node": n.hostname },
    el("div", { class: "node-head" }, el("strong", {}, n.hostname), badge(n.status),
      el("span", { class: "muted" }, n.pool ? `pool ${n.pool}` : "no pool"),
      n.kind ? el("span", { class: "muted" }, n.kind) : null),
    n.gpus.map((g) => el("div", { class: "gpu" },
      el("span", { class: "gpu-label", title: g.uuid }, "GPU " + g.index), gpuLayout(g))),
    n.gpus.filter((g) => g.problem).map((g) => el("p", { class: "muted" }, `GPU ${g.index}: ${g.problem}`))));
  return section("Fleet", "fleet", "wide",
    fleet.nodes.length ? el("div", { class: "nodes" }, nodes) : el("p", { class: "empty" }, "no nodes"),
    fleet.unassigned.length ? el("p", { class: "muted" }, "Nodes no pool claims: " + fleet.unassigned.join(", ")) : null);
}

// ------------------------------------------------------------------ overview sections

function queueSection(jobs) {
  const queued = jobs.filter((j) => j.state === "queued").sort((a, b) => (a.position || 0) - (b.position || 0));
  return section(`Queue (${queued.length})`, "queue", null, table(["#", "Job", "User", "Asks", "Prio", "Waiting", "Why"],
    queued.map((j) => [String(j.position || ""), jobLink(j.id), j.user || "", request(j), String(j.priority ?? ""),
      ago(j.submitted_at), j.reason || ""]), "nothing queued"));
}

function runningSection(jobs) {
  const running = jobs.filter((j) => j.state === "running" || j.state === "preempted");
  return section(`Running (${running.length})`, "running", null, table(["Job", "User", "GPUs", "Node", "Runtime", "Restarts", "State"],
    running.map((j) => [jobLink(j.id), j.user || "", request(j), (j.allocation || {}).node || "",
      ago(j.started_at), String(Math.max(0, (j.attempts || 1) - 1)), badge(j.state)]), "nothing running"));
}

function recentSection(jobs) {
  const done = jobs.filter((j) => !["queued", "running", "preempted"].includes(j.state)).slice(-15).reverse();
  return section("Recently finished", "recent", null, table(["Job", "User", "Command", "Ended", "State"],
    done.map((j) => [jobLink(j.id), j.user || "", el("code", {}, argvText(j)), ago(j.finished_at) + " ago",
      badge(j.state)]), "no finished jobs"));
}

function policySection(info, decisions) {
  const fb = Object.entries(info.fallbacks_by_reason || {}).map(([k, v]) => `${k}: ${v}`).join(", ") || "none";
  return section("Policy", "policy-panel", null,
    el("dl", { class: "kv" },
      el("dt", {}, "served"), el("dd", {}, `${info.policy} (${info.scheduler}${info.model ? ", model " + info.model : ""})`),
      el("dt", {}, "model version"), el("dd", {}, info.model_version || "-"),
      el("dt", {}, "mode"), el("dd", {}, info.mode),
      el("dt", {}, "fallback"), el("dd", {}, `${info.fallback} (primary ${info.primary_available ? "available" : "unavailable"})`),
      el("dt", {}, "circuit breaker"), el("dd", {}, badge(info.breaker)),
      el("dt", {}, "fallbacks"), el("dd", {}, fb),
      el("dt", {}, "backend"), el("dd", {}, info.backend || "")),
    el("h3", {}, "Last decisions"),
    table(["Time", "Kind", "Job", "Source", "Applied"], decisions.slice().reverse().map((d) => [clock(d.time), d.kind,
      d.job ? jobLink(d.job) : "", d.policy || "", d.applied ? "yes" : "refused" + (d.reason ? ": " + d.reason : "")]),
    "no decisions yet"));
}

function quotaBar(used, max) {
  if (max === null || max === undefined) return el("span", { class: "muted" }, String(used));
  const frac = max > 0 ? Math.min(used / max, 1) : (used > 0 ? 1 : 0);
  return el("span", {}, svg("svg", { width: 80, height: 8, viewBox: "0 0 80 8", class: "qbar" },
    svg("rect", { width: 80, height: 8, rx: 3, class: "free" }),
    svg("rect", { width: 80 * frac, height: 8, rx: 3, class: used > max ? "sick" : "used" })), ` ${used}/${max}`);
}

function quotaSection(q) {
  const rows = q.quotas.map((x) => {
    const slices = Object.entries(x.max_slices || {}).map(([p, m]) => el("div", {}, p + " ", quotaBar(x.used.slices[p] || 0, m)));
    return [x.name, x.principal, x.pool, x.max_gpus !== null ? quotaBar(x.used.gpus, x.max_gpus) : "",
      slices.length ? slices : "", x.max_gpu_hours_per_day !== null ? quotaBar(x.used.gpu_hours, x.max_gpu_hours_per_day) : ""];
  });
  const users = Object.entries(q.users).map(([u, h]) => [u, String(h.jobs), String(h.gpus),
    Object.entries(h.slices).map(([p, n]) => `${n}x ${p}`).join(", "), h.pools.join(", ")]);
  return section("Quotas and users", "quotas", null,
    table(["Quota", "Principal", "Pool", "GPUs", "MIG", "GPU-h/day"], rows, "no quotas declared"),
    el("h3", {}, "Held per user"), table(["User", "Jobs", "GPUs", "MIG instances", "Pools"], users, "nobody holds GPUs"));
}

function costSection(fleet) {
  const kinds = Object.entries(fleet.held).map(([k, v]) => [k, String(v.nodes), String(v.gpus)]);
  const pools = Object.entries(fleet.cost.pools).map(([p, v]) => [p, v.kind, usd(v.usd_per_gpu_hour) + " (" + v.price_source + ")",
    usd(v.usd_per_hour) + "/h"]);
  return section("Capacity and cost", "cost", null,
    el("dl", { class: "kv" }, el("dt", {}, "rate"), el("dd", { id: "cost-rate" }, usd(fleet.cost.usd_per_hour) + " per hour"),
      el("dt", {}, "so far"), el("dd", { id: "cost-total" }, usd(fleet.cost.usd_total) + " since " + clock(fleet.cost.since))),
    table(["Kind", "Nodes held", "GPUs"], kinds, "no nodes held"),
    table(["Pool", "Kind", "Per GPU-hour", "Rate"], pools, ""));
}

function auditTable(records) {
  return table(["Time", "Event", "Job", "GPUs", "Policy", "Reason"], records.slice().reverse().map((r) => [clock(r.time),
    r.event, r.job ? jobLink(r.job) : "", String((r.gpus || []).length || ""), r.policy || "", r.reason || ""]),
  "no records yet");
}

// ------------------------------------------------------------------ views

async function pollAudit(lastId) {
  if (ui.auditCursor === null) ui.auditCursor = Math.max(0, lastId - 30);
  const recs = await api(`/v1/audit?since=${ui.auditCursor}&limit=200`);
  if (recs.length) {
    ui.audit = ui.audit.concat(recs).slice(-AUDIT_KEEP);
    ui.auditCursor = recs[recs.length - 1].id;
  }
}

/** A panel's body for an anonymous reader: what needs the token. */
function loginToSee() { return el("p", { class: "empty login-to-see" }, "log in to see"); }

async function renderOverview(main) {
  const [info, fleet, live, recent, quotas, decisions] = await Promise.all([
    api("/v1/info"), api("/v1/fleet"), api("/v1/jobs?state=queued&state=running&state=preempted"),
    api("/v1/jobs?limit=40"), api("/v1/quotas"), api("/v1/decisions?limit=12")]);
  const authed = Boolean(token());
  if (authed) await pollAudit(fleet.audit_last_id);
  showPolicy(info);
  main.className = "";
  main.replaceChildren(fleetSection(fleet), queueSection(live), runningSection(live), policySection(info, decisions),
    quotaSection(quotas), costSection(fleet), recentSection(recent),
    section("Audit stream", "audit", "wide", authed ? auditTable(ui.audit) : loginToSee()));
}

/** Whether the service answers reads without a token (its /healthz says so; false when it cannot be asked). */
async function publicRead() {
  try {
    return (await api("/healthz")).public_read === true;
  } catch (e) {
    return false;
  }
}

/** The login-only page: the service refuses to be read without the token. */
async function renderWelcome(main) {
  main.className = "single";
  main.replaceChildren(section("Log in", "welcome", null,
    el("p", {}, "Paste the service's token above to read the fleet, the queue and the audit. The token is in " +
      "<state_dir>/token on the service's machine."), await healthLine()));
}

async function renderJob(main, id) {
  const said = ui.cancelMsg && ui.cancelMsg.id === id ? ui.cancelMsg : null;
  const actions = el("div", { class: "actions" },
    el("button", { type: "button", class: "danger", id: "cancel" }, "Cancel job"),
    el("span", { id: "cancel-result", class: said && said.error ? "error" : null }, said ? said.text : ""));
  if (ui.jobLog.id !== id) ui.jobLog = { id, next: 0, text: "" };
  const authed = Boolean(token());
  let job = null;
  try {
    if (authed || await publicRead()) job = await api(`/v1/jobs/${encodeURIComponent(id)}`);
  } catch (e) {
    if (authed || e.status !== 401) throw e;
  }
  if (job === null) {
    // The service is not readable without the token; the cancel button stays, and the service decides (it refuses).
    main.className = "single";
    main.replaceChildren(section("Job " + id, "job", null,
      el("p", { class: "empty", id: "job-error" }, "Log in with the token to read this job."), actions));
    wireCancel(id);
    return;
  }
  let records = null;
  if (authed) {
    const logResp = await api(`/v1/jobs/${encodeURIComponent(id)}/logs?offset=${ui.jobLog.next}`, { raw: true });
    const chunk = await logResp.text();
    ui.jobLog.next = Number(logResp.headers.get("X-Rlsched-Log-Next") || ui.jobLog.next);
    ui.jobLog.text = (ui.jobLog.text + chunk).slice(-200000);
    records = await api(`/v1/audit?job=${encodeURIComponent(id)}&limit=500`);
  } else {
    // Read-only (public read): no cancel, no logs, no audit without the token.
    const button = actions.querySelector("#cancel");
    button.disabled = true;
    button.title = "log in to cancel";
    actions.append(el("span", { class: "muted", id: "cancel-note" }, "log in to cancel"));
  }
  const a = job.allocation;
  const r = job.request || {};
  main.className = "single";
  main.replaceChildren(
    section("Job " + job.id, "job", null,
      el("dl", { class: "kv" },
        el("dt", {}, "state"), el("dd", {}, el("span", { id: "job-state", class: "badge s-" + job.state }, job.state)),
        el("dt", {}, "user"), el("dd", {}, job.user || ""),
        el("dt", {}, "command"), el("dd", {}, el("code", { id: "job-argv" }, argvText(job))),
        el("dt", {}, "asks"), el("dd", {}, request(job) + (r.pool ? " in pool " + r.pool : "") + (r.preemptible ? ", preemptible" : "")),
        el("dt", {}, "priority"), el("dd", {}, String(job.priority ?? "")),
        job.reason ? [el("dt", {}, "why"), el("dd", { id: "job-reason" }, job.reason)] : null,
        job.position ? [el("dt", {}, "place in queue"), el("dd", {}, String(job.position))] : null,
        el("dt", {}, "submitted"), el("dd", {}, clock(job.submitted_at) + " (" + ago(job.submitted_at) + " ago)"),
        job.started_at ? [el("dt", {}, "started"), el("dd", {}, clock(job.started_at))] : null,
        job.finished_at ? [el("dt", {}, "finished"), el("dd", {}, clock(job.finished_at))] : null,
        job.exit_code !== null && job.exit_code !== undefined ? [el("dt", {}, "exit code"), el("dd", {}, String(job.exit_code))] : null,
        el("dt", {}, "attempts"), el("dd", {}, String(job.attempts ?? 0)),
        job.last_reason ? [el("dt", {}, "last stop"), el("dd", {}, job.last_reason)] : null),
      actions),
    section("Allocation", "allocation", null, a ? el("dl", { class: "kv" },
      el("dt", {}, "node"), el("dd", {}, a.node), el("dt", {}, "pool"), el("dd", {}, a.pool || ""),
      el("dt", {}, "GPU indices"), el("dd", {}, (a.gpu_indices || []).join(", ")),
      a.slice_start !== null && a.slice_start !== undefined ? [el("dt", {}, "MIG slice"), el("dd", {}, String(a.slice_start))] : null,
      el("dt", {}, "devices"), el("dd", {}, (a.devices || []).map((d) => el("div", {}, el("code", {}, d)))))
      : el("p", { class: "empty" }, "no allocation")),
    section("Logs", "logs", null, authed ? el("pre", { id: "log" }, ui.jobLog.text || "(no output yet)") : loginToSee()),
    section("Audit records", "job-audit", null, authed ? auditTable(records) : loginToSee()));
  const pre = document.getElementById("log");
  if (pre) pre.scrollTop = pre.scrollHeight;
  if (authed) wireCancel(id);
}

function wireCancel(id) {
  const button = document.getElementById("cancel");
  button.addEventListener("click", async () => {
    const out = document.getElementById("cancel-result");
    try {
      const res = await api(`/v1/jobs/${encodeURIComponent(id)}/cancel`, { method: "POST" });
      ui.cancelMsg = { id, text: "cancel requested: " + res.state, error: false };
    } catch (e) {
      ui.cancelMsg = { id, text: `cancel refused (${e.status || "network"}): ${e.message}`, error: true };
    }
    out.className = ui.cancelMsg.error ? "error" : "";
    out.textContent = ui.cancelMsg.text;
    if (!ui.cancelMsg.error) refresh();
  });
}

function showPolicy(info) {
  document.getElementById("policy").textContent =
    `policy ${info.policy} - breaker ${info.breaker} - ${info.queue_length} queued, ${info.running} running`;
}

function route() {
  const m = location.hash.match(/^#\/jobs\/([^/]+)$/);
  return m ? { view: "job", id: decodeURIComponent(m[1]) } : { view: "overview" };
}

async function refresh() {
  if (ui.busy) return;
  ui.busy = true;
  const main = document.getElementById("main");
  const r = route();
  try {
    if (r.view === "job") {
      await renderJob(main, r.id);
    } else {
      try {
        if (token() || await publicRead()) await renderOverview(main);
        else await renderWelcome(main);  // not readable without the token: the login only
      } catch (e) {
        if (token() || e.status !== 401) throw e;
        await renderWelcome(main);
      }
    }
    banner(token() || document.getElementById("welcome") || document.getElementById("job-error") ? "" :
      "Read-only: log in with the token to cancel jobs and to read logs and the audit.");
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (e) {
    if (e.status === 401) banner(token() ? "The token was refused: log in again." : "Log in with the token to read.", true);
    else banner(`Cannot read the service: ${e.message}`, true);
  } finally {
    ui.busy = false;
  }
}

async function healthLine() {
  try {
    const h = await api("/healthz");
    return el("p", { class: "muted" }, `service ${h.status}, version ${h.version}`);
  } catch (e) {
    return el("p", { class: "muted" }, "service not answering");
  }
}

function showSession() {
  const logged = Boolean(token());
  document.getElementById("login").hidden = logged;
  document.getElementById("session").hidden = !logged;
}

function start() {
  document.getElementById("login").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const input = document.getElementById("token");
    const value = input.value.trim();
    input.value = "";
    if (value) sessionStorage.setItem(TOKEN_KEY, value);
    showSession();
    refresh();
  });
  document.getElementById("logout").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    ui.audit = [];
    ui.auditCursor = null;
    showSession();
    refresh();
  });
  window.addEventListener("hashchange", () => { ui.jobLog = { id: null, next: 0, text: "" }; refresh(); });
  showSession();
  refresh();
  ui.timer = setInterval(refresh, POLL_MS);
}

document.addEventListener("DOMContentLoaded", start);
