// Overview (#/), the landing page: a search box (an order id or a customer), live counts, the newest
// orders, the remotes' breakers, the last hour as a chart, queues, the supervisor, every 10 s.
// Each refresh makes two requests, side by side: GET /api/overview and one page of GET /api/orders.

import { api } from "./api.js";
import { capped, errorBox, fmtDuration, fmtTime, h, setChildren, table } from "./dom.js";
import { COLUMNS } from "./orderlist.js";
import { remotes } from "./remotes.js";
import { isOrderId, orderRoute, searchRoute } from "./search.js";

const REFRESH_MS = 10000;
const SWEEP_STALE_SECONDS = 180;
const FINISHED_FIELDS = ["submitted", "processed", "failed", "compensated"];
const NEWEST = 20;
const NEWEST_COLUMNS = [COLUMNS.id, COLUMNS.state, COLUMNS.outcome, COLUMNS.workflow, COLUMNS.customer,
  COLUMNS.total, COLUMNS.createdAgo];

export function render(main, ctx) {
  const status = h("p", { class: "muted", dataset: { testid: "overview-status" } }, "loading…");
  const newest = h("section", { class: "panel newest", dataset: { testid: "newest" } },
    h("h2", {}, "Newest orders"), h("p", { class: "muted" }, "loading…"));
  const body = h("div", { class: "overview" });
  // The search box is built once, outside what the refresh redraws, so that what is typed stays.
  setChildren(main, h("h1", {}, "Overview"), quickSearch(), status, body);
  let chart = null;
  let timer = null;

  async function refresh() {
    // Both at once: the page waits for the slower one, not for the two in a row.
    const [overview, orders] = await Promise.allSettled([api("/overview"), api("/orders", { params: { limit: NEWEST } })]);
    if (!ctx.alive()) return;
    if (overview.status === "fulfilled") {
      const data = overview.value;
      chart = draw(body, data, chart, newest);
      setChildren(status, `as of ${fmtTime(data.asOf)} · refreshes every ${REFRESH_MS / 1000} s`);
      status.dataset.asOf = data.asOf;
    } else {
      setChildren(status, errorBox("GET /api/overview", overview.reason));
    }
    if (!newest.isConnected) body.prepend(newest); // the overview failed before its first draw
    setChildren(newest, newestOrders(orders));
    if (ctx.alive()) timer = window.setTimeout(refresh, REFRESH_MS);
  }
  refresh();
  return () => {
    window.clearTimeout(timer);
    if (chart) chart.destroy();
  };
}

/** One box: an order id (32 hex digits or a UUID) opens its page; anything else searches that customer. */
function quickSearch() {
  const input = h("input", { name: "q", type: "search", size: 44, autocomplete: "off",
    placeholder: "an order id, or a customer id", dataset: { testid: "quick-search-input" } });
  const message = h("p", { class: "error", role: "alert", hidden: true, dataset: { testid: "quick-search-message" } });
  const form = h("form", { class: "search", role: "search", dataset: { testid: "quick-search" }, onsubmit: (event) => {
    event.preventDefault();
    const text = input.value.trim();
    if (!text) {
      message.hidden = false;
      setChildren(message, "Type an order id (32 hexadecimal digits, or a UUID with dashes) or a customer id.");
      input.focus();
      return;
    }
    message.hidden = true;
    window.location.hash = isOrderId(text) ? orderRoute(text) : searchRoute({ customerId: text });
  } },
  h("label", {}, h("span", {}, "Order or customer"), input),
  h("button", { type: "submit" }, "Find"));
  return [form, message];
}

/** The newest orders (GET /api/orders with no filter: newest first), or why they are not shown. */
function newestOrders(result) {
  const heading = h("h2", {}, "Newest orders ", h("a", { href: "#/search" }, "(search all)"));
  if (result.status === "rejected") return [heading, errorBox("GET /api/orders", result.reason)];
  const orders = result.value.orders || [];
  if (!orders.length) return [heading, h("p", { class: "muted", dataset: { testid: "no-newest" } }, "No orders yet.")];
  return [heading, table(NEWEST_COLUMNS.map(([header]) => header),
    orders.map((order) => NEWEST_COLUMNS.map(([, cell]) => cell(order))), { dataset: { testid: "newest-orders" } })];
}

function draw(body, data, chart, newest) {
  if (!body.querySelector("[data-part=counts]")) {
    newest.remove();
    body.replaceChildren(
      h("section", { class: "cards", dataset: { part: "counts" } }),
      newest,
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
