// The Palisade console: read-only views polled from the coordinator's HTTP API.
// Every value is put in the page as text (never as HTML): lock names and holders come from
// clients and may contain anything.
"use strict";

const started = performance.now();
let token = null;
let lastSeq = 0;
let feedCount = 0;
let audit = null;

function credentials() {
  const match = location.hash.match(/token=([^&]+)/);
  if (match) {
    sessionStorage.setItem("palisade-token", decodeURIComponent(match[1]));
    history.replaceState(null, "", location.pathname);
  }
  token = sessionStorage.getItem("palisade-token");
}

// A cluster member that does not lead names the leader: the console follows it there, as the
// clients do, carrying the secret in the fragment (never sent to a server).
let following = false;

function followLeader(leader) {
  let target;
  try {
    target = new URL("/ui/", leader);
  } catch {
    return false;
  }
  if (following || target.origin === location.origin) return false;
  following = true;
  if (token) target.hash = "token=" + encodeURIComponent(token);
  banner("This member does not lead: opening the console of the leader, " + target.origin);
  location.replace(target.href);
  return true;
}

async function get(path) {
  const headers = token ? { Authorization: "Bearer " + token } : {};
  const response = await fetch(path, { headers, cache: "no-store" });
  const body = await response.json().catch(() => ({}));
  if (!response.ok && body.error === "not_leader" && body.leader) followLeader(body.leader);
  if (!response.ok) {
    const error = new Error(body.message || response.statusText);
    error.status = response.status;
    throw error;
  }
  return body;
}

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function row(cells, attrs) {
  const tr = document.createElement("tr");
  for (const cell of cells) {
    tr.appendChild(cell instanceof Node ? cell : el("td", cell));
  }
  for (const [key, value] of Object.entries(attrs || {})) tr.setAttribute(key, value);
  return tr;
}

function num(value) {
  return el("td", value === undefined || value === null ? "–" : value, "num");
}

function fill(tableId, rows) {
  const body = document.querySelector("#" + tableId + " tbody");
  body.replaceChildren(...rows);
}

function duration(ms) {
  if (ms < 1000) return ms + " ms";
  if (ms < 60000) return (ms / 1000).toFixed(1) + " s";
  return Math.floor(ms / 60000) + " m " + Math.floor((ms % 60000) / 1000) + " s";
}

function clock(ms) {
  return new Date(ms).toLocaleTimeString();
}

function banner(message) {
  const node = document.getElementById("banner");
  node.hidden = !message;
  node.textContent = message || "";
}

function failed(error) {
  if (error.status === 401 || error.status === 403) {
    banner("The coordinator refused these credentials (" + error.message + "). Open /ui/#token=SECRET with a secret that may read every lock.");
  } else {
    banner("Cannot reach the coordinator: " + error.message);
  }
}

async function refreshLocks() {
  const reply = await get("/v1/locks");
  const byLock = new Map((audit ? audit.locks : []).map((l) => [l.lock, l]));
  const held = reply.locks.filter((l) => l.held);
  fill("locks", held.map((l) => {
    const a = byLock.get(l.lock) || {};
    return row([
      l.lock, l.holder, num(l.epoch), a.class || l.class, num(duration(l.remaining_ms)),
      num(l.waiters), a.boundary || "–", num(a.fence), num(a.lag), num(a.stale_rejections),
    ], { "data-lock": l.lock, "data-epoch": String(l.epoch) });
  }));
  document.getElementById("locks-empty").hidden = held.length > 0;
}

async function refreshFeed() {
  const reply = await get("/v1/transitions?after=" + lastSeq);
  const list = document.getElementById("feed");
  for (const t of reply.transitions) {
    lastSeq = Math.max(lastSeq, t.seq);
    const text = t.kind === "missed"
      ? "… " + t.epoch + " transitions missed"
      : clock(t.at_ms) + "  " + t.lock + "  epoch " + t.epoch + "  " + t.kind + "  " + t.holder;
    const item = el("li", text, "kind-" + t.kind);
    item.setAttribute("data-kind", t.kind);
    list.prepend(item);
    feedCount += 1;
  }
  while (list.children.length > 200) list.lastChild.remove();
  lastSeq = Math.max(lastSeq, reply.last);
  document.getElementById("feed-empty").hidden = feedCount > 0;
}

async function refreshAudit() {
  audit = await get("/v1/audit");
  const policy = audit.policy_file
    ? "Policy " + audit.policy_file + ": " + audit.patterns.length + " rule(s), default class " + audit.default_class + (audit.require_policy ? ", critical locks without a boundary refused" : "")
    : "No policy file: every lock is critical and none names a boundary.";
  document.getElementById("policy").textContent = policy;
  fill("findings", audit.findings.map((f) => row([
    el("td", f.severity, "sev-" + f.severity), f.code, f.subject, f.message,
  ], { "data-code": f.code })));
  const rejections = [];
  for (const b of audit.boundaries) {
    for (const r of b.recent_rejections || []) rejections.push([b.target, r]);
  }
  rejections.sort((x, y) => y[1].at_ms - x[1].at_ms);
  fill("rejections", rejections.slice(0, 50).map(([target, r]) => row([
    clock(r.at_ms), target, r.lock, num(r.epoch), num(r.fence), r.reason,
  ], { "data-reason": r.reason, "data-lock": r.lock })));
  document.getElementById("rejections-empty").hidden = rejections.length > 0;
  fill("boundaries", audit.boundaries.map((b) => {
    const fences = Object.entries(b.fences).map(([lock, fence]) => lock + " " + fence).join(", ");
    const totals = b.rejection_totals || {};
    const refused = [totals.stale_epoch, totals.invalid_token, totals.missing_token]
      .map((n) => (n === undefined ? "–" : n)).join(" / ");
    const restore = b.restore_required ? "REQUIRED: palisade resource restore"
      : (b.restore_floor ? "floor " + b.restore_floor : "–");
    return row([b.target, b.reachable ? "yes" : "NO: " + (b.error || ""), fences || "–", refused, restore]);
  }));
}

async function refreshCluster() {
  const status = await get("/v1/cluster");
  document.getElementById("node").textContent = status.mode === "single"
    ? "single node"
    : "node " + status.node_id + " · " + status.role + " · term " + status.term + " · leader " + (status.leader ?? "none");
  fill("members", (status.members || []).map((m) => row([
    String(m.id), m.addr || "this node", m.kind, m.id === status.leader ? "leader" : "follower",
    num(m.matched), num(m.lag),
  ])));
}

async function tick(step) {
  try {
    await step();
    banner(null);
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (error) {
    failed(error);
  }
}

async function start() {
  credentials();
  // The first render waits for every view, so the page is complete when it first shows data.
  await Promise.all([tick(refreshAudit), tick(refreshCluster), tick(refreshFeed)]);
  await tick(refreshLocks);
  document.body.setAttribute("data-first-render-ms", String(Math.round(performance.now() - started)));
  setInterval(() => tick(refreshLocks), 1000);
  setInterval(() => tick(refreshFeed), 1000);
  setInterval(() => tick(refreshAudit), 3000);
  setInterval(() => tick(refreshCluster), 2000);
}

start();
