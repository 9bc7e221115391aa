// Steps that wait on a remote: on its open circuit breaker (which remote, since when, and when its
// next probe is due), or on its rate limit (`for` "rate": the slot reserved for the call, `wakeAt`). The API's `waiting` (a step's {remote, since, breaker, nextProbeAt}; an order's adds
// `step`; a search result's is {step, remote, giveUpAt, breaker, nextProbeAt}) is used when present;
// an API without it has only a step's `waitingOn` and `waitingSince`, and its state Running.

import { clock, h, relative } from "./dom.js";

/** A step's wait ({remote, since, nextProbeAt, breaker}), or null when it does not wait. */
export function stepWaiting(step) {
  if (step.waiting !== undefined) return step.waiting || null;
  if (!step.waitingOn) return null;
  return { remote: step.waitingOn, since: step.waitingSince || null, nextProbeAt: null, breaker: null };
}

/** An order's (or a search result's) wait, with the step that waits, or null. */
export function orderWaiting(order) {
  if (order.waiting !== undefined) return order.waiting || null;
  for (const step of order.steps || []) {
    const waiting = stepWaiting(step);
    if (waiting) return { step: step.name, ...waiting };
  }
  return null;
}

/** What waits: "step" (its attempt in flight), "compensation" (the step's compensation), or null. */
export function waitsIn(step) {
  if (!stepWaiting(step)) return null;
  return ["Running", "Waiting"].includes(step.state) ? "step" : "compensation";
}

/** The state a step shows: "Waiting" while its attempt waits (the API with `waiting` says so itself). */
export function stepState(step) {
  return waitsIn(step) === "step" ? "Waiting" : step.state;
}

/** The state its compensation shows: "Waiting" while it waits (likewise). */
export function compensationState(step) {
  return waitsIn(step) === "compensation" ? "Waiting" : step.compensation.state;
}

/** "next probe in 4 s (08:30:24Z)"; a probe out now, or none known, said as such. */
export function nextProbe(waiting, now = Date.now()) {
  const at = waiting.nextProbeAt;
  if (at) {
    const when = relative(at, now);
    return `next probe ${when.endsWith(" ago") ? `due ${when}` : when} (${clock(at)})`;
  }
  if (waiting.breaker === "half-open") return "a probe is out now";
  if (waiting.breaker === "closed") return "the breaker closed: resuming";
  return "next probe time not known";
}

/** Whether the wait is for the remote's rate limit (a slot reserved), not its breaker. */
export function isRateWait(waiting) {
  return waiting.for === "rate";
}

/** "call sent again in 2 s (08:30:24Z)": when a rate limit's wait ends. */
export function wakeUp(waiting, now = Date.now()) {
  const at = waiting.wakeAt;
  if (!at) return "slot time not known";
  const when = relative(at, now);
  return `call sent again ${when.endsWith(" ago") ? `(due ${when})` : when} (${clock(at)})`;
}

/**
 * "Waiting on shipping — next probe in 4 s (08:30:24Z) · since 08:29:50Z (34 s ago)", or for a rate
 * limit "Waiting on payment's rate limit — call sent again in 2 s (08:30:24Z) · since ...".
 */
export function waitingText(waiting, now = Date.now()) {
  const since = waiting.since ? ` · since ${clock(waiting.since)} (${relative(waiting.since, now)})` : "";
  const giveUp = waiting.giveUpAt ? ` · gives up ${relative(waiting.giveUpAt, now)} (${clock(waiting.giveUpAt)})` : "";
  if (isRateWait(waiting)) return `Waiting on ${waiting.remote}'s rate limit — ${wakeUp(waiting, now)}${since}`;
  const breaker = waiting.breaker ? ` · breaker ${waiting.breaker}` : "";
  return `Waiting on ${waiting.remote} — ${nextProbe(waiting, now)}${since}${breaker}${giveUp}`;
}

/** The badge of an order accepted over its customer's CustomerMaxInFlight (the API's `waitingFor`), or null. */
export function roomBadge(waitingFor) {
  if (!waitingFor) return null;
  return h("span", { class: "state state-Suspended", dataset: { testid: "waiting-room" },
    title: `Over customer ${waitingFor.customerId}'s CustomerMaxInFlight: it starts when one of the customer's orders ends, in submission order` },
  "Waiting for its customer's room");
}

/** The badge a list shows next to an order's state while one of its steps waits. */
export function waitingBadge(waiting) {
  if (!waiting) return null;
  const title = `${waiting.step ? `${waiting.step}: ` : ""}${waitingText(waiting)}`;
  return h("span", { class: "state state-Waiting", title, dataset: { testid: "waiting", for: waiting.for || "breaker" } },
    isRateWait(waiting) ? `Waiting on ${waiting.remote}'s rate` : `Waiting on ${waiting.remote}`);
}
