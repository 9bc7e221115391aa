// A paged list of orders from GET /api/orders (search and attention share it).

import { api } from "./api.js";
import { ageSeconds, errorBox, fmtDuration, fmtMoney, fmtTime, h, orderLink, relative, setChildren, table } from "./dom.js";
import { orderWaiting, roomBadge, waitingBadge } from "./waiting.js";

/**
 * Loads pages of `params` into `target`; `columns` is [[header, (order) => cell], ...].
 * `afterPage(orders, tbody)` may fill cells later (e.g. the attention reasons).
 */
export function pagedOrders(target, ctx, params, columns, afterPage) {
  const tokens = [null]; // tokens[i] = the token of page i (page 0 has none)
  let page = 0;

  async function load() {
    setChildren(target, h("p", { class: "muted" }, "loading…"));
    let data;
    try {
      data = await api("/orders", { params: { ...params, continuationToken: tokens[page] } });
    } catch (error) {
      if (ctx.alive()) setChildren(target, errorBox("GET /api/orders", error));
      return;
    }
    if (!ctx.alive()) return;
    tokens[page + 1] = data.continuationToken;
    const rows = data.orders.map((order) => columns.map(([, cell]) => cell(order)));
    const list = table(columns.map(([header]) => header), rows, { dataset: { testid: "orders" } });
    setChildren(target,
      data.orders.length ? list : h("p", { class: "muted", dataset: { testid: "no-orders" } }, "No orders."),
      h("nav", { class: "pager", "aria-label": "pages" },
        h("button", { type: "button", disabled: page === 0, onclick: () => { page -= 1; load(); } }, "← Previous"),
        h("span", { class: "muted" }, ` page ${page + 1} · ${data.orders.length} orders `),
        h("button", { type: "button", disabled: !data.continuationToken, dataset: { testid: "next-page" },
          onclick: () => { page += 1; load(); } }, "Next →")));
    if (afterPage) afterPage(data.orders, list.tBodies[0]);
  }
  load();
  return { reload: load };
}

export const COLUMNS = {
  id: ["Order", (order) => orderLink(order.orderId)],
  state: ["State", (order) => [h("span", { class: `state state-${order.processState}` }, order.processState),
    orderWaiting(order) ? [" ", waitingBadge(orderWaiting(order))] : null,
    order.waitingFor ? [" ", roomBadge(order.waitingFor)] : null]],
  category: ["Category", (order) => order.category],
  outcome: ["Outcome", (order) => order.outcome || "—"],
  customer: ["Customer", (order) => order.customerId],
  failureCount: ["Failures", (order) => String(order.failureCount)],
  workflow: ["Workflow", (order) => order.workflow || "—"],
  total: ["Total", (order) => fmtMoney(order.total, order.currency)],
  created: ["Created", (order) => fmtTime(order.createdAt)],
  createdAgo: ["Created", (order) => h("span", { title: fmtTime(order.createdAt) },
    order.createdAt ? relative(order.createdAt) : "—")],
  age: ["Age", (order) => fmtDuration(ageSeconds(order.createdAt))],
  updated: ["Updated", (order) => fmtTime(order.updatedAt)],
};
