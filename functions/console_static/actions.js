// Operator actions (retry, cancel, terminate, suspend, resume): a confirmation dialog, the POST, and its result shown.

import { api, callerMayAct } from "./api.js";
import { describeError, h, setChildren } from "./dom.js";

const EXPLAIN = {
  retry: "Retry resubmits the order: a held order is redriven from its failed step, a failed and compensated " +
    "order runs again as a new generation, a failed compensation is redriven.",
  cancel: "Cancel compensates the completed steps and ends the order as Error/cancelled.",
  terminate: "Terminate stops the order in flight, compensates it and ends it as Error/terminated.",
  suspend: "Suspend lets the step in flight finish, then dispatches nothing more until the order is resumed.",
  resume: "Resume lets a suspended order go on with its next step.",
};

/** Ask with the page's <dialog>; resolves true when confirmed (Esc or "Keep" resolve false). */
export function confirmDialog(title, message, keep = "Keep the order as it is") {
  const dialog = document.getElementById("confirm-dialog");
  setChildren(dialog.querySelector("[data-role=title]"), title);
  setChildren(dialog.querySelector("[data-role=message]"), message);
  setChildren(dialog.querySelector("button[value=cancel]"), keep);
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "confirm"), { once: true });
    dialog.returnValue = "";
    dialog.showModal();
    dialog.querySelector("button[value=confirm]").focus();
  });
}

/**
 * Buttons for the actions allowed; the outcome goes into `status` (an element with role=status).
 * `onDone(result)` runs after a successful action.
 */
export function actionButtons(orderId, actions, status, onDone) {
  return h("span", { class: "actions", dataset: { testid: "actions" } }, actions.map((action) =>
    h("button", {
      type: "button", class: `action action-${action}`, dataset: { action, order: orderId },
      onclick: (event) => runAction(event.currentTarget, orderId, action, status, onDone),
    }, action[0].toUpperCase() + action.slice(1))));
}

async function runAction(button, orderId, action, status, onDone) {
  const confirmed = await confirmDialog(`${action} order ${orderId}?`, EXPLAIN[action]);
  if (!confirmed) {
    button.focus();
    return;
  }
  button.disabled = true;
  setChildren(status, `${action} ${orderId}: sending…`);
  status.className = "status";
  try {
    const result = await api(`/orders/${encodeURIComponent(orderId)}/${action}`, { method: "POST" });
    setChildren(status, `${action} ${orderId}: ${result.result} (processState ${result.processState ?? "—"})`);
    status.className = "status ok";
    if (onDone) onDone(result);
  } catch (error) {
    setChildren(status, `${action} ${orderId} failed: ${describeError(error)}`);
    status.className = "status error";
  } finally {
    button.disabled = false;
  }
}

/**
 * The operator actions the API accepts for `order` (as GET /api/orders/{id} shows it): its
 * `actions`, which the API asks of its own decisions (shared/core/statemachine/actions.py). The
 * order page and the attention list both offer these and no other; the API keeps the last word
 * (an order may move between the read and the click). A viewer is offered none.
 */
export function allowedActions(order) {
  if (!callerMayAct()) return []; // a viewer: read only
  const known = ["retry", "cancel", "terminate", "suspend", "resume"];
  return Array.isArray(order.actions) ? order.actions.filter((action) => known.includes(action)) : [];
}
