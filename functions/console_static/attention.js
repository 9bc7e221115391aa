// Attention (#/attention): orders an operator must act on, with the actions that apply to each.

import { actionButtons, allowedActions } from "./actions.js";
import { api } from "./api.js";
import { describeError, h, orderLink, setChildren } from "./dom.js";
import { COLUMNS, pagedOrders } from "./orderlist.js";

const PAGE = 25;
const ORDER_FETCHES = 4; // order reads in parallel for the reason and actions columns

export function render(main, ctx) {
  const status = h("p", { class: "status", role: "status", "aria-live": "polite", dataset: { testid: "action-status" } });
  const list = h("div");
  setChildren(main,
    h("h1", {}, "Attention"),
    h("p", { class: "muted" }, "Held orders, failed orders not retried, and compensations that failed for good. " +
      "Each row offers the actions the API accepts for it; each asks for confirmation, and the API's answer is " +
      "shown below."),
    status, list);
  let paged = null;
  const done = (result) => {
    setChildren(status, status.textContent, " · ", orderLink(result.orderId));
    if (paged) paged.reload();
  };
  const later = (what) => () => h("span", { class: `${what} muted` }, "…");
  const columns = [
    COLUMNS.id,
    ["Reason", later("reason")],
    COLUMNS.state,
    COLUMNS.outcome,
    COLUMNS.failureCount,
    COLUMNS.age,
    ["Actions", later("actions")],
  ];
  const cellOf = (header) => columns.findIndex(([name]) => name === header);
  const cells = { reason: cellOf("Reason"), actions: cellOf("Actions") };
  paged = pagedOrders(list, ctx, { state: "attention", limit: PAGE }, columns,
    (orders, tbody) => fillFromOrders(orders, tbody, cells, ctx,
      (order, actions) => actionButtons(order.orderId, actions, status, done)));
}

/**
 * The reason and the actions come from the order itself, not the search summary (its compensation,
 * steps and claim decide what applies): read each order, a few at a time.
 */
async function fillFromOrders(orders, tbody, cells, ctx, buttons) {
  const queue = orders.map((order, index) => [order.orderId, tbody.rows[index]]);
  async function worker() {
    while (queue.length && ctx.alive()) {
      const [orderId, row] = queue.shift();
      const [reasonCell, actionsCell] = [row.cells[cells.reason], row.cells[cells.actions]];
      let order;
      try {
        order = await api(`/console/orders/${encodeURIComponent(orderId)}`);
      } catch (error) {
        setChildren(reasonCell, h("span", { class: "error", role: "alert" }, describeError(error)));
        setChildren(actionsCell, "—");
        continue;
      }
      if (!ctx.alive()) return;
      const reason = order.reason || (order.failedStep ? `${order.failedStep} failed` : order.outcome || "—");
      setChildren(reasonCell, h("span", { class: "reason", dataset: { testid: "reason" } }, reason));
      const actions = allowedActions(order);
      setChildren(actionsCell, actions.length ? buttons(order, actions)
        : h("span", { class: "muted", dataset: { testid: "no-actions" } }, "none: the order has moved on"));
    }
  }
  await Promise.all(Array.from({ length: ORDER_FETCHES }, worker));
}
