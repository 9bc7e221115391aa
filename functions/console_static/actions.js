// Operator actions (retry, cancel, terminate): a confirmation dialog, the POST, and its result shown.

import { api } from "./api.js";
import { describeError, h, setChildren } from "./dom.js";

const EXPLAIN = {
  retry: "Retry resubmits the order: a held order is redriven from its failed step, a failed and compensated " +
    "order runs again as a new generation, a failed compensation is redriven.",
  cancel: "Cancel compensates the completed steps and ends the order as Error/cancelled.",
  terminate: "Terminate stops the order in flight, compensates it and ends it as Error/terminated.",
};

/** Ask with the page's <dialog>; resolves true when confirmed (Esc or "Keep" resolve false). */
export function confirmDialog(title, message) {
  const dialog = document.getElementById("confirm-dialog");
  setChildren(dialog.querySelector("[data-role=title]"), title);
  setChildren(dialog.querySelector("[data-role=message]"), message);
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
 * The operator actions the API accepts for `order` (as GET /api/orders/{id} shows it), by the API's
 * own rules (shared/core/statemachine/operator.py: retry, cancel; terminate.py: terminate). The
 * order page and the attention list both show these and no other: an action offered here is one
 * the API does not refuse with 409, unless the order moved meanwhile (it keeps the last word).
 *
 * The API decides on the state row's mode, which the view shows through these fields:
 * - held: outcome "held" (only a hold sets it; processState Error), and no instance holds a claim;
 * - finished: neither in flight nor held (category attention, processed or error);
 * - running its steps: in flight and Pending or Processing (a compensating order is Error).
 */
export function allowedActions(order) {
  const steps = order.steps || [];
  const compensation = (order.compensation && order.compensation.state) || "none";
  const held = order.processState === "Error" && order.outcome === "held" && !order.lockedBy;
  const finished = order.category !== "inFlight" && order.outcome !== "held";
  // failed, and everything it did was compensated (or it did nothing): it can run again
  const failedUndone = finished && order.outcome === "failed" && ["none", "completed"].includes(compensation);
  const compensationFailed = finished && compensation === "failed";
  const forward = order.category === "inFlight" && ["Pending", "Processing"].includes(order.processState);
  const waitsForClaim = forward && order.processState === "Pending" && !order.lockedBy;
  const actions = [];
  if ((held && steps.some((step) => step.state === "Failed")) || failedUndone
      || (compensationFailed && steps.some((step) => step.compensation && step.compensation.state === "Failed"))) {
    actions.push("retry");
  }
  if (waitsForClaim || held || failedUndone) actions.push("cancel");
  if (forward) actions.push("terminate");
  return actions;
}
