// tokentap's live view: reads /api/live/snapshot once (the heatmaps' last 5 minutes), then
// the server-sent events of /api/live/stream: `tick` (the window's figures, the slowest
// recent requests and each model's newest heatmap column) and `requests` (requests just
// finished).
// Charts: uPlot (vendored, /ui/uplot.min.js); the heatmaps are drawn in its draw hook.
// Model and tenant names come from clients: they are only ever Map keys (never property
// names of a plain object, where `constructor` or `__proto__` would find the prototype's)
// and text (textContent, dataset), never markup.
"use strict";

const HEAT_COLUMNS = 300;
const live = {
  window: 60,
  bounds: { ttft: [], itl: [] },
  frame: null,
  heat: new Map(),   // model -> { at: [s...], ttft: [[counts]...], itl: [[counts]...] }
  plots: new Map(),  // "model/kind" -> uPlot
  recent: [],
  source: null,
  ticks: 0,
};
window.tokentapLive = live;

const $ = (sel) => document.querySelector(sel);

function secs(v) {
  if (v === null || v === undefined) return "–";
  if (v < 1) return (v * 1000).toFixed(v < 0.01 ? 2 : 1) + " ms";
  return v.toFixed(2) + " s";
}
function num(v, digits) {
  return v === null || v === undefined ? "–" : v.toFixed(digits);
}
function pct(n, d) {
  return d > 0 ? (100 * n / d).toFixed(1) + "%" : "–";
}
function cell(row, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  row.appendChild(td);
  return td;
}

function renderModels(frame) {
  const body = $("#models tbody");
  body.textContent = "";
  for (const m of frame.models) {
    const tr = document.createElement("tr");
    tr.dataset.model = m.model;
    cell(tr, m.model, "text");
    cell(tr, num(m.requests_per_s, 2)).dataset.field = "requests_per_s";
    cell(tr, String(m.requests)).dataset.field = "requests";
    for (const q of ["p50", "p90", "p99"]) cell(tr, secs(m.ttft[q])).dataset.field = "ttft_" + q;
    for (const q of ["p50", "p90", "p99"]) cell(tr, secs(m.itl[q])).dataset.field = "itl_" + q;
    cell(tr, num(m.tokens_per_s, 1)).dataset.field = "tokens_per_s";
    cell(tr, String(m.in_flight)).dataset.field = "in_flight";
    cell(tr, pct(m.outcomes.completed, m.requests)).dataset.field = "completed";
    const others = Object.entries(m.outcomes)
      .filter(([o, n]) => o !== "completed" && n > 0)
      .map(([o, n]) => o + " " + pct(n, m.requests));
    cell(tr, others.join(", ") || "–", others.length ? "bad" : "").dataset.field = "others";
    // Each objective's attainment over the window: the share of judged requests that met it.
    const objectives = (m.objectives || []).map((o) => o.objective + " " + pct(o.met, o.met + o.missed));
    const missed = (m.objectives || []).some((o) => o.missed > 0);
    cell(tr, objectives.join(", ") || "–", missed ? "text bad" : "text").dataset.field = "objectives";
    body.appendChild(tr);
  }
}

function renderOverCap(frame) {
  const note = $("#over-cap");
  note.hidden = !frame.models_over_cap;
  note.textContent = frame.models_over_cap
    ? frame.models_over_cap + " more model(s) past the 32 the live view keeps are not shown (see /metrics)."
    : "";
}

// What a request in flight waits for, as /api/live names it.
const PHASES = new Map([
  ["waiting_head", "waiting for head"],
  ["waiting_first_token", "waiting for first token"],
  ["streaming", "streaming"],
]);

