// The Palisade console: read-only views polled from the coordinator's HTTP API.
// Every value is put in the page as text (never as HTML): lock names and holders come from
// clients and may contain anything.
"use strict";

const started = performance.now();
let token = null;
let lastSeq = 0;
let feedId = null;
let audit = null;
let heldNow = [];
let showProbes = /(^|[#&])probes\b/.test(location.hash);

// What this page has seen, kept across a leader change (a new leader's feed starts empty):
// leases by lock and epoch, feed entries by identity, refused writes by identity.
// The charts span what this page has seen, from one minute up to five.
const MAX_WINDOW_MS = 5 * 60 * 1000;
const MIN_WINDOW_MS = 60 * 1000;
const BUCKETS = 20;
let WINDOW_MS = MIN_WINDOW_MS;
const MAX_KEPT = 2000;
const leases = new Map();
const feed = [];
const feedSeen = new Set();
const refusals = new Map();

function credentials() {
  const match = location.hash.match(/token=([^&]+)/);
  if (match) {
    sessionStorage.setItem("palisade-token", decodeURIComponent(match[1]));
    history.replaceState(null, "", location.pathname + (showProbes ? "#probes" : ""));
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

// An epoch is 19 digits; two adjacent ones differ in the last few. Shown as its last six,
// the whole number on hover and copied on click.
function shortEpoch(epoch) {
  const text = String(epoch);
  return text.length > 8 ? "…" + text.slice(-6) : text;
}

function epochCell(epoch) {
  if (epoch === undefined || epoch === null) return num(null);
  const cell = el("td", shortEpoch(epoch), "num epoch");
  cell.title = String(epoch);
  cell.setAttribute("data-epoch", String(epoch));
  cell.addEventListener("click", () => navigator.clipboard && navigator.clipboard.writeText(String(epoch)).catch(() => {}));
  return cell;
}

function since(ms) {
  if (!ms) return "–";
  const s = Math.max(0, Math.floor((Date.now() - ms) / 1000));
  if (s < 60) return s + " s";
  if (s < 3600) return Math.floor(s / 60) + " m " + (s % 60) + " s";
  if (s < 86400) return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " m";
  return Math.floor(s / 86400) + " d " + Math.floor((s % 86400) / 3600) + " h";
}

function leaseOf(lock, epoch) {
  const key = lock + "#" + epoch;
  let lease = leases.get(key);
  if (!lease) {
    lease = { lock, epoch: String(epoch), holder: "", start: null, end: null, endKind: null, probe: false, lastHeld: null, renewals: [] };
    leases.set(key, lease);
  }
  return lease;
}

function visible(lease) {
  return showProbes || !lease || !lease.probe;
}

function trim() {
  if (feed.length > MAX_KEPT) feed.splice(0, feed.length - MAX_KEPT);
  const now = Date.now();
  let earliest = now;
  for (const t of feed) if (t.at_ms) earliest = Math.min(earliest, t.at_ms);
  for (const l of leases.values()) if (l.start) earliest = Math.min(earliest, l.start);
  for (const r of refusals.values()) earliest = Math.min(earliest, r.at);
  WINDOW_MS = Math.min(MAX_WINDOW_MS, Math.max(MIN_WINDOW_MS, Math.ceil((now - earliest) / 60000) * 60000));
  const minutes = WINDOW_MS / 60000;
  document.getElementById("window-label").textContent = minutes === 1 ? "minute" : minutes + " min";
  const old = now - 2 * MAX_WINDOW_MS;
  for (const [key, lease] of leases) {
    if (lease.end !== null && lease.end < old) leases.delete(key);
  }
  for (const [key, r] of refusals) {
    if (r.at < old) refusals.delete(key);
  }
}

async function refreshLocks() {
  const reply = await get("/v1/locks");
  const byLock = new Map((audit ? audit.locks : []).map((l) => [l.lock, l]));
  heldNow = reply.locks.filter((l) => l.held);
  const now = Date.now();
  const heldKeys = new Set();
  for (const l of heldNow) {
    const lease = leaseOf(l.lock, l.epoch);
    lease.holder = l.holder;
    if (lease.start === null && l.granted_unix_ms) lease.start = l.granted_unix_ms;
    // Renewals as the polls see them: the last renewal's time, each new one kept (at most 50).
    if (l.renewed_unix_ms && !lease.renewals.includes(l.renewed_unix_ms)) {
      lease.renewals.push(l.renewed_unix_ms);
      if (lease.renewals.length > 50) lease.renewals.shift();
    }
    lease.lastHeld = now;
    heldKeys.add(l.lock + "#" + l.epoch);
  }
  // A lease this page saw held that is gone without a transition seen (a leader change):
  // it ended between the two looks.
  for (const [key, lease] of leases) {
    if (lease.end === null && lease.lastHeld !== null && !heldKeys.has(key)) {
      lease.end = lease.lastHeld;
      lease.endKind = lease.endKind || "ended";
    }
  }
  fill("locks", heldNow.filter((l) => visible(leases.get(l.lock + "#" + l.epoch))).map((l) => {
    const a = byLock.get(l.lock) || {};
    return row([
      l.lock, l.holder, epochCell(l.epoch), num(since(l.granted_unix_ms)), a.class || l.class,
      num(duration(l.remaining_ms)), num(l.waiters), a.boundary || "–", num(a.fence === undefined ? null : shortEpoch(a.fence)),
      num(a.lag), num(a.stale_rejections),
    ], { "data-lock": l.lock, "data-epoch": String(l.epoch) });
  }));
  document.getElementById("locks-empty").hidden = heldNow.length > 0;
}

function noteTransition(t) {
  const key = t.at_ms + "|" + t.kind + "|" + t.lock + "|" + t.epoch;
  if (feedSeen.has(key)) return;
  feedSeen.add(key);
  feed.push(t);
  if (t.kind === "missed") return;
  const lease = leaseOf(t.lock, t.epoch);
  lease.holder = t.holder;
  lease.probe = lease.probe || Boolean(t.probe);
  if (t.kind === "granted") lease.start = t.at_ms;
  else {
    lease.end = t.at_ms;
    lease.endKind = t.kind;
    lease.by = t.by;
  }
}

async function refreshFeed() {
  let reply = await get("/v1/transitions?after=" + lastSeq);
  if (reply.feed !== feedId || reply.last < lastSeq) {
    // Another feed (a new leader, a restart: its numbers start again). Read it whole; what
    // this page saw before stays.
    feedId = reply.feed;
    lastSeq = 0;
    reply = await get("/v1/transitions?after=0");
  }
  for (const t of reply.transitions) {
    lastSeq = Math.max(lastSeq, t.seq);
    noteTransition(t);
  }
  lastSeq = Math.max(lastSeq, reply.last);
  renderFeed();
}

function renderFeed() {
  const list = document.getElementById("feed");
  const items = [];
  for (const t of feed.slice(-200)) {
    const probe = t.kind !== "missed" && (t.probe || (leases.get(t.lock + "#" + t.epoch) || {}).probe);
    const text = t.kind === "missed"
      ? "… " + t.epoch + " transitions missed"
      : clock(t.at_ms) + "  " + t.lock + "  epoch " + shortEpoch(t.epoch) + "  " + t.kind + "  " + t.holder
        + (t.by ? "  by " + t.by : "") + (probe ? "  (audit probe)" : "");
    const item = el("li", text, "kind-" + t.kind + (probe ? " probe" : ""));
    item.title = t.kind === "missed" ? "" : "epoch " + t.epoch;
    for (const [name, value] of [["data-kind", t.kind], ["data-lock", t.lock], ["data-epoch", String(t.epoch)], ["data-holder", t.holder], ["data-probe", String(Boolean(probe))]]) {
      item.setAttribute(name, value);
    }
    if (probe && !showProbes) item.hidden = true;
    items.push(item);
  }
  list.replaceChildren(...items.reverse());
  document.getElementById("feed-empty").hidden = items.some((item) => !item.hidden);
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
  for (const b of audit.boundaries) {
    for (const r of b.recent_rejections || []) {
      const key = b.target + "|" + r.at_ms + "|" + r.lock + "|" + r.epoch + "|" + r.reason;
      if (!refusals.has(key)) refusals.set(key, { at: r.at_ms, lock: r.lock, epoch: String(r.epoch), fence: r.fence, reason: r.reason, target: b.target });
    }
  }
  renderRejections();
  fill("boundaries", audit.boundaries.map((b) => {
    const fences = Object.entries(b.fences).map(([lock, fence]) => lock + " " + shortEpoch(fence)).join(", ");
    const totals = b.rejection_totals || {};
    const refused = [totals.stale_epoch, totals.invalid_token, totals.missing_token]
      .map((n) => (n === undefined ? "–" : n)).join(" / ");
    const restore = b.restore_required ? "REQUIRED: palisade resource restore"
      : (b.restore_floor ? "floor " + b.restore_floor : "–");
    return row([b.target, b.reachable ? "yes" : "NO: " + (b.error || ""), fences || "–", refused, restore]);
  }));
}

function renderRejections() {
  const shown = [...refusals.values()]
    .filter((r) => visible(leases.get(r.lock + "#" + r.epoch)))
    .sort((x, y) => y.at - x.at);
  fill("rejections", shown.slice(0, 50).map((r) => row([
    clock(r.at), r.target, r.lock, epochCell(r.epoch), epochCell(r.fence), r.reason,
  ], { "data-reason": r.reason, "data-lock": r.lock, "data-epoch": r.epoch })));
  document.getElementById("rejections-empty").hidden = shown.length > 0;
}

const SVG = "http://www.w3.org/2000/svg";

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  if (text !== undefined) node.textContent = String(text);
  return node;
}

function titled(node, text) {
  node.appendChild(svg("title", {}, text));
  return node;
}

function hue(text) {
  let h = 0;
  for (const c of text) h = (h * 31 + c.charCodeAt(0)) % 360;
  return h;
}

function timeAxis(root, x, left, right, height) {
  const step = WINDOW_MS <= MIN_WINDOW_MS ? 10000 : 60000;
  for (let back = 0; back <= WINDOW_MS; back += step) {
    const at = x(Date.now() - back);
    const text = back === 0 ? "now" : "−" + (step === 60000 ? back / 60000 + " min" : back / 1000 + " s");
    root.appendChild(svg("line", { x1: at, x2: at, y1: 0, y2: height - 14, class: "gridline" }));
    root.appendChild(svg("text", { x: at, y: height - 2, "text-anchor": back === 0 ? "end" : "middle", class: "axis" }, text));
  }
}

// One lane per lock with a lease in the window: a bar per lease (holder · epoch), its end
// marked when it expired or was broken, and each write a boundary refused as a ✕ at its time,
// on the lock's lane, naming the lease whose epoch it carried.
function renderTimeline() {
  const root = document.getElementById("timeline");
  const now = Date.now();
  const t0 = now - WINDOW_MS;
  const inWindow = [...leases.values()].filter((l) => visible(l) && (l.end === null || l.end >= t0) && (l.start !== null || l.lastHeld !== null || l.end !== null));
  const locks = [...new Set(inWindow.map((l) => l.lock))].sort().slice(0, 30);
  document.getElementById("timeline-empty").hidden = locks.length > 0;
  if (locks.length === 0) {
    root.replaceChildren();
    return;
  }
  const width = Math.max(600, Math.min(root.clientWidth || 1200, 1240));
  const label = 170;
  const lane = 24;
  const height = locks.length * lane + 22;
  const x = (t) => label + ((Math.max(t0, Math.min(now, t)) - t0) / WINDOW_MS) * (width - label - 8);
  const chart = svg("svg", { viewBox: "0 0 " + width + " " + height, width, height, role: "img", "aria-label": "ownership timeline" });
  timeAxis(chart, x, label, width, height);
  locks.forEach((lock, i) => {
    const y = i * lane;
    chart.appendChild(svg("rect", { x: 0, y: y + 2, width, height: lane - 4, class: "lane" }));
    chart.appendChild(titled(svg("text", { x: 4, y: y + lane / 2 + 4, class: "lock-name" }, lock.length > 24 ? lock.slice(0, 23) + "…" : lock), lock));
    for (const l of inWindow.filter((l) => l.lock === lock)) {
      const x1 = x(l.start === null ? t0 : l.start);
      const x2 = x(l.end === null ? now : l.end);
      const g = svg("g", { class: "lease", "data-lock": lock, "data-epoch": l.epoch, "data-holder": l.holder, "data-end": l.end === null ? "held" : l.endKind });
      g.appendChild(svg("rect", { x: x1, y: y + 4, width: Math.max(2, x2 - x1), height: lane - 8, rx: 3, fill: "hsl(" + hue(l.holder) + " 55% 42%)", class: "lease" + (l.end === null ? " open" : "") }));
      const fits = Math.floor((x2 - x1 - 8) / 6.5);
      const text = l.holder + " · " + shortEpoch(l.epoch);
      if (fits >= 6) g.appendChild(svg("text", { x: x1 + 4, y: y + lane / 2 + 4, class: "label" }, text.length > fits ? text.slice(0, fits - 1) + "…" : text));
      if (l.endKind === "expired" || l.endKind === "broken") g.appendChild(svg("line", { x1: x2, x2, y1: y + 2, y2: y + lane - 2, class: "end-" + l.endKind }));
      for (const at of l.renewals) {
        if (at < t0) continue;
        const rx = x(at);
        g.appendChild(titled(svg("line", { x1: rx, x2: rx, y1: y + 4, y2: y + lane - 4, class: "renewal", "data-at": at }), "renewed at " + clock(at)));
      }
      titled(g, l.holder + " at epoch " + l.epoch + (l.start ? ", from " + clock(l.start) : "") + (l.end === null ? ", held now" : ", " + l.endKind + " at " + clock(l.end) + (l.by ? " by " + l.by : "")) + (l.probe ? " (audit probe)" : ""));
      chart.appendChild(g);
    }
    for (const r of refusals.values()) {
      if (r.lock !== lock || r.at < t0) continue;
      const owner = leases.get(r.lock + "#" + r.epoch);
      if (!visible(owner)) continue;
      const cx = x(r.at);
      const cy = y + lane / 2;
      const g = svg("g", { class: "refusal", "data-lock": r.lock, "data-epoch": r.epoch, "data-holder": owner ? owner.holder : "", "data-reason": r.reason });
      g.appendChild(svg("line", { x1: cx - 5, y1: cy - 5, x2: cx + 5, y2: cy + 5 }));
      g.appendChild(svg("line", { x1: cx - 5, y1: cy + 5, x2: cx + 5, y2: cy - 5 }));
      titled(g, "refused at " + clock(r.at) + " by " + r.target + ": epoch " + r.epoch + (owner ? " (" + owner.holder + ")" : "") + ", " + r.reason);
      chart.appendChild(g);
    }
  });
  root.replaceChildren(chart);
}

// Grants, ends (expiries and breaks) and refused writes per 15 s over the window.
function renderRates() {
  const root = document.getElementById("rates");
  const now = Date.now();
  const t0 = now - WINDOW_MS;
  const buckets = BUCKETS;
  const BUCKET_MS = WINDOW_MS / BUCKETS;
  const series = { grants: new Array(buckets).fill(0), ends: new Array(buckets).fill(0), refusals: new Array(buckets).fill(0) };
  const put = (name, at) => {
    if (at >= t0 && at <= now) series[name][Math.min(buckets - 1, Math.floor((at - t0) / BUCKET_MS))] += 1;
  };
  for (const t of feed) {
    if (t.kind === "missed" || !visible(leases.get(t.lock + "#" + t.epoch))) continue;
    if (t.kind === "granted") put("grants", t.at_ms);
    if (t.kind === "expired" || t.kind === "broken") put("ends", t.at_ms);
  }
  for (const r of refusals.values()) if (visible(leases.get(r.lock + "#" + r.epoch))) put("refusals", r.at);
  const width = Math.max(600, Math.min(root.clientWidth || 1200, 1240));
  const height = 120;
  const left = 40;
  const top = Math.max(1, ...Object.values(series).flat());
  const x = (i) => left + (i + 0.5) * ((width - left - 8) / buckets);
  const y = (n) => 8 + (1 - n / top) * (height - 30);
  const chart = svg("svg", { viewBox: "0 0 " + width + " " + height, width, height, role: "img", "aria-label": "rates" });
  chart.appendChild(svg("text", { x: 4, y: 14, class: "axis" }, top));
  chart.appendChild(svg("text", { x: 4, y: height - 22, class: "axis" }, 0));
  timeAxis(chart, (t) => left + ((t - t0) / WINDOW_MS) * (width - left - 8), left, width, height);
  for (const [name, counts] of Object.entries(series)) {
    const total = counts.reduce((a, b) => a + b, 0);
    const points = counts.map((n, i) => x(i) + "," + y(n)).join(" ");
    chart.appendChild(titled(svg("polyline", { points, class: "series-" + name, "data-series": name, "data-total": total }), name + ": " + total + " in the window"));
  }
  let lx = left + 8;
  for (const [name, counts] of Object.entries(series)) {
    chart.appendChild(svg("line", { x1: lx, x2: lx + 14, y1: 20, y2: 20, class: "series-" + name }));
    chart.appendChild(svg("text", { x: lx + 18, y: 24, class: "axis" }, name + " " + counts.reduce((a, b) => a + b, 0)));
    lx += 120;
  }
  root.replaceChildren(chart);
  const sum = (name) => series[name].reduce((a, b) => a + b, 0);
  document.getElementById("summary").textContent = heldNow.length + " held · last " + WINDOW_MS / 60000 + " min: " + sum("grants") + " grants, " + sum("ends") + " expired or broken, " + sum("refusals") + " writes refused";
}

function render() {
  trim();
  renderFeed();
  renderRejections();
  renderTimeline();
  renderRates();
  document.body.setAttribute("data-fits", String(document.documentElement.scrollWidth <= window.innerWidth));
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
  const toggle = document.getElementById("show-probes");
  toggle.checked = showProbes;
  toggle.addEventListener("change", () => {
    showProbes = toggle.checked;
    render();
  });
  // The first render waits for every view, so the page is complete when it first shows data.
  await Promise.all([tick(refreshAudit), tick(refreshCluster), tick(refreshFeed)]);
  await tick(refreshLocks);
  render();
  document.body.classList.remove("loading");
  document.body.setAttribute("data-first-render-ms", String(Math.round(performance.now() - started)));
  setInterval(() => tick(refreshLocks).then(render), 1000);
  setInterval(() => tick(refreshFeed), 1000);
  setInterval(() => tick(refreshAudit), 3000);
  setInterval(() => tick(refreshCluster), 2000);
}

start();
