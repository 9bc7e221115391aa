// Attention (#/attention): orders an operator must act on, with retry / cancel / terminate.

import { actionButtons } from "./actions.js";
import { api } from "./api.js";
import { describeError, h, orderLink, setChildren } from "./dom.js";
import { COLUMNS, pagedOrders } from "./orderlist.js";

const PAGE = 25;
const REASON_FETCHES = 4; // order reads in parallel for the reason column

export function render(main, ctx) {
  const status = h("p", { class: "status", role: "status", "aria-live": "polite", dataset: { testid: "action-status" } });
  const list = h("div");
  setChildren(main,
    h("h1", {}, "Attention"),
    h("p", { class: "muted" }, "Held orders, failed orders not retried, and compensations that failed for good. " +
      "Each action asks for confirmation; the API's answer is shown below."),
    status, list);
  let paged = null;
  const done = (result) => {
    setChildren(status, status.textContent, " · ", orderLink(result.orderId));
    if (paged) paged.reload();
  };
  const columns = [
    COLUMNS.id,
    ["Reason", () => h("span", { class: "reason muted" }, "…")],
    COLUMNS.state,
    COLUMNS.failureCount,
    COLUMNS.age,
    ["Actions", (order) => actionButtons(order.orderId, ["retry", "cancel", "terminate"], status, done)],
  ];
  paged = pagedOrders(list, ctx, { state: "attention", limit: PAGE }, columns,
    (orders, tbody) => fillReasons(orders, tbody, ctx));
}

/** The reason is on the order, not in the search summary: read each order (a few at a time). */
async function fillReasons(orders, tbody, ctx) {
  const queue = orders.map((order, index) => [order.orderId, tbody.rows[index].cells[1]]);
  async function worker() {
    while (queue.length && ctx.alive()) {
      const [orderId, cell] = queue.shift();
      try {
        const order = await api(`/orders/${encodeURIComponent(orderId)}`);
        const reason = order.reason || (order.failedStep ? `${order.failedStep} failed` : order.outcome || "—");
        setChildren(cell, h("span", { class: "reason", dataset: { testid: "reason" } }, reason));
      } catch (error) {
        setChildren(cell, h("span", { class: "error", role: "alert" }, describeError(error)));
      }
    }
  }
  await Promise.all(Array.from({ length: REASON_FETCHES }, worker));
}
