// The remote services' circuit breakers on the overview (GET /api/overview's remotes): one chip per
// remote, its state as a word and a colour (closed green, half-open amber, open red); for a remote
// with a rate limit, its rate, and the pause a 429 put on every instance while it lasts.

import { capped, clock, errorBox, fmtTime, h, relative } from "./dom.js";

export function remotes(data) {
  const list = data.remotes || [];
  return [
    h("h2", {}, "Remote services"),
    data.remotesError ? errorBox("Circuit breakers", { message: data.remotesError }) : null,
    list.length ? h("ul", { class: "chips", dataset: { testid: "remotes" } }, list.map((r) => chip(r, data.asOf)))
      : data.remotesError ? null : h("p", { class: "muted" }, "No remote services."),
  ];
}

function chip(remote, asOf) {
  const name = remote.name;
  const attrs = { class: `chip breaker-${remote.state}`, title: details(remote),
    dataset: { testid: `remote-${name}`, state: remote.state } };
  return h("li", attrs,
    h("strong", { class: "chip-name" }, name),
    h("span", { class: "chip-state", dataset: { testid: `remote-state-${name}` } }, remote.state),
    h("span", { dataset: { testid: `remote-failures-${name}` } }, `failures ${remote.failures}`),
    timing(remote, asOf),
    h("span", { dataset: { testid: `remote-waiting-${name}` } },
      `waiting ${capped(remote.waiting, remote.waitingCapped)}`),
    rate(remote, asOf));
}

/** "8/s · 429s 2 · paused until 08:30:24Z (in 3 s)": a limited remote's rate (null: no limit). */
function rate(remote, asOf) {
  const limit = remote.rateLimit;
  if (!limit) return null;
  const parts = [`${limit.perSecond}/s${limit.burst > 1 ? ` (burst ${limit.burst})` : ""}`];
  if (limit.throttled) parts.push(`429s ${limit.throttled}`);
  const paused = limit.pausedUntil && Date.parse(limit.pausedUntil) > Date.parse(asOf);
  if (paused) parts.push(`paused until ${clock(limit.pausedUntil)} (${relative(limit.pausedUntil, asOf)})`);
  return h("span", { class: paused ? "rate-paused" : "rate",
    title: "Every instance together calls it at most this often (RemoteRateLimits, workflows/agents.json)",
    dataset: { testid: `remote-rate-${remote.name}` } }, `rate ${parts.join(" · ")}`);
}

/** Open: when the next call may probe; half-open: until when the probe out holds its lease. */
function timing(remote, asOf) {
  const [label, at] = remote.state === "open" ? ["retry", remote.retryAt]
    : remote.state === "half-open" ? ["probe until", remote.probeUntil] : [null, null];
  if (!label || !at) return null;
  return h("span", { dataset: { testid: `remote-timing-${remote.name}` } }, `${label} ${clock(at)} (${relative(at, asOf)})`);
}

function details(remote) {
  const lines = [`opened ${remote.opens} time${remote.opens === 1 ? "" : "s"}`];
  if (remote.openedAt) lines.push(`last opened ${fmtTime(remote.openedAt)}`);
  if (remote.lastFault) lines.push(`last fault: ${remote.lastFault}`);
  if (remote.changedAt) lines.push(`changed ${fmtTime(remote.changedAt)}`);
  return lines.join("\n");
}
