"""Issue 15's cost target and the relations the counts must satisfy.

:func:`saturation_cost`: table requests per order over the saturation window, by table and kind,
the breaker reads on their own line, the sweep's own reads apart, against the target of at most 5
per order of 3 steps. :func:`consistency`: relations that hold whatever the machine's speed (the
smoke run asserts them): the per-table requests add up, every work-queue message sent was
completed, a step is a request and a reply when nothing was re-sent, an order makes at least steps
+ 1 state transactions and writes at least as many entities.
"""

from __future__ import annotations

from typing import Any

STEPS = 3
TARGET_REQUESTS_PER_ORDER = 5.0
# Table request kinds only the Supervisor's sweep issues: the deadline index query and the listing
# of a remote's waiting steps when its breaker's watch falls due (shared.supervisor.breakers). Its
# point read of a due order's state row is one kind with the agents' check of every request
# (``orders|get``, shared.storage.views.current_view), so under load it is counted as work.
SWEEP_KINDS = ("deadlines|query", "orders|query|waiting")
STATE_READS = "orders|get"
# point reads: the agents' admissions of a breaker that is not closed and clean (or when their
# query failed), and the Supervisor's: one per due breaker watch (none while no breaker opened
# since the process's first sweep, which reads each remote once)
BREAKER_READS = "orders|get|breakers"
# an agent instance's query of every breaker at once (shared.agent.board): its healthy admissions
BREAKER_QUERIES = "orders|query|breakers"
WAITING_LISTINGS = "orders|query|waiting"  # the Supervisor's, when a watch of a closed (or overdue) breaker is due
# while idle no agent calls: every breaker read is the Supervisor's
# the console's stats rows: after a sweep with due rows, and while idle once a minute (a heartbeat,
# so that the console can tell a Supervisor that runs from one that stopped): the sweep's own writes
STATS_WRITES = "orderindex|batch|stats"
# while idle no agent checks a request: every state point read is the sweep's
IDLE_SWEEP_KINDS = (*SWEEP_KINDS, STATE_READS, BREAKER_READS, STATS_WRITES)


def work_queues(bus: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """The work queues of every lane (``scheduler``, ``scheduler-high``, ``replies``, ``agent-*``)."""
    return {q: r for q, r in bus.items() if q.split("-")[0] in ("scheduler", "replies") or q.startswith("agent-")}


def saturation_cost(result: dict[str, Any]) -> dict[str, Any] | None:
    """Table requests (and entities) per order over the saturation window, against issue 15's target."""
    sat = (result.get("phases") or {}).get("saturation") or {}
    orders = sat.get("processed") or 0
    table = (sat.get("window") or {}).get("table") or {}
    if not orders or not table:
        return None
    work = {k: v for k, v in table.items() if k not in SWEEP_KINDS}
    total = sum(v["requests"] for v in work.values())
    by_table: dict[str, float] = {}
    for k, v in work.items():
        name = k.split("|", 1)[0]
        by_table[name] = by_table.get(name, 0) + v["requests"]
    per_order = round(total / orders, 3)
    breaker_reads = sum(table.get(k, {}).get("requests", 0) for k in (BREAKER_READS, BREAKER_QUERIES))
    listings = table.get(WAITING_LISTINGS, {}).get("requests", 0)
    return {
        "orders": orders, "steps_per_order": STEPS,
        "requests_per_order": per_order,
        "requests_per_order_by_table": {t: round(n / orders, 3) for t, n in sorted(by_table.items())},
        "requests_per_order_by_kind": {k: round(v["requests"] / orders, 3) for k, v in sorted(work.items())},
        "entities_per_order_by_kind": {k: round(v["entities"] / orders, 3) for k, v in sorted(work.items())},
        "breaker_reads_per_order": round(breaker_reads / orders, 3),
        # both kinds; the Supervisor reads a breaker only for a due watch (a point read), and lists its
        # waiting steps for most of them: its listings stand for its breaker reads (none while no
        # breaker opened); the rest are the agents' admissions (their queries and point reads)
        "breaker_reads_per_order_by_reader": {
            "agents": round(max(breaker_reads - listings, 0) / orders, 3),
            "supervisor": round(min(listings, breaker_reads) / orders, 3)},
        "sweep_requests_in_window": {k: table[k]["requests"] for k in SWEEP_KINDS if k in table},
        "target": {"target": f"<= {TARGET_REQUESTS_PER_ORDER:g} table requests per order of {STEPS} steps at "
                             "saturation (issue 15: history, search and deadline index included)",
                   "value": f"{per_order} per order ({round(per_order / STEPS, 3)} per step) over {orders} orders",
                   "met": per_order <= TARGET_REQUESTS_PER_ORDER},
    }


def _check(name: str, ok: bool, detail: Any) -> dict[str, Any]:
    return {"check": name, "ok": bool(ok), "detail": detail}


def consistency(po: dict[str, Any] | None, sat: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The relations the counted window must satisfy (``po``: ``bench.report.per_order``;
    ``sat``: :func:`saturation_cost`). Each: check, ok, detail."""
    if not po:
        return [_check("counted window", False, "no load phase was counted")]
    t = po["table"]
    out = [_check("per-table requests add up to the total",
                  abs(sum(t["requests_per_step_by_table"].values()) - t["requests_per_step"]) < 0.01,
                  {"byTable": t["requests_per_step_by_table"], "total": t["requests_per_step"]})]
    tx = t["requests_per_order_by_kind"].get("orders|batch", 0)
    out.append(_check(f"state transactions per order >= steps + 1 ({STEPS + 1}: the submission and a reply per step)",
                      tx >= STEPS + 1, tx))
    written = t["entities_per_order_by_kind"].get("orders|batch", 0)
    out.append(_check("state entities written per order >= state transactions per order", written >= tx,
                      {"entities": written, "transactions": tx}))
    if sat:
        out.append(_check("saturation: per-table requests add up to the total",
                          abs(sum(sat["requests_per_order_by_table"].values()) - sat["requests_per_order"]) < 0.01,
                          {"byTable": sat["requests_per_order_by_table"], "total": sat["requests_per_order"]}))
    if "bus" in po:
        out += _bus_checks(po)
    return out


def _bus_checks(po: dict[str, Any]) -> list[dict[str, Any]]:
    bus = po["bus"]
    orders = po["orders"]
    queues = bus["consistency"]
    out = []
    for q, c in sorted(queues.items()):
        out.append(_check(f"{q}: every message sent was completed, and delivered at least once",
                          c["completed"] == c["sent"] and c["delivered"] >= c["sent"], c))
    sent = sum(c["sent"] for c in queues.values())
    completed = sum(c["completed"] for c in queues.values())
    resent = sum(c["sent"] for q, c in queues.items() if q.split("-")[0] == "scheduler")
    detail = {"sentPerStep": round(sent / orders / STEPS, 3), "completedPerStep": round(completed / orders / STEPS, 3),
              "schedulerQueueSends": resent,
              "redeliveries": sum(c["delivered"] - c["sent"] for c in queues.values())}
    if resent == 0:  # no redrive, resume or schedule: nothing was re-sent, each step is a request and a reply
        out.append(_check("work-queue messages per step == 4 (a request and a reply, each sent once and completed "
                          "once; redeliveries apart)", sent == completed == 2 * STEPS * orders, detail))
    else:
        out.append(_check("work-queue messages per step >= 4 (the scheduler queue carried re-sends)",
                          sent == completed >= 2 * STEPS * orders, detail))
    return out