function renderInFlight(frame) {
  const body = $("#inflight tbody");
  body.textContent = "";
  $("#inflight-total").textContent =
    "(" + frame.in_flight.total + " now" +
    (frame.in_flight.total > frame.in_flight.streams.length ? ", the longest running shown" : "") + ")";
  for (const s of frame.in_flight.streams) {
    const tr = document.createElement("tr");
    // The model is null until the request body (or the response) names it.
    cell(tr, s.model === null ? "–" : s.model, "text");
    cell(tr, s.tenant, "text");
    cell(tr, PHASES.get(s.phase) || String(s.phase), s.phase === "streaming" ? "text" : "text wait")
      .dataset.phase = s.phase;
    cell(tr, secs(s.elapsed_s));
    cell(tr, String(s.tokens));
    cell(tr, num(s.tokens_per_s, 1));
    cell(tr, secs(s.largest_gap_s));
    cell(tr, secs(s.since_last_event_s));
    body.appendChild(tr);
  }
}

function requestRow(r, withEnded) {
  const tr = document.createElement("tr");
  cell(tr, r.model, "text");
  cell(tr, r.tenant, "text");
  // A buffered response's tokens reached tokentap in one burst: it did not really stream.
  const outcome = r.buffered ? r.outcome + " · buffered" : r.outcome;
  cell(tr, outcome, r.outcome === "completed" && !r.buffered ? "text" : "text bad");
  cell(tr, secs(r.duration_s));
  cell(tr, secs(r.ttft_s));
  cell(tr, secs(r.slowest_gap_s));
  cell(tr, String(r.output_tokens));
  const missed = (r.objectives || []).filter((o) => !o.met).map((o) => o.objective);
  const judged = (r.objectives || []).length;
  cell(tr, judged ? (missed.length ? "missed " + missed.join(", ") : "met") : "–",
    missed.length ? "text bad" : "text").dataset.field = "objectives";
  if (withEnded) cell(tr, new Date(r.ended_ms).toLocaleTimeString());
  cell(tr, r.trace_id || "–", "text");
  return tr;
}

function renderSlowest(list) {
  const body = $("#slowest tbody");
  body.textContent = "";
  for (const r of list) body.appendChild(requestRow(r, true));
}

function renderRecent() {
  const body = $("#recent tbody");
  body.textContent = "";
  for (const r of live.recent) body.appendChild(requestRow(r, false));
}

// The heatmap of one model's histogram: x is time, y the bucket (its upper bound).
function heatPlot(model, kind) {
  const key = model + "/" + kind;
  const existing = live.plots.get(key);
  if (existing) return existing;
  let holder = document.getElementById("heat-" + key);
  if (!holder) {
    holder = document.createElement("figure");
    holder.id = "heat-" + key;
    holder.dataset.model = model;
    holder.dataset.kind = kind;
    const caption = document.createElement("figcaption");
    caption.textContent = model + " · " + (kind === "ttft" ? "TTFT" : "ITL");
    holder.appendChild(caption);
    $("#heatmaps").appendChild(holder);
  }
  const bucketLabel = (i) => {
    const b = live.bounds[kind];
    if (i >= b.length) return "+Inf";
    return b[i] < 1 ? +(b[i] * 1000).toPrecision(3) + "ms" : +b[i].toPrecision(3) + "s";
  };
  const opts = {
    width: Math.max(320, holder.clientWidth - 12),
    height: 200,
    legend: { show: false },
    cursor: { show: false },
    scales: {
      x: { time: true },
      y: { auto: false, range: () => [0, live.bounds[kind].length + 1] },
    },
    axes: [
      {},
      {
        size: 56,
        splits: () => {
          const n = live.bounds[kind].length + 1;
          const step = Math.max(1, Math.ceil(n / 8));
          const out = [];
          for (let i = 1; i <= n; i += step) out.push(i);
          return out;
        },
        values: (u, splits) => splits.map((v) => bucketLabel(v - 1)),
      },
    ],
    series: [{}, { stroke: "transparent", points: { show: false } }],
    hooks: {
      draw: [
        (u) => {
          const data = live.heat.get(model);
          if (!data || data.at.length === 0) return;
          const columns = data[kind];
          let max = 0;
          for (const c of columns) for (const n of c) if (n > max) max = n;
          if (max === 0) return;
          const ctx = u.ctx;
          const w = Math.max(1, u.valToPos(data.at[0] + 1, "x", true) - u.valToPos(data.at[0], "x", true));
          ctx.save();
          for (let i = 0; i < columns.length; i++) {
            const x = u.valToPos(data.at[i], "x", true);
            const c = columns[i];
            for (let j = 0; j < c.length; j++) {
              if (!c[j]) continue;
              const top = u.valToPos(j + 1, "y", true);
              const bottom = u.valToPos(j, "y", true);
              const a = 0.15 + 0.85 * Math.sqrt(c[j] / max);
              ctx.fillStyle = kind === "ttft" ? `rgba(37,99,235,${a})` : `rgba(220,38,38,${a})`;
              ctx.fillRect(x - w, top, Math.ceil(w), Math.max(1, bottom - top));
            }
          }
          ctx.restore();
        },
      ],
    },
  };
  const data = live.heat.get(model) || { at: [] };
  const plot = new uPlot(opts, [data.at.slice(), data.at.map(() => null)], holder);
  live.plots.set(key, plot);
  return plot;
}

