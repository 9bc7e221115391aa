// Webhooks (#/webhooks): the deliveries that gave up (every try of WebhookRetrySchedule failed),
// from GET /api/webhooks?state=failed; an operator may send each again (POST
// /api/orders/{id}/webhooks/{delivery}/resend: a new round of tries, the same webhook-id and body),
// a viewer is offered nothing. An order's page shows its own deliveries (`orderDeliveries`).

import { confirmDialog } from "./actions.js";
import { api, callerMayAct } from "./api.js";
import { describeError, errorBox, fmtTime, h, orderLink, setChildren, table } from "./dom.js";

const EXPLAIN = "Resend starts the delivery's tries again, from the first (WebhookRetrySchedule): the same " +
  "webhook-id and body, signed anew. Do it once the receiver is fixed; a receiver that deduplicates on " +
  "webhook-id takes it once.";

async function resend(button, delivery, status, onDone) {
  const what = `${delivery.type} of order ${delivery.orderId}`;
  if (!await confirmDialog(`Resend the ${what}?`, EXPLAIN, "Keep it failed")) {
    button.focus();
    return;
  }
  button.disabled = true;
  setChildren(status, `resend ${what}: sending…`);
  status.className = "status";
  try {
    const done = await api(`/orders/${encodeURIComponent(delivery.orderId)}/webhooks/` +
      `${encodeURIComponent(delivery.delivery)}/resend`, { method: "POST" });
    setChildren(status, `resent ${what}: ${done.status}, round ${done.round}`);
    status.className = "status ok";
    onDone();
  } catch (error) {
    setChildren(status, `resend ${what} failed: ${describeError(error)}`);
    status.className = "status error";
    button.disabled = false;
  }
}

function resendButton(delivery, status, onDone) {
  return h("button", { type: "button", class: "action", dataset: { testid: "webhook-resend" },
    onclick: (event) => resend(event.currentTarget, delivery, status, onDone) }, "Resend");
}

/** The status of a delivery, and when its next try is due while it is pending. */
function statusText(d) {
  if (d.status === "pending" && d.nextTryAt) return `pending · try ${d.attempt} at ${fmtTime(d.nextTryAt)}`;
  return d.round > 1 ? `${d.status} (round ${d.round})` : d.status;
}

/** An order's deliveries (GET /api/webhooks?orderId=), for its page: null when it has none. */
export function orderDeliveries(deliveries, status, onDone) {
  if (!deliveries || !deliveries.length) return null;
  const mayAct = callerMayAct();
  return table(["Event", "Status", "Tries", "Last error", "Webhook id", ...(mayAct ? ["Actions"] : [])],
    deliveries.map((d) => ({ attrs: { dataset: { status: d.status } }, cells: [
      d.type, statusText(d), String(d.tries), d.lastError || "—", h("span", { class: "mono" }, d.webhookId),
      ...(mayAct ? [d.status === "failed" ? resendButton(d, status, onDone) : "—"] : []),
    ] })), { dataset: { testid: "order-webhooks" } });
}

export function render(main, ctx) {
  const list = h("div", { dataset: { testid: "webhooks" } });
  const status = h("p", { class: "status", role: "status", "aria-live": "polite",
    dataset: { testid: "webhook-status" } });
  const mayAct = callerMayAct();
  setChildren(main, h("h1", {}, "Failed webhook deliveries"),
    h("p", { class: "muted" }, "Each ended order is told by a signed POST to WebhookUrl, tried again with backoff " +
      "for hours. These gave up: every try failed." + (mayAct ? " Resend one once its receiver answers again." : "")),
    status, list);

  async function load() {
    setChildren(list, h("p", { class: "muted" }, "loading…"));
    let data;
    try {
      data = await api("/webhooks", { params: { state: "failed" } });
    } catch (error) {
      if (ctx.alive()) setChildren(list, errorBox("GET /api/webhooks", error));
      return;
    }
    if (!ctx.alive()) return;
    const rows = data.deliveries.map((d) => [
      orderLink(d.orderId), d.type, h("span", { class: "mono" }, d.webhookId), String(d.tries),
      d.lastError || "—", fmtTime(d.updatedAt), ...(mayAct ? [resendButton(d, status, load)] : []),
    ]);
    setChildren(list, rows.length
      ? table(["Order", "Event", "Webhook id", "Tries", "Last error", "Gave up", ...(mayAct ? ["Actions"] : [])], rows)
      : h("p", { class: "muted", dataset: { testid: "no-webhooks" } }, "No failed webhook deliveries."));
  }
  load();
}
