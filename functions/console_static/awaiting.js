// Steps that wait for an external event (kind "wait") or for a durable timer (kind "delay"), and
// steps whose `when` does not hold (Skipped): what GET /api/orders/{id} says of them (a step's
// `kind`, a wait's `event`, a delay's `dueAt`, the order's `awaiting`) in words; and the form that
// sends a wait's event to POST /api/orders/{id}/events/{name}, posted as the operator actions are
// (api.js: the page's key as x-functions-key), after the same confirmation dialog.

import { confirmDialog } from "./actions.js";
import { api } from "./api.js";
import { describeError, fmtTime, h, relative, setChildren } from "./dom.js";

export const SKIPPED_TEXT = "skipped: its condition does not hold";

/** A step's kind: "call" (an agent's), "wait" (an event) or "delay" (a timer); an API without kinds has calls only. */
export function stepKind(step) {
  return step.kind === "wait" || step.kind === "delay" ? step.kind : "call";
}

/** "in 1 min 20 s", "5 s ago": to the second under ten minutes (a countdown the page's refresh moves on), else relative(). */
export function countdown(iso, now = Date.now()) {
  const seconds = Math.round((Date.parse(iso) - now) / 1000);
  if (Number.isNaN(seconds) || Math.abs(seconds) >= 600) return relative(iso, now);
  const abs = Math.abs(seconds);
  const text = abs < 60 ? `${abs} s` : `${Math.floor(abs / 60)} min ${abs % 60} s`;
  return seconds >= 0 ? `in ${text}` : `${text} ago`;
}

/** "2026-11-23 19:00:05Z (in 4 s)". */
function when(iso, now) {
  return iso ? `${fmtTime(iso)} (${countdown(iso, now)})` : "—";
}

/** The order's `awaiting` if it is this step's. */
function awaitingOf(order, step) {
  return order.awaiting && order.awaiting.step === step.name ? order.awaiting : null;
}

const quoted = (name) => `“${name}”`;

/** What a wait or a delay step waits for, until when, and what came (null for a call or a skipped step). */
export function kindDetail(step, order, now = Date.now()) {
  const kind = stepKind(step);
  if (kind === "call" || step.state === "Skipped") return null;
  return kind === "wait" ? waitDetail(step, order, now) : delayDetail(step, order, now);
}

function waitDetail(step, order, now) {
  const event = step.event || {};
  const name = quoted(event.name || "?");
  const decides = event.decision ? ` (decided by its field ${quoted(event.decision)}: true or false)` : "";
  if (event.receivedAt) {
    const kept = step.state === "Pending" ? " — kept until the step starts" : "";
    return h("div", { class: "kind-detail", dataset: { testid: "wait-detail" } },
      h("div", { dataset: { testid: "event-received" } }, `event ${name} received at ${when(event.receivedAt, now)}${kept}`),
      event.body !== null && event.body !== undefined
        ? h("code", { class: "detail", dataset: { testid: "event-received-body" } }, JSON.stringify(event.body)) : null);
  }
  const awaiting = awaitingOf(order, step);
  let text;
  if (awaiting) {
    text = `waits for event ${name}${decides} until ${when(awaiting.until, now)}; ` +
      `with none by then: ${awaiting.onTimeout || "—"}`;
  } else if (step.state === "Pending") {
    text = `will wait for event ${name}${decides}`;
  } else if (step.result && step.result.timedOut) {
    text = `no event ${name} came in time: the order went on without it`;
  } else {
    text = `event ${name}${decides}: none received`;
  }
  return h("div", { class: "kind-detail", dataset: { testid: "wait-detail" } }, text);
}

function delayDetail(step, order, now) {
  const awaiting = awaitingOf(order, step);
  const due = step.dueAt || (awaiting ? awaiting.until : null);
  let text;
  if (step.state === "Running") {
    text = `timer due at ${when(due, now)}`;
  } else if (step.state === "Done") {
    const result = step.result || {};
    const late = result.by === "supervisor" ? " by the Supervisor (its timer was late or lost)" : "";
    text = `timer fired at ${fmtTime(result.firedAt || step.finishedAt)}${late}${due ? ` · due at ${fmtTime(due)}` : ""}`;
  } else if (step.state === "Pending") {
    text = "a timer, set when the step starts";
  } else {
    text = `timer${due ? ` due at ${fmtTime(due)}` : ""}: ${step.state}`;
  }
  return h("div", { class: "kind-detail", dataset: { testid: "delay-detail" } }, text);
}

/** "Awaiting event approval until ..." or "timer due at ...": what the order's step in flight waits for. */
export function awaitingText(awaiting, now = Date.now()) {
  if (!awaiting) return null;
  if (awaiting.kind === "event") {
    return `${awaiting.step}: awaiting event ${quoted(awaiting.event)} until ${when(awaiting.until, now)}` +
      `${awaiting.onTimeout ? `, then ${awaiting.onTimeout}` : ""}`;
  }
  return `${awaiting.step}: timer due at ${when(awaiting.until, now)}`;
}

/** The badge next to the order's state while its step in flight waits for an event or a timer. */
export function awaitingBadge(awaiting, now = Date.now()) {
  if (!awaiting) return null;
  const text = awaiting.kind === "event" ? `Awaiting event ${awaiting.event}` : `Timer due ${countdown(awaiting.until, now)}`;
  return h("span", { class: "state state-Awaiting", title: awaitingText(awaiting, now),
    dataset: { testid: "awaiting", kind: awaiting.kind } }, text);
}

/**
 * The body an event form sends: the textarea's JSON object (empty: {}), and, for a wait that
 * decides by a field, that field set to `decision` (true: Approve, false: Decline). Throws an
 * Error saying what is wrong with the text (nothing is sent then).
 */
