// Order (#/orders/{id}): the order, its timeline, compensation progress, full history, trace, actions.

import { actionButtons, allowedActions } from "./actions.js";
import { api, callerMayAct } from "./api.js";
import { SKIPPED_TEXT, awaitingBadge, awaitingText, eventForm, kindDetail, stepKind } from "./awaiting.js";
import { errorBox, fmtMoney, fmtTime, h, setChildren, table } from "./dom.js";
import { branchNote, branchesOf, currentStepText, groupHeader, groupOf, shownState } from "./parallel.js";
import { buildTimeline, renderGantt, renderTrace } from "./timeline.js";
import { compensationState, orderWaiting, roomBadge, stepWaiting, waitingBadge, waitingText, waitsIn } from "./waiting.js";
import { orderDeliveries } from "./webhooks.js";

const REFRESH_MS = 3000; // while the order is in flight
const HISTORY_PAGE = 1000;
const HISTORY_PAGES_AT_ONCE = 20;

export function render(main, ctx, query, orderId) {
  const status = h("p", { class: "status", role: "status", "aria-live": "polite", dataset: { testid: "action-status" } });
  const body = h("div", {}, h("p", { class: "muted" }, "loading…"));
  setChildren(main, h("h1", {}, "Order ", h("span", { class: "mono" }, orderId)), status, body);
  let timer = null;
  const path = `/console/orders/${encodeURIComponent(orderId)}`; // the operator gate's copy of GET /orders/{id}
  const drafts = {}; // an event form's text, by event name: kept across re-renders
  // Never re-render under an open question, nor under someone typing an event's body.
  const busy = () => document.getElementById("confirm-dialog")?.open
    || (document.activeElement?.tagName === "TEXTAREA" && body.contains(document.activeElement));

  async function load(auto = false) {
    window.clearTimeout(timer);
    if (auto && busy()) {
      timer = window.setTimeout(() => load(true), REFRESH_MS);
      return;
    }
    let order;
    let history;
    try {
      order = await api(path);
      history = await fullHistory(path, order);
    } catch (error) {
      if (ctx.alive()) setChildren(body, errorBox(`GET /api${path}`, error));
      return;
    }
    const webhooks = order.category === "inFlight" ? null : await deliveries(orderId); // an ended order's
    if (!ctx.alive()) return;
    if (auto && busy()) { // it became busy while the order was read
      timer = window.setTimeout(() => load(true), REFRESH_MS);
      return;
    }
    const focused = focusOf(body);
    setChildren(body, page(order, history, status, load, path, drafts, webhooks));
    refocus(body, focused); // a refresh keeps the keyboard where it was
    if (order.category === "inFlight") timer = window.setTimeout(() => load(true), REFRESH_MS);
  }
  load();
  return () => window.clearTimeout(timer);
}

const FOCUSABLE = "button, a, summary, select, input, textarea, [tabindex]";

/** Where the keyboard focus is inside `root`: its place among the focusable elements, and its text. */
function focusOf(root) {
  const active = document.activeElement;
  if (!active || !root.contains(active)) return null;
  return { index: [...root.querySelectorAll(FOCUSABLE)].indexOf(active), text: active.textContent };
}

/** Focus the element of the new content that matches `focused` (same place and text, else same text). */
function refocus(root, focused) {
  if (!focused) return;
  const all = [...root.querySelectorAll(FOCUSABLE)];
  const same = all[focused.index];
  const target = same && same.textContent === focused.text ? same : all.find((el) => el.textContent === focused.text);
  if (target) target.focus({ preventScroll: true });
}

/** The order's webhook deliveries (GET /api/webhooks?orderId=): a list, or the error that kept them (the
 * page goes on without them). */
async function deliveries(orderId) {
  try {
    return (await api("/webhooks", { params: { orderId } })).deliveries;
  } catch (error) {
    return error;
  }
}

/** The Webhooks panel of an order that was told (or failed to be): none when it has no delivery. */
function webhooksPanel(webhooks, status, reload) {
  if (webhooks instanceof Error) {
    return h("section", { class: "panel" }, h("h2", {}, "Webhooks"), errorBox("GET /api/webhooks", webhooks));
  }
  const list = orderDeliveries(webhooks, status, () => reload());
  return list ? h("section", { class: "panel" }, h("h2", {}, "Webhooks"), list) : null;
}

/** The history's first page (in the order) and every further page, up to a limit; `more` is the token left. */
async function fullHistory(path, order) {
  const events = [...order.history];
  let token = order.historyContinuationToken;
  for (let pages = 0; token && pages < HISTORY_PAGES_AT_ONCE; pages += 1) {
    const next = await api(`${path}/history`, { params: { limit: HISTORY_PAGE, continuationToken: token } });
    events.push(...next.history);
    token = next.continuationToken;
  }
  return { events, more: token };
}

