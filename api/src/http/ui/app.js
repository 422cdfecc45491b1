"use strict";
// Every piece of server data is placed with textContent (never innerHTML): transcripts,
// experiences and memory are untrusted text.
const TOKEN_KEY = "zuno.token";
const $ = (id) => document.getElementById(id);
let token = sessionStorage.getItem(TOKEN_KEY) || "";
let liveAbort = null;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}
const tag = (text, kind) => el("span", { class: "tag " + (kind || "") }, text);
const when = (ms) => (ms ? new Date(ms).toLocaleString() : "");
function replace(id, ...children) { $(id).replaceChildren(...children.filter((c) => c)); }

class AuthRequired extends Error {}

async function api(path, options = {}) {
  const headers = Object.assign({ Accept: "application/json" }, options.headers || {});
  if (token) headers.Authorization = "Bearer " + token;
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method: options.method || "GET",
    headers,
    body: options.body === undefined ? undefined : JSON.stringify(options.body),
    signal: options.signal,
  });
  if (response.status === 401) { askForToken(); throw new AuthRequired("authentication required"); }
  if (options.raw) return response;
  const text = await response.text();
  let body = null;
  try { body = text ? JSON.parse(text) : null; } catch (_) { body = text; }
  if (!response.ok) {
    const detail = body && body.detail ? body.detail : response.statusText;
    throw new Error(`${options.method || "GET"} ${path}: ${response.status} ${detail}`);
  }
  return body;
}

function askForToken(message) {
  $("auth").hidden = false;
  $("auth-error").textContent = message || (token ? "The token was refused." : "");
  $("token").focus();
}

function showError(error) {
  if (error instanceof AuthRequired) return;
  $("status").textContent = String(error && error.message ? error.message : error);
}

const project = () => $("project").value;
const enc = encodeURIComponent;

async function loadProjects() {
  const projects = await api("/api/projects");
  const select = $("project");
  const previous = select.value || localStorage.getItem("zuno.project") || "";
  select.replaceChildren(...projects.map((p) => el("option", { value: p.id }, p.name === p.id ? p.id : `${p.name} (${p.id})`)));
  if (projects.some((p) => p.id === previous)) select.value = previous;
}

function countsTable(counts) {
  if (!counts || counts.length === 0) return el("p", { class: "muted" }, "No jobs.");
  const rows = counts.map((c) => el("tr", {}, el("td", {}, c.kind), el("td", {}, tag(c.state, stateClass(c.state))), el("td", {}, c.count)));
  return el("table", {}, el("tr", {}, el("th", {}, "kind"), el("th", {}, "state"), el("th", {}, "jobs")), ...rows);
}
function stateClass(state) {
  return { completed: "ok", applied: "ok", passed: "ok", verified: "ok", failed: "bad", rejected: "bad", uncertain: "warn", running: "warn", pending: "warn" }[state] || "";
}

async function loadJobs() {
  const page = await api("/api/jobs?limit=50");
  replace("queue", countsTable(page.counts));
  const mine = page.jobs.filter((j) => !project() || j.projectId === project());
  const sessions = [...new Set(mine.map((j) => j.sessionId).filter(Boolean))];
  $("sessions").replaceChildren(...sessions.map((s) => el("option", { value: s })));
  if (mine.length === 0) { replace("jobs", el("p", { class: "muted" }, "No recent jobs.")); return; }
  const rows = mine.map((j) => el("tr", {},
    el("td", {}, j.id, el("div", { class: "muted" }, j.sessionId || "")),
    el("td", {}, j.kind),
    el("td", {}, tag(j.state, stateClass(j.state)), el("div", { class: "muted" }, `attempt ${j.attempts}/${j.maxAttempts}`)),
    el("td", {}, when(j.updatedAt)),
    el("td", { class: j.lastError ? "error" : "" }, j.lastError || "")));
  replace("jobs", el("table", {}, el("tr", {}, ...["job", "kind", "state", "updated", "error"].map((h) => el("th", {}, h))), ...rows));
}