function redrawHeat(model, data) {
  for (const kind of ["ttft", "itl"]) {
    const plot = heatPlot(model, kind);
    plot.setData([data.at.slice(), data.at.map(() => null)]);
    // The hottest bucket of the last 5 columns, for a glance (and the browser test).
    let hot = -1;
    for (const c of data[kind].slice(-5)) for (let j = 0; j < c.length; j++) if (c[j] && j > hot) hot = j;
    plot.root.parentElement.dataset.hot = String(hot);
  }
}

function loadHeat(snapshot) {
  live.heat = new Map();
  const at = snapshot.heatmap.at_ms.map((t) => t / 1000);
  // JSON.parse makes every key an own property, `__proto__` included.
  for (const [model, columns] of Object.entries(snapshot.heatmap.models)) {
    live.heat.set(model, { at: at.slice(), ttft: columns.ttft, itl: columns.itl });
  }
}

function appendColumns(frame) {
  const t = frame.at_ms / 1000;
  for (const m of frame.models) {
    let data = live.heat.get(m.model);
    if (!data) {
      data = { at: [], ttft: [], itl: [] };
      live.heat.set(m.model, data);
    }
    if (data.at.length && data.at[data.at.length - 1] >= t) continue;
    data.at.push(t);
    data.ttft.push(m.column.ttft);
    data.itl.push(m.column.itl);
    if (data.at.length > HEAT_COLUMNS) {
      data.at.shift();
      data.ttft.shift();
      data.itl.shift();
    }
  }
}

function render(frame) {
  live.frame = frame;
  live.bounds = frame.bounds;
  renderModels(frame);
  renderInFlight(frame);
  renderOverCap(frame);
  renderSlowest(frame.slowest || []);
  for (const [model, data] of live.heat) redrawHeat(model, data);
}

async function fetchSnapshot() {
  const response = await fetch("/api/live/snapshot?window=" + live.window, { cache: "no-store" });
  if (!response.ok) throw new Error("snapshot: " + response.status);
  return response.json();
}

async function start() {
  if (live.source) live.source.close();
  const status = $("#status");
  try {
    const snapshot = await fetchSnapshot();
    loadHeat(snapshot);
    render(snapshot);
  } catch (e) {
    status.className = "down";
    status.textContent = "no data: " + e.message;
  }
  const source = new EventSource("/api/live/stream?window=" + live.window);
  live.source = source;
  source.onopen = () => { status.className = "live"; status.textContent = "live"; };
  source.onerror = () => { status.className = "down"; status.textContent = "reconnecting"; };
  source.addEventListener("tick", (e) => {
    const frame = JSON.parse(e.data);
    live.ticks++;
    appendColumns(frame);
    render(frame);
    status.className = "live";
    status.textContent = "live · " + new Date(frame.at_ms).toLocaleTimeString();
  });
  source.addEventListener("requests", (e) => {
    const batch = JSON.parse(e.data);
    live.recent = batch.requests.slice().reverse().concat(live.recent).slice(0, 20);
    renderRecent();
  });
}

$("#window").addEventListener("change", (e) => {
  live.window = Number(e.target.value);
  start();
});
start();