function page(order, history, status, reload, path, drafts, webhooks) {
  const actions = allowedActions(order);
  const outcome = outcomeText(order);
  const timeline = buildTimeline(history.events, order.category === "inFlight", Date.now(), order.steps);
  return [
    h("p", { class: "headline" },
      h("span", { class: `state state-${order.processState}`, dataset: { testid: "process-state" } }, order.processState),
      orderWaiting(order) ? [" ", waitingBadge(orderWaiting(order))] : null,
      order.awaiting ? [" ", awaitingBadge(order.awaiting)] : null,
      order.suspended ? [" ", h("span", { class: "state state-Suspended", dataset: { testid: "suspended" } },
        "Suspended")] : null,
      order.waitingFor ? [" ", roomBadge(order.waitingFor)] : null,
      outcome ? [" · ", h("span", { class: "outcome", dataset: { testid: "outcome" } }, outcome)] : null,
      actions.length ? [" ", actionButtons(order.orderId, actions, status, () => reload())] : null,
      " ", h("button", { type: "button", onclick: () => reload() }, "Refresh")),
    callerMayAct() ? eventForm(order, status, () => reload(), drafts) : null,
    h("section", { class: "panel" }, h("h2", {}, "Steps"), steps(order), compensation(order.compensation)),
    h("section", { class: "panel" }, h("h2", {}, "Timeline"), renderGantt(timeline)),
    h("div", { class: "columns" },
      h("section", { class: "panel" }, h("h2", {}, "State"), summary(order)),
      h("section", { class: "panel" }, h("h2", {}, "The order"), orderDetails(order.order))),
    webhooks ? webhooksPanel(webhooks, status, reload) : null,
    h("section", { class: "panel" }, h("h2", {}, "Trace"), renderTrace(history.events)),
    h("section", { class: "panel" }, h("h2", {}, `History (${history.events.length} events)`),
      historyTable(history.events), history.more ? moreHistory(path, history) : null),
  ];
}

const COMPENSATION_TEXT = { running: "compensating", completed: "compensated", failed: "compensation failed" };

/**
 * What the headline says after the order's state, each thing once: its outcome where it adds to
 * the state ("failed at charge-payment", "held at create-shipment", "cancelled", "terminated"; not
 * "processed" after Processed), and its compensation's progress when steps are undone. The
 * category is left out: the state and the outcome say it (the State panel shows it). "" for an
 * order running its steps or Processed.
 */
export function outcomeText(order) {
  const parts = [];
  const at = order.failedStep ? ` at ${order.failedStep}` : "";
  if (order.outcome === "failed" || order.outcome === "held") parts.push(`${order.outcome}${at}`);
  else if (order.outcome && order.outcome.toLowerCase() !== String(order.processState).toLowerCase()) {
    parts.push(order.outcome);
  }
  const comp = order.compensation || {};
  if (comp.total && COMPENSATION_TEXT[comp.state]) parts.push(COMPENSATION_TEXT[comp.state]);
  return parts.join(" · ");
}

function definitions(pairs, testid) {
  return h("dl", { class: "facts", dataset: { testid } }, pairs.map(([term, value]) =>
    [h("dt", {}, term), h("dd", {}, value === null || value === undefined || value === "" ? "—" : value)]));
}

function summary(order) {
  return definitions([
    ["Process state", order.processState], ["Category", order.category], ["Outcome", order.outcome],
    ["Workflow", order.workflow ? `${order.workflow.name} v${order.workflow.version}` : null],
    ["Reason", order.reason], ["Failed step", order.failedStep], ["Failure count", String(order.failureCount)],
    ["Generation", String(order.generation)], ["Current step", currentStepText(order)],
    ["Awaiting", awaitingText(order.awaiting)],
    ["Waiting for", order.waitingFor ? `a slot of customer ${order.waitingFor.customerId} (CustomerMaxInFlight), since ${fmtTime(order.waitingFor.since)}` : null],
    ["Locked by", order.lockedBy],
    ["Complete by", order.completeBy ? fmtTime(order.completeBy) : null], ["Created", fmtTime(order.createdAt)],
    ["Updated", fmtTime(order.updatedAt)],
    // the order's trace: its operation id in Application Insights (operation_Id), to find its telemetry
    ["Trace id", order.traceId ? h("code", { dataset: { testid: "trace-id" }, title: "operation_Id in Application Insights" },
      order.traceId) : null],
  ], "summary");
}

function orderDetails(body) {
  if (!body) return h("p", { class: "muted" }, "The order's body is not available.");
  return [
    definitions([["Customer", body.customerId], ["Total", fmtMoney(body.total, body.currency)],
      ["Priority", body.priority], ["Status queue", body.statusQueue]], "order"),
    table(["SKU", "Quantity", "Unit price"], (body.items || []).map((item) =>
      [item.sku, String(item.quantity), fmtMoney(item.unitPrice, body.currency)]), { dataset: { testid: "items" } }),
  ];
}

const STEP_COLUMNS = ["Step", "State", "Kind", "Attempt", "Started", "Finished", "Failure", "Compensation"];

