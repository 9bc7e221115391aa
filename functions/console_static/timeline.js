// From an order's history events: the Gantt-like timeline of step attempts and compensations,
// and the trace (trace ids, and a waterfall of the events' offsets from submission by instance).
// A parallel step's branches are lanes, one row each, grouped under a row of their group.

import { SKIPPED_TEXT, stepKind } from "./awaiting.js";
import { fmtTime, h } from "./dom.js";
import { isStoppedReason } from "./parallel.js";

const OPENS = { dispatched: "step", compensationDispatched: "compensation" };
const CLOSES = {
  stepDone: ["step", "done"], stepFailed: ["step", "failed"], redriven: ["step", "timed out"],
  terminated: ["step", "terminated"],
  compensationDone: ["compensation", "done"], compensationFailed: ["compensation", "failed"],
  compensationRedriven: ["compensation", "timed out"],
};
// A step's wait on a remote's open breaker: the attempt in flight waits (no call) until resumed.
const WAITS = { stepWaiting: "wait", resumed: "resume" };
// A wait step's moments: its event came (kept: before the step started), or it timed out.
const POINTS = { eventReceived: "event", waitTimedOut: "timeout" };
// How a step of each kind is drawn and named (a wait or a delay calls no agent: an outlined bar).
const KIND_TEXT = { call: "", wait: "wait for an event", delay: "delay (a timer)" };
const ORDER_MARKS = new Set(["accepted", "processed", "failed", "compensated", "held", "retried", "restarted",
  "cancelled", "terminated", "rescheduled", "alert"]);

/**
 * Rows (one per step, one per step's compensation) of attempt bars, and the order-level marks.
 * `steps` (the order's, as GET /api/orders/{id} gives them) names each step's kind, and adds a
 * row without bars for each Skipped step, after the step before it.
 */
export function buildTimeline(events, stillRunning, now = Date.now(), steps = []) {
  const kinds = new Map(steps.map((step) => [step.name, stepKind(step)]));
  const groups = new Map(steps.filter((step) => step.group).map((step) => [step.name, step.group]));
  const rows = new Map();
  const open = new Map();
  const marks = [];
  const points = [];
  for (const event of events) {
    const at = Date.parse(event.at);
    if (POINTS[event.event] && event.step) points.push({ at, step: event.step, what: POINTS[event.event], event });
    if (OPENS[event.event] && event.step) {
      const kind = OPENS[event.event];
      const key = `${kind}:${event.step}`;
      if (!rows.has(key)) {
        rows.set(key, { key, kind, step: event.step, stepKind: kinds.get(event.step) || "call",
          group: groups.get(event.step) || null, bars: [], points: [] });
      }
      const previous = open.get(key);
      if (previous) close(previous, at, "superseded");
      const bar = { start: at, end: null, attempt: event.attempt ?? 0, status: "running", reason: null };
      rows.get(key).bars.push(bar);
      open.set(key, bar);
    } else if (WAITS[event.event] && event.step) {
      const key = `${event.detail && event.detail.compensation ? "compensation" : "step"}:${event.step}`;
      const bar = open.get(key);
      const reason = event.detail && event.detail.breaker ? `on ${event.detail.breaker}` : null;
      if (bar && WAITS[event.event] === "wait") {
        bar.status = "waiting"; // drawn as waiting up to now, or up to its resume
        bar.reason = reason;
      } else if (bar && bar.status === "waiting") {
        close(bar, at, "waiting", reason || bar.reason); // the resume dispatches the next attempt: a bar of its own
        open.delete(key);
      }
    } else if (CLOSES[event.event] && event.step) {
      const [kind, status] = CLOSES[event.event];
      const key = `${kind}:${event.step}`;
      const bar = open.get(key);
      const reason = event.detail && event.detail.reason;
      if (bar) {
        // a branch stopped because another branch of its parallel step failed for good: not a failure of its own
        close(bar, at, kind === "step" && status === "failed" && isStoppedReason(reason) ? "stopped" : status, reason);
        open.delete(key);
      }
    }
    if (ORDER_MARKS.has(event.event)) marks.push({ at, event });
  }
  const times = events.map((event) => Date.parse(event.at));
  const start = times.length ? Math.min(...times) : now;
  let end = times.length ? Math.max(...times) : now;
  if (open.size && stillRunning) end = Math.max(end, now);
  for (const bar of open.values()) bar.end = end; // still open: drawn up to now (or the last event)
  for (const point of points) rows.get(`step:${point.step}`)?.points.push(point);
  const ordered = [...rows.values()].sort((a, b) => a.bars[0].start - b.bars[0].start);
  placeSkipped(ordered, steps);
  laneGroups(ordered, steps);
  return { rows: ordered, marks, start, end: Math.max(end, start + 1000) };
}

