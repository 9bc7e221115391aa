// Overview (#/): live counts, the remotes' breakers, the last hour as a chart, queues, the supervisor,
// every 10 s.

import { api } from "./api.js";
import { capped, errorBox, fmtDuration, fmtTime, h, setChildren, table } from "./dom.js";
import { remotes } from "./remotes.js";

const REFRESH_MS = 10000;
const SWEEP_STALE_SECONDS = 180;
const FINISHED_FIELDS = ["submitted", "processed", "failed", "compensated"];

export function render(main, ctx) {
  const status = h("p", { class: "muted", dataset: { testid: "overview-status" } }, "loading…");
  const body = h("div", { class: "overview" });
  setChildren(main, h("h1", {}, "Overview"), status, body);
  let chart = null;
  let timer = null;

  async function refresh() {
    try {
      const data = await api("/overview");
      if (!ctx.alive()) return;
      chart = draw(body, data, chart);
      setChildren(status, `as of ${fmtTime(data.asOf)} · refreshes every ${REFRESH_MS / 1000} s`);
      status.dataset.asOf = data.asOf;
    } catch (error) {
      if (!ctx.alive()) return;
      setChildren(status, errorBox("GET /api/overview", error));
    }
    if (ctx.alive()) timer = window.setTimeout(refresh, REFRESH_MS);
  }
  refresh();
  return () => {
    window.clearTimeout(timer);
    if (chart) chart.destroy();
  };
}

function draw(body, data, chart) {
  if (!body.firstChild) {
    body.append(
      h("section", { class: "cards", dataset: { part: "counts" } }),
      h("section", { class: "panel", dataset: { part: "remotes" } }),
      h("section", { class: "panel", dataset: { part: "chart" } }, h("h2", {}, "Last hour"),
        h("div", { class: "chart", dataset: { testid: "chart" } })),
      h("section", { class: "panel", dataset: { part: "queues" } }),
      h("section", { class: "panel", dataset: { part: "supervisor" } }));
  }
  const part = (name) => body.querySelector(`[data-part=${name}]`);
  setChildren(part("counts"), counts(data));
  setChildren(part("remotes"), remotes(data));
  chart = drawChart(part("chart").querySelector(".chart"), data.series || [], chart);
  setChildren(part("queues"), queues(data));
  setChildren(part("supervisor"), supervisor(data.supervisor, data.asOf));
  return chart;
}

function card(label, value, testid, href) {
  const shown = h("span", { class: "value", dataset: { testid } }, value);
  return h("div", { class: "card" }, h("div", { class: "label" }, label), href ? h("a", { href }, shown) : shown);
}

function counts(data) {
  const live = data.live || {};
  const cards = [
    card("In flight", capped(live.inFlight.count, live.inFlight.capped), "count-inFlight", "#/search?state=inFlight"),
    card("Attention", capped(live.attention.count, live.attention.capped), "count-attention", "#/attention"),
  ];
  for (const [period, label] of [["lastHour", "last hour"], ["last24h", "last 24 h"]]) {
    const figures = (data.finished || {})[period] || {};
    for (const field of FINISHED_FIELDS) {
      cards.push(card(`${field[0].toUpperCase()}${field.slice(1)} ${label}`, String(figures[field] ?? "—"),
        `finished-${period}-${field}`));
    }
  }
  return cards;
}

function drawChart(target, series, chart) {
  const xs = series.map((point) => Date.parse(point.minute) / 1000);
  const column = (name) => series.map((point) => point[name] ?? null);
  const columns = [xs, column("submitted"), column("processed"), column("failed"), column("p50Seconds"),
    column("p95Seconds")];
  if (chart) {
    chart.setData(columns);
    return chart;
  }
  const width = Math.max(480, target.clientWidth || 900);
  const utc = (ts) => window.uPlot.tzDate(new Date(ts * 1000), "Etc/UTC");
  const hhmm = window.uPlot.fmtDate("{HH}:{mm}");
  const line = (label, stroke, extra) => ({ label, scale: "n", stroke, width: 2, points: { show: false }, ...extra });
  const options = {
    width, height: 260, tzDate: utc,
    scales: { x: { time: true }, n: { auto: true, range: (u, min, max) => [0, Math.max(1, max)] }, s: { auto: true } },
    axes: [{ values: (u, splits) => splits.map((v) => hhmm(utc(v))) }, { scale: "n", label: "orders / min" }, { scale: "s", side: 1, label: "seconds", grid: { show: false } }],
    series: [
      { label: "minute (UTC)", value: (u, v) => (v === null ? "—" : fmtTime(new Date(v * 1000).toISOString())) },
      line("submitted", "#1f6feb"),
      line("processed", "#1a7f37"),
      line("failed", "#cf222e"),
      // latencies: points too, since a minute without a Processed order breaks the line
      { label: "p50 s", scale: "s", stroke: "#8250df", dash: [6, 4], points: { show: true, size: 5 } },
      { label: "p95 s", scale: "s", stroke: "#bf8700", dash: [2, 3], points: { show: true, size: 5 } },
    ],
  };
  return new window.uPlot(options, columns, target);
}

function queues(data) {
  const rows = (data.queues || []).map((queue) => [
    h("span", { class: "mono" }, queue.name), queue.setting,
    h("span", { dataset: { testid: `queue-active-${queue.name}` } }, capped(queue.active, queue.activeCapped)),
    h("a", { href: `#/deadletters/${encodeURIComponent(queue.name)}`, dataset: { testid: `queue-dead-${queue.name}` } },
      capped(queue.deadLetter, queue.deadLetterCapped)),
  ]);
  return [
    h("h2", {}, "Queues"),
    data.queuesError ? errorBox("Service Bus", { message: data.queuesError }) : null,
    rows.length ? table(["Queue", "Setting", "Active", "Dead letters"], rows, { dataset: { testid: "queues" } })
      : h("p", { class: "muted" }, "No queue figures."),
  ];
}

function supervisor(sup, asOf) {
  if (!sup) return [h("h2", {}, "Supervisor"), h("p", { class: "muted" }, "No figures.")];
  const age = sup.lastSweepAt ? (Date.parse(asOf) - Date.parse(sup.lastSweepAt)) / 1000 : null;
  const stale = age === null || age > SWEEP_STALE_SECONDS;
  return [
    h("h2", {}, "Supervisor"),
    h("p", {},
      "Last sweep: ", h("strong", { dataset: { testid: "last-sweep" } }, fmtTime(sup.lastSweepAt)),
      age === null ? "" : ` (${fmtDuration(age)} before ${fmtTime(asOf)})`,
      ` · due rows in it: ${sup.lastDueRows ?? "—"} · sweeps in the last hour: ${sup.sweepsLastHour ?? "—"}`),
    stale ? h("p", { class: "warning", role: "alert", dataset: { testid: "sweep-warning" } },
      sup.lastSweepAt ? `No sweep for ${fmtDuration(age)}: is the Supervisor timer running?`
        : "No sweep recorded: is the Supervisor timer running?") : null,
  ];
}
