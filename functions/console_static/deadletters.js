// Dead letters (#/deadletters/{queue}): a peek, a page at a time, from GET /api/deadletters; an
// operator may resubmit or discard each (POST /api/deadletters/{queue}/{seq}/{action}), a viewer
// is offered neither.

import { confirmDialog } from "./actions.js";
import { api, callerMayAct } from "./api.js";
import { describeError, errorBox, fmtTime, h, orderLink, setChildren, table } from "./dom.js";

const PAGE = 20;

/** The body's first characters, on one line, for the row (the whole body in the <details>). */
function preview(body) {
  const text = String(body ?? "").replace(/\s+/g, " ");
  return text.length > 60 ? `${text.slice(0, 60)}…` : text || "(empty)";
}

const EXPLAIN = {
  resubmit: "Resubmit sends a copy of the message back to its queue (a new message id, the same body and " +
    "properties), then removes the dead letter. Do it once the cause is fixed: the agent or the scheduler " +
    "handles it again, and the order's step keys make a second copy harmless.",
  discard: "Discard removes the dead letter for good; nothing is sent. The order it names is not changed.",
};

/** Resubmit or discard one dead letter, once confirmed; the outcome goes into `status`. */
async function act(button, queue, message, action, status, onDone) {
  const seq = message.sequenceNumber;
  const what = `dead letter ${seq}${message.orderId ? ` (order ${message.orderId})` : ""}`;
  if (!await confirmDialog(`${action} ${what}?`, EXPLAIN[action], "Keep the dead letter")) {
    button.focus();
    return;
  }
  button.disabled = true;
  setChildren(status, `${action} ${what}: sending…`);
  status.className = "status";
  try {
    const done = await api(`/deadletters/${encodeURIComponent(queue)}/${seq}/${action}`, { method: "POST" });
    setChildren(status, action === "resubmit" ? `resubmitted ${what} to ${done.queue} as ${done.resubmittedAs}`
      : `discarded ${what}`);
    status.className = "status ok";
    onDone();
  } catch (error) {
    setChildren(status, `${action} ${what} failed: ${describeError(error)}`);
    status.className = "status error";
    button.disabled = false;
  }
}

/** The row's buttons (none for a viewer: the caller may not act). */
function rowActions(queue, message, status, onDone) {
  return h("span", { class: "actions", dataset: { testid: "deadletter-actions" } }, ["resubmit", "discard"].map(
    (action) => h("button", { type: "button", class: `action action-${action}`,
      dataset: { action, seq: String(message.sequenceNumber) },
      onclick: (event) => act(event.currentTarget, queue, message, action, status, onDone) },
    action[0].toUpperCase() + action.slice(1))));
}

/** A list of the app's queues: choosing one shows its dead letters. */
function switcher(queues, current) {
  const select = h("select", { "aria-label": "queue", dataset: { testid: "queue-switch" },
    onchange: () => { window.location.hash = `#/deadletters/${encodeURIComponent(select.value)}`; } },
  queues.map((q) => h("option", { value: q.name, selected: q.name === current || q.setting === current },
    `${q.name} (${q.setting})`)));
  return h("label", { class: "switch" }, "Queue ", select);
}

export function render(main, ctx, query, queue) {
  const list = h("div", { dataset: { testid: "deadletters" } });
  const switchHolder = h("span", {});
  const status = h("p", { class: "status", role: "status", "aria-live": "polite",
    dataset: { testid: "deadletter-status" } });
  const mayAct = callerMayAct();
  setChildren(main, h("h1", {}, "Dead letters of ", h("span", { class: "mono" }, queue)),
    h("p", { class: "muted" }, mayAct ? "A peek: nothing is received or removed until you resubmit or discard one. "
      : "A peek: nothing is received or removed. ", switchHolder, " ", h("a", { href: "#/" }, "All queues")),
    status, list);
  const starts = [null]; // starts[i] = the sequence number page i starts from
  let page = 0;

  async function load() {
    setChildren(list, h("p", { class: "muted" }, "loading…"));
    let data;
    try {
      data = await api("/deadletters", { params: { queue, limit: PAGE, from: starts[page] } });
    } catch (error) {
      if (ctx.alive()) setChildren(list, errorBox("GET /api/deadletters", error));
      return;
    }
    if (!ctx.alive()) return;
    starts[page + 1] = data.next;
    if (!switchHolder.firstChild && data.queues) setChildren(switchHolder, switcher(data.queues, queue));
    const rows = data.messages.map((message) => [
      String(message.sequenceNumber), fmtTime(message.enqueuedAt), message.reason || "—", message.description || "—",
      message.orderId ? orderLink(message.orderId) : "—", String(message.deliveryCount),
      ...(mayAct ? [rowActions(queue, message, status, load)] : []),
      h("details", {}, h("summary", { class: "mono" }, preview(message.body)),
        h("pre", { class: "body" }, message.body ?? ""),
        h("p", { class: "muted" }, `message id ${message.messageId}${message.subject ? `, subject ${message.subject}` : ""}` +
          (message.bodyTruncated ? " · body truncated by the API" : ""))),
    ]);
    const headers = ["Seq", "Enqueued", "Reason", "Description", "Order", "Deliveries",
      ...(mayAct ? ["Actions"] : []), "Body"];
    setChildren(list,
      rows.length ? table(headers, rows)
        : h("p", { class: "muted", dataset: { testid: "no-deadletters" } }, "No dead letters."),
      h("nav", { class: "pager", "aria-label": "pages" },
        h("button", { type: "button", disabled: page === 0, onclick: () => { page -= 1; load(); } }, "← Previous"),
        h("span", { class: "muted" }, ` page ${page + 1} · ${rows.length} messages `),
        h("button", { type: "button", disabled: data.next === null || data.next === undefined,
          onclick: () => { page += 1; load(); } }, "Next →")));
  }
  load();
}