/**
 * The step rows of a parallel step's branches, side by side: moved together (in the workflow's
 * order) to where the first of them is, so that they are drawn as lanes under their group's row.
 * Their compensations' rows stay where they are in time (they run one at a time).
 */
function laneGroups(ordered, steps) {
  const names = steps.map((step) => step.name);
  for (const group of new Set(steps.map((step) => step.group).filter(Boolean))) {
    const lanes = ordered.filter((row) => row.kind === "step" && row.group === group);
    if (!lanes.length) continue;
    const at = ordered.indexOf(lanes[0]);
    const rest = ordered.filter((row) => !lanes.includes(row));
    lanes.sort((a, b) => names.indexOf(a.step) - names.indexOf(b.step));
    ordered.splice(0, ordered.length, ...rest.slice(0, at), ...lanes, ...rest.slice(at));
  }
}

/** A row for each Skipped step, after the row of the nearest step before it in the workflow (first if none). */
function placeSkipped(ordered, steps) {
  const names = steps.map((step) => step.name);
  for (const step of steps.filter((s) => s.state === "Skipped")) {
    const row = { key: `skipped:${step.name}`, kind: "step", step: step.name, stepKind: stepKind(step),
      group: step.group || null, bars: [], points: [], skipped: true };
    let index = 0;
    for (const before of names.slice(0, names.indexOf(step.name)).reverse()) {
      const found = ordered.findIndex((r) => r.kind === "step" && r.step === before);
      if (found >= 0) {
        index = found + 1;
        break;
      }
    }
    ordered.splice(index, 0, row);
  }
}

function close(bar, at, status, reason) {
  bar.end = at;
  bar.status = status;
  bar.reason = reason || null;
}

const seconds = (ms) => `${(ms / 1000).toFixed(3)} s`;

function track(timeline, children) {
  return h("div", { class: "track" }, children);
}

function place(timeline, from, to) {
  const span = timeline.end - timeline.start;
  const left = ((from - timeline.start) / span) * 100;
  const width = Math.max(0.4, ((to - from) / span) * 100);
  return { left: `${left.toFixed(3)}%`, width: `${Math.min(width, 100 - left).toFixed(3)}%` };
}

function axis(timeline) {
  const span = timeline.end - timeline.start;
  return h("div", { class: "gantt-row axis" }, h("div", { class: "gantt-label" }, fmtTime(new Date(timeline.start).toISOString())),
    track(timeline, [0, 0.25, 0.5, 0.75, 1].map((fraction) =>
      h("span", { class: "tick", style: { left: `${fraction * 100}%` } }, `+${seconds(span * fraction)}`))));
}

/** The Gantt chart as elements. */
export function renderGantt(timeline) {
  if (!timeline.rows.some((row) => row.bars.length)) return h("p", { class: "muted" }, "No step was dispatched yet.");
  const rows = [];
  const all = timeline.rows;
  for (let i = 0; i < all.length; i += 1) {
    const row = all[i];
    if (row.kind !== "step" || !row.group) {
      rows.push(ganttRow(timeline, row));
      continue;
    }
    let last = i;
    while (last + 1 < all.length && all[last + 1].kind === "step" && all[last + 1].group === row.group) last += 1;
    rows.push(laneGroup(timeline, row.group, all.slice(i, last + 1)));
    i = last;
  }
  const marks = h("div", { class: "gantt-row marks" }, h("div", { class: "gantt-label" }, "order"),
    track(timeline, groupMarks(timeline).map((group) => {
      const fraction = (group[0].at - timeline.start) / (timeline.end - timeline.start);
      // near the right end the label goes to the left of its mark, or it would be cut off
      const style = fraction > 0.75 ? { right: `${((1 - fraction) * 100).toFixed(3)}%` } : { left: `${(fraction * 100).toFixed(3)}%` };
      return h("span", {
        class: `mark mark-${group[group.length - 1].event.event}${fraction > 0.75 ? " mark-end" : ""}`, style,
        title: group.map((mark) => `${mark.event.event} at ${fmtTime(mark.event.at)}`).join("\n"),
      }, group.map((mark) => mark.event.event).join(", "));
    })));
  return h("div", { class: "gantt", dataset: { testid: "gantt" } }, axis(timeline), rows, marks,
    h("p", { class: "legend muted" }, legend(timeline.rows.some((row) => row.group))));
}

/**
 * A parallel step: a row of its own (its name, and a band from its first branch's start to its
 * last branch's end), then one lane per branch, the whole framed as one group.
 */
