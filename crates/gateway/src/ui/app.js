// The Staccato dashboard: reads GET /system/dashboard/stream (server-sent
// events, one snapshot a second) with the management token as a bearer
// token, and draws functions, engines and recent call trees. Counts in a
// snapshot are cumulative; rates and percentiles come from the difference
// between the newest snapshot and one about WINDOW_MS older.
"use strict";

const WINDOW_MS = 10000;
const TOKEN_KEY = "staccato-token";
let snaps = [];   // recent snapshots, oldest first

function takeTokenFromFragment() {
  const m = /(?:^|&)token=([^&]*)/.exec(location.hash.slice(1));
  if (!m) return false;
  let token;
  try {
    token = decodeURIComponent(m[1]);
  } catch {
    token = m[1]; // not percent-encoded after all
  }
  sessionStorage.setItem(TOKEN_KEY, token);
  // Out of the address bar (and of a bookmark or a screenshot of it).
  window.history.replaceState(null, "", location.pathname);
  return true;
}

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k === "style") e.style.cssText = v; else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k);
  return e;
}

function fmtUs(s) {
  if (s === null || s === undefined) return "–";
  if (!isFinite(s)) return "> 10 s";
  const us = s * 1e6;
  if (us < 1000) return us.toFixed(0) + " µs";
  if (us < 1e6) return (us / 1000).toFixed(us < 10000 ? 2 : 1) + " ms";
  return (us / 1e6).toFixed(2) + " s";
}

// The q-quantile of a histogram given as per-bucket counts over `bounds`
// (the last count is above every bound): linear within its bucket.
function quantile(counts, bounds, q) {
  const total = counts.reduce((a, b) => a + b, 0);
  if (!total) return null;
  const rank = q * total;
  let seen = 0;
  for (let i = 0; i < counts.length; i++) {
    if (seen + counts[i] >= rank && counts[i] > 0) {
      if (i >= bounds.length) return Infinity; // above every bound
      const lo = i === 0 ? 0 : bounds[i - 1];
      return lo + (bounds[i] - lo) * ((rank - seen) / counts[i]);
    }
    seen += counts[i];
  }
  return Infinity;
}


function render(snap) {
  // A gateway that restarted counts from zero: start the window again.
  const last = snaps[snaps.length - 1];
  if (last && Object.entries(snap.functions).some(([n, f]) => {
    const o = last.functions[n];
    return o && o.latency && f.latency && f.latency.count < o.latency.count;
  })) snaps = [];
  snaps.push(snap);
  while (snaps.length > 2 && snap.time_ms - snaps[1].time_ms >= WINDOW_MS) snaps.shift();
  const old = snaps[0];
  const dt = Math.max((snap.time_ms - old.time_ms) / 1000, 1e-9);
  document.getElementById("updated").textContent = "updated " + new Date(snap.time_ms).toLocaleTimeString();

  const tbody = document.querySelector("#functions tbody");
  tbody.replaceChildren();
  // The functions the engines run (a name only ever seen in a request
  // URL is not one).
  for (const name of Object.keys(snap.functions).filter((n) => snap.functions[n].engines).sort()) {
    const f = snap.functions[name], o = old.functions[name] || {};
    const engines = f.engines;
    const add = (k) => engines.reduce((a, e) => a + (e[k] || 0), 0);
    const addOld = (k) => (o.engines || []).reduce((a, e) => a + (e[k] || 0), 0);
    // Every call the engines ran, internal ones too; latency is the
    // gateway's, so of external calls only.
    const calls = add("completed") + add("failed"), errors = add("failed");
    const lat = (f.latency || {}).buckets || [];
    const latOld = (o.latency || {}).buckets || lat.map(() => 0);
    const window = old === snap ? lat : lat.map((n, i) => n - (latOld[i] || 0));
    const rate = old === snap ? 0 : Math.max(calls - addOld("completed") - addOld("failed"), 0) / dt;
    const paused = engines.filter((e) => e.paused === true).length;
    const running = engines.filter((e) => e.paused === false).length;
    const container = paused || running ? (running ? "running" : "paused") + (paused && running ? ` (${paused} paused)` : "") : "–";
    const row = el("tr", { "data-function": name },
      el("td", { class: "name" }, name),
      el("td", { class: "runtime" }, engines[0].runtime),
      el("td", { class: "rate" }, rate.toFixed(rate < 10 ? 1 : 0)),
      el("td", { class: "p50" }, fmtUs(quantile(window, snap.bounds_s, 0.5))),
      el("td", { class: "p99" }, fmtUs(quantile(window, snap.bounds_s, 0.99))),
      el("td", { class: "calls" }, String(calls)),
      el("td", { class: "errors" + (errors ? " some" : "") }, String(errors)),
      el("td", { class: "tau" }, String(add("tau"))),
      el("td", { class: "workers" }, `${add("workers")} (${add("busy")})`),
      el("td", { class: "queued" }, String(add("queued"))),
      el("td", { class: "container" }, container),
      el("td", { class: "cold" }, String(f.cold_starts || 0)));
    const lastError = engines.map((e) => e.last_error).filter(Boolean)[0];
    if (lastError) row.title = "last error: " + lastError;
    tbody.append(row);
  }

  const etbody = document.querySelector("#engines tbody");
  etbody.replaceChildren(...snap.engines.map((e) => el("tr", { "data-engine": e.id },
    el("td", {}, e.id), el("td", { class: "state" }, e.state),
    el("td", {}, String(e.in_flight)), el("td", {}, String(e.calls)),
    el("td", { class: "pool" }, e.pool ? `${e.pool.idle} / ${e.pool.target}` : "no containers"),
    el("td", {}, e.pool ? String(e.pool.created) : "–"),
    el("td", {}, e.pool ? String(e.pool.misses) : "–"))));

  renderRecent(snap.recent || []);
}

