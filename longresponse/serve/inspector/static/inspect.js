// The inspector page: reads /inspect/api/state and the rollout endpoint, follows
// /inspect/api/feed (Server-Sent Events), and draws with plain DOM and SVG.
// No library, no build step. The page's own ?key= is passed on to every request.
"use strict";

const KEY = new URLSearchParams(location.search).get("key");
const PHASES = [
  ["admission", "admission + validation"],
  ["classification", "classification"],
  ["render", "render"],
  ["ttft", "model: time to first token"],
  ["count", "counting the input, after the first output"],
  ["decode", "model: decode"],
  ["hosted", "hosted tools, run by the server (MCP listings and calls)"],
  ["post", "post-inference"],
  ["pause", "paused for client tools"],
];
const SVG = "http://www.w3.org/2000/svg";
let selected = location.hash.startsWith("#rollout=") ? location.hash.slice(9) : null;
let detail = null;
let refreshTimer = null;

function url(path) {
  return KEY ? `${path}${path.includes("?") ? "&" : "?"}key=${encodeURIComponent(KEY)}` : path;
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value !== null && value !== undefined) node.setAttribute(name, value);
  }
  for (const child of children) {
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, value);
  return node;
}

function bytes(n) {
  if (n === null || n === undefined) return "–";
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} kB`;
  return `${(n / 1024 / 1024).toFixed(1)} MB`;
}

function short(id) {
  return id.length > 20 ? `${id.slice(0, 11)}…${id.slice(-6)}` : id;
}

function ms(n) {
  return n < 10 ? `${n.toFixed(2)} ms` : `${n.toFixed(0)} ms`;
}

function age(seconds) {
  if (seconds < 60) return `${seconds.toFixed(0)} s`;
  if (seconds < 3600) return `${(seconds / 60).toFixed(1)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

function stateBadge(rollout) {
  const span = el("span", { class: `state state-${rollout.status}` }, rollout.status);
  if (rollout.status === "paused" && rollout.pending_call_ids.length) {
    return el("span", {}, span, " waiting for ",
      el("span", { class: "calls" }, rollout.pending_call_ids.join(", ")));
  }
  return span;
}

// --- the server panel, connections and rollouts -------------------------------

function renderState(state) {
  const s = state.server;
  const rows = [
    ["event-loop lag", `${ms(s.event_loop_lag_ms)} (worst ${ms(s.event_loop_lag_max_ms)})`],
    ["live rollouts", s.live_rollouts],
    ["paused rollouts", s.paused_rollouts],
    ["WebSocket sessions", s.live_sessions],
    ["memory (RSS)", `${bytes(s.memory.rss_bytes)} (peak ${bytes(s.memory.peak_rss_bytes)})`],
    ["store", s.store.state + (s.store.backend ? ` (${s.store.backend})` : "")
      + (s.store.error ? `: ${s.store.error}` : "")],
    ["uptime", age(s.uptime_s)],
    ["feeds", `${s.watchers} of ${s.max_watchers}`],
  ];
  document.getElementById("server").replaceChildren(
    ...rows.flatMap(([name, value]) => [el("dt", {}, name), el("dd", { "data-field": name }, value)]));

  document.querySelector("#connections tbody").replaceChildren(...state.connections.map((c) =>
    el("tr", { "data-connection-id": c.id },
      el("td", {}, c.id), el("td", {}, c.shape), el("td", {}, c.shape === "http" ? "–" : age(c.age_s)),
      el("td", {}, c.lanes ?? "–"), el("td", {}, bytes(c.bytes_in)), el("td", {}, bytes(c.bytes_out)),
      el("td", {}, c.outbox_events === null ? "–" : `${c.outbox_events} (${bytes(c.outbox_bytes)})`))));

  const rollouts = [...state.rollouts].reverse();
  const scale = (name) => Math.max(1e-9, ...rollouts.flatMap((r) => r.per_turn[name]));
  const scales = { pre_inference_ms: scale("pre_inference_ms"), bytes: scale("bytes") };
  document.querySelector("#rollouts tbody").replaceChildren(...rollouts.map((r) => {
    const row = el("tr", { "data-rollout-id": r.id, "data-status": r.status,
        class: r.id === selected ? "selected" : null },
      el("td", { title: r.id }, short(r.id)), el("td", {}, r.shape), el("td", {}, r.connection), el("td", {}, r.model ?? "–"),
      el("td", { class: "rollout-state" }, stateBadge(r)), el("td", {}, r.turns),
      el("td", {}, bytes(r.bytes_in)), el("td", {}, bytes(r.bytes_out)),
      el("td", {}, spark(r.per_turn.pre_inference_ms, scales.pre_inference_ms, ms)),
      el("td", {}, spark(r.per_turn.bytes, scales.bytes, bytes)));
    row.addEventListener("click", () => select(r.id));
    return row;
  }));
  if (!selected && rollouts.length) select(rollouts[0].id);
}

// A sparkline of per-turn figures on a scale shared by every row, and the last value.
function spark(values, top, format) {
  const line = svg("svg", { class: "spark", viewBox: "0 0 120 18", preserveAspectRatio: "none" });
  const step = values.length > 1 ? 118 / (values.length - 1) : 0;
  const points = values.map((v, i) => `${1 + i * step},${17 - (v / top) * 16}`).join(" ");
  line.append(svg("polyline", { points: values.length === 1 ? `0,${points.split(",")[1]} 120,${points.split(",")[1]}` : points }));
  return el("span", {}, line, el("span", { class: "spark-value" }, values.length ? format(values.at(-1)) : "–"));
}

// --- one rollout: the timeline and the event log ------------------------------

function phases(turn) {
  const t = turn.server;
  const count = t.count_ms || 0; // within the model's time: it runs while the model writes
  const decode = Math.max(0, t.inference_ms - t.time_to_first_token_ms - count);
  return {
    admission: t.decode_ms + t.validate_ms,
    classification: t.classify_ms,
    render: t.resolve_ms + t.render_ms,
    ttft: t.time_to_first_token_ms,
    count: count,
    decode: decode,
    hosted: t.hosted_ms || 0,
    post: t.post_inference_ms,
    pause: document.getElementById("show-pauses").checked ? turn.pause_ms : 0,
  };
}

function renderTimeline(turns) {
  const all = turns.map(phases);
  const longest = Math.max(1e-9, ...all.map((p) => Object.values(p).reduce((a, b) => a + b, 0)));
  const most = Math.max(1, ...turns.map((t) => t.bytes_in + t.bytes_out));
  const rows = turns.map((turn, i) => {
    const bar = svg("svg", { class: "turn-bar", viewBox: "0 0 1000 18", preserveAspectRatio: "none",
      "data-turn": turn.turn });
    let x = 0;
    for (const [name, label] of PHASES) {
      const width = (all[i][name] / longest) * 1000;
      const rect = svg("rect", { class: `phase-${name}`, x: x, y: 0, width: Math.max(0, width), height: 18,
        "data-phase": name });
      const title = svg("title", {});
      title.textContent = `${label}: ${ms(all[i][name])}`;
      rect.append(title);
      bar.append(rect);
      x += width;
    }
    const wire = svg("svg", { class: "turn-bytes", viewBox: "0 0 1000 4", preserveAspectRatio: "none" });
    wire.append(svg("rect", { class: "bytes", x: 0, y: 0, height: 4,
      width: ((turn.bytes_in + turn.bytes_out) / most) * 1000 }));
    const numbers = `new ${turn.new_tokens} · cached ${turn.cached_tokens} · total ${turn.input_tokens}`
      + ` tok · ↑${bytes(turn.bytes_in)} ↓${bytes(turn.bytes_out)}`;
    return el("div", { class: "turn-row" },
      el("span", { class: "turn-label" }, `turn ${turn.turn}`),
      el("span", {}, bar, wire),
      el("span", { class: "turn-numbers", title: turn.response_id }, numbers));
  });
  const scale = el("div", { class: "turn-row" }, el("span", {}), el("small", {},
    `full width = ${ms(longest)}; thin bar: bytes on the wire (full = ${bytes(most)})`), el("span", {}));
  document.getElementById("timeline").replaceChildren(...rows, scale);
}

function renderEvents() {
  if (!detail) return;
  const filter = document.getElementById("event-filter");
  const chosen = filter.value;
  const types = [...new Set(detail.events.map((e) => e.type))].sort();
  filter.replaceChildren(el("option", { value: "" }, "all"),
    ...types.map((t) => el("option", { value: t }, t)));
  filter.value = types.includes(chosen) ? chosen : "";
  const events = detail.events.filter((e) => !filter.value || e.type === filter.value);
  document.querySelector("#events tbody").replaceChildren(...events.slice(-400).reverse().map((e) =>
    el("tr", { "data-type": e.type },
      el("td", {}, e.seq), el("td", {}, new Date(e.at * 1000).toISOString().slice(11, 23)),
      el("td", { class: `dir-${e.direction}` }, e.direction),
      el("td", {}, e.count > 1 ? `${e.type} ×${e.count}` : e.type),
      el("td", {}, e.count > 1 ? `${e.sequence_number}–${e.sequence_number + e.count - 1}`
        : e.sequence_number ?? ""), el("td", {}, e.bytes || ""),
      el("td", {}, e.detail ? JSON.stringify(e.detail) : ""))));
  document.getElementById("events-kept").textContent =
    `(${detail.events.length} most recent kept, up to ${detail.events_kept})`;
}

function renderDetail() {
  const section = document.getElementById("detail");
  if (!detail) { section.hidden = true; return; }
  section.hidden = false;
  document.getElementById("detail-id").textContent = `${detail.id} (${detail.shape})`;
  document.getElementById("detail-state").replaceChildren(stateBadge(detail));
  renderTimeline(detail.timeline);
  renderEvents();
  const link = document.getElementById("download");
  link.href = url(`/inspect/api/rollouts/${encodeURIComponent(detail.id)}/trace`);
  link.setAttribute("download", `${detail.id}.json`);
}

async function loadDetail() {
  refreshTimer = null;
  if (!selected) return;
  const response = await fetch(url(`/inspect/api/rollouts/${encodeURIComponent(selected)}`));
  detail = response.ok ? await response.json() : null;
  renderDetail();
}

function refreshSoon() {
  if (refreshTimer === null) refreshTimer = setTimeout(loadDetail, 250);
}

function select(id) {
  selected = id;
  history.replaceState(null, "", `${location.search}#rollout=${id}`);
  for (const row of document.querySelectorAll("#rollouts tbody tr")) {
    row.classList.toggle("selected", row.dataset.rolloutId === id);
  }
  loadDetail();
}

// --- the feed ---------------------------------------------------------------------

function follow() {
  const status = document.getElementById("feed-status");
  const feed = new EventSource(url("/inspect/api/feed"));
  feed.addEventListener("open", () => { status.textContent = "live"; status.className = "feed-on"; });
  feed.addEventListener("error", () => { status.textContent = "reconnecting…"; status.className = "feed-off"; });
  feed.addEventListener("state", (message) => renderState(JSON.parse(message.data)));
  for (const kind of ["event", "turn", "rollout"]) {
    feed.addEventListener(kind, (message) => {
      const data = JSON.parse(message.data);
      if ((data.rollout ?? data.id) === selected) refreshSoon();
    });
  }
  feed.addEventListener("lagged", () => { status.textContent = "lagged, reconnecting…"; });
}

document.getElementById("legend").replaceChildren(...PHASES.map(([name, label]) =>
  el("span", { style: `--c: var(--${name})` }, label)));
document.getElementById("event-filter").addEventListener("change", renderEvents);
document.getElementById("show-pauses").addEventListener("change", renderDetail);
fetch(url("/inspect/api/state")).then((r) => r.json()).then(renderState);
if (selected) loadDetail();
follow();