function laneGroup(timeline, group, lanes) {
  const bars = lanes.flatMap((lane) => lane.bars);
  const names = lanes.map((lane) => lane.step);
  let span = h("span", { class: "skipped-note" }, SKIPPED_TEXT); // a group whose `when` does not hold
  if (bars.length) {
    const from = Math.min(...bars.map((bar) => bar.start));
    const to = Math.max(...bars.map((bar) => bar.end));
    const text = `${group}: ${names.join(" and ")} side by side, ${seconds(to - from)} ` +
      `(+${seconds(from - timeline.start)} to +${seconds(to - timeline.start)})`;
    span = h("span", { class: "group-span", title: text, style: place(timeline, from, to),
      dataset: { testid: "gantt-group-span", start: iso(from), end: iso(to) } },
      h("span", { class: "visually-hidden" }, text));
  }
  const label = h("div", { class: "gantt-label",
    title: `${group}: a parallel step; its branches ${names.join(", ")} are dispatched together` }, `${group} (parallel)`);
  const head = h("div", { class: `gantt-row group-head${bars.length ? "" : " skipped"}`,
    dataset: { testid: "gantt-group-head", group } }, label, track(timeline, span));
  return h("div", { class: "gantt-group", role: "group", "aria-label": `${group} (parallel)`,
    dataset: { testid: "gantt-group", group } },
    head, lanes.map((lane, index) => ganttRow(timeline, lane, index === lanes.length - 1 ? "└" : "├")));
}

const iso = (ms) => new Date(ms).toISOString();

/** A step's (or a compensation's) row: its attempts' bars, a wait's event and timeout, or that it is skipped.
 * `lane` ("├" or "└") for a branch's row inside its group. */
function ganttRow(timeline, row, lane = null) {
  const kind = row.kind === "compensation" ? "compensation" : row.stepKind;
  const dataset = { testid: "gantt-row", step: row.step, kind };
  if (row.skipped) dataset.skipped = "true";
  if (row.group) dataset.group = row.group;
  let tag = row.kind === "step" && kind !== "call" ? h("span", { class: `kind kind-${kind}` }, kind) : null;
  // a branch's compensation, outside its group's lanes: named with its group
  if (row.kind === "compensation" && row.group) tag = h("span", { class: "kind kind-parallel" }, `${row.group}`);
  const label = h("div", { class: "gantt-label", title: row.skipped ? `${row.step}: ${SKIPPED_TEXT}` : null },
    lane ? h("span", { class: "branch-mark", "aria-hidden": "true" }, `${lane} `) : null,
    row.kind === "compensation" ? `↺ ${row.step}` : row.step, tag ? [" ", tag] : null);
  const rowClass = `gantt-row ${row.kind} kind-${kind}${row.skipped ? " skipped" : ""}${lane ? " lane" : ""}`;
  if (row.skipped) {
    return h("div", { class: rowClass, dataset }, label,
      track(timeline, h("span", { class: "skipped-note", dataset: { testid: "gantt-skipped" } }, SKIPPED_TEXT)));
  }
  const branchOf = row.group ? ` (a branch of ${row.group}, parallel)` : "";
  const what = row.kind === "compensation" ? `compensation of ${row.step}${branchOf}`
    : `${row.step}${KIND_TEXT[kind] ? ` (${KIND_TEXT[kind]})` : ""}${branchOf}`;
  const bars = row.bars.map((bar) => {
    const text = `${what} attempt ${bar.attempt}: ${bar.status}, ${seconds(bar.end - bar.start)}` +
      `${bar.reason ? ` (${bar.reason})` : ""}`;
    return h("span", { class: `bar bar-${bar.status.replace(" ", "-")}`, title: text, style: place(timeline, bar.start, bar.end),
      dataset: { testid: "gantt-bar", status: bar.status, start: iso(bar.start), end: iso(bar.end) } },
      h("span", { class: "visually-hidden" }, text));
  });
  const points = row.points.map((point) => {
    const detail = point.event.detail || {};
    const text = point.what === "event"
      ? `event ${detail.event || ""} received at ${fmtTime(point.event.at)}${detail.kept ? " (kept: before the step started)" : ""}`
      : `no event ${detail.event || ""} in time: ${detail.onTimeout || "timed out"} (${fmtTime(point.event.at)})`;
    return h("span", { class: `point point-${point.what}`, title: text, style: { left: place(timeline, point.at, point.at).left },
      dataset: { testid: "gantt-point", what: point.what } }, h("span", { class: "visually-hidden" }, text));
  });
  return h("div", { class: rowClass, dataset }, label, track(timeline, [bars, points]));
}

