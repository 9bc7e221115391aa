// Parallel steps: a step of kind "parallel" is a group of call steps (its branches) dispatched
// together. GET /api/orders/{id} lists each branch as a step with `"group": "<the group's name>"`
// (other steps have `"group": null`), the order's `currentStep` is the group's name while it runs,
// and a branch still in flight when another one failed for good is stopped: Failed, with the
// failure reason below (shared/core/statemachine/groups.py, STOPPED_REASON) and its outcome unknown.

import { h } from "./dom.js";
import { stepState } from "./waiting.js";

// The start of a stopped branch's failureReason (and of its stepFailed event's detail.reason).
const STOPPED_PREFIX = "stopped:";

/** The name of the parallel step a step is a branch of, or null. */
export function groupOf(step) {
  return step && typeof step.group === "string" && step.group ? step.group : null;
}

/** The branches (steps, in the workflow's order) of the group `name`. */
export function branchesOf(steps, name) {
  return (steps || []).filter((step) => groupOf(step) === name);
}

/** Is this failure reason a stopped branch's (another branch of its group failed for good)? */
export function isStoppedReason(reason) {
  return typeof reason === "string" && reason.startsWith(STOPPED_PREFIX);
}

/** A branch stopped because another branch of its group failed for good (not a failure of its own). */
export function isStopped(step) {
  return Boolean(groupOf(step)) && step.state === "Failed" && isStoppedReason(step.failureReason);
}

/** The state a step shows: "Stopped" for a stopped branch, else stepState() ("Waiting" on a breaker ...). */
export function shownState(step) {
  return isStopped(step) ? "Stopped" : stepState(step);
}

/** The branch whose failure stopped the others: the order's failedStep if it is one, else a Failed branch not stopped. */
function failedBranch(order, group) {
  const branches = branchesOf(order.steps, group);
  const named = branches.find((step) => step.name === order.failedStep && !isStopped(step));
  return named || branches.find((step) => step.state === "Failed" && !isStopped(step)) || null;
}

/**
 * Under a branch's failure reason: for a stopped branch, which branch's failure stopped it and what
 * that means (its outcome is unknown: compensated, or the order held); for the
 * branch that failed, which branches it stopped; null for any other step.
 */
export function branchNote(step, order) {
  const group = groupOf(step);
  if (!group) return null;
  if (isStopped(step)) {
    const failed = failedBranch(order, group);
    let undo = "; no compensation of it has run";
    if (step.compensation) undo = ", so its compensation undoes it by its idempotency key";
    else if (order.outcome === "held") undo = ": the order is held for an operator"; // as for a timed-out pivot
    return h("div", { class: "stopped-note", dataset: { testid: "stopped" } },
      `${failed ? failed.name : "another branch"} (${group}) failed for good while this branch was in flight; ` +
      `whether its call took effect is unknown${undo}`);
  }
  if (step.state === "Failed") {
    const stopped = branchesOf(order.steps, group).filter(isStopped).map((branch) => branch.name);
    if (stopped.length) {
      return h("div", { class: "stopped-note", dataset: { testid: "stopped-by" } },
        `this failure stopped ${stopped.join(" and ")} (${group}), still in flight`);
    }
  }
  return null;
}

const ORDER_OF_STATES = ["Done", "Running", "Waiting", "Pending", "Failed", "Stopped", "Skipped"];

/** "2 of 2 done", "1 of 2 done · 1 running", "0 of 2 done · 1 failed · 1 stopped", "skipped: ...". */
export function groupSummary(branches) {
  const counts = new Map();
  for (const branch of branches) counts.set(shownState(branch), (counts.get(shownState(branch)) || 0) + 1);
  if (counts.get("Skipped") === branches.length) return "skipped: its condition does not hold";
  if (counts.get("Pending") === branches.length) return "not started";
  const states = [...counts.keys()].sort((a, b) => ORDER_OF_STATES.indexOf(a) - ORDER_OF_STATES.indexOf(b));
  const others = states.filter((state) => state !== "Done").map((state) => `${counts.get(state)} ${state.toLowerCase()}`);
  return [`${counts.get("Done") || 0} of ${branches.length} done`, ...others].join(" · ");
}

/** The step list's header row of a group: "prepare — parallel reserve-inventory and charge-payment, dispatched
 * together · 1 of 2 done · 1 running". */
export function groupHeader(name, branches) {
  const names = branches.map((branch) => branch.name);
  const listed = names.length > 1 ? `${names.slice(0, -1).join(", ")} and ${names[names.length - 1]}` : names.join("");
  return [h("strong", {}, name), " — ", h("span", { class: "kind kind-parallel" }, "parallel"),
    ` ${listed}, dispatched together `, h("span", { class: "group-summary", dataset: { testid: "group-summary" } },
      `· ${groupSummary(branches)}`)];
}

/** The order's currentStep in words: "prepare (parallel: reserve-inventory Done, charge-payment Running)" for a group. */
export function currentStepText(order) {
  const name = order.currentStep;
  if (!name) return null;
  const branches = branchesOf(order.steps, name);
  if (!branches.length) return name;
  return `${name} (parallel: ${branches.map((branch) => `${branch.name} ${shownState(branch)}`).join(", ")})`;
}