function experienceItem(x) {
  const evidence = (x.evidence || []).map((e) => el("li", {},
    tag(e.verified ? "verified" : "unverified", e.verified ? "ok" : "warn"),
    el("span", { class: "muted" }, `${e.sourceId}${e.messageId ? " · " + e.messageId : ""} `),
    el("q", {}, e.excerpt)));
  return el("div", { class: "item", "data-experience": x.id },
    el("strong", {}, x.title), " ",
    tag(x.kind), tag(x.verification, stateClass(x.verification)), tag(x.status),
    el("div", {}, x.summary),
    x.resolution ? el("div", { class: "muted" }, "Resolution: " + x.resolution) : null,
    el("div", { class: "muted" }, `${x.id} · ${x.origin} · confidence ${x.confidence} · ${when(x.createdAt)}`),
    evidence.length ? el("ul", {}, ...evidence) : el("div", { class: "muted" }, "No citations."));
}

async function loadExperiences() {
  if (!project()) return replace("experiences");
  const page = await api(`/api/projects/${enc(project())}/learn/experiences`);
  replace("experiences",
    el("div", { class: "muted" }, `${page.total} experiences`),
    ...page.experiences.map(experienceItem));
}

// A revision stores its entries as a JSON array of strings (older rows: of {content} objects).
function entryLines(json) {
  try {
    return JSON.parse(json)
      .map((e) => (typeof e === "string" ? e : e && typeof e.content === "string" ? e.content : null))
      .filter((e) => e !== null);
  } catch (_) { return []; }
}

async function loadMemory() {
  if (!project()) return replace("memory");
  const read = await api(`/api/projects/${enc(project())}/memory`);
  const parts = [];
  for (const doc of read.documents) {
    parts.push(el("h3", {}, `${doc.scope} memory (revision ${doc.revision})`));
    parts.push(doc.entries.length
      ? el("ul", {}, ...doc.entries.map((e) => el("li", {}, e.content, " ", el("span", { class: "muted" }, e.owner))))
      : el("p", { class: "muted" }, "Empty."));
    if (doc.withheld) parts.push(el("p", { class: "muted" }, `${doc.withheld} derived entries withheld`));
    const history = await api(`/api/projects/${enc(project())}/memory/revisions?target=${enc(doc.scope)}`);
    const revisions = [...history.revisions].sort((a, b) => a.revision - b.revision);
    const items = [];
    let before = [];
    for (const r of revisions) {
      const after = entryLines(r.entries);
      const diff = el("pre", {});
      for (const line of before.filter((l) => !after.includes(l))) diff.append(el("div", { class: "del" }, "- " + line));
      for (const line of after.filter((l) => !before.includes(l))) diff.append(el("div", { class: "add" }, "+ " + line));
      items.unshift(el("div", { class: "item" },
        el("strong", {}, `r${r.revision}`), " ", r.change, " ",
        el("span", { class: "muted" }, when(r.at) + (r.candidateId ? " · " + r.candidateId : "")),
        diff.childNodes.length ? diff : el("div", { class: "muted" }, "(no entry changes)")));
      before = after;
    }
    parts.push(el("details", {}, el("summary", {}, `Revision history (${revisions.length})`), ...items));
  }
  replace("memory", ...parts);
}

async function act(path, body) {
  $("status").textContent = "";
  try {
    await api(path, { method: "POST", body });
    await refresh();
  } catch (error) { showError(error); }
}

async function loadCandidates() {
  if (!project()) return replace("candidates");
  const pending = await api(`/api/projects/${enc(project())}/memory/candidates?state=pending`);
  if (pending.length === 0) { replace("candidates", el("p", { class: "muted" }, "No pending candidates.")); return; }
  replace("candidates", ...pending.map((c) => el("div", { class: "item candidate", "data-candidate": c.id },
    el("strong", {}, `${c.target} memory`), " ", tag(c.action), tag(c.state, stateClass(c.state)), tag(c.origin),
    el("div", { class: "muted" }, `${c.id} · confidence ${c.confidence} · ${c.reason}`),
    c.detail ? el("div", {}, c.detail) : null,
    c.oldText ? el("pre", { class: "del" }, "- " + c.oldText) : null,
    el("pre", {}, c.content || ""),
    el("button", { type: "button", class: "approve", "data-candidate": c.id, onclick: () => act(`/api/memory/candidates/${enc(c.id)}/approve`, {}) }, "Approve"),
    el("button", { type: "button", class: "reject", "data-candidate": c.id, onclick: () => act(`/api/memory/candidates/${enc(c.id)}/reject`) }, "Reject"))));
}

