// "Retry all N" on a search result (POST /api/operations, GET /api/operations/{id}): the count first
// (a dry run), a confirmation, then the operation's progress, polled until it is done. All of it in a
// dialog, so the page under it does not move; a viewer is offered nothing.

import { api, callerMayAct } from "./api.js";
import { describeError, h, orderLink, setChildren } from "./dom.js";

const POLL_MS = 1000;
// The filters each bulk action is offered on (state=attention: held or failed orders, what a retry is for).
const OFFERED = { retry: (filter) => filter.state === "attention" };
const LABEL = { retry: "Retry all" };

const orders = (n) => `${n} order${n === 1 ? "" : "s"}`;

/** "state=attention · customerId=c-1" */
export function describeFilter(filter) {
  return Object.entries(filter).map(([name, value]) => `${name}=${value}`).join(" · ") || "(no filter)";
}

/**
 * The bulk actions' bar for a search's `filter` ({state: "attention", ...}, strings), or null when
 * none is offered (a viewer, or a filter no action is offered on). `onDone()` runs when an
 * operation is done (the search reloads its results).
 */
export function bulkBar(ctx, filter, onDone) {
  if (!callerMayAct()) return null;
  const actions = Object.keys(OFFERED).filter((action) => OFFERED[action](filter));
  if (!actions.length) return null;
  const note = h("span", { class: "muted", dataset: { testid: "bulk-note" } });
  const buttons = actions.map((action) => h("button", {
    type: "button", class: `bulk-start action-${action}`, dataset: { testid: `bulk-${action}` },
    onclick: (event) => openBulk(event.currentTarget, ctx, action, filter, note, onDone),
  }, `${LABEL[action]}…`));
  return h("div", { class: "bulk", dataset: { testid: "bulk" } }, buttons, note);
}

// The dialog lives in the bar (in <main>): a route followed from it (an order's link) removes it.
function openBulk(button, ctx, action, filter, note, onDone) {
  const title = h("h2", { id: "bulk-title" });
  const body = h("div", { class: "bulk-body", role: "status", "aria-live": "polite" });
  const menu = h("menu");
  const dialog = h("dialog", { class: "bulk-dialog", "aria-labelledby": "bulk-title", dataset: { testid: "bulk-dialog" } },
    title, body, menu);
  let open = true;
  const close = () => {
    if (dialog.open) dialog.close();
  };
  dialog.addEventListener("close", () => {
    open = false;
    dialog.remove();
    if (button.isConnected) button.focus();
  });
  button.parentElement.appendChild(dialog);
  const alive = () => open && ctx.alive();
  const closeButton = (text) => h("button", { type: "button", dataset: { testid: "bulk-close" }, onclick: close }, text);
  const what = `${LABEL[action]} orders matching ${describeFilter(filter)}`;

  setChildren(title, what);
  setChildren(body, h("p", { class: "muted" }, "Counting the orders…"));
  setChildren(menu, closeButton("Cancel"));
  dialog.showModal();

  api("/operations", { method: "POST", body: { action, filter, dryRun: true } }).then((count) => {
    if (!alive()) return;
    if (count.overLimit) {
      setChildren(body, h("p", { class: "error", role: "alert", dataset: { testid: "bulk-over-limit" } },
        `More than ${count.limit} orders match: narrow the filter (customer, workflow, failed step, created from/before).`));
      setChildren(menu, closeButton("Close"));
      return;
    }
    if (count.matched === 0) {
      setChildren(body, h("p", { dataset: { testid: "bulk-none" } }, "No order matches: nothing to do."));
      setChildren(menu, closeButton("Close"));
      return;
    }
    const n = count.matched;
    setChildren(title, `${LABEL[action]} `, h("span", { dataset: { testid: "bulk-count" } }, String(n)),
      ` ${n === 1 ? "order" : "orders"} matching ${describeFilter(filter)}?`);
    setChildren(body, h("p", {}, "Each order is decided as it is when its turn comes: one that moved on meanwhile " +
      "is counted as failed, with the reason. The first 25 are done at once, the rest a slice per Supervisor tick."));
    const confirm = h("button", { type: "button", class: "danger", dataset: { testid: "bulk-confirm" },
      onclick: () => start(action, filter, { title, body, menu, alive, closeButton, note, onDone }) },
    `${LABEL[action]} ${n}`);
    setChildren(menu, closeButton("Cancel"), confirm);
    confirm.focus();
  }).catch((error) => {
    if (!alive()) return;
    setChildren(body, h("p", { class: "error", role: "alert", dataset: { testid: "bulk-error" } },
      `Counting failed (POST /api/operations, dry run): ${describeError(error)}`));
    setChildren(menu, closeButton("Close"));
  });
}

async function start(action, filter, view) {
  const { title, body, menu, alive, closeButton, note, onDone } = view;
  setChildren(menu, closeButton("Close"));
  setChildren(body, h("p", { class: "muted" }, "Starting…"));
  let op;
  try {
    // one key per click: a POST the browser or the network retries starts nothing twice
    op = await api("/operations", { method: "POST", body: { action, filter },
      headers: { "Idempotency-Key": crypto.randomUUID() } });
  } catch (error) {
    if (!alive()) return;
    setChildren(body, h("p", { class: "error", role: "alert", dataset: { testid: "bulk-error" } },
      `${LABEL[action]} failed (POST /api/operations): ${describeError(error)}`));
    return;
  }
  setChildren(title, `${LABEL[action]} ${orders(op.matched)} matching ${describeFilter(filter)}`);
  const bar = h("progress", { max: Math.max(op.matched, 1), value: 0, dataset: { testid: "bulk-progress" } });
  const figures = h("p", { dataset: { testid: "bulk-figures" } });
  const errors = h("div", { dataset: { testid: "bulk-errors" } });
  const problem = h("p", { class: "error", role: "alert", hidden: true });
  setChildren(body, bar, figures, problem, errors);
  let shown = { ...op, errors: [] };
  const show = (progress) => {
    shown = progress;
    const done = progress.succeeded + progress.failed;
    bar.value = done;
    setChildren(figures, h("strong", { dataset: { testid: "bulk-state" } }, progress.state), ` · ${done} of `,
      `${progress.matched} · ${progress.succeeded} succeeded · ${progress.failed} failed · operation `,
      h("code", {}, progress.operationId));
    setChildren(errors, progress.errors.length ? [h("p", {}, `First ${progress.errors.length} failures:`),
      h("ul", {}, progress.errors.map((e) => h("li", {}, orderLink(e.orderId), ` ${e.reason}`)))] : null);
  };
  show(shown);
  note.textContent = `Operation ${op.operationId} started.`;
  while (shown.state !== "done") {
    await new Promise((resolve) => { setTimeout(resolve, POLL_MS); });
    if (!alive()) return; // the operation goes on without the page; GET /api/operations/{id} shows it
    try {
      show(await api(`/operations/${op.operationId}`));
      problem.hidden = true;
    } catch (error) {
      problem.hidden = false;
      setChildren(problem, `GET /api/operations/${op.operationId}: ${describeError(error)}`);
      if (error.status && error.status < 500) return;
    }
  }
  note.textContent = `Operation ${op.operationId}: ${shown.succeeded} succeeded, ${shown.failed} failed.`;
  if (onDone) onDone();
}