// Call trees: roots are calls from outside (parent 0); each call's bar
// spans receive -> complete on its engine's clock, relative to its root.
function renderRecent(records) {
  const box = document.getElementById("recent");
  if (!records.length) { box.textContent = "none yet"; box.className = "muted"; return; }
  box.className = "";
  const byId = new Map(records.map((r) => [r.engine + "/" + r.call_id, r]));
  const kids = new Map();
  const roots = [];
  for (const r of records) {
    const parentKey = r.engine + "/" + r.parent_call_id;
    if (/^0+$/.test(r.parent_call_id) || !byId.has(parentKey)) roots.push(r);
    else (kids.get(parentKey) || kids.set(parentKey, []).get(parentKey)).push(r);
  }
  roots.sort((a, b) => b.receive_ns - a.receive_ns);
  const trees = [];
  for (const root of roots.slice(0, 8)) {
    const rows = [];
    const walk = (r, depth) => {
      rows.push([r, depth]);
      for (const k of (kids.get(r.engine + "/" + r.call_id) || []).sort((a, b) => a.receive_ns - b.receive_ns)) walk(k, depth + 1);
    };
    walk(root, 0);
    const t0 = Math.min(...rows.map(([r]) => r.receive_ns));
    const t1 = Math.max(...rows.map(([r]) => r.complete_ns || r.receive_ns));
    const span = Math.max(t1 - t0, 1);
    const tree = el("div", { class: "tree", "data-root": root.call_id },
      el("div", { class: "tree-head" }, `${root.function} · ${fmtUs(span / 1e9)} · ${rows.length} call${rows.length > 1 ? "s" : ""}`));
    for (const [r, depth] of rows) {
      const left = ((r.receive_ns - t0) / span) * 70;
      const width = Math.max((((r.complete_ns || r.receive_ns) - r.receive_ns) / span) * 70, 0.3);
      const ok = r.outcome === "ok";
      tree.append(el("div", { class: "span" + (ok ? "" : " error"), "data-function": r.function, "data-outcome": r.outcome },
        el("div", { class: "bar", style: `left:${left}%;width:${width}%` }),
        el("div", { class: "label", style: `left:${Math.min(left + width, 70) + 1}%` },
          `${"· ".repeat(depth)}${r.function} ${fmtUs(((r.complete_ns || r.receive_ns) - r.receive_ns) / 1e9)}${ok ? "" : " — " + r.outcome}`)));
    }
    trees.push(tree);
  }
  box.replaceChildren(...trees);
}

function setStatus(text, live) {
  const s = document.getElementById("status");
  s.textContent = text;
  s.className = live ? "live" : "down";
}

function askForToken(message) {
  document.getElementById("login-box").hidden = false;
  document.getElementById("login-error").textContent = message || "";
}

// One stream at a time: a new token ends the old stream's loop.
let current = null;

async function follow() {
  if (current) current.abort();
  const me = (current = new AbortController());
  const token = sessionStorage.getItem(TOKEN_KEY);
  const headers = token ? { Authorization: "Bearer " + token } : {};
  let wait = 1000;
  while (current === me) {
    try {
      const r = await fetch("/system/dashboard/stream", { headers, cache: "no-store", signal: me.signal });
      if (r.status === 401) {
        setStatus("not signed in", false);
        askForToken(token ? "That token was refused." : "This gateway needs its management token.");
        return;
      }
      if (!r.ok) throw new Error("HTTP " + r.status);
      document.getElementById("login-box").hidden = true;
      setStatus("live", true);
      wait = 1000;
      snaps = [];
      const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value;
        let i;
        while ((i = buf.indexOf("\n\n")) >= 0) {
          const event = buf.slice(0, i);
          buf = buf.slice(i + 2);
          const data = event.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n");
          if (data) render(JSON.parse(data));
        }
      }
      setStatus("reconnecting", false);
      // Never a tight loop, whatever ended the stream.
      await new Promise((ok) => setTimeout(ok, 500));
    } catch (e) {
      if (current !== me) return;
      setStatus("disconnected: " + e.message, false);
      await new Promise((ok) => setTimeout(ok, wait));
      wait = Math.min(wait * 2, 10000);
    }
  }
}

document.getElementById("login").addEventListener("submit", (ev) => {
  ev.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, document.getElementById("token").value.trim());
  follow();
});
// A link with the token (`staccato ui`) opened on a tab already here.
window.addEventListener("hashchange", () => {
  if (takeTokenFromFragment()) follow();
});
takeTokenFromFragment();
follow();