async function loadSkills() {
  if (!project()) return replace("skills");
  const skills = await api(`/api/projects/${enc(project())}/skills`);
  if (skills.length === 0) { replace("skills", el("p", { class: "muted" }, "No Skill candidates.")); return; }
  const items = [];
  for (const s of skills) {
    const runs = await api(`/api/skills/${enc(s.id)}/runs`);
    const runRows = runs.map((r) => el("tr", {},
      el("td", {}, tag(r.state, stateClass(r.state))),
      el("td", {}, r.baselineScore ?? ""), el("td", {}, r.candidateScore ?? ""),
      el("td", {}, r.diagnostic || ""), el("td", {}, when(r.finishedAt || r.startedAt))));
    items.push(el("div", { class: "item", "data-skill": s.id },
      el("strong", {}, s.name), " ", tag(s.state, stateClass(s.state)), tag("evaluation: " + s.evaluationState, stateClass(s.evaluationState)),
      el("div", { class: "muted" }, `${s.id} → ${s.targetPath}`),
      el("details", {}, el("summary", {}, "Diff"), el("pre", {}, s.diff || "")),
      runRows.length
        ? el("table", {}, el("tr", {}, ...["run", "baseline", "candidate", "diagnostic", "at"].map((h) => el("th", {}, h))), ...runRows)
        : el("div", { class: "muted" }, "Not evaluated yet.")));
  }
  replace("skills", ...items);
}

function renderProjection(data) {
  const view = data.learning;
  const q = view.queue;
  replace("projection",
    el("div", { class: "muted" }, `session ${view.sessionId} · revision ${data.revision} · ${new Date().toLocaleTimeString()}`),
    el("div", {}, `policy: use memories ${view.policy.useMemories ? "on" : "off"}, generation ${view.policy.generation}`),
    countsTable(q.counts),
    q.pending.length ? el("div", {}, `${q.pending.length} pending job(s)`) : null,
    ...q.recentErrors.map((e) => el("div", { class: "error" }, `${e.jobId}: ${e.error}`)),
    ...view.warnings.map((w) => el("div", { class: "error" }, w.message)),
    el("h3", {}, `Session experiences (${view.sessionExperiences.length})`),
    ...view.sessionExperiences.map(experienceItem));
}

// EventSource cannot send an Authorization header, so the stream is read with fetch.
async function follow(sessionId) {
  if (liveAbort) liveAbort.abort();
  liveAbort = null;
  $("live").textContent = "";
  if (!sessionId) return;
  const controller = new AbortController();
  liveAbort = controller;
  let lastId = "";
  while (!controller.signal.aborted) {
    try {
      const headers = { Accept: "text/event-stream" };
      if (lastId) headers["Last-Event-ID"] = lastId;
      const response = await api(`/api/session/${enc(sessionId)}/learning/events`, { raw: true, headers, signal: controller.signal });
      if (!response.ok) { $("live").textContent = `live: ${response.status}`; return; }
      $("live").textContent = "live ●";
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          let event = "message", data = "", id = null;
          for (const line of block.split("\n")) {
            if (line.startsWith("event:")) event = line.slice(6).trim();
            else if (line.startsWith("data:")) data += (data ? "\n" : "") + line.slice(5).replace(/^ /, "");
            else if (line.startsWith("id:")) id = line.slice(3).trim();
          }
          if (id !== null) lastId = id;
          if (event === "learning.state.changed" && data) {
            renderProjection(JSON.parse(data));
            refresh();
          }
        }
      }
    } catch (error) {
      if (controller.signal.aborted || error instanceof AuthRequired) return;
      $("live").textContent = "live: reconnecting…";
    }
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
}