/** Marks closer than 12% of the span share one label (their texts would overlap). */
function groupMarks(timeline) {
  const groups = [];
  const near = (timeline.end - timeline.start) * 0.12;
  for (const mark of timeline.marks) {
    const last = groups[groups.length - 1];
    if (last && mark.at - last[0].at < near) last.push(mark);
    else groups.push([mark]);
  }
  return groups;
}

function legend(parallel) {
  return [
    ...["done", "failed", "timed out", "running", "waiting", "terminated", "superseded"].map((status) =>
      h("span", { class: "legend-item" }, h("span", { class: `swatch bar-${status.replace(" ", "-")}` }), status)),
    parallel ? h("span", { class: "legend-item" }, h("span", { class: "swatch bar-stopped" }),
      "stopped (another branch of its parallel step failed)") : null,
    h("span", { class: "legend-item" }, h("span", { class: "swatch bar-compensated" }), "compensation done (↺ rows)"),
    h("span", { class: "legend-item" }, h("span", { class: "swatch swatch-awaits" }),
      "wait or delay step (outlined: no agent is called)"),
    h("span", { class: "legend-item" }, h("span", { class: "swatch point-event" }), "event received"),
    h("span", { class: "legend-item" }, h("span", { class: "swatch swatch-skipped" }), "skipped"),
    parallel ? h("span", { class: "legend-item" }, h("span", { class: "swatch swatch-group" }),
      "parallel step (its branches' lanes, dispatched together)") : null,
  ];
}

/**
 * An event's offset, written beside its time in the track: after it in the track's first half,
 * before it (ending there) in the second, so that the text never leaves the track for the
 * instance column on its right (nor the label column on its left) while it is narrower than
 * half the track (a track is at least 470 px wide: the chart's min-width).
 */
function offsetLabel(timeline, at, text) {
  const fraction = (at - timeline.start) / (timeline.end - timeline.start);
  const style = fraction > 0.5 ? { right: `${((1 - fraction) * 100).toFixed(3)}%` } : { left: place(timeline, at, at).left };
  return h("span", { class: `offset${fraction > 0.5 ? " offset-before" : ""}`, style, dataset: { testid: "waterfall-offset" } },
    text);
}

/** Trace ids and the waterfall of events (offset from the first event), coloured by instance. */
export function renderTrace(events) {
  if (!events.length) return h("p", { class: "muted" }, "No events.");
  const start = Date.parse(events[0].at);
  const end = Math.max(start + 1000, ...events.map((event) => Date.parse(event.at)));
  const timeline = { start, end };
  const traces = new Map();
  const instances = [];
  for (const event of events) {
    if (event.traceId) traces.set(event.traceId, (traces.get(event.traceId) || 0) + 1);
    const instance = event.instance || "(unknown)";
    if (!instances.includes(instance)) instances.push(instance);
  }
  const traceList = h("ul", { class: "traces", dataset: { testid: "trace-ids" } }, [...traces].map(([traceId, count]) =>
    h("li", {}, h("code", {}, traceId), ` · ${count} event${count === 1 ? "" : "s"}`)));
  const color = (instance) => `instance-${instances.indexOf(instance) % 6}`;
  const legend = h("p", { class: "legend muted" }, "Instances: ", instances.map((instance) =>
    h("span", { class: "legend-item" }, h("span", { class: `swatch ${color(instance)}` }), instance)));
  let previous = start;
  const rows = events.map((event) => {
    const at = Date.parse(event.at);
    const label = `${event.seq} ${event.event}${event.step ? ` ${event.step}` : ""}${event.attempt !== undefined ? ` #${event.attempt}` : ""}`;
    const instance = event.instance || "(unknown)";
    const bar = h("span", { class: `bar ${color(instance)}`, style: place(timeline, previous, at),
      title: `${label} on ${instance} at +${seconds(at - start)}` });
    previous = at;
    return h("div", { class: "gantt-row", dataset: { testid: "waterfall-row" } }, h("div", { class: "gantt-label" }, label),
      track(timeline, [bar, offsetLabel(timeline, at, `+${seconds(at - start)}`)]),
      h("div", { class: "instance muted", title: instance }, instance));
  });
  return [
    traces.size ? [h("p", {}, `Trace id${traces.size === 1 ? "" : "s"} (W3C, from the events):`), traceList]
      : h("p", { class: "muted" }, "The events carry no trace id."),
    legend,
    h("div", { class: "gantt waterfall", dataset: { testid: "waterfall" } }, axis(timeline), rows),
  ];
}
