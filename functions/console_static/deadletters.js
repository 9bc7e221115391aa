// Dead letters (#/deadletters/{queue}): a peek, a page at a time, from GET /api/deadletters.

import { api } from "./api.js";
import { errorBox, fmtTime, h, orderLink, setChildren, table } from "./dom.js";

const PAGE = 20;

/** The body's first characters, on one line, for the row (the whole body in the <details>). */
function preview(body) {
  const text = String(body ?? "").replace(/\s+/g, " ");
  return text.length > 60 ? `${text.slice(0, 60)}…` : text || "(empty)";
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
  setChildren(main, h("h1", {}, "Dead letters of ", h("span", { class: "mono" }, queue)),
    h("p", { class: "muted" }, "A peek: nothing is received or removed. ", switchHolder, " ",
      h("a", { href: "#/" }, "All queues")), list);
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
      h("details", {}, h("summary", { class: "mono" }, preview(message.body)),
        h("pre", { class: "body" }, message.body ?? ""),
        h("p", { class: "muted" }, `message id ${message.messageId}${message.subject ? `, subject ${message.subject}` : ""}` +
          (message.bodyTruncated ? " · body truncated by the API" : ""))),
    ]);
    setChildren(list,
      rows.length ? table(["Seq", "Enqueued", "Reason", "Description", "Order", "Deliveries", "Body"], rows)
        : h("p", { class: "muted", dataset: { testid: "no-deadletters" } }, "No dead letters."),
      h("nav", { class: "pager", "aria-label": "pages" },
        h("button", { type: "button", disabled: page === 0, onclick: () => { page -= 1; load(); } }, "← Previous"),
        h("span", { class: "muted" }, ` page ${page + 1} · ${rows.length} messages `),
        h("button", { type: "button", disabled: data.next === null || data.next === undefined,
          onclick: () => { page += 1; load(); } }, "Next →")));
  }
  load();
}