// The Memory audit: each document's size against its limit, entries sharing a subject, rules
// stated twice, entries whose files are gone, entries withheld as stale (restorable) and
// entries pushed out at the limit (still Experience).
function auditEntry(text, ...extra) { return el("li", {}, text, ...extra); }
async function loadAudit() {
  if (!project()) return replace("audit");
  const audit = await api(`/api/projects/${enc(project())}/memory/audit`);
  const parts = [];
  for (const doc of audit.documents) {
    parts.push(el("h3", {}, `${doc.target} memory `,
      tag(`${doc.entries} entries · ${doc.chars}/${doc.charLimit} chars`, doc.withinLimit ? "ok" : "bad")));
    for (const group of doc.sharedSubjects) {
      parts.push(el("div", { class: "item" }, tag("shared subject", "warn"), group.subject.join(", "),
        el("ul", {}, ...group.entries.map((e) => auditEntry(e.content)))));
    }
    for (const [a, b] of doc.duplicates) {
      parts.push(el("div", { class: "item" }, tag("same rule twice", "warn"), el("ul", {}, auditEntry(a.content), auditEntry(b.content))));
    }
    for (const stale of doc.stale) {
      parts.push(el("div", { class: "item" }, tag("files gone", "warn"), stale.entry.content,
        el("div", { class: "muted" }, "missing: " + stale.missingPaths.join(", "))));
    }
    for (const marked of doc.markedStale) {
      const restored = marked.restoredCandidateId;
      parts.push(el("div", { class: "item stale", "data-candidate": marked.candidateId },
        tag("stale: " + marked.reason, "warn"), marked.content,
        el("div", { class: "muted" }, `${marked.candidateId} · ${when(marked.markedAt)}${marked.missingPaths.length ? " · missing: " + marked.missingPaths.join(", ") : ""}`),
        restored
          ? el("div", { class: "muted" }, "restored by " + restored)
          : el("button", { type: "button", class: "restore", "data-candidate": marked.candidateId,
              onclick: () => act(`/api/memory/candidates/${enc(marked.candidateId)}/restore`, {}) }, "Restore")));
    }
    for (const pushed of doc.pushedOut) {
      parts.push(el("div", { class: "item" }, tag("pushed out: " + pushed.reason), pushed.content,
        el("div", { class: "muted" }, `still Experience: ${pushed.experienceIds.join(", ") || "none"}`)));
    }
    if (parts[parts.length - 1].tagName === "H3") parts.push(el("p", { class: "muted" }, "Nothing to review."));
  }
  replace("audit", ...parts);
}

// Guards compiled from checkable lessons: what each stops, its lesson, and the person's
// decisions (a pending guard takes effect only when approved).
function guardButtons(g) {
  const button = (verb, label) => el("button", { type: "button", class: verb, "data-guard": g.id,
    onclick: () => act(`/api/guards/${enc(g.id)}/${verb}`) }, label);
  switch (g.state) {
    case "pending": return [button("approve", "Approve"), button("reject", "Reject")];
    case "active": return [button("disable", "Disable")];
    case "disabled": return [button("enable", "Enable")];
    default: return [];
  }
}
function describeMatcher(m) {
  if (m.kind === "path") return `edits of ${m.glob}`;
  return [m.program, ...(m.args || [])].join(" ");
}
async function loadGuards() {
  if (!project()) return replace("guards");
  const guards = await api(`/api/projects/${enc(project())}/guards`);
  if (guards.length === 0) { replace("guards", el("p", { class: "muted" }, "No guards.")); return; }
  replace("guards", ...guards.map((g) => el("div", { class: "item guard", "data-guard": g.id },
    el("code", {}, describeMatcher(g.matcher)), " ", tag(g.state, stateClass(g.state)), tag(g.decision),
    g.projectId ? null : tag("global"),
    el("div", {}, g.reason),
    g.alternative ? el("div", { class: "muted" }, "instead: " + g.alternative) : null,
    el("div", { class: "muted" }, `${g.id} · ${g.blocks} stops · ${g.violations} violations in transcripts`),
    ...guardButtons(g))));
}