/** The step list; a parallel step's branches indented under a header row of their group (its name, their progress). */
function steps(order) {
  const now = Date.now();
  const rows = [];
  for (const step of order.steps) {
    const group = groupOf(step);
    const branches = group ? branchesOf(order.steps, group) : [];
    if (group && branches[0] === step) {
      rows.push({ attrs: { class: "group-row", dataset: { testid: "step-group", group } },
        cells: [{ attrs: { colspan: STEP_COLUMNS.length }, content: groupHeader(group, branches) }] });
    }
    rows.push(stepRow(step, order, now, group ? { group, last: branches[branches.length - 1] === step } : null));
  }
  return table(STEP_COLUMNS, rows, { dataset: { testid: "steps" } });
}

/** A step's row; `branch` ({group, last}) if it is a branch of a parallel step. */
function stepRow(step, order, now, branch) {
  const classes = [step.state === "Skipped" ? "skipped" : null, branch ? "branch" : null].filter(Boolean);
  const dataset = { step: step.name, kind: stepKind(step), state: shownState(step) };
  if (branch) dataset.group = branch.group;
  return {
    attrs: { class: classes.length ? classes.join(" ") : null, dataset },
    cells: [
      branch ? [h("span", { class: "branch-mark", "aria-hidden": "true" }, branch.last ? "└ " : "├ "), step.name]
        : step.name,
      stateCell(step), kindCell(step, order, now), String(step.attempt),
      fmtTime(step.startedAt), fmtTime(step.finishedAt), [step.failureReason || "—", branchNote(step, order)],
      step.compensation ? [`${compensationState(step)} (attempt ${step.compensation.attempt})` +
        `${step.compensation.reason ? `: ${step.compensation.reason}` : ""}`, waitLine(step, "compensation")] : "—",
    ],
  };
}

/** The step's state (Stopped: a parallel step's branch stopped by another's failure); while it waits
 * on a breaker, on which remote and when the next probe is due; if its `when` does not hold for the
 * order, that it is skipped. */
function stateCell(step) {
  const state = shownState(step);
  const title = state === "Stopped" ? "Failed (the API's state): stopped by another branch's failure, not its own" : null;
  return [h("span", { class: `state step-${state}`, title }, state), waitLine(step, "step"),
    state === "Skipped" ? h("div", { class: "skipped-note", dataset: { testid: "skipped" } }, SKIPPED_TEXT) : null];
}

/** The step's kind (call, wait, delay); a wait's event and until when, a delay's timer; a branch's group. */
function kindCell(step, order, now) {
  const kind = stepKind(step);
  const group = groupOf(step);
  return [h("span", { class: `kind kind-${kind}` }, kind), kindDetail(step, order, now),
    group ? h("div", { class: "kind-detail muted" }, `a branch of ${group} (parallel)`) : null];
}

/** The wait of the step's attempt (`what` "step") or of its compensation, if that is what waits. */
function waitLine(step, what) {
  const waiting = waitsIn(step) === what ? stepWaiting(step) : null;
  return waiting ? h("div", { class: "waiting", dataset: { testid: `${what}-waiting`, remote: waiting.remote } },
    waitingText(waiting)) : null;
}

function compensation(comp) {
  if (!comp || !comp.total) {
    return h("p", { class: "muted", dataset: { testid: "compensation" } },
      `Compensation: none${comp && comp.state && comp.state !== "none" ? ` (${comp.state})` : ""}.`);
  }
  return h("p", { class: "compensation", dataset: { testid: "compensation" } }, "Compensation: ",
    h("progress", { max: comp.total, value: comp.done, "aria-label": "compensations done" }),
    ` ${comp.state}: ${comp.done} of ${comp.total} done, ${comp.failed} failed, ${comp.pending} pending`);
}

function historyTable(events) {
  const start = events.length ? Date.parse(events[0].at) : 0;
  return table(["#", "At", "Offset", "Event", "Step", "Attempt", "Instance", "Trace", "Detail"], events.map((event) => [
    String(event.seq), fmtTime(event.at), `+${((Date.parse(event.at) - start) / 1000).toFixed(3)} s`,
    h("span", { class: `event event-${event.event}` }, event.event), event.step || "", event.attempt ?? "",
    event.instance || "", h("span", { class: "mono", title: event.traceId || "" }, (event.traceId || "").slice(0, 8)),
    event.detail ? h("code", { class: "detail" }, JSON.stringify(event.detail)) : "",
  ]), { dataset: { testid: "history" }, class: "history" });
}

function moreHistory(path, history) {
  const button = h("button", { type: "button", onclick: async () => {
    button.disabled = true;
    try {
      const next = await api(`${path}/history`, { params: { limit: HISTORY_PAGE, continuationToken: history.more } });
      history.events.push(...next.history);
      history.more = next.continuationToken;
      const section = button.closest("section");
      setChildren(section, h("h2", {}, `History (${history.events.length} events)`), historyTable(history.events),
        history.more ? moreHistory(path, history) : null);
    } catch (error) {
      button.replaceWith(errorBox("GET history", error));
    }
  } }, "Load more history");
  return button;
}