export function eventBody(text, decisionField, decision) {
  let body = {};
  if (text.trim()) {
    try {
      body = JSON.parse(text);
    } catch (error) {
      throw new Error(`not valid JSON (${error.message})`);
    }
    if (body === null || typeof body !== "object" || Array.isArray(body)) throw new Error("the body must be a JSON object: {…}");
  }
  if (!decisionField) return body;
  if (Object.prototype.hasOwnProperty.call(body, decisionField)) {
    throw new Error(`leave ${quoted(decisionField)} out of the extra fields: Approve and Decline set it`);
  }
  return { ...body, [decisionField]: decision };
}

// What each answer of the route means for the order (functions/openapi.yaml, sendEvent).
const RESULTS = {
  "step-done": "the wait is over, the next step is dispatched",
  processed: "the wait was the last step: the order is Processed",
  "event-kept": "kept: the step uses it when it starts",
  "event-duplicate": "the same event was received already: nothing changed",
  compensating: "declined: the order's done steps are being undone",
  failed: "declined: nothing to undo, the order failed",
};

/** "409 Cannot send 'approval' to this order: <detail>" (the problem's detail), else what describeError says. */
export function problemDetail(error) {
  const body = error && error.body;
  if (body && typeof body.detail === "string" && body.detail) {
    return `${error.status} ${body.title ? `${body.title}: ` : ""}${body.detail}`;
  }
  return describeError(error);
}

/**
 * While the order awaits an event (`awaiting.kind` "event"): a form to send it. A wait with a
 * `decision` field gets Approve and Decline (that field true or false) and an optional JSON
 * textarea of extra fields; one without, a JSON textarea and Send. The answer (or the problem's
 * detail) goes into `status`; `onDone()` runs after the POST answered, whatever it answered.
 * `drafts` (event name -> text) keeps what was typed across the page's re-renders.
 */
export function eventForm(order, status, onDone, drafts) {
  const awaiting = order.awaiting;
  if (!awaiting || awaiting.kind !== "event" || !awaiting.event) return null;
  const name = awaiting.event;
  const field = awaiting.decision || null;
  const route = `/orders/${encodeURIComponent(order.orderId)}/events/${encodeURIComponent(name)}`;
  const id = `event-body-${name}`;
  const textarea = h("textarea", {
    id, rows: 3, class: "mono", spellcheck: "false", dataset: { testid: "event-body" },
    placeholder: field ? '{"note": "checked with the customer"}' : "{}",
    oninput: () => {
      drafts[name] = textarea.value;
      textarea.removeAttribute("aria-invalid");
    },
  });
  textarea.value = drafts[name] ?? (field ? "" : "{}");
  const form = { order, awaiting, route, textarea, status, onDone, drafts };
  const button = (label, testid, decision, cls) => h("button", {
    type: "button", class: cls, dataset: { testid },
    onclick: (event) => sendEvent(event.currentTarget, form, label, decision),
  }, label);
  const buttons = field
    ? [button("Approve", "event-approve", true, "event-approve"), button("Decline", "event-decline", false, "event-decline")]
    : [button("Send", "event-send", undefined, "event-send")];
  const explain = field
    ? `Approve sends ${JSON.stringify({ [field]: true })} and the order goes on; Decline sends ` +
      `${JSON.stringify({ [field]: false })}: the step fails and the order is compensated. Extra fields go with either.`
    : "The JSON object below is the event's body; it becomes the step's result.";
  return h("section", { class: "panel event-form", dataset: { testid: "event-form", event: name } },
    h("h2", {}, `Send event ${quoted(name)}`),
    h("p", {}, `Step ${awaiting.step} waits for it until ${when(awaiting.until)}; with none by then: ` +
      `${awaiting.onTimeout || "—"}. ${explain} Posted to `, h("code", {}, `POST /api${route}`), "."),
    h("label", { for: id }, field ? "Extra fields (a JSON object, optional)" : "Body (a JSON object)"),
    textarea,
    h("div", { class: "actions" }, buttons));
}

async function sendEvent(button, form, label, decision) {
  const { order, awaiting, route, textarea, status, onDone, drafts } = form;
  const what = `event ${awaiting.event} → ${order.orderId}`;
  let body;
  try {
    body = eventBody(textarea.value, awaiting.decision || null, decision);
  } catch (error) {
    textarea.setAttribute("aria-invalid", "true");
    setChildren(status, `${what}: not sent: ${error.message}`);
    status.className = "status error";
    textarea.focus();
    return;
  }
  const consequence = decision === false ? " The step fails and the order's done steps are undone." : "";
  const confirmed = await confirmDialog(`${label} order ${order.orderId}?`,
    ["Sends ", h("code", {}, JSON.stringify(body)), ` to POST /api${route}.${consequence}`]);
  if (!confirmed) {
    button.focus();
    return;
  }
  button.disabled = true;
  setChildren(status, `${what}: sending…`);
  status.className = "status";
  try {
    const result = await api(route, { method: "POST", body });
    const meaning = RESULTS[result.result] ? ` — ${RESULTS[result.result]}` : "";
    setChildren(status, `${what}: ${result.result}${meaning} (processState ${result.processState ?? "—"})`);
    status.className = "status ok";
    delete drafts[awaiting.event];
  } catch (error) {
    setChildren(status, `${what} refused: ${problemDetail(error)}`);
    status.className = "status error";
  } finally {
    button.disabled = false;
  }
  onDone(); // the order as it is now, whatever the answer (a 409 says it moved meanwhile)
}