// The project's worktree binding, and deleting the project (two clicks: the first arms it).
async function loadProjectControls() {
  if (!project()) return replace("project-controls");
  const p = await api(`/api/projects/${enc(project())}`);
  const path = el("input", { id: "worktree-path", size: "40", placeholder: "/path/to/repository" });
  path.value = p.worktree || "";
  const call = async (method, url, body) => {
    $("status").textContent = "";
    try { await api(url, { method, body }); await refresh(); } catch (error) { showError(error); }
  };
  const remove = el("button", { type: "button", id: "delete-project" }, "Delete project…");
  remove.addEventListener("click", () => {
    if (remove.dataset.armed === "true") { call("DELETE", `/api/projects/${enc(p.id)}`); return; }
    remove.dataset.armed = "true";
    remove.textContent = `Really delete ${p.id} with its sessions, Experience and Memory?`;
  });
  replace("project-controls",
    el("div", {}, el("strong", {}, p.name), " ", el("span", { class: "muted" }, p.id)),
    el("div", {}, "worktree: ", p.worktree ? el("code", { id: "worktree" }, p.worktree) : el("span", { id: "worktree", class: "muted" }, "not bound")),
    el("div", {}, path,
      el("button", { type: "button", id: "bind-worktree", onclick: () => call("PUT", `/api/projects/${enc(p.id)}/worktree`, { worktree: path.value.trim() }) }, "Bind"),
      p.worktree ? el("button", { type: "button", id: "unbind-worktree", onclick: () => call("DELETE", `/api/projects/${enc(p.id)}/worktree`) }, "Unbind") : null),
    el("div", {}, remove));
}

let refreshing = null;
async function refresh() {
  if (refreshing) return refreshing;
  refreshing = (async () => {
    try {
      $("status").textContent = "";
      await loadProjects();
      localStorage.setItem("zuno.project", project());
      const results = await Promise.allSettled([loadJobs(), loadExperiences(), loadMemory(), loadCandidates(), loadSkills(), loadAudit(), loadGuards(), loadProjectControls()]);
      const failed = results.find((r) => r.status === "rejected");
      if (failed) showError(failed.reason);
      document.body.dataset.loaded = "true";
    } catch (error) {
      showError(error);
    } finally {
      refreshing = null;
    }
  })();
  return refreshing;
}

$("auth-form").addEventListener("submit", (event) => {
  event.preventDefault();
  token = $("token").value.trim();
  sessionStorage.setItem(TOKEN_KEY, token);
  $("auth").hidden = true;
  $("signout").hidden = false;
  refresh();
  follow($("session").value.trim());
});
// The server prints a one-time sign-in link (`/ui#code=…`) at start; the code is exchanged
// once for the token, which stays in this tab's session storage. The fragment never reaches the
// server's logs and is removed from the address bar at once.
async function signInWithCode() {
  const match = /^#code=([A-Za-z0-9_-]{16,128})$/.exec(location.hash);
  if (!match) return;
  history.replaceState(null, "", location.pathname + location.search);
  try {
    const response = await fetch("/ui/token", {
      method: "POST",
      headers: { "Content-Type": "application/json", Accept: "application/json" },
      body: JSON.stringify({ code: match[1] }),
    });
    if (!response.ok) { askForToken("The sign-in link was already used or has expired; paste the token instead."); return; }
    const body = await response.json();
    token = body.token;
    sessionStorage.setItem(TOKEN_KEY, token);
  } catch (error) { showError(error); }
}
$("signout").hidden = !token;
$("signout").addEventListener("click", () => { token = ""; sessionStorage.removeItem(TOKEN_KEY); $("signout").hidden = true; askForToken(); });
$("refresh").addEventListener("click", () => refresh());
$("project").addEventListener("change", () => refresh());
$("session").addEventListener("change", () => follow($("session").value.trim()));
setInterval(() => { if (!document.hidden && !liveAbort) refresh(); }, 10000);
signInWithCode().then(() => { $("signout").hidden = !token; refresh(); });
